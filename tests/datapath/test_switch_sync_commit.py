"""The datapath's staging and commit logic against fake switches (no OVS): ordering, shared
flows, failures, staging while a commit is in flight, streaming, and the collector."""

from __future__ import annotations

import gc
import ipaddress
from collections.abc import Iterator, Sequence

import pytest

from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath import plan, switch_sync
from ovsproxy.datapath import service_flows as svc
from ovsproxy.datapath.desired import encoded_flow
from ovsproxy.datapath.fixed_flows import pipeline_flows
from ovsproxy.datapath.flow_context import Context
from ovsproxy.datapath.groups import BucketSpec, GroupSpec, InstalledGroup, plan_group
from ovsproxy.datapath.switch_sync import DatapathError, SwitchSync, flow_key
from ovsproxy.model import Endpoint, IPFamily, Protocol, ServicePort, ServicePortName
from ovsproxy.openflow import protocol as of
from ovsproxy.openflow.errors import BundleError, ChannelNotReady, OpenFlowError, RequestTimeout
from tests.fakes.registry import MemoryRegistry
from tests.fakes.switch import FakeBundle, FakeSwitch

CONFIG = pl.PipelineConfig()
CMD = of.GroupModCommand


def ctx_for(dp: SwitchSync) -> Context:
    return Context(dp.tables, dp.generation)


def service(
    dp: SwitchSync, name: str, n: int, gid: int, *, first: int = 1, vip: str = "10.96.0.10"
) -> tuple[ServicePortName, svc.ServiceObjects]:
    spn = ServicePortName("ns", name, "http", Protocol.TCP)
    port = ServicePort(spn, (ipaddress.ip_address(vip),), 80)
    base = int(ipaddress.IPv4Address("10.244.0.0"))
    eps = [Endpoint(ipaddress.IPv4Address(base + first + i), 8080) for i in range(n)]
    objs = svc.service_objects(ctx_for(dp), port, eps, {IPFamily.IPv4: gid})
    # and a flow per endpoint, shared by every owner that has the endpoint: the EndpointDNAT
    # flows an affinity Service stages (without affinity its buckets translate)
    dnat = {
        (ep.ip, ep.port): encoded_flow(
            svc.endpoint_dnat_flow(ctx_for(dp), ep.ip, ep.port, Protocol.TCP).wire
        )
        for ep in eps
    }
    return spn, svc.ServiceObjects(objs.groups, (*objs.staged, *dnat.values()))


def stage(dp: SwitchSync, name: str, n: int, gid: int, **kw: object) -> ServicePortName:
    spn, objs = service(dp, name, n, gid, **kw)  # type: ignore[arg-type]
    dp.stage(spn, objs.groups, objs.flows)
    return spn


async def adopted(switch: FakeSwitch | None = None) -> tuple[SwitchSync, FakeSwitch]:
    switch = switch or FakeSwitch()
    dp = SwitchSync(switch, CONFIG, 1)
    dp.stage(("pipeline",), (), pipeline_flows(ctx_for(dp)))
    await dp.commit()
    return dp, switch


def kinds(messages: Sequence[of.Message]) -> list[str]:
    out = []
    for m in messages:
        if isinstance(m, of.GroupMod):
            out.append(f"group_{CMD(m.command).name.lower()}")
        else:
            out.append(f"flow_{of.FlowModCommand(m.command).name.lower()}")
    return out


@pytest.fixture(autouse=True)
def _collector() -> Iterator[None]:
    """Leave the collector as we found it (commits may freeze and pause it)."""
    enabled = gc.isenabled()
    yield
    gc.unfreeze()
    if enabled:
        gc.enable()


class _Keeping(FakeSwitch):
    """Keeps exactly what the datapath hands the bundle (FakeSwitch decodes it)."""

    def __init__(self) -> None:
        super().__init__()
        self.raw: list[of.Message] = []

    def bundle(self):  # type: ignore[no-untyped-def]
        bundle = super().bundle()
        add = bundle.add

        def keep(msg: of.Message) -> int:
            self.raw.append(msg)
            return add(msg)

        bundle.add = keep  # type: ignore[method-assign]
        return bundle


