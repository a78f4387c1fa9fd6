"""``drift``: the switch against what the synchroniser committed. The comparisons are pure;
``DriftCheck`` against a switch that answers from values. (``test_switch_sync_live.py`` checks
it against a real ovs-vswitchd edited by hand.)"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath.drift import DriftCheck, group_counts_differ, group_differs
from ovsproxy.datapath.groups import BucketSpec, InstalledGroup, SelectionMethod, bucket_spec
from ovsproxy.datapath.plan import InstalledState
from ovsproxy.datapath.service_flows import GROUP_SELECTION_METHOD
from ovsproxy.openflow import protocol as of

ADD = of.GroupModCommand.ADD


def installed_group(
    gid: int, buckets: list[BucketSpec], method: SelectionMethod | None
) -> InstalledGroup:
    return InstalledGroup(
        gid,
        ids={b.key: n for n, b in enumerate(buckets)},
        buckets={b.key: b for b in buckets},
        selection_method=method,
    )


def described(gid: int, buckets: list[of.Bucket], method: SelectionMethod | None) -> of.GroupMod:
    if method is None:
        return of.GroupMod(ADD, gid, buckets=buckets)
    return of.GroupMod(
        ADD, gid, buckets=buckets, selection_method=method.name, fields=method.fields
    )


def specs(n: int) -> list[BucketSpec]:
    return [bucket_spec(k, [of.Output(k + 1)], weight=100) for k in range(n)]


def as_switch_has(buckets: list[BucketSpec]) -> list[of.Bucket]:
    return [of.Bucket(n, b.actions, b.weight) for n, b in enumerate(buckets)]


counts_by_gid = st.dictionaries(st.integers(1, 50), st.integers(0, 6), max_size=6)


@given(counts_by_gid)
def test_counts_as_installed_do_not_differ(counts: dict[int, int]) -> None:
    installed = {gid: installed_group(gid, specs(n), None) for gid, n in counts.items()}
    assert not group_counts_differ(counts, installed)


@given(counts_by_gid, st.data())
def test_another_count_or_another_id_differs(counts: dict[int, int], data: st.DataObject) -> None:
    installed = {gid: installed_group(gid, specs(n), None) for gid, n in counts.items()}
    changed = dict(counts)
    if changed and data.draw(st.booleans()):
        gid = data.draw(st.sampled_from(sorted(changed)))
        changed[gid] += data.draw(st.integers(1, 3))
    else:
        changed[data.draw(st.integers(51, 60))] = 0  # a group of ours we did not install
    assert group_counts_differ(changed, installed)


@given(counts_by_gid.filter(bool), st.data())
def test_a_group_gone_differs(counts: dict[int, int], data: st.DataObject) -> None:
    installed = {gid: installed_group(gid, specs(n), None) for gid, n in counts.items()}
    gone = data.draw(st.sampled_from(sorted(counts)))
    assert group_counts_differ({k: n for k, n in counts.items() if k != gone}, installed)


def test_a_group_as_installed_does_not_differ() -> None:
    buckets = specs(3)
    for method in (GROUP_SELECTION_METHOD, None):
        have = installed_group(7, buckets, method)
        assert not group_differs(described(7, as_switch_has(buckets), method), have)
        # the switch's order of buckets does not matter, their ids do
        assert not group_differs(described(7, as_switch_has(buckets)[::-1], method), have)


def test_another_bucket_weight_id_or_method_differs() -> None:
    buckets = specs(3)
    have = installed_group(7, buckets, GROUP_SELECTION_METHOD)
    on_switch = as_switch_has(buckets)
    reweighted = [*on_switch[:2], of.Bucket(2, on_switch[2].actions, 50)]
    renumbered = [*on_switch[:2], of.Bucket(9, on_switch[2].actions, 100)]
    rewritten = [*on_switch[:2], of.Bucket(2, [of.Output(99)], 100)]
    for buckets_there in (reweighted, renumbered, rewritten, on_switch[:2]):
        assert group_differs(described(7, buckets_there, GROUP_SELECTION_METHOD), have)
    assert group_differs(described(7, on_switch, SelectionMethod("dp_hash")), have)
    assert group_differs(described(7, on_switch, None), have)


class Switch:
    """Answers the drift check from values; without ``groups`` it cannot read groups."""

    def __init__(self, flows: int, groups: list[of.GroupMod] | None = None) -> None:
        self.flows = flows
        self.asked: list[tuple[int, int]] = []
        if groups is not None:
            self.groups = groups

            async def group_stats() -> list[of.GroupStats]:
                return [
                    of.GroupStats(g.group_id, bucket_stats=((0, 0),) * len(g.buckets))
                    for g in self.groups
                ]

            async def dump_groups(max_buckets: int) -> list[of.GroupMod]:
                return list(self.groups)

            self.group_stats = group_stats
            self.dump_groups = dump_groups

    async def flow_cookies(self, cookie: int, mask: int) -> list[int]:
        self.asked.append((cookie, mask))
        return [cookie] * self.flows


def state(flows: int, groups: dict[int, InstalledGroup]) -> InstalledState:
    installed = InstalledState()
    installed.flows = {bytes([n]): b"" for n in range(flows)}
    installed.groups.update(groups)
    return installed


def ours(gid: int) -> bool:
    return gid < 100


async def test_the_flows_of_this_generation_are_counted() -> None:
    switch = Switch(flows=2)
    check = DriftCheck(switch, state(2, {}), 5, ours)
    assert not await check.drifted()
    app_generation = (pl.COOKIE_APP << pl.COOKIE_APP_SHIFT) | (5 << pl.COOKIE_GENERATION_SHIFT)
    assert switch.asked == [(app_generation, pl.COOKIE_APP_GENERATION_MASK)]
    switch.flows = 1
    assert await check.drifted()


async def test_groups_are_read_where_the_switch_offers_it() -> None:
    buckets = specs(2)
    installed = state(0, {7: installed_group(7, buckets, GROUP_SELECTION_METHOD)})
    there = described(7, as_switch_has(buckets), GROUP_SELECTION_METHOD)
    assert not await DriftCheck(Switch(0, [there]), installed, 5, ours).drifted()
    # not ours: left out of the comparison
    foreign = described(200, as_switch_has(buckets), None)
    assert not await DriftCheck(Switch(0, [there, foreign]), installed, 5, ours).drifted()
    changed = described(7, as_switch_has(buckets)[:1], GROUP_SELECTION_METHOD)
    assert await DriftCheck(Switch(0, [changed]), installed, 5, ours).drifted()
    # a switch that cannot read groups, or groups of unknown content: only flows count
    assert not await DriftCheck(Switch(0), installed, 5, ours).drifted()
    installed.unknown_groups.add(7)
    assert not await DriftCheck(Switch(0, [changed]), installed, 5, ours).drifted()


async def test_what_is_committed_after_the_check_is_made_is_what_it_reads() -> None:
    installed = state(0, {})
    switch = Switch(flows=1)
    check = DriftCheck(switch, installed, 5, ours)
    assert await check.drifted()
    installed.flows[b"\0"] = b""
    assert not await check.drifted()
