"""bench.pressure: the machine's stall shares from /proc/pressure samples."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bench.pressure import PressureWatch, cpu_times, some_total, summary

CPU = "some avg10=0.26 avg60=8.87 avg300=10.80 total=3225043454\nfull avg10=0.00 total=0\n"


def test_some_total_reads_the_some_line() -> None:
    assert some_total(CPU) == 3225043454
    with pytest.raises(ValueError):
        some_total("full avg10=0.00 total=0\n")


def test_summary_finds_the_worst_interval_and_the_total() -> None:
    samples = [
        (0.0, {"cpu": 1_000_000, "io": 0}),
        (0.5, {"cpu": 1_050_000, "io": 0}),  # 10% of 0.5 s stalled
        (1.0, {"cpu": 1_450_000, "io": 100_000}),  # 80% of it: the stall
        (1.5, {"cpu": 1_450_000, "io": 100_000}),
    ]
    got = summary(samples)
    assert got["cpu"]["stalled_s"] == 0.45
    assert (got["cpu"]["worst_share"], got["cpu"]["worst_at_s"]) == (0.8, 1.0)
    assert got["cpu"]["series"] == [(0.5, 0.1), (1.0, 0.8), (1.5, 0.0)]
    assert got["io"]["worst_share"] == 0.2 and "memory" not in got
    assert summary(samples[:1]) == {}


def test_the_watch_samples_the_files_while_entered(tmp_path: Path) -> None:
    (tmp_path / "cpu").write_text(CPU)
    with PressureWatch(interval=0.05, root=tmp_path) as watch:
        time.sleep(0.2)
        (tmp_path / "cpu").write_text(CPU.replace("total=3225043454", "total=3225143454"))
        time.sleep(0.2)
    got = watch.summary()
    assert got["cpu"]["stalled_s"] == 0.1 and got["started_wall"] > 0
    assert len(watch.samples) >= 4  # first, a few in between, last


def test_steal_iowait_and_the_samplers_gaps() -> None:
    stat = "cpu  100 0 50 800 10 0 5 20 0 0\ncpu0 1 2 3\n"
    assert cpu_times(stat) == {"jiffies": 985, "iowait": 10, "steal": 20}
    samples = [
        (0.0, {"jiffies": 0, "iowait": 0, "steal": 0}),
        (0.5, {"jiffies": 100, "iowait": 0, "steal": 5}),
        (2.5, {"jiffies": 500, "iowait": 40, "steal": 305}),  # 2 s late: the hypervisor's
        (3.0, {"jiffies": 600, "iowait": 40, "steal": 305}),
    ]
    got = summary(samples, interval=0.5)
    assert got["steal"] == {"worst_share": 0.75, "worst_at_s": 2.5}
    assert got["iowait"] == {"worst_share": 0.1, "worst_at_s": 2.5}
    assert got["gaps"] == {"asked_s": 0.5, "longest_s": 2.0, "longest_at_s": 2.5}
    assert "cpu" not in got  # no pressure files sampled
