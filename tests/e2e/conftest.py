"""The e2e modules share one sandbox per module (``shared_sandbox``): the example lab's pods
are built on it once, and each test's agent and what it installed are removed after it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.controlplane import delete_namespace

from ovsproxy.lab import build_lab
from ovsproxy.lab.controlplane import ControlPlane
from ovsproxy.ovs.sandbox import Pod, Sandbox


@pytest.fixture(scope="module")
def example_pods(request: pytest.FixtureRequest, module_sandbox: Sandbox) -> dict[str, Pod]:
    """The example lab's pods (ovsproxy.lab.build_lab) on the module's sandbox."""
    assert request.node.get_closest_marker("shared_sandbox"), "the module's sandbox is shared"
    return build_lab(module_sandbox)


@pytest.fixture(scope="package")
def kube_api() -> Iterator[ControlPlane]:
    """The real control plane of the e2e tests that read the Kubernetes API: watch cache off,
    so that a watch from a compacted resourceVersion gets 410 at once."""
    with ControlPlane(watch_cache=False) as api:
        yield api


@pytest.fixture
def demo_namespace(kube_api: ControlPlane) -> Iterator[str]:
    """The examples' namespace, fresh per test, removed (and waited for) after it."""
    kube_api.create_namespace("demo")
    yield "demo"
    delete_namespace(kube_api, "demo")
