"""The real Kubernetes control plane for tests (``ovsproxy.lab.controlplane``), as fixtures.

``control_plane``: etcd + kube-apiserver + kube-controller-manager of the pinned release,
started once per test process (each xdist worker its own) the first time a test asks, stopped
and removed at the end of the session. ``kube_namespace``: a fresh namespace per test, deleted
when the test ends (the namespace controller removes what is in it). A module that needs a
server of its own (restarted, compacted, watch cache off) starts a ``ControlPlane`` itself.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import pytest

from ovsproxy.lab.controlplane import ControlPlane, list_control_plane_records


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    with ControlPlane() as api:
        yield api


@pytest.fixture
def kube_namespace(control_plane: ControlPlane) -> Iterator[str]:
    name = f"t-{secrets.token_hex(4)}"
    control_plane.create_namespace(name)
    yield name
    control_plane.request("DELETE", f"/api/v1/namespaces/{name}", ok=(200, 202, 404))


@pytest.fixture(scope="session", autouse=True)
def no_leftover_control_planes() -> Iterator[None]:
    """No control plane of this test run may outlive the session."""
    yield
    mine = [r.name for r in list_control_plane_records() if r.owner_pid == os.getpid()]
    assert not mine, f"leftover control planes {mine}"
