"""Fast checks (no lab) of the soak bench's arithmetic: its percentiles and its goals."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from bench.scenarios import soak


@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1), st.floats(0.01, 1.0))
def test_percentile_is_the_nearest_rank(values: list[float], fraction: float) -> None:
    ordered = sorted(values)
    got = soak.percentile(ordered, fraction)
    assert got in ordered
    at_or_below = sum(1 for v in ordered if v <= got)
    assert at_or_below >= math.ceil(fraction * len(ordered))  # at least that share is <= it
    assert sum(1 for v in ordered if v < got) < math.ceil(fraction * len(ordered))


def test_percentile_of_nothing_is_zero() -> None:
    assert soak.percentile([], 0.99) == 0.0


def _phase(failed: int, retransmitted: int, tcp: int = 10_000) -> dict:
    return {"failed": failed, "retransmitted": retransmitted, "tcp_requests": tcp}


def test_goals_hold_only_at_their_targets() -> None:
    ok = soak.goals({"quiet": _phase(0, 0), "hog": _phase(0, 10)})
    assert all(g["met"] for g in ok), ok
    over = soak.goals({"quiet": _phase(0, 1), "hog": _phase(0, 11)})
    assert [g["met"] for g in over] == [True, True, False, False], over
    failed = soak.goals({"quiet": _phase(1, 0), "hog": _phase(2, 0)})
    assert [g["met"] for g in failed] == [False, False, True, True], failed
