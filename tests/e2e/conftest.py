"""The e2e modules share one sandbox per module (``shared_sandbox``): the example lab's pods
are built on it once, and each test's agent and what it installed are removed after it."""

from __future__ import annotations

import pytest

from ovsproxy.lab import build_lab
from ovsproxy.ovs.sandbox import Pod, Sandbox


@pytest.fixture(scope="module")
def example_pods(request: pytest.FixtureRequest, module_sandbox: Sandbox) -> dict[str, Pod]:
    """The example lab's pods (ovsproxy.lab.build_lab) on the module's sandbox."""
    assert request.node.get_closest_marker("shared_sandbox"), "the module's sandbox is shared"
    return build_lab(module_sandbox)
