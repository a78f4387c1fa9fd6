"""Shared fixtures. Live tests use a real private OVS sandbox (see ovsproxy.ovs.sandbox)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.leftovers import no_leftover_sandboxes  # noqa: F401  (session check)

from ovsproxy.ovs.ovsdb import _import_ovsdbapp
from ovsproxy.ovs.sandbox import Sandbox

# Before any test module imports os-ken (and with it eventlet): see _import_ovsdbapp.
_import_ovsdbapp()


@pytest.fixture
def sandbox() -> Iterator[Sandbox]:
    """A fresh private OVS: bridge br0 (netdev, OpenFlow15, fail_mode secure) and gw0."""
    with Sandbox() as sb:
        yield sb
