"""The sources' tests against the real control plane (``ovsproxy.lab.controlplane``).

``cp``: one etcd + kube-apiserver + kube-controller-manager for the package's tests, with the
watch cache off, so that a watch from a compacted resourceVersion gets etcd's 410 at once
(through the cache it takes > 100 events and minutes). ``control_plane`` (the session one,
watch cache on) serves what only the cache does: bookmarks. ``ns``: a fresh namespace per
test, whose teardown waits until the namespace controller has removed it and everything in
it, so one test's deletions never reach the next test's cluster-wide informers.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.controlplane import delete_namespace

from ovsproxy.lab.controlplane import ControlPlane


@pytest.fixture(scope="package")
def cp() -> Iterator[ControlPlane]:
    with ControlPlane(watch_cache=False) as plane:
        yield plane


@pytest.fixture(scope="package")
def agent_kubeconfig(cp: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The agent's identity as shipped: deploy/base/rbac.yaml applied, its token."""
    return cp.ovsproxy_kubeconfig(tmp_path_factory.mktemp("kube") / "agent.kubeconfig")


@pytest.fixture
def ns(cp: ControlPlane) -> Iterator[str]:
    name = f"t-{secrets.token_hex(4)}"
    cp.create_namespace(name)
    yield name
    delete_namespace(cp, name)
