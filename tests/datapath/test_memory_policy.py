"""The memory policy around a sync (``datapath.memory.memory_policy``): the collector paused
inside; after a big sync (and only then), what is alive frozen and the heap's free pages given
back once the commit's own values are garbage; nothing of it after a failed sync."""

from __future__ import annotations

import gc
import ipaddress
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from ovsproxy.datapath import memory, switch_sync
from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath import service_flows as svc
from ovsproxy.datapath.fixed_flows import pipeline_flows
from ovsproxy.datapath.flow_context import Context
from ovsproxy.datapath.memory import memory_policy
from ovsproxy.datapath.switch_sync import SwitchSync
from ovsproxy.model import Endpoint, IPFamily, Protocol, ServicePort, ServicePortName
from tests.fakes.switch import FakeSwitch


def stage(
    dp: SwitchSync, name: str, n: int, gid: int, *, first: int = 1, vip: str = "10.96.0.10"
) -> None:
    spn = ServicePortName("ns", name, "http", Protocol.TCP)
    port = ServicePort(spn, (ipaddress.ip_address(vip),), 80)
    base = int(ipaddress.IPv4Address("10.244.0.0"))
    eps = [Endpoint(ipaddress.IPv4Address(base + first + i), 8080) for i in range(n)]
    ctx = Context(dp.tables, dp.generation)
    objs = svc.service_objects(ctx, port, eps, {IPFamily.IPv4: gid})
    dp.stage(spn, objs.groups, objs.staged)


@pytest.fixture(autouse=True)
def _collector() -> Iterator[None]:
    """Leave the collector as we found it (a big sync freezes what is alive)."""
    enabled = gc.isenabled()
    yield
    gc.unfreeze()
    if enabled:
        gc.enable()


@pytest.fixture
def released(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Each release of the heap's free pages, as the number of commit diffs still alive then."""
    diffs: weakref.WeakSet[switch_sync.Diff] = weakref.WeakSet()
    calls: list[int] = []

    class Tracked(switch_sync.Diff):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            diffs.add(self)

    def release() -> bool:
        calls.append(len(diffs))
        return True

    monkeypatch.setattr(switch_sync, "Diff", Tracked)
    monkeypatch.setattr(memory, "release_free_memory", release)
    return calls


async def adopted(*, freeze_gc: bool = True) -> SwitchSync:
    dp = SwitchSync(FakeSwitch(), pl.PipelineConfig(), 1, freeze_gc=freeze_gc)
    dp.stage(("pipeline",), (), pipeline_flows(Context(dp.tables, dp.generation)))
    await dp.commit()
    return dp


async def test_a_small_sync_only_pauses_the_collector(released: list[int]) -> None:
    gc.enable()
    dp = await adopted()
    frozen = gc.get_freeze_count()
    with memory_policy(dp):
        assert not gc.isenabled()
        stage(dp, "a", 3, gid=1)
        await dp.commit()
    assert gc.isenabled() and gc.get_freeze_count() == frozen and released == []


async def test_a_big_sync_freezes_then_gives_memory_back_after_its_diff_is_gone(
    released: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    gc.enable()
    dp = await adopted()
    monkeypatch.setattr(memory, "BIG_COMMIT", 2)
    stage(dp, "a", 2, gid=1)
    with memory_policy(dp):
        await dp.commit()  # the group and its ServiceLB flow (the buckets DNAT): not more than 2
    assert released == []
    gc.unfreeze()
    with memory_policy(dp):
        stage(dp, "a", 4, gid=1)
        stage(dp, "b", 2, gid=2, first=20, vip="10.96.0.11")
        await dp.commit()
        assert gc.get_freeze_count() == 0  # not before the sync is done
    assert gc.isenabled() and gc.get_freeze_count() > 0
    assert released == [0]  # once, with the commit's diff garbage by then


async def test_without_freeze_gc_a_big_sync_only_gives_memory_back(
    released: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    gc.enable()
    dp = await adopted(freeze_gc=False)
    monkeypatch.setattr(memory, "BIG_COMMIT", 0)
    with memory_policy(dp):
        stage(dp, "a", 2, gid=1)
        await dp.commit()
    assert gc.get_freeze_count() == 0 and released == [0]


async def test_a_failed_sync_freezes_nothing_and_resumes_the_collector(
    released: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    gc.enable()
    dp = await adopted()
    monkeypatch.setattr(memory, "BIG_COMMIT", 0)
    with pytest.raises(RuntimeError, match="mid-sync"), memory_policy(dp):
        stage(dp, "a", 2, gid=1)
        await dp.commit()
        raise RuntimeError("mid-sync")
    assert gc.isenabled() and gc.get_freeze_count() == 0 and released == []


def test_release_free_memory_works_here() -> None:
    from ovsproxy.heap import release_free_memory

    assert release_free_memory()  # glibc (Linux): malloc_trim
