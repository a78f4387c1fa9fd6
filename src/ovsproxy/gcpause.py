"""The cyclic garbage collector around the agent's work: paused around bursts that create
many long-lived objects (a manifest load, a full sync), and settled after every sync, so that
no collection ever traverses the cluster's state: shared by the sources, the datapath and the
agent's sync."""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass


class _GcPause:
    """No cyclic garbage collection inside ``with gc_paused():`` (process-wide; nests,
    also across threads; the collector's previous state comes back with the last exit).

    Loading thousands of objects that all stay alive makes every full collection scan all
    of them again (a large share of a big load: bench ``load`` measures it). Parsing makes no
    reference cycles, so
    reference counting frees everything a collection would have.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._restore = False

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            if self._depth == 0:
                self._restore = gc.isenabled()
                gc.disable()
            self._depth += 1
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0 and self._restore:
                    gc.enable()


gc_paused = _GcPause()


@dataclass(frozen=True, slots=True)
class Collected:
    """One explicit collection: unreachable objects found, and how long it took."""

    objects: int
    seconds: float


def settle() -> Collected | None:
    """After a sync: collect every generation the collector still sees, then move what
    survived to the permanent generation (``gc.freeze()``). None (nothing done) while the
    collector is off, paused by a burst or by whoever runs us.

    Why: what a sync leaves behind is mostly state that lives until the Service changes
    again. Left to the collector's thresholds, every survivor is traversed again by each
    older-generation collection; after the start-up's freeze those accumulate with every
    change, so a full collection's cost grows with the churn since start-up until it is that
    of the whole cluster, in the middle of a watch event or a sync (bench ``churn`` reports
    the collections and the longest). Settled after each sync, the collector only ever sees
    what was allocated since the last sync: the pause is the size of the change, taken where
    no event is waiting on it. Freezing is constant time; reference counting still frees
    frozen objects. What it cannot free is a reference cycle that becomes garbage after its
    objects were frozen: ``compact`` finds those.
    """
    if not gc.isenabled():
        return None
    started = time.perf_counter()
    found = gc.collect()
    gc.freeze()
    return Collected(found, time.perf_counter() - started)


def compact() -> Collected | None:
    """A collection over everything, frozen objects included, then freeze again: collects
    the reference cycles that became garbage after ``settle`` or a burst froze them. Its cost
    is the whole heap's (the periodic full resync calls it). None while the collector is off."""
    if not gc.isenabled():
        return None
    started = time.perf_counter()
    gc.unfreeze()
    try:
        found = gc.collect()
    finally:
        gc.freeze()
    return Collected(found, time.perf_counter() - started)
