"""The datapath's two pure parts, without a switch: the desired state (``desired``: owners,
shared flows, dirty sets) and the planner (``plan``: a diff as one ordered message stream,
and the owners written while staging folded into the commit's diff)."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

import pytest

from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath import plan
from ovsproxy.datapath import service_flows as svc
from ovsproxy.datapath.desired import (
    DatapathError,
    DesiredState,
    EncodedFlow,
    encoded_flow,
    flow_key,
)
from ovsproxy.datapath.flow_context import Context
from ovsproxy.model import Endpoint, IPFamily, Protocol, ServicePort, ServicePortName
from ovsproxy.openflow import protocol as of

CTX = Context(pl.Tables.for_config(pl.PipelineConfig()), 1)


def objects(
    name: str, n: int, gid: int, *, first: int = 1, vip: str = "10.96.0.10"
) -> tuple[ServicePortName, svc.ServiceObjects]:
    spn = ServicePortName("ns", name, "http", Protocol.TCP)
    port = ServicePort(spn, (ipaddress.ip_address(vip),), 80)
    base = int(ipaddress.IPv4Address("10.244.0.0"))
    eps = [Endpoint(ipaddress.IPv4Address(base + first + i), 8080) for i in range(n)]
    return spn, with_endpoint_flows(
        CTX, svc.service_objects(CTX, port, eps, {IPFamily.IPv4: gid}), eps
    )


def with_endpoint_flows(
    ctx: Context, objs: svc.ServiceObjects, eps: Sequence[Endpoint]
) -> svc.ServiceObjects:
    """``objs`` and a flow per endpoint, shared by every owner that has the endpoint: the
    EndpointDNAT flows an affinity Service stages (without affinity its buckets translate),
    staged as encodings, as the proxier stages them."""
    flows = {
        (ep.ip, ep.port): encoded_flow(
            svc.endpoint_dnat_flow(ctx, ep.ip, ep.port, Protocol.TCP).wire
        )
        for ep in eps
    }
    return svc.ServiceObjects(objs.groups, (*objs.staged, *flows.values()))


def stage(state: DesiredState, name: str, n: int, gid: int, **kw: object) -> ServicePortName:
    spn, objs = objects(name, n, gid, **kw)  # type: ignore[arg-type]
    state.stage(spn, objs.groups, objs.staged)
    return spn


def test_a_new_owner_is_returned_and_everything_it_wants_is_dirty() -> None:
    state = DesiredState()
    spn, objs = objects("a", 2, gid=1)
    owner = state.stage(spn, objs.groups, objs.staged)
    assert owner is not None and owner.key == spn and state.owners[spn] is owner
    assert state.dirty_groups == {1}
    assert list(state.dirty_flows) == [
        f.key if isinstance(f, EncodedFlow) else flow_key(f) for f in objs.staged
    ]
    state.take_dirty()
    # the same again: not new, nothing changed
    assert state.stage(spn, objs.groups, objs.staged) is None
    assert not state.dirty_groups and not state.dirty_flows


def test_a_shared_flow_is_wanted_while_any_owner_wants_it() -> None:
    state = DesiredState()
    a = stage(state, "a", 2, gid=1)
    b = stage(state, "b", 2, gid=2, vip="10.96.0.11")  # the same two endpoints
    shared = state.owners[a].flows.keys() & state.owners[b].flows.keys()
    assert len(shared) == 2  # their EndpointDNAT flows
    state.take_dirty()
    state.stage(a, (), ())
    assert a not in state.owners and all(state.flow(k) is not None for k in shared)
    assert set(state.dirty_flows) >= shared and state.dirty_groups == {1}
    assert state.group(1) is None and state.group(2) is not None
    state.stage(b, (), ())
    assert all(state.flow(k) is None for k in shared) and not state.flow_refs


def test_a_group_of_another_owner_is_refused_and_nothing_changes() -> None:
    state = DesiredState()
    stage(state, "a", 2, gid=1)
    dirty = (set(state.dirty_groups), dict(state.dirty_flows))
    with pytest.raises(DatapathError, match="group 1 is already owned"):
        stage(state, "b", 1, gid=1, first=9, vip="10.96.0.12")
    assert len(state.owners) == 1 and (state.dirty_groups, state.dirty_flows) == dirty


def test_a_failed_commit_puts_its_dirty_sets_back_first() -> None:
    state = DesiredState()
    stage(state, "a", 1, gid=1)
    groups, flows = state.take_dirty()
    assert not state.dirty_groups and not state.dirty_flows
    stage(state, "b", 1, gid=2, first=5, vip="10.96.0.11")
    later = list(state.dirty_flows)
    state.restore_dirty(groups, flows)
    assert state.dirty_groups == {1, 2}
    assert list(state.dirty_flows) == [*flows, *(k for k in later if k not in flows)]


def test_an_encoded_flow_has_the_key_of_its_value() -> None:
    _, objs = objects("a", 1, gid=1)
    for staged in objs.staged:
        if isinstance(staged, EncodedFlow):
            value = of.decode_flow_mod(staged.wire)
            assert encoded_flow(staged.wire) == staged and staged.key == flow_key(value)


class Sink:
    """A ``plan.Stream`` that keeps what it is given, as values."""

    def __init__(self, batch: int = 512) -> None:
        self.sent: list[of.Message] = []
        self._batch = batch

    def add_bodies(self, msg_type: int, bodies: Sequence[bytes]) -> None:
        kind = of.EncodedFlowMod if msg_type == plan.FLOW_MOD else of.EncodedGroupMod
        self.sent.extend(kind(body).decoded() for body in bodies)

    def add(self, msg: of.Message) -> None:
        self.sent.append(msg)

    @property
    def due(self) -> bool:
        return False

    @property
    def batch(self) -> int:
        return self._batch


def kinds(sent: Sequence[of.Message]) -> list[str]:
    out = []
    for msg in sent:
        if isinstance(msg, of.GroupMod):
            out.append(f"group_{of.GroupModCommand(msg.command).name.lower()}")
        else:
            assert isinstance(msg, of.FlowMod)
            out.append(f"flow_{of.FlowModCommand(msg.command).name.lower()}")
    return out


def commit(state: DesiredState, installed: plan.InstalledState) -> tuple[plan.Diff, Sink]:
    diff = plan.Diff(*state.take_dirty(), set())
    sink = Sink()
    for _ in plan.emit(diff, state, installed, sink):
        pass
    installed.record(diff)
    return diff, sink


def test_emit_sends_groups_before_their_flows_and_deletes_after_the_adds() -> None:
    state, installed = DesiredState(), plan.InstalledState()
    a = stage(state, "a", 2, gid=1)
    stage(state, "b", 2, gid=2, first=10, vip="10.96.0.11")
    diff, sink = commit(state, installed)
    sent = sink.sent
    group_at = {m.group_id: i for i, m in enumerate(sent) if isinstance(m, of.GroupMod)}
    for i, msg in enumerate(sent):
        if isinstance(msg, of.FlowMod):
            assert all(group_at[g] < i for g in plan.groups_used(msg) or ())
    assert diff.stats.groups_added == 2 and diff.stats.flows_added == len(installed.flows)
    assert diff.stats.messages == len(sent)
    # nothing changed: nothing planned
    assert commit(state, installed)[1].sent == []
    # a and its group go: the flow deletes, then the group's
    state.stage(a, (), ())
    diff, sink = commit(state, installed)
    assert kinds(sink.sent) == ["flow_delete_strict"] * 3 + ["group_delete"]
    assert 1 not in installed.groups and 2 in installed.groups


def test_an_endpoint_change_is_one_incremental_group_mod() -> None:
    state, installed = DesiredState(), plan.InstalledState()
    stage(state, "a", 2, gid=1)
    commit(state, installed)
    stage(state, "a", 3, gid=1)
    diff, sink = commit(state, installed)
    assert kinds(sink.sent) == ["group_insert_bucket", "flow_add"]
    assert diff.stats.groups_incremental == 1 and installed.groups[1].endpoint_count == 3


def test_owners_written_while_staging_are_not_planned_again_unless_staged_since() -> None:
    state, installed = DesiredState(), plan.InstalledState()
    written, early = plan.Written(), Sink()
    for name, gid, first in (("a", 1, 1), ("b", 2, 10)):
        spn, objs = objects(name, 2, gid=gid, first=first, vip=f"10.96.0.{gid}")
        owner = state.stage(spn, objs.groups, objs.staged)
        assert owner is not None
        plan.write_owner(owner, written, state.dirty_groups, {}, early)
    # every group whole with ADD_OR_MOD, then the owner's flows
    assert kinds(early.sent)[0] == "group_add_or_mod" and set(written.groups) == {1, 2}
    b = state.owners[ServicePortName("ns", "b", "http", Protocol.TCP)]
    before = set(b.flows)
    spn, objs = objects("b", 3, gid=2, first=10, vip="10.96.0.2")
    state.stage(spn, objs.groups, objs.staged, written.restaged)
    assert written.recheck_flows == before | set(b.flows) and written.recheck_groups == {2}
    diff = plan.Diff(*state.take_dirty(), set())
    plan.fold_written(diff, written)
    assert diff.plan_groups == {2}  # group 1 is in the bundle already
    rest = Sink()
    for _ in plan.emit(diff, state, installed, rest):
        pass
    # b's group goes from what the bundle carries: one more bucket, its one new flow
    assert kinds(rest.sent) == ["group_insert_bucket", "flow_add"]
    installed.record(diff)
    assert installed.groups[2].endpoint_count == 3 and not installed.unknown_groups


def test_an_uncertain_commit_makes_its_groups_unknown() -> None:
    state, installed = DesiredState(), plan.InstalledState()
    stage(state, "a", 2, gid=1)
    diff, _ = commit(state, installed)
    installed.group_ids_changed = False
    installed.mark_uncertain(diff)
    assert installed.unknown_groups == {1} and 1 not in installed.groups
    assert installed.group_ids_changed
