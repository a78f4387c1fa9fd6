"""Pausing the cyclic garbage collector around bursts that create many long-lived objects
(a manifest load, a full sync): shared by the sources and the datapath."""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator


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
