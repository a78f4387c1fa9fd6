"""``our_group_ids``: which group ids are ours, and their record in the registry (saved only
when it changed; read back for adoption and cleanup). ``test_remove_all.py`` and
``tests/sandbox/test_ovsdb_registry.py`` cover the synchroniser's use and the OVSDB registry."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath.desired import DesiredState
from ovsproxy.datapath.groups import InstalledGroup
from ovsproxy.datapath.our_group_ids import STATS_SAFE_BUCKETS, OurGroupIds
from ovsproxy.datapath.plan import InstalledState
from tests.fakes.registry import MemoryRegistry

CONFIG = pl.PipelineConfig(group_id_min=10, group_id_max=20)


class Desired(DesiredState):
    def __init__(self, largest: int = 0) -> None:
        super().__init__()
        self.largest = largest

    def largest_group(self) -> int:
        return self.largest


def installed(*gids: int, unknown: set[int] | None = None) -> InstalledState:
    state = InstalledState()
    state.groups.update({gid: InstalledGroup(gid) for gid in gids})
    state.unknown_groups |= unknown or set()
    return state


class Listing:
    def __init__(self, ids: set[int]) -> None:
        self.ids = ids
        self.calls = 0

    async def __call__(self) -> set[int]:
        self.calls += 1
        return set(self.ids)


@given(st.integers(0, 40))
def test_ours_is_the_configured_range(gid: int) -> None:
    assert OurGroupIds(CONFIG, None).ours(gid) == (10 <= gid <= 20)


async def test_the_installed_ids_are_saved_when_changed_and_only_then() -> None:
    registry = MemoryRegistry(None)
    ids = OurGroupIds(CONFIG, registry)
    state = installed(11, 12)
    await ids.record(state)
    assert registry.saves == [{11, 12}]
    assert not state.group_ids_changed
    await ids.record(state)  # not changed since
    state.group_ids_changed = True  # may have changed, has not
    await ids.record(state)
    assert registry.saves == [{11, 12}]
    assert not state.group_ids_changed
    state.groups[13] = InstalledGroup(13)
    state.group_ids_changed = True
    await ids.record(state)
    assert registry.saves == [{11, 12}, {11, 12, 13}]


async def test_without_a_registry_nothing_is_recorded() -> None:
    ids = OurGroupIds(CONFIG, None)
    state = installed(11)
    await ids.record(state)
    assert state.group_ids_changed  # (no registry: the flag is nobody's business)
    assert await ids.recorded() is None
    assert await ids.in_switch(state, Desired(), Listing({11, 15, 30})) == {11, 15}


async def test_the_switch_may_hold_the_recorded_ids_and_the_believed_ones_of_ours() -> None:
    listing = Listing({16})
    ids = OurGroupIds(CONFIG, MemoryRegistry({12, 13, 99}))
    assert await ids.in_switch(installed(11, unknown={14, 5}), Desired(), listing) == {
        11,
        12,
        13,
        14,
    }
    assert listing.calls == 0  # a record: the switch is not listed


async def test_with_no_record_the_switch_is_listed_unless_a_group_is_too_large(
    caplog: pytest.LogCaptureFixture,
) -> None:
    listing = Listing({16, 30})
    ids = OurGroupIds(CONFIG, MemoryRegistry(None))
    assert await ids.in_switch(installed(11), Desired(STATS_SAFE_BUCKETS), listing) == {11, 16}
    with caplog.at_level(logging.WARNING):
        too_large = Desired(STATS_SAFE_BUCKETS + 1)
        assert await ids.in_switch(installed(11, unknown={12}), too_large, listing) == {11, 12}
    assert listing.calls == 1
    assert "would overflow" in caplog.text


async def test_forgetting_records_no_ids_once() -> None:
    registry = MemoryRegistry({11})
    ids = OurGroupIds(CONFIG, registry)
    await ids.forget(await ids.recorded())
    assert registry.saves == [set()]
    await ids.forget(await ids.recorded())  # an empty record is not written again
    assert registry.saves == [set()]
    state = installed()
    state.group_ids_changed = True
    await ids.record(state)  # nothing installed, nothing recorded: already saved
    assert registry.saves == [set()]