async def test_flows_and_groups_are_kept_and_sent_as_their_encoding() -> None:
    """Memory: the desired and installed state hold an EndpointDNAT flow's bytes, not its
    value tree, and the bundle (which keeps every message until its commit) gets those and
    the groups as encodings only."""
    switch = _Keeping()
    dp, _ = await adopted(switch)
    spn, objs = service(dp, "a", 3, gid=1)
    dp.stage(spn, objs.groups, objs.staged)
    await dp.commit()
    sent = switch.raw[-len(switch.bundles[-1]) :]
    assert {type(m) for m in sent} == {of.EncodedGroupMod, of.EncodedFlowMod, of.FlowMod}
    assert [m.decoded().table_id for m in sent if type(m) is of.EncodedFlowMod] == [
        dp.tables.endpoint_dnat
    ] * 3
    dnat = [k for k, f in dp.desired.owners[spn].flows.items() if type(f) is bytes]
    assert len(dnat) == 3 and all(type(dp.installed.flows[k]) is bytes for k in dnat)
    # ...and read back as the values that were staged
    for flow in objs.flows:
        assert dp.installed_flows[flow_key(flow)] == flow
        assert dp.desired_flow(flow_key(flow)) == flow
    assert sorted(map(of.format_flow, dp.owner_flows(spn))) == sorted(
        map(of.format_flow, objs.flows)
    )
    assert switch.bundles[-1] == [m.decoded() if type(m) is not of.FlowMod else m for m in sent]


async def test_order_groups_then_flow_adds_then_deletes_then_group_deletes() -> None:
    dp, switch = await adopted()
    stage(dp, "a", 2, gid=1)
    await dp.commit()
    assert kinds(switch.bundles[-1]) == ["group_add", "flow_add", "flow_add", "flow_add"]
    dp.unstage(ServicePortName("ns", "a", "http", Protocol.TCP))
    stage(dp, "b", 1, gid=2, first=50, vip="10.96.0.11")
    stats = await dp.commit()
    assert kinds(switch.bundles[-1]) == [
        "group_add",
        "flow_add",
        "flow_add",
        "flow_delete_strict",
        "flow_delete_strict",
        "flow_delete_strict",
        "group_delete",
    ]
    assert stats.groups_added == 1 and stats.groups_deleted == 1
    assert stats.flows_added == 2 and stats.flows_deleted == 3
    assert stats.messages == 7 and stats.group_messages == 2 and stats.flow_messages == 5
    assert stats.kinds == {
        "group_add": 1,
        "flow_add": 2,
        "flow_delete_strict": 3,
        "group_delete": 1,
    }


async def test_streaming_in_batches_sends_what_one_batch_sends_and_nothing_when_unchanged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def commit_40(batch: int) -> tuple[SwitchSync, FakeSwitch]:
        monkeypatch.setattr(switch_sync, "_STREAM_YIELD_EVERY", batch)
        dp, switch = await adopted()
        for i in range(40):  # enough messages to cross the streaming yield point
            stage(dp, f"s{i}", 15, gid=i + 1, first=i * 15 + 1, vip=f"10.96.1.{i + 1}")
        await dp.commit()
        return dp, switch

    _, whole = await commit_40(10**9)  # one batch: never drained
    streamed_dp, streamed = await commit_40(512)
    assert whole.drains == 0 and streamed.drains >= 1
    assert whole.bundles[-1] == streamed.bundles[-1]
    assert len(streamed.bundles[-1]) == 40 + 40 + 600
    opened = streamed.opened
    for i in range(40):  # re-staging the same content is no change at all
        stage(streamed_dp, f"s{i}", 15, gid=i + 1, first=i * 15 + 1, vip=f"10.96.1.{i + 1}")
    stats = await streamed_dp.commit()
    assert stats.messages == 0 and streamed.opened == opened  # not even an empty bundle


async def test_shared_flow_stays_while_any_owner_wants_it() -> None:
    dp, switch = await adopted()
    a = stage(dp, "a", 2, gid=1)
    b = stage(dp, "b", 2, gid=2, vip="10.96.0.11")  # the same two endpoints
    stats = await dp.commit()
    assert stats.flows_added == 2 + 2  # two ServiceLB flows, two shared DNAT flows
    dp.unstage(a)
    stats = await dp.commit()
    assert kinds(switch.bundles[-1]) == ["flow_delete_strict", "group_delete"]
    dp.unstage(b)
    stats = await dp.commit()
    assert stats.flows_deleted == 3 and stats.groups_deleted == 1
    assert len(dp.installed_flows) == len(pipeline_flows(ctx_for(dp)))


