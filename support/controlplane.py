"""The real Kubernetes control plane for tests (``ovsproxy.lab.controlplane``), as fixtures.

Imported once, by tests/conftest.py: a conftest below it importing them again would make
another session control plane for its tests.

``control_plane``: etcd + kube-apiserver + kube-controller-manager of the pinned release,
started once per test process (each xdist worker its own) the first time a test asks, stopped
and removed at the end of the session. ``kube_namespace``: a fresh namespace per test, deleted
when the test ends (the namespace controller removes what is in it). A module that needs a
server of its own (restarted, compacted, watch cache off) starts a ``ControlPlane`` itself.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest

from ovsproxy.lab.controlplane import ApiError, ControlPlane, list_control_plane_records

SESSION_PREFIX = "ovsp-cp-session-"


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """The session's control plane. Checked here, not by ``no_leftover_control_planes``: that
    one can be set up after this one (first used by a later test) and so torn down before it."""
    api = ControlPlane(f"{SESSION_PREFIX}{os.getpid()}-{secrets.token_hex(2)}")
    with api:
        yield api
    assert api.name not in {r.name for r in list_control_plane_records()}, "not removed"


@pytest.fixture
def kube_namespace(control_plane: ControlPlane) -> Iterator[str]:
    name = f"t-{secrets.token_hex(4)}"
    control_plane.create_namespace(name)
    yield name
    control_plane.request("DELETE", f"/api/v1/namespaces/{name}", ok=(200, 202, 404))


@pytest.fixture(scope="session", autouse=True)
def no_leftover_control_planes() -> Iterator[None]:
    """No control plane a test of this run started may outlive the session (the session's
    own is ``control_plane``'s to check)."""
    yield
    mine = [
        r.name
        for r in list_control_plane_records()
        if r.owner_pid == os.getpid() and not r.name.startswith(SESSION_PREFIX)
    ]
    assert not mine, f"leftover control planes {mine}"


PLURALS = {
    "Service": "services",
    "EndpointSlice": "endpointslices",
    "Node": "nodes",
    "ServiceCIDR": "servicecidrs",
}


def object_path(obj: dict[str, Any]) -> str:
    """The API path of ``obj`` (a kind of ``PLURALS``)."""
    meta = obj["metadata"]
    version = obj["apiVersion"]
    base = f"/api/{version}" if "/" not in version else f"/apis/{version}"
    if meta.get("namespace"):
        base += f"/namespaces/{meta['namespace']}"
    return f"{base}/{PLURALS[obj['kind']]}/{meta['name']}"


def apply_object(api: ControlPlane, obj: dict[str, Any]) -> dict[str, Any]:
    """Server-side apply as the field manager ``tests``: what it no longer names goes."""
    return api.request(
        "PATCH",
        object_path(obj),
        obj,
        params={"fieldManager": "tests", "force": "true"},
        content_type="application/apply-patch+yaml",
    )


def delete_namespace(api: ControlPlane, name: str, timeout: float = 90.0) -> None:
    """Delete a namespace and wait until the namespace controller has emptied and removed it
    (so its objects' deletions never reach a later test's cluster-wide informers)."""
    api.request("DELETE", f"/api/v1/namespaces/{name}", ok=(200, 202, 404))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            api.request("GET", f"/api/v1/namespaces/{name}")
        except ApiError as exc:
            if exc.status == 404:
                return
            raise
        time.sleep(0.2)
    raise AssertionError(f"namespace {name} still there after {timeout:.0f} s")
