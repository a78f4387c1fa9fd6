"""bench.compare: the figures two sides share, their medians over runs, those that moved."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.compare import figures, main, moved, runs


def test_figures_are_the_numeric_leaves_without_booleans() -> None:
    report = {"a": {"x": 1, "ok": True, "runs": [2.0, 3]}, "name": "n"}
    assert dict(figures(report)) == {"a.x": 1.0, "a.runs.0": 2.0, "a.runs.1": 3.0}


def test_moved_counts_changes_beyond_the_threshold_either_way() -> None:
    before = runs(
        [{"commit": "a", "s": {"t": 1.0, "u": 100.0, "v": 10.0, "gone": 1.0, "wall_s": 5.0}}]
    )
    after = runs(
        [{"commit": "b", "s": {"t": 1.04, "u": 90.0, "v": 11.0, "new": 2.0, "wall_s": 50.0}}]
    )
    shared, big = moved(before, after, 0.05)
    assert sorted(shared) == ["s.t", "s.u", "s.v"]  # commit and wall times are not figures
    assert [(k, round(c, 2)) for k, _, _, c in big] == [("s.u", -0.1), ("s.v", 0.1)]


def test_a_side_of_several_runs_compares_medians_and_merges_scenarios() -> None:
    # three rounds of one scenario, and another scenario's file on the same side
    before = runs([{"s": {"t": 1.0}}, {"s": {"t": 1.01}}, {"s": {"t": 1.02}}, {"r": {"x": 3.0}}])
    after = runs([{"s": {"t": 2.0}}, {"s": {"t": 1.01}}, {"s": {"t": 1.0}}, {"r": {"x": 3.3}}])
    assert before["s.t"] == [1.0, 1.01, 1.02]
    shared, big = moved(before, after, 0.05)
    assert sorted(shared) == ["r.x", "s.t"]
    # one run's 2.0 does not move s.t (as a first run or a mean would): both medians are 1.01
    assert [k for k, *_ in big] == ["r.x"]


def test_main_prints_each_moved_figure_with_every_runs_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = []
    for name, value in (("b1", 1.0), ("b2", 1.1), ("a1", 2.0), ("a2", 2.2)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"commit": name[0] * 12, "s": {"t": value}}))
        files.append(str(path))
    main(["--before", *files[:2], "--after", *files[2:], "--list", "s"])
    out = capsys.readouterr().out
    assert "1 moved by more than 5%" in out
    assert "| s.t | 1.05 | 2.1 | +100.0% | 1 / 1.1 | 2 / 2.2 |" in out
    with pytest.raises(SystemExit):
        main([files[0]])  # one side only