async def test_a_changed_flow_under_the_same_key_is_re_added() -> None:
    dp, switch = await adopted()
    spn, objs = service(dp, "a", 1, gid=1)
    dp.stage(spn, objs.groups, objs.flows)
    await dp.commit()
    lb = objs.flows[0]
    changed = of.FlowMod(lb.table_id, lb.priority, lb.match, (), cookie=lb.cookie)  # now a drop
    dp.stage(spn, objs.groups, (changed, *objs.flows[1:]))
    stats = await dp.commit()
    assert switch.bundles[-1] == [changed] and stats.flows_added == 1
    assert dp.installed_flows[flow_key(lb)] == changed


async def test_a_group_owned_by_another_owner_is_refused_and_nothing_changes() -> None:
    dp, _ = await adopted()
    stage(dp, "a", 2, gid=1)
    spn, objs = service(dp, "b", 2, gid=1, vip="10.96.0.11")
    with pytest.raises(DatapathError, match="already owned"):
        dp.stage(spn, objs.groups, objs.flows)
    assert spn not in dp.owners()
    assert dp.desired_flow(flow_key(objs.flows[0])) is None


async def test_a_refused_bundle_keeps_the_diff_and_is_not_uncertain() -> None:
    dp, switch = await adopted()
    stage(dp, "a", 2, gid=1)
    error = BundleError(1, of.Error(1, 1), 7, [], "commit")
    switch.fail = error
    with pytest.raises(DatapathError, match="refused"):
        await dp.commit()
    assert dp.pending and 1 not in dp.installed_groups
    stats = await dp.commit()  # the same diff again: an ADD, not a MODIFY of an unknown group
    assert kinds(switch.bundles[-1])[0] == "group_add" and stats.groups_added == 1


async def test_a_timeout_at_commit_makes_the_groups_uncertain() -> None:
    dp, switch = await adopted()
    stage(dp, "a", 2, gid=1)
    switch.fail = RequestTimeout("no reply to bundle commit")
    with pytest.raises(DatapathError):
        await dp.commit()
    await dp.commit()  # the group may exist or not: ADD_OR_MOD rewrites it whole
    assert kinds(switch.bundles[-1])[0] == "group_add_or_mod"


