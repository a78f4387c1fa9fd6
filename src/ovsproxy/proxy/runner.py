"""A bounded-frequency sync runner, in the manner of kube-proxy's BoundedFrequencyRunner.

Event handlers call :meth:`SyncRunner.request`; the runner calls the sync function at most once
per ``min_interval`` (bursts of events collapse into one sync), at least once per
``full_resync_interval`` (a full sync that heals drift), and retries a failed sync with capped
exponential backoff. A sync that succeeds but reports that it left something to retry (the
sync function returns True: Service ports the switch refused, set aside so that the others go
in) is followed by another with the same backoff (its own count), without waiting for an
unrelated event: a refusal may pass (a full table, a late commit). Only one sync runs at a
time: the sync function owns the state it applies.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

# argument: full resync; returns True when the sync left something to retry
SyncFunction = Callable[[bool], Awaitable[bool | None]]


@dataclass
class RunnerStats:
    syncs: int = 0
    full_syncs: int = 0
    failures: int = 0
    consecutive_failures: int = 0
    consecutive_incomplete: int = 0  # successful syncs in a row that left something to retry
    last_success: float | None = None  # time.monotonic()
    last_failure: str | None = None
    last_duration: float = 0.0


class SyncRunner:
    def __init__(
        self,
        sync: SyncFunction,
        *,
        min_interval: float = 1.0,
        full_resync_interval: float = 3600.0,
        retry_initial: float = 0.5,
        retry_max: float = 30.0,
        on_result: Callable[[bool, float], None] | None = None,
    ) -> None:
        if min_interval < 0 or full_resync_interval <= 0:
            raise ValueError("min_interval must be >= 0 and full_resync_interval > 0")
        self._sync = sync
        self.min_interval = min_interval
        self.full_resync_interval = full_resync_interval
        self.retry_initial = retry_initial
        self.retry_max = retry_max
        self._on_result = on_result
        self._wake = asyncio.Event()
        self._requested = False
        self._full_requested = False
        self._retry_at: float | None = None
        self._last_start = -float("inf")
        self._last_full = time.monotonic()
        self._stopped = False
        self._idle = asyncio.Event()
        self._idle.set()
        self.stats = RunnerStats()
        # Unix time a sync was last asked for (kube-proxy's last_queued_timestamp; its
        # SyncLoop sets it at start too, as the informers sync); None before either.
        self.last_queued: float | None = None

    def request(self, *, full: bool = False) -> None:
        """Ask for a sync soon (call on the runner's event loop)."""
        self._requested = True
        self._full_requested |= full
        self.last_queued = time.time()
        self._wake.set()

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()

    async def wait_idle(self, timeout: float | None = None) -> None:
        """Wait until no sync is requested or running (tests and start-up use it)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._requested or self._retry_at is not None or not self._idle.is_set():
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError("sync runner did not become idle")
            await asyncio.sleep(0.01 if remaining is None else min(0.01, remaining))

    def _next_deadline(self, now: float) -> float:
        due = self._last_full + self.full_resync_interval
        if self._retry_at is not None:
            due = min(due, self._retry_at)
        if self._requested:
            due = min(due, self._last_start + self.min_interval)
        return due

    async def run(self) -> None:
        self.last_queued = time.time()
        while not self._stopped:
            now = time.monotonic()
            deadline = self._next_deadline(now)
            if deadline > now:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=deadline - now)
                except TimeoutError:
                    pass
                continue
            await self._run_once(now)

    async def _run_once(self, now: float) -> None:
        full = self._full_requested or now >= self._last_full + self.full_resync_interval
        self._requested = False
        self._full_requested = False
        self._retry_at = None
        self._last_start = now
        self._idle.clear()
        started = time.perf_counter()
        try:
            incomplete = await self._sync(full)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.stats.failures += 1
            self.stats.consecutive_failures += 1
            self.stats.last_failure = f"{type(exc).__name__}: {exc}"
            backoff = self._retry_in(self.stats.consecutive_failures)
            self._full_requested |= full  # a failed full sync is retried as a full sync
            log.error("sync failed (retry in %.1fs): %s", backoff, self.stats.last_failure)
            ok = False
        else:
            self.stats.consecutive_failures = 0
            if incomplete:
                self.stats.consecutive_incomplete += 1
                backoff = self._retry_in(self.stats.consecutive_incomplete)
                log.info("sync left something to retry: again in %.1fs", backoff)
            else:
                self.stats.consecutive_incomplete = 0
            self.stats.last_success = time.monotonic()
            if full:
                self._last_full = now
                self.stats.full_syncs += 1
            ok = True
        finally:
            self.stats.syncs += 1
            self.stats.last_duration = time.perf_counter() - started
            self._idle.set()
        if self._on_result is not None:
            self._on_result(ok, self.stats.last_duration)

    def _retry_in(self, attempt: int) -> float:
        """Schedule the retry after the ``attempt``-th failure in a row (capped exponential
        backoff, jittered so that agents do not retry in lock-step); returns its delay."""
        backoff: float = min(self.retry_max, self.retry_initial * 2.0 ** (attempt - 1))
        backoff *= random.uniform(0.8, 1.2)
        self._retry_at = time.monotonic() + backoff
        return backoff
