"""Giving freed heap memory back to the operating system after a big burst of work.

A full sync allocates and frees tens of megabytes of short-lived values (bucket and message
encodings, the commit's lists and dicts) among the long-lived ones. glibc's malloc keeps the
pages they freed (its dynamic mmap threshold moves large blocks into the heap after the
first big free, and it only trims the heap's top), so the agent's resident set stays that
much larger than what it holds. ``malloc_trim(0)`` releases every free page of the heap
(a few milliseconds over a large heap: called after big commits only). Elsewhere (another
libc, another platform) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Callable


def _load_malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim: Callable[[int], int] = libc.malloc_trim  # glibc only
    except (OSError, AttributeError):
        return None
    return trim


_MALLOC_TRIM = _load_malloc_trim()


def release_free_memory() -> bool:
    """Return the heap's free pages to the OS; False where that is not available."""
    if _MALLOC_TRIM is None:
        return False
    _MALLOC_TRIM(0)
    return True