async def test_a_switch_gone_while_an_uncertain_commit_is_adopted_is_a_datapath_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a commit of unknown outcome the next commit first reads the switch (adopting
    it); the connection lost there is the commit's failure like any other (DatapathError,
    the ChannelError its cause), not an escaped channel error (test_bundles_restart saw it
    under load), and the commit after it adopts and lands."""
    dp, switch = await adopted()
    stage(dp, "a", 2, gid=1)
    switch.fail = RequestTimeout("no reply to bundle commit")
    with pytest.raises(DatapathError):
        await dp.commit()

    async def gone(*args: object) -> object:
        raise ChannelNotReady("unix:/x/br0.mgmt: not connected")

    monkeypatch.setattr(switch, "flow_keys", gone)
    with pytest.raises(DatapathError, match="not connected") as caught:
        await dp.commit()
    assert isinstance(caught.value.__cause__, ChannelNotReady)
    monkeypatch.undo()
    await dp.commit()
    assert kinds(switch.bundles[-1])[0] == "group_add_or_mod" and 1 in dp.installed_groups


async def test_a_reconnection_after_an_uncertain_commit_replays_at_once() -> None:
    """A commit whose outcome is unknown (the switch went away at its COMMIT) leaves the
    switch to be adopted; the reconnection that follows replays then, as after any other
    commit, not at the next commit (test_bundles_restart's kill meant for the replay found
    none when its sync's commit was the uncertain one)."""
    dp, switch = await adopted()
    stage(dp, "a", 2, gid=1)
    await dp.commit()
    stage(dp, "a", 3, gid=1)
    switch.fail = RequestTimeout("no reply to bundle commit")
    with pytest.raises(DatapathError):
        await dp.commit()
    bundles = len(switch.bundles)
    await dp.on_connected()
    assert len(switch.bundles) == bundles + 1
    assert "group_add_or_mod" in kinds(switch.bundles[-1]) and not dp.pending
    # before any commit, a connection replays nothing: the first commit adopts
    fresh = SwitchSync(FakeSwitch(), CONFIG, 1)
    stage(fresh, "a", 2, gid=1)
    await fresh.on_connected()
    assert not fresh.switch.bundles  # type: ignore[attr-defined]


async def test_a_planning_error_discards_the_bundle_and_keeps_the_diff(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dp, switch = await adopted()
    stage(dp, "a", 2, gid=1)
    stage(dp, "b", 2, gid=2, first=10, vip="10.96.0.11")

    def broken(desired: object, installed: object, **kw: object) -> object:
        if getattr(desired, "group_id", None) == 2:
            raise ValueError("planning bug")
        return plan_group(desired, installed, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(plan, "plan_group", broken)
    with pytest.raises(ValueError, match="planning bug"):
        await dp.commit()
    assert switch.discarded == 1 and dp.pending and not dp.installed_groups
    monkeypatch.setattr(plan, "plan_group", plan_group)
    stats = await dp.commit()
    assert stats.groups_added == 2


async def test_staging_while_a_commit_is_in_flight_is_not_lost() -> None:
    dp, switch = await adopted()
    stage(dp, "a", 2, gid=1)
    late: list[ServicePortName] = []
    switch.during.append(lambda: late.append(stage(dp, "b", 1, gid=2, first=9, vip="10.96.0.12")))
    await dp.commit()
    switch.during.clear()
    assert late and dp.pending and 2 not in dp.installed_groups
    stats = await dp.commit()
    assert stats.groups_added == 1 and 2 in dp.installed_groups


async def test_resync_deletes_flows_we_installed_and_no_longer_want() -> None:
    dp, switch = await adopted()
    spn = stage(dp, "a", 2, gid=1)
    await dp.commit()
    dp.unstage(spn)
    switch.present_groups = {1}
    stats = await dp.resync_switch()  # e.g. after a reconnection, before the next commit
    assert stats.flows_deleted == 3 and stats.groups_deleted == 1
    assert len(dp.installed_flows) == len(pipeline_flows(ctx_for(dp)))


async def test_staging_and_committing_leave_the_collector_alone() -> None:
    """The sync around them pauses and freezes the collector (datapath.memory), not the
    datapath: not even a big commit."""
    gc.enable()
    frozen = gc.get_freeze_count()
    dp, _ = await adopted()
    stage(dp, "a", 2, gid=1)
    assert gc.isenabled()
    for n in range(3, 40):
        stage(dp, f"s{n}", n, gid=n, first=100 * n, vip=f"10.96.1.{n}")
    await dp.commit()
    assert dp.last_commit.messages > 500
    assert gc.isenabled() and gc.get_freeze_count() == frozen


def test_incremental_sizing_does_not_need_the_running_byte_count() -> None:
    ctx = Context(pl.Tables.for_config(CONFIG), 1)

    def spec(keys: list[int]) -> GroupSpec:
        buckets = []
        for k in keys:
            ip = ipaddress.ip_address(f"10.244.{k // 250}.{k % 250 + 1}")
            buckets.append(BucketSpec((ip, 80), svc.endpoint_bucket_wire(ip, 80, False, ctx)))
        return GroupSpec(3, tuple(buckets))

    first = plan_group(spec(list(range(100))), None).result
    assert first is not None and first.bucket_bytes > 0
    unknown = InstalledGroup(3, dict(first.ids), dict(first.buckets), None)  # bucket_bytes -1
    for after in (list(range(101)), list(range(1, 100)), list(range(50, 150))):
        known_plan = plan_group(spec(after), first)
        unknown_plan = plan_group(spec(after), unknown)
        assert known_plan.messages == unknown_plan.messages
        assert known_plan.result is not None and unknown_plan.result is not None
        assert known_plan.result.bucket_bytes == unknown_plan.result.bucket_bytes
        wire = sum(len(of.Bucket(0, b.actions, b.weight).wire) for b in spec(after).buckets)
        assert known_plan.result.bucket_bytes == wire


async def test_the_registry_gets_the_group_ids_each_time_they_change_and_only_then() -> None:
    registry = MemoryRegistry()
    switch = FakeSwitch()
    dp = SwitchSync(switch, CONFIG, 1, registry=registry)
    dp.stage(("pipeline",), (), pipeline_flows(ctx_for(dp)))
    await dp.commit()
    assert registry.saves == [set()]
    a = stage(dp, "a", 2, gid=1)
    await dp.commit()
    stage(dp, "a", 3, gid=1)  # buckets only: the same ids
    await dp.commit()
    assert registry.saves == [set(), {1}]
    stage(dp, "b", 2, gid=2, first=10, vip="10.96.0.11")
    await dp.commit()
    dp.unstage(a)
    await dp.commit()
    assert registry.saves == [set(), {1}, {1, 2}, {2}]
    # An uncertain commit forgets group 2's content; the retry that lands has the same ids.
    stage(dp, "b", 3, gid=2, first=10, vip="10.96.0.11")
    switch.fail = RequestTimeout("no reply to bundle commit")
    with pytest.raises(DatapathError):
        await dp.commit()
    await dp.commit()
    assert registry.saves[-1] == {2} and 2 in dp.installed_groups
    # A group that came back under an uncertain commit and then went is saved as gone.
    stage(dp, "c", 1, gid=3, first=20, vip="10.96.0.12")
    await dp.commit()
    assert registry.saves[-1] == {2, 3}
    await dp.resync_switch()
    assert registry.saves[-1] == {2, 3}


# -- the adopting commit streamed while staging ----------------------------------------------


def _fresh(*, stream: bool, switch: FakeSwitch | None = None) -> tuple[SwitchSync, FakeSwitch]:
    switch = switch or FakeSwitch()
    dp = SwitchSync(switch, CONFIG, 1, stream_while_staging=stream)
    dp.stage(("pipeline",), (), pipeline_flows(ctx_for(dp)))
    return dp, switch


def _cluster(dp: SwitchSync, n: int) -> list[ServicePortName]:
    # endpoints overlap between neighbours: shared EndpointDNAT flows
    return [
        stage(dp, f"s{i}", 3, gid=i + 1, first=2 * i + 1, vip=f"10.96.2.{i + 1}") for i in range(n)
    ]


def _state(dp: SwitchSync) -> tuple[object, ...]:
    return (
        sorted(map(of.format_flow, dp.installed_flows.values())),
        {gid: (g.ids, g.buckets, g.selection_method) for gid, g in dp.installed_groups.items()},
    )


def _texts(messages: Sequence[of.Message]) -> list[str]:
    return sorted(of.to_text(m) for m in messages)


@pytest.fixture
def stream_early(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stream from the first staged owner on, one owner at a time."""
    monkeypatch.setattr(switch_sync, "STREAM_WHILE_STAGING_AFTER", 1)
    monkeypatch.setattr(switch_sync, "_STREAM_OWNERS_EVERY", 1)


async def test_the_first_commit_is_written_while_staging_and_sends_what_it_would_have(
    stream_early: None,
) -> None:
    streamed, streamed_switch = _fresh(stream=True)
    _cluster(streamed, 6)
    assert streamed._streaming is not None
    written = streamed._streaming.bundle.messages  # type: ignore[attr-defined]
    # the pipeline, then per Service its group, ServiceLB flow and the DNAT flows not
    # written yet (neighbours share one endpoint)
    assert len(written) == len(pipeline_flows(ctx_for(streamed))) + 6 * 2 + (6 * 3 - 5)
    assert not streamed_switch.bundles  # nothing committed yet
    stats = await streamed.commit()
    plain, plain_switch = _fresh(stream=False)
    _cluster(plain, 6)
    plain_stats = await plain.commit()
    assert streamed_switch.opened == plain_switch.opened == 1
    assert _texts(streamed_switch.bundles[-1]) == _texts(plain_switch.bundles[-1])
    assert _state(streamed) == _state(plain)
    assert (stats.messages, stats.kinds, stats.groups_added, stats.flows_added) == (
        plain_stats.messages,
        plain_stats.kinds,
        plain_stats.groups_added,
        plain_stats.flows_added,
    )
    # every group before the flows that send to it
    sent = streamed_switch.bundles[-1]
    first_use = {}
    for at, msg in enumerate(sent):
        if isinstance(msg, of.FlowMod):
            for gid in plan.groups_used(msg) or ():
                first_use.setdefault(gid, at)
    added = {m.group_id: at for at, m in enumerate(sent) if isinstance(m, of.GroupMod)}
    assert first_use and all(added[gid] < at for gid, at in first_use.items())


async def test_staged_again_or_unstaged_after_being_written_is_planned_again(
    stream_early: None,
) -> None:
    results = []
    for stream in (True, False):
        dp, switch = _fresh(stream=stream)
        names = _cluster(dp, 5)
        stage(dp, "s1", 2, gid=2, first=40, vip="10.96.2.2")  # other endpoints
        dp.unstage(names[3])  # group 4 and its flows: written, then given up
        stage(dp, "late", 1, gid=4, first=70, vip="10.96.2.90")  # its group id, reused
        stats = await dp.commit()
        results.append((dp, switch, stats))
    (streamed, switch, stats), (plain, _, plain_stats) = results
    assert _state(streamed) == _state(plain)
    assert streamed._streaming is None and not streamed.pending
    # what was written and is no longer wanted is taken back in the same bundle
    kinds_sent = kinds(switch.bundles[-1])
    assert "flow_delete_strict" in kinds_sent and stats.messages > plain_stats.messages
    # ...after every add: the deletes come last
    first_delete = kinds_sent.index("flow_delete_strict")
    assert all(k.startswith(("flow_delete", "group_delete")) for k in kinds_sent[first_delete:])


async def test_a_socket_that_does_not_keep_up_leaves_the_rest_to_the_commit(
    stream_early: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(FakeBundle, "backlog", switch_sync.STREAM_WHILE_STAGING_BACKLOG + 1)
    dp, switch = _fresh(stream=True)
    _cluster(dp, 4)
    assert dp._streaming is not None and not dp._streaming.written.flows  # nothing written
    await dp.commit()
    plain, _ = _fresh(stream=False)
    _cluster(plain, 4)
    await plain.commit()
    assert switch.opened == 1 and _state(dp) == _state(plain)


@pytest.mark.parametrize("staged_after", [True, False])
async def test_a_streamed_bundle_lost_before_the_commit_is_discarded_and_all_sent_again(
    stream_early: None, staged_after: bool
) -> None:
    dp, switch = _fresh(stream=True)
    _cluster(dp, 3)
    assert dp._streaming is not None
    dp._streaming.bundle.state = "lost"  # type: ignore[misc]  # its connection went
    plain, _ = _fresh(stream=False)
    _cluster(plain, 3)
    if staged_after:  # the next owner finds it lost (else: the commit does)
        stage(dp, "s9", 2, gid=9, first=90, vip="10.96.2.99")
        stage(plain, "s9", 2, gid=9, first=90, vip="10.96.2.99")
    stats = await dp.commit()
    plain_stats = await plain.commit()
    assert switch.opened == 2 and switch.discarded == 1
    assert _state(dp) == _state(plain) and stats.messages == plain_stats.messages


async def test_a_refused_streamed_bundle_names_the_owner_and_keeps_everything_dirty(
    stream_early: None,
) -> None:
    dp, switch = _fresh(stream=True)
    names = _cluster(dp, 3)
    assert dp._streaming is not None
    written = dp._streaming.bundle.messages  # type: ignore[attr-defined]
    culprit = next(m for m in written if isinstance(m, of.GroupMod) and m.group_id == 2)
    failure = OpenFlowError(of.Error(6, 0), 9, of.to_text(culprit), of.EncodedGroupMod.of(culprit))
    switch.fail = BundleError(1, failure.error, 9, [failure], "add")
    with pytest.raises(DatapathError) as caught:
        await dp.commit()
    assert caught.value.owners == [names[1]]
    assert dp.pending and not dp.installed_groups
    await dp.commit()  # the same diff again, now without streaming: all of it
    plain, _ = _fresh(stream=False)
    _cluster(plain, 3)
    await plain.commit()
    assert _state(dp) == _state(plain)


async def test_a_commit_never_asks_a_bundle_its_length() -> None:
    """A bundle's truth is its length (the number of messages it keeps): asking it once per
    run of messages made a full sync quadratic (``Channel``'s bundles count their runs)."""
    asked: list[int] = []

    class Counting(FakeBundle):
        def __len__(self) -> int:
            asked.append(1)
            return len(self.messages)

    class Switch(FakeSwitch):
        def bundle(self) -> FakeBundle:
            self.opened += 1
            return Counting(self)

    for stream in (False, True):
        dp, switch = _fresh(stream=stream, switch=Switch())
        _cluster(dp, 4)
        await dp.commit()
        assert switch.bundles and not asked
