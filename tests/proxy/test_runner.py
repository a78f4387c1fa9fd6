"""The bounded-frequency runner: bursts collapse, failures retry with backoff, full resyncs."""

from __future__ import annotations

import asyncio
import time

import pytest

from ovsproxy.proxy.runner import SyncRunner


class Recorder:
    def __init__(self, fail_times: int = 0) -> None:
        self.calls: list[tuple[float, bool]] = []
        self.fail_times = fail_times

    async def __call__(self, full: bool) -> None:
        self.calls.append((time.monotonic(), full))
        if self.fail_times:
            self.fail_times -= 1
            raise RuntimeError("OVS said no")


async def _running(runner: SyncRunner):
    task = asyncio.create_task(runner.run())
    await asyncio.sleep(0)
    return task


async def test_a_burst_of_requests_is_one_sync_per_min_interval() -> None:
    rec = Recorder()
    runner = SyncRunner(rec, min_interval=0.2, full_resync_interval=3600)
    task = await _running(runner)
    for _ in range(50):
        runner.request()
        await asyncio.sleep(0.002)
    await runner.wait_idle(timeout=2)
    runner.stop()
    await task
    # 50 requests over ~0.1 s: the first runs at once, the rest collapse into one more sync.
    assert len(rec.calls) == 2
    assert rec.calls[1][0] - rec.calls[0][0] >= 0.19


async def test_zero_min_interval_syncs_each_request_promptly() -> None:
    rec = Recorder()
    runner = SyncRunner(rec, min_interval=0, full_resync_interval=3600)
    task = await _running(runner)
    for _ in range(3):
        runner.request()
        await runner.wait_idle(timeout=1)
    runner.stop()
    await task
    assert len(rec.calls) == 3 and not any(full for _, full in rec.calls)


async def test_failed_sync_is_retried_with_growing_backoff_until_it_succeeds() -> None:
    rec = Recorder(fail_times=3)
    results: list[bool] = []
    runner = SyncRunner(
        rec,
        min_interval=0,
        retry_initial=0.05,
        retry_max=1,
        on_result=lambda ok, _: results.append(ok),
    )
    task = await _running(runner)
    runner.request(full=True)
    await runner.wait_idle(timeout=5)
    runner.stop()
    await task
    assert results == [False, False, False, True]
    gaps = [b[0] - a[0] for a, b in zip(rec.calls, rec.calls[1:], strict=False)]
    assert gaps[0] >= 0.04 and gaps[2] > gaps[0] * 2.5  # 0.05, 0.1, 0.2 (+-20% jitter)
    # A failed full sync is retried as a full sync.
    assert all(full for _, full in rec.calls)
    assert runner.stats.failures == 3 and runner.stats.consecutive_failures == 0


class LeavesWork:
    """A sync that succeeds but reports something left to retry (Service ports the switch
    refused) its first ``times`` calls."""

    def __init__(self, times: int) -> None:
        self.calls: list[float] = []
        self.times = times

    async def __call__(self, full: bool) -> bool:
        self.calls.append(time.monotonic())
        self.times -= 1
        return self.times >= 0


async def test_a_sync_that_left_work_is_retried_with_backoff_without_a_request() -> None:
    rec = LeavesWork(times=3)
    results: list[bool] = []
    runner = SyncRunner(
        rec,
        min_interval=0,
        retry_initial=0.05,
        retry_max=1,
        on_result=lambda ok, _: results.append(ok),
    )
    task = await _running(runner)
    runner.request()  # the only request
    await runner.wait_idle(timeout=5)
    runner.stop()
    await task
    assert results == [True] * 4  # each a success (the agent stays healthy)...
    gaps = [b - a for a, b in zip(rec.calls, rec.calls[1:], strict=False)]
    assert gaps[0] >= 0.04 and gaps[2] > gaps[0] * 2.5  # ...retried at 0.05, 0.1, 0.2 s
    assert runner.stats.consecutive_incomplete == 0 and runner.stats.failures == 0


async def test_periodic_full_resync_happens_without_any_request() -> None:
    rec = Recorder()
    runner = SyncRunner(rec, min_interval=0, full_resync_interval=0.1)
    task = await _running(runner)
    await asyncio.sleep(0.35)
    runner.stop()
    await task
    assert len(rec.calls) >= 2 and all(full for _, full in rec.calls)


def test_bad_intervals_are_refused() -> None:
    with pytest.raises(ValueError):
        SyncRunner(Recorder(), min_interval=-1)


class SlowRecorder(Recorder):
    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    async def __call__(self, full: bool) -> None:
        await super().__call__(full)
        await asyncio.sleep(self.seconds)


async def test_the_min_interval_counts_from_the_start_of_the_last_sync() -> None:
    # A change that arrives just after a sync started waits for the next one: at most the
    # interval after that start (plus the next sync), not the interval after its end (which
    # would add a whole sync to every wait under steady churn).
    rec = SlowRecorder(0.15)
    runner = SyncRunner(rec, min_interval=0.3, full_resync_interval=3600)
    task = await _running(runner)
    runner.request()
    await asyncio.sleep(0.01)  # the first sync is running
    runner.request()
    await asyncio.sleep(0.5)
    await runner.wait_idle(timeout=2)
    runner.stop()
    await task
    assert len(rec.calls) == 2
    gap = rec.calls[1][0] - rec.calls[0][0]
    assert 0.29 <= gap < 0.3 + 0.1, gap  # counted from the end, it would be 0.45
