"""The deploy tests' objects on the session's real control plane (support/controlplane.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.controlplane import delete_namespace

from ovsproxy.lab.controlplane import ControlPlane


@pytest.fixture(scope="module")
def demo_namespace(control_plane: ControlPlane) -> Iterator[str]:
    """``demo``, the examples' namespace, for a module's tests; removed (and waited for)
    after them."""
    control_plane.create_namespace("demo")
    yield "demo"
    delete_namespace(control_plane, "demo")
