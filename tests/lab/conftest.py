"""Fixtures for the multi-node lab tests: one lab per module (starting one costs seconds)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from ovsproxy.lab.cluster import Lab, list_lab_records


@pytest.fixture(scope="session", autouse=True)
def _no_lab_leftovers() -> Iterator[None]:
    """No lab of this test run may outlive the session."""
    yield
    mine = [r.name for r in list_lab_records() if r.owner_pid == os.getpid()]
    assert not mine, f"leftover labs {mine}"


def start_lab(nodes: int = 3, **kwargs: object) -> Iterator[Lab]:
    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    lab = Lab(nodes, **kwargs)  # type: ignore[arg-type]
    with lab:
        print(f"\nlab {lab.name}: {nodes} nodes up in {lab.started_in:.2f} s")
        yield lab
