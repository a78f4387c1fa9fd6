"""Fixtures for the multi-node lab tests: one lab per module (starting one costs seconds)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from support.leftovers import no_leftover_labs  # noqa: F401  (session check)

from ovsproxy.lab.cluster import Lab


def start_lab(nodes: int = 3, **kwargs: object) -> Iterator[Lab]:
    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    lab = Lab(nodes, **kwargs)  # type: ignore[arg-type]
    with lab:
        print(f"\nlab {lab.name}: {nodes} nodes up in {lab.started_in:.2f} s")
        yield lab
