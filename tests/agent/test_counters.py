"""The traffic counters' pure parts (``agent.counters``): the series cap and the folding of
successive bucket counts into totals that only grow."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ovsproxy.agent.counters import OTHER, Totals, capped


@given(st.dictionaries(st.text(max_size=3), st.integers(0, 10**6), max_size=30), st.integers(1, 40))
def test_the_cap_keeps_the_largest_and_sums_the_rest(series: dict[str, int], cap: int) -> None:
    keyed = {(k, "x"): v for k, v in series.items()}
    out = capped(keyed, cap)
    assert len(out) <= cap and sum(out.values()) == sum(keyed.values())
    if len(keyed) > cap:
        kept = [v for k, v in out.items() if k != (OTHER, OTHER)]
        dropped = [v for k, v in keyed.items() if k not in out]
        assert len(kept) == cap - 1 and (not kept or min(kept) >= max(dropped))


def test_totals_grow_and_a_reset_adds_the_new_count_and_is_not_exact() -> None:
    totals = Totals()
    totals.fold(1, ["a", "b"], [3, 5])
    totals.fold(1, ["a", "b"], [4, 9])
    assert (totals.total(1, "a"), totals.total(1, "b"), totals.exact) == (4, 9, True)
    totals.fold(1, ["a", "b"], [2, 9])  # a's bucket counted down: the switch lost it
    assert (totals.total(1, "a"), totals.exact, totals.resets) == (6, False, 1)
    totals.keep({2})
    assert totals.total(1, "a") == 0
