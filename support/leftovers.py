"""Session checks that every test cleans up after itself, for each test tree's conftest:
no OVS sandbox, network namespace or lab of this test run may outlive the session."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from ovsproxy.lab.cluster import list_lab_records
from ovsproxy.ovs.sandbox import NETNS_PREFIX, Sandbox, list_records


def _our_netns() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.startswith(NETNS_PREFIX)}


@pytest.fixture(scope="session", autouse=True)
def no_leftover_sandboxes() -> Iterator[None]:
    """Every test cleans up: no sandbox of this test run may outlive the session."""
    yield
    mine = [r for r in list_records() if r.owner_pid == os.getpid()]
    # Only ours: other test runs (or a developer's sandbox) may be up at the same time.
    leaked_ns = _our_netns() & Sandbox.created_netns
    assert not mine and not leaked_ns, f"leftover sandboxes {mine} namespaces {leaked_ns}"


@pytest.fixture(scope="session", autouse=True)
def no_leftover_labs() -> Iterator[None]:
    """No lab of this test run may outlive the session."""
    yield
    mine = [r.name for r in list_lab_records() if r.owner_pid == os.getpid()]
    assert not mine, f"leftover labs {mine}"
