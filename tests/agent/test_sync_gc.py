"""The garbage collector after the agent's syncs (``gcpause.settle`` / ``compact`` through the
``Syncer``): under churn, what the collector still traverses stays the size of one change, not
of all the changes since start-up; a periodic full resync collects cycles frozen earlier.

The switch is the fake one: what is measured is the agent's heap, not OVS (bench ``churn``
measures the same through a real OVS and the fake API's watch)."""

from __future__ import annotations

import gc
import ipaddress
import weakref
from collections.abc import Iterator

import pytest

from ovsproxy import gcpause
from ovsproxy.agent.core import NodeFacts, Semantics, build_core
from ovsproxy.agent.sync import COMPACT_EVERY, Syncer
from ovsproxy.agent.wiring import Components
from ovsproxy.config import AgentConfig
from ovsproxy.metrics import HealthState, Metrics
from ovsproxy.model import (
    Endpoint,
    EndpointSlice,
    Protocol,
    Service,
    ServicePort,
    ServicePortName,
    SlicePort,
)
from ovsproxy.model.handler import SYNC_ENDPOINT_SLICES, SYNC_SERVICES
from tests.fakes.switch import FakeSwitch

SERVICES = 300
ENDPOINTS = 10
CHANGES = 400


class _Cycle:
    """Two of these referring to each other: garbage only the cyclic collector frees."""

    other: _Cycle | None = None


@pytest.fixture
def clean_heap() -> Iterator[None]:
    """Start from a settled heap (pytest's own objects out of sight) and give back an
    unfrozen one: this process's collector is as the other tests expect it afterwards."""
    assert gc.isenabled()
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.collect()


def _seen_by_collector() -> int:
    return sum(len(gc.get_objects(generation)) for generation in range(3))


def _slice(i: int, first_pod: int) -> EndpointSlice:
    endpoints = tuple(
        Endpoint(ipaddress.ip_address(f"10.{i // 250}.{i % 250}.{(first_pod + j) % 250 + 1}"), 8080)
        for j in range(ENDPOINTS)
    )
    return EndpointSlice(
        "ns", f"svc-{i}-abc", f"svc-{i}", (SlicePort("http", Protocol.TCP, endpoints),)
    )


def _agent_parts() -> tuple[Components, Syncer]:
    parts = Components(AgentConfig(node_name="n"))
    parts.tracker.on_synced(SYNC_SERVICES)
    parts.tracker.on_synced(SYNC_ENDPOINT_SLICES)
    switch = FakeSwitch(keep=False)
    parts.take_core(
        build_core(
            parts.config, switch, NodeFacts(), semantics=Semantics.NONE, tracker=parts.tracker
        )
    )
    for i in range(SERVICES):
        name = ServicePortName("ns", f"svc-{i}", "http")
        ip = ipaddress.ip_address(f"172.16.{i // 250}.{i % 250 + 1}")
        parts.tracker.on_service_add(Service("ns", f"svc-{i}", (ServicePort(name, (ip,), 80),)))
        parts.tracker.on_endpoint_slice_add(_slice(i, 0))
    return parts, Syncer(parts, Metrics(), HealthState())


async def _churn(parts: Components, syncer: Syncer) -> list[int]:
    """One endpoint change per sync, spread over the Services; what the collector sees after
    each sync."""
    seen = []
    for change in range(CHANGES):
        i = change * 7 % SERVICES
        parts.tracker.on_endpoint_slice_update(_slice(i, change + 1))
        await syncer(False)
        seen.append(_seen_by_collector())
    return seen


async def test_under_churn_the_collector_sees_one_change_not_all_changes_since_start(
    clean_heap: None,
) -> None:
    parts, syncer = _agent_parts()
    await syncer(True)
    assert syncer.ready.is_set()
    seen = await _churn(parts, syncer)
    # Each change replaces a Service's state (its slice, endpoints, buckets, group, flows):
    # left to the thresholds, those survivors pile up in the older generations, and every
    # full collection traverses them all again.
    assert max(seen) < 200, seen[-10:]
    # ... and the collector did see them when nothing settles (the same churn, unsettled).
    syncer.settle_gc = False
    unsettled = await _churn(parts, syncer)
    assert max(unsettled) > 10 * CHANGES, max(unsettled)


async def test_a_periodic_full_resync_frees_cycles_that_became_garbage_after_a_freeze(
    clean_heap: None,
) -> None:
    _parts, syncer = _agent_parts()
    await syncer(True)  # the first sync settles (it does not compact)
    assert syncer.gc_compactions == 0
    a, b = _Cycle(), _Cycle()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    await syncer(False)  # the cycle is alive: frozen with the rest
    del a, b
    await syncer(False)  # garbage now, but frozen: a settle does not see it
    assert gone() is not None
    await syncer(True)  # a periodic full resync, too soon after start-up to compact
    assert gone() is not None and syncer.gc_compactions == 0
    syncer._compacted_at -= COMPACT_EVERY
    await syncer(True)  # the first periodic full resync an interval later
    assert gone() is None
    assert syncer.gc_compactions == 1
    assert syncer.last_gc is not None and syncer.last_gc.objects >= 2


def test_settle_frees_young_cycles_freezes_survivors_and_waits_for_a_pause(
    clean_heap: None,
) -> None:
    a, b = _Cycle(), _Cycle()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    kept = [_Cycle() for _ in range(100)]
    frozen = gc.get_freeze_count()
    settled = gcpause.settle()
    assert settled is not None and settled.objects >= 2 and gone() is None
    assert gc.get_freeze_count() >= frozen + len(kept)
    assert _seen_by_collector() < 100
    with gcpause.gc_paused():  # a burst (a manifest load in its thread) owns the collector
        assert gcpause.settle() is None
        assert gcpause.compact() is None
    assert gc.isenabled()


async def test_the_proxiers_sync_runs_with_the_collector_paused(clean_heap: None) -> None:
    """The sync is where the memory policy is (agent.sync): the collector is off while the
    proxier stages and commits, back on (and settled) once it is done."""
    parts, syncer = _agent_parts()
    assert parts.proxier is not None
    seen: list[bool] = []
    sync = parts.proxier.sync

    async def observed(full: bool = False) -> object:
        seen.append(gc.isenabled())
        result = await sync(full)
        seen.append(gc.isenabled())
        return result

    parts.proxier.sync = observed  # type: ignore[method-assign]
    await syncer(True)
    assert seen == [False, False]
    assert gc.isenabled() and syncer.last_gc is not None  # settled after it
