"""Shared fixtures. Live tests use a real private OVS sandbox (see ovsproxy.ovs.sandbox)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.controlplane import (  # noqa: F401  (fixtures and the session check)
    control_plane,
    kube_namespace,
    no_leftover_control_planes,
)
from support.leftovers import no_leftover_sandboxes  # noqa: F401  (session check)

# The suite's own figures (OVSPROXY_RECORD_RESULTS=1): support/suite_record.py's hooks.
from support.suite_record import pytest_sessionstart, pytest_terminal_summary  # noqa: F401

from ovsproxy.ovs.ovsdb import _import_ovsdbapp
from ovsproxy.ovs.sandbox import Sandbox
from tests.shared_sandbox import SandboxState, leave_as_found, pod_servers, read_state

# Before any test module imports os-ken (and with it eventlet): see _import_ovsdbapp.
_import_ovsdbapp()


@pytest.fixture(scope="module")
def module_sandbox() -> Iterator[Sandbox]:
    """One private OVS for a module's tests (see ``sandbox``)."""
    with Sandbox() as sb:
        yield sb


@pytest.fixture(scope="module")
def _module_sandbox_found() -> list[SandboxState]:
    """The state the module's sandbox is in between its tests, once read."""
    return []


@pytest.fixture
def sandbox(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    """A private OVS: bridge br0 (netdev, OpenFlow15, fail_mode secure) and gw0. Fresh per
    test, or in a module marked ``shared_sandbox`` the module's one, reset after each test to
    the state the test found and checked to be so (tests/shared_sandbox.py)."""
    if request.node.get_closest_marker("shared_sandbox") is None:
        with Sandbox() as sb:
            yield sb
        return
    sb = request.getfixturevalue("module_sandbox")
    found = request.getfixturevalue("_module_sandbox_found")
    # The previous test's teardown checked the sandbox is in this state again; read anew
    # only if a module fixture has added pods since.
    if not found or found[0].pods != pod_servers(sb):
        found[:] = [read_state(sb)]
    yield sb
    leave_as_found(sb, found[0])
