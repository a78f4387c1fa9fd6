"""``SwitchSync.remove_all`` (``ovsproxy cleanup``, ``--cleanup``) against a switch that records
what it gets: which flows and groups are ours, what is reported as found, the registry.
``tests/e2e/test_cleanup.py`` runs it against a real ovs-vswitchd."""

from __future__ import annotations

from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath.switch_sync import Removal, SwitchSync
from ovsproxy.openflow import protocol as of
from tests.fakes.registry import MemoryRegistry
from tests.fakes.switch import FakeSwitch

APP = pl.COOKIE_APP << pl.COOKIE_APP_SHIFT
CONFIG = pl.PipelineConfig(group_id_min=1, group_id_max=100)


def deleted(switch: FakeSwitch) -> tuple[list[of.FlowMod], list[int]]:
    (bundle,) = switch.bundles
    flows = [m for m in bundle if isinstance(m, of.FlowMod)]
    groups = [m.group_id for m in bundle if isinstance(m, of.GroupMod)]
    assert all(m.command == of.GroupModCommand.DELETE for m in bundle if isinstance(m, of.GroupMod))
    return flows, groups


async def test_every_flow_of_ours_and_our_recorded_and_listed_groups_go() -> None:
    switch = FakeSwitch()
    switch.cookies = [APP | 1 << 32, pl.learned_cookie(30)]
    switch.present_groups = {2, 3, 500}  # 500: outside our range (another controller's)
    registry = MemoryRegistry({1, 2})  # 1: recorded, no longer on the switch
    removal = await SwitchSync(switch, CONFIG, 7, registry=registry).remove_all()
    assert removal == Removal(flows=2, groups=(2, 3))  # what the switch held
    flows, groups = deleted(switch)
    # One delete by our app bits: every generation, learned flows (generation 0) too.
    assert [(f.cookie, f.cookie_mask, f.command) for f in flows] == [
        (APP, pl.COOKIE_APP_MASK, of.FlowModCommand.DELETE)
    ]
    assert groups == [1, 2, 3]
    assert registry.saves == [set()]


async def test_groups_that_cannot_be_listed_are_removed_by_the_registry() -> None:
    class Unlistable(FakeSwitch):
        async def group_ids(self) -> set[int]:
            raise RuntimeError("group statistics overflow")

    switch = Unlistable()
    removal = await SwitchSync(switch, CONFIG, 7, registry=MemoryRegistry({4, 5})).remove_all()
    assert removal == Removal(flows=0, groups=(4, 5))
    assert deleted(switch)[1] == [4, 5]


async def test_nothing_there_sends_nothing() -> None:
    switch = FakeSwitch()
    registry = MemoryRegistry(None)
    assert await SwitchSync(switch, CONFIG, 7, registry=registry).remove_all() == Removal(0, ())
    assert switch.opened == 0 and registry.saves == []
