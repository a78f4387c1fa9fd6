"""Shared fixtures. Live tests use a real private OVS sandbox (see ovsproxy.ovs.sandbox)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from ovsproxy.ovs.ovsdb import _import_ovsdbapp
from ovsproxy.ovs.sandbox import NETNS_PREFIX, Sandbox, list_records

# Before any test module imports os-ken (and with it eventlet): see _import_ovsdbapp.
_import_ovsdbapp()


def _our_netns() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.startswith(NETNS_PREFIX)}


@pytest.fixture(scope="session", autouse=True)
def _no_leftovers() -> Iterator[None]:
    """Every test cleans up: no sandbox of this test run may outlive the session."""
    yield
    mine = [r for r in list_records() if r.owner_pid == os.getpid()]
    # Only ours: other test runs (or a developer's sandbox) may be up at the same time.
    leaked_ns = _our_netns() & Sandbox.created_netns
    assert not mine and not leaked_ns, f"leftover sandboxes {mine} namespaces {leaked_ns}"


@pytest.fixture
def sandbox() -> Iterator[Sandbox]:
    """A fresh private OVS: bridge br0 (netdev, OpenFlow15, fail_mode secure) and gw0."""
    with Sandbox() as sb:
        yield sb
