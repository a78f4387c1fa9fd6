"""Whether the machine itself stalled during a measurement: Linux's pressure stall information
(``/proc/pressure/{cpu,io,memory}``), sampled while a bench phase runs.

A soak run once lost 22 requests within 0.3 s of each other on every node, client and
family, at half the usual throughput, and nothing on record could say whether the machine
as a whole had stalled (issue 23's closing note). Each line of a pressure file ends with the
microseconds some task spent stalled on that resource since boot (``some ... total=``); its
growth between two samples over their interval is the share of that time some task waited.
``PressureWatch`` samples the three files every ``interval`` seconds in a thread;
``summary`` (pure) gives per resource the total stalled time, the worst interval (its share
and when, in seconds from the start) and the series, so a stall shows next to the failures'
times.

On a loaded machine CPU pressure is near 100% all the time (some task always waits for a
core), so it cannot show a stall by itself. Two more signs are sampled: the CPU time the
hypervisor took (``steal``, from ``/proc/stat``, beside ``iowait``) and the sampler's own
lateness (``gaps``: an interval much longer than asked means nothing ran, the sampler
included).
"""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path
from typing import Any

RESOURCES = ("cpu", "io", "memory")
STAT_FIELDS = {"iowait": 4, "steal": 7}  # in /proc/stat's "cpu" line, after the name
# (seconds from the start, resource -> "some" total us, and "jiffies", "iowait", "steal")
Sample = tuple[float, dict[str, int]]


def cpu_times(text: str) -> dict[str, int]:
    """From ``/proc/stat``: all CPUs' jiffies, and those of ``iowait`` and ``steal``."""
    for line in text.splitlines():
        if line.startswith("cpu "):
            values = [int(v) for v in line.split()[1:]]
            out = {name: values[at] for name, at in STAT_FIELDS.items() if at < len(values)}
            # guest time is counted in user already
            return {"jiffies": sum(values[:8]), **out}
    raise ValueError("no 'cpu' line in /proc/stat")


def some_total(text: str) -> int:
    """The ``some`` line's ``total=`` (microseconds stalled since boot)."""
    for line in text.splitlines():
        if line.startswith("some "):
            for field in line.split():
                if field.startswith("total="):
                    return int(field.removeprefix("total="))
    raise ValueError(f"no 'some ... total=' line in {text!r}")


def summary(samples: list[Sample], interval: float | None = None) -> dict[str, Any]:
    """Per resource: ``stalled_s`` (over the samples), ``worst_share`` of one interval,
    ``worst_at_s`` (that interval's end), and ``series`` (each interval's end and share,
    rounded); per ``/proc/stat`` field its worst share of all CPUs' time and when; with the
    asked ``interval``, the longest ``gap`` between samples and when. Empty without two
    samples."""
    if len(samples) < 2:
        return {}
    out: dict[str, Any] = {}
    pairs = list(itertools.pairwise(samples))
    if all("jiffies" in totals for _, totals in samples):
        for name in STAT_FIELDS:
            shares = []
            for (_, a), (t1, b) in pairs:
                ticks = b["jiffies"] - a["jiffies"]
                share = (b[name] - a[name]) / ticks if ticks > 0 else 0.0
                shares.append((round(t1, 2), round(share, 3)))
            at, worst = max(shares, key=lambda point: point[1])
            out[name] = {"worst_share": worst, "worst_at_s": at}
    if interval is not None:
        at, gap = max(((round(t1, 2), t1 - t0) for (t0, _), (t1, _) in pairs), key=lambda g: g[1])
        out["gaps"] = {"asked_s": interval, "longest_s": round(gap, 3), "longest_at_s": at}
    for resource in RESOURCES:
        if not all(resource in totals for _, totals in samples):
            continue
        series = []
        for (t0, a), (t1, b) in pairs:
            span = t1 - t0
            share = (b[resource] - a[resource]) / (span * 1e6) if span > 0 else 0.0
            series.append((round(t1, 2), round(min(max(share, 0.0), 1.0), 3)))
        worst_at, worst = max(series, key=lambda point: point[1])
        out[resource] = {
            "stalled_s": round((samples[-1][1][resource] - samples[0][1][resource]) / 1e6, 3),
            "worst_share": worst,
            "worst_at_s": worst_at,
            "series": series,
        }
    return out


class PressureWatch:
    """Samples ``/proc/pressure`` every ``interval`` seconds while entered (nothing where the
    kernel has no pressure files)."""

    def __init__(
        self,
        interval: float = 0.5,
        root: Path = Path("/proc/pressure"),
        stat: Path = Path("/proc/stat"),
    ) -> None:
        self.interval = interval
        self.root = root
        self.stat = stat
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = 0.0
        self.started_wall = 0.0  # Unix time of the first sample (failures carry "wall")

    def _sample(self) -> None:
        totals = {}
        for resource in RESOURCES:
            try:
                totals[resource] = some_total((self.root / resource).read_text())
            except (OSError, ValueError):
                continue
        try:
            totals.update(cpu_times(self.stat.read_text()))
        except (OSError, ValueError):
            pass
        if totals:
            self.samples.append((time.monotonic() - self._started, totals))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> PressureWatch:
        self._started = time.monotonic()
        self.started_wall = time.time()
        self._sample()
        self._thread = threading.Thread(target=self._run, name="pressure", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()

    def summary(self) -> dict[str, Any]:
        found = summary(self.samples, self.interval)
        return {"started_wall": round(self.started_wall, 3), **found} if found else {}
