"""bench.compare: the figures two result files share and those that moved."""

from __future__ import annotations

from bench.compare import figures, moved


def test_figures_are_the_numeric_leaves_without_booleans() -> None:
    report = {"a": {"x": 1, "ok": True, "runs": [2.0, 3]}, "name": "n"}
    assert dict(figures(report)) == {"a.x": 1.0, "a.runs.0": 2.0, "a.runs.1": 3.0}


def test_moved_counts_changes_beyond_the_threshold_either_way() -> None:
    before = {"commit": "a", "s": {"t": 1.0, "u": 100.0, "v": 10.0, "gone": 1.0, "wall_s": 5.0}}
    after = {"commit": "b", "s": {"t": 1.04, "u": 90.0, "v": 11.0, "new": 2.0, "wall_s": 50.0}}
    shared, big = moved(before, after, 0.05)
    assert sorted(shared) == ["s.t", "s.u", "s.v"]  # commit and wall times are not figures
    assert [(k, round(c, 2)) for k, _, _, c in big] == [("s.u", -0.1), ("s.v", 0.1)]
