"""The endpoint value caches stay bounded, keep the newest entries, and evict in constant
time per insert (one oldest entry per insert turned a 50,000-Service cold start quadratic)."""

from __future__ import annotations

import time

from ovsproxy.datapath import services as svc


def test_bounded_cache_keeps_the_newest_entries(monkeypatch) -> None:
    monkeypatch.setattr(svc, "ENDPOINT_CACHE_SIZE", 64)
    cache: dict[int, int] = {}
    for i in range(1_000):
        svc._bounded_put(cache, i, i)
        assert len(cache) <= 64
    assert 999 in cache and 0 not in cache
    assert list(cache) == sorted(cache)  # oldest first, as inserted


def test_eviction_is_not_quadratic(monkeypatch) -> None:
    # One oldest entry evicted per insert: ~7 s for this on the machine that found it.
    monkeypatch.setattr(svc, "ENDPOINT_CACHE_SIZE", 20_000)
    cache: dict[int, int] = {}
    started = time.process_time()
    for i in range(200_000):
        svc._bounded_put(cache, i, i)
    assert time.process_time() - started < 2.0
    assert len(cache) <= 20_000
