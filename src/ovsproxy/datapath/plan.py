"""The planner: a commit's diff (desired state against what the switch holds) as one ordered
stream of messages. Pure: it writes into a ``Sink`` (the datapath's bundle) and records in the
diff what the switch will hold once the messages are applied; nothing here does I/O. Both
commits consume it: the normal commit (``emit``) and the adopting commit's bundle written
while its owners are staged (``write_owner``; ``fold_written`` then hands what that bundle
carries to the commit's diff).

Order (``emit``): group adds and changes, then the flow adds, then flow deletes, then group
deletes -- except that flow adds are interleaved with the group messages once the groups
they use (most use none: mid-stream, EndpointDNAT) have been sent, so that Open vSwitch takes
them in while the next groups are planned (planning a group costs us far more than it costs OVS, a
flow the other way round; a full sync streams in about max(ours, OVS) instead of their sum).
Messages go out by their encodings, a run per group or owner (``Sink.add_bodies``): no object per
message is made for the bundle, which names a failing one by decoding its bytes. Flows staged
as values are written as values (the bundle keeps what it is given, to name a failure: a
value keeps its own text, which decoding an action the codec does not model would not give
back).

``InstalledState`` is what the switch holds once the last commit succeeded; ``record`` moves
a committed diff into it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath.desired import KEY_HEAD, DesiredState, Flow, FlowKey, Owner, flow_key
from ovsproxy.datapath.groups import InstalledGroup, delete_group, plan_group
from ovsproxy.openflow import protocol as of

_GROUP_KINDS = {int(c): f"group_{c.name.lower()}" for c in of.GroupModCommand}
_FLOW_KINDS = {int(c): f"flow_{c.name.lower()}" for c in of.FlowModCommand}
FLOW_MOD = int(of.MsgType.FLOW_MOD)
GROUP_MOD = int(of.MsgType.GROUP_MOD)
# Where the command is in a FlowMod's wire (its body, ``FlowMod.wire``): one byte.
_COMMAND_AT = 17

_APPLY_ACTIONS, _GOTO_TABLE = of.ApplyActions, of.GotoTable
_GROUP_USERS = frozenset({of.GroupAction, of.RawAction})

# A group's state once its messages are applied, and the plan's kind (``GroupPlan.kind``).
GroupResult = tuple[InstalledGroup | None, str]
_DELETED: GroupResult = (None, "delete")


@dataclass
class CommitStats:
    messages: int = 0
    group_messages: int = 0
    flow_messages: int = 0
    groups_added: int = 0
    groups_modified: int = 0
    groups_incremental: int = 0
    groups_deleted: int = 0
    flows_added: int = 0
    flows_deleted: int = 0
    seconds: float = 0.0
    kinds: dict[str, int] = field(default_factory=dict)
    # an adopting commit that found no flow of ours on the switch: no datapath flow it had
    # cached came from our pipeline
    onto_empty_switch: bool = False
    # an adopting commit asked to watch some flow keys (``SwitchSync.commit(watch=...)``):
    # those of them the switch held before it (an older agent's flows, any generation)
    held_before: frozenset[FlowKey] = frozenset()


class Sink(Protocol):
    """Where planned messages go: a bundle (``datapath.StreamingBundle`` has these)."""

    def add_bodies(self, msg_type: int, bodies: Sequence[bytes]) -> None:
        """One ``msg_type`` message per body (its encoding without the header)."""

    def add(self, msg: of.Message) -> object:
        """One message, as the value it is."""


class Stream(Sink, Protocol):
    """A ``Sink`` that ``emit`` lets write between its messages."""

    @property
    def due(self) -> bool:
        """Whether ``emit`` should yield now (to let the transport write)."""

    @property
    def batch(self) -> int:
        """How many flow adds ``emit`` writes between its checks of ``due``."""


class InstalledState:
    """What the switch holds once the last commit succeeded (flows as staged, values or
    wires), and what we know we do not know: groups the switch may hold with content we do
    not know (agent restart, uncertain commit: rewritten whole, or deleted, before their id is
    trusted), and what the switch held of groups a reconnection made unknown (rewritten whole
    with the same bucket ids and order, ``groups.plan_group``'s ``replay``, until recorded
    again). ``group_ids_changed``: the ids of ``groups`` may have changed since the registry
    last saved them (most commits change buckets only: no set of every id is built for them)."""

    __slots__ = ("flows", "group_ids_changed", "groups", "replay_groups", "unknown_groups")

    def __init__(self) -> None:
        self.flows: dict[FlowKey, Flow] = {}
        self.groups: dict[int, InstalledGroup] = {}
        self.unknown_groups: set[int] = set()
        self.replay_groups: dict[int, InstalledGroup] = {}
        self.group_ids_changed = True

    def record(self, diff: Diff) -> None:
        """The diff's bundle committed: the switch holds what it planned."""
        installed_groups = self.groups
        unknown = self.unknown_groups
        replay = self.replay_groups
        for gid, (result, _) in diff.plans.items():
            if replay:
                replay.pop(gid, None)
            if result is None:
                if installed_groups.pop(gid, None) is not None:
                    self.group_ids_changed = True
            else:
                if gid not in installed_groups:
                    self.group_ids_changed = True
                installed_groups[gid] = result
            unknown.discard(gid)
        installed_flows = self.flows
        installed_flows.update(zip(diff.add_keys, diff.add_flows, strict=True))
        for key in diff.delete_keys:
            installed_flows.pop(key, None)

    def mark_uncertain(self, diff: Diff) -> None:
        """A commit that may or may not have been applied (it timed out, or was cancelled,
        after its COMMIT went out: a busy switch may apply it late). The groups it added or
        changed are of unknown content now (rewritten whole, not re-added, next time: no
        GROUP_EXISTS); the flows it added are counted as held, so that they are deleted if
        they are no longer wanted (a late commit must not leave them behind). Neither tells
        what it deleted: the synchroniser adopts the switch again before trusting this record
        (``SwitchSync``)."""
        for gid, (_, kind) in diff.plans.items():
            if kind in ("add", "modify", "incremental"):
                self.unknown_groups.add(gid)
                self.groups.pop(gid, None)
                self.group_ids_changed = True
        self.flows.update(zip(diff.add_keys, diff.add_flows, strict=True))


class Diff:
    """One commit's diff: filled while its messages are planned, recorded on success."""

    __slots__ = (
        "add_flows",
        "add_keys",
        "committing",
        "delete_keys",
        "dirty_flows",
        "dirty_groups",
        "plan_flows",
        "plan_groups",
        "plans",
        "stale",
        "stats",
        "streamed_flows",
        "streamed_groups",
    )

    def __init__(
        self, dirty_groups: set[int], dirty_flows: dict[FlowKey, Any], stale: set[int]
    ) -> None:
        self.dirty_groups = dirty_groups
        self.dirty_flows = dirty_flows
        self.stale = stale  # old cookie generations to delete
        # what is still to plan: the dirty sets, less what was written while staging
        self.plan_groups: set[int] = dirty_groups
        self.plan_flows: Iterable[FlowKey] = dirty_flows
        # written into the bundle while staging (see Written): the switch holds these once
        # the bundle's earlier messages are applied
        self.streamed_groups: dict[int, GroupResult] = {}
        self.streamed_flows: dict[FlowKey, Flow] = {}
        # each dirty group's (installed state once committed, plan kind): not the plan's
        # messages, which are garbage once written (a full sync's would all stay alive)
        self.plans: dict[int, GroupResult] = {}
        self.add_keys: list[FlowKey] = []
        self.add_flows: list[Flow] = []
        self.delete_keys: list[FlowKey] = []
        self.stats = CommitStats()
        self.committing = False  # past this point a failure may hide a successful commit

    @property
    def size(self) -> int:
        return len(self.dirty_groups) + len(self.dirty_flows)


class Written:
    """What the adopting commit's bundle carries of owners written while they were staged
    (``write_owner``): flows by key, groups' plans, and what was staged again (or is shared)
    since, to plan again at the commit."""

    __slots__ = ("flows", "groups", "recheck_flows", "recheck_groups", "stats")

    def __init__(self) -> None:
        self.flows: dict[FlowKey, Flow] = {}
        self.groups: dict[int, GroupResult] = {}
        self.recheck_flows: set[FlowKey] = set()
        self.recheck_groups: set[int] = set()
        self.stats = CommitStats()

    def restaged(self, old: Owner, groups: Iterable[int], flows: Iterable[FlowKey]) -> None:
        """An owner staged again: what was written for it is planned again by the commit
        (``old``: its sets before, ``groups``, ``flows``: its keys now)."""
        self.recheck_flows.update(old.flows, flows)
        self.recheck_groups.update(old.groups, groups)


def groups_used(flow: of.FlowMod) -> tuple[int, ...] | None:
    """The ids of the groups a flow sends to; None when it may use groups we cannot tell (an
    action or instruction the codec does not model)."""
    used: tuple[int, ...] = ()
    for instruction in flow.instructions:
        if type(instruction) is _APPLY_ACTIONS:
            for action in instruction.actions:
                if type(action) is of.GroupAction:
                    used += (action.group_id,)
                elif type(action) is of.RawAction:
                    return None
        elif type(instruction) is not _GOTO_TABLE:
            return None
    return used


def delete_strict(key: FlowKey) -> of.FlowMod:
    """The DELETE_STRICT of the flow with this key (any cookie)."""
    table, priority = KEY_HEAD.unpack_from(key)
    match, _ = of.Match.decode(key, KEY_HEAD.size)
    return of.FlowMod.delete(table, match, priority=priority, strict=True)


def _write_flows(
    flows: Sequence[Flow], pending: set[int], after_groups: list[Flow], out: Sink
) -> None:
    """Write flow adds: the encoded ones as one run, values as they are; those that use a
    group still to come (or groups we cannot tell) go to ``after_groups``."""
    bodies: list[bytes] = []
    add = bodies.append
    values: list[of.FlowMod] = []
    for flow in flows:
        if isinstance(flow, bytes):  # an EncodedFlow: sends to no group
            add(flow)
            continue
        # (inline for the usual shape: one apply-actions instruction of one action)
        instructions = flow.instructions
        if (
            len(instructions) == 1
            and type(first := instructions[0]) is _APPLY_ACTIONS
            and len(actions := first.actions) == 1
            and type(actions[0]) not in _GROUP_USERS
        ):
            values.append(flow)
            continue
        used = groups_used(flow)
        if used is None or not pending.isdisjoint(used):
            after_groups.append(flow)  # after its group(s), or every group
        else:
            values.append(flow)
    out.add_bodies(FLOW_MOD, bodies)
    for value in values:
        out.add(value)


def _write_adds(flows: Sequence[Flow], out: Sink) -> None:
    """Write flow adds that need no ordering: encoded ones as a run, values as they are."""
    out.add_bodies(FLOW_MOD, [f for f in flows if isinstance(f, bytes)])
    for flow in flows:
        if not isinstance(flow, bytes):
            out.add(flow)


def _commands(flows: Sequence[Flow]) -> Counter[int]:
    """How many of the flows have each command (read from the wires' bytes in C)."""
    counts: Counter[int] = Counter([f.command for f in flows if not isinstance(f, bytes)])
    wires = bytes([f[_COMMAND_AT] for f in flows if isinstance(f, bytes)])
    for command in set(wires):
        counts[command] += wires.count(command)
    return counts


def _count(kinds: dict[str, int], name: str, count: int = 1) -> None:
    kinds[name] = kinds.get(name, 0) + count


def flow_adds(diff: Diff, desired: DesiredState, installed: InstalledState) -> list[Flow]:
    """The flows to add (or replace), recorded in the diff; the keys to delete are collected
    on the way. A flow written while staging counts as what the switch holds (the bundle
    already carries it)."""
    installed_flows = installed.flows
    streamed = diff.streamed_flows
    refs = desired.flow_refs
    shared_owner = desired.shared_owner
    add_keys, add_flows, delete_keys = diff.add_keys, diff.add_flows, diff.delete_keys
    adds: list[Flow] = []
    add, add_key = adds.append, add_keys.append
    owner_type = Owner
    for key in diff.plan_flows:
        ref = refs.get(key)
        have = streamed.get(key) if key in streamed else installed_flows.get(key)
        if ref is None:
            if have is not None:
                delete_keys.append(key)
            continue
        owner = ref if isinstance(ref, owner_type) else shared_owner(key, ref)
        want = owner.flows[key]
        if want is have or want == have:
            continue
        # ADD replaces a flow with the same match and priority
        add_key(key)
        add(want)
    add_flows.extend(adds)
    return adds


def emit(
    diff: Diff, desired: DesiredState, installed: InstalledState, out: Stream
) -> Iterator[None]:
    """Write the diff's messages to ``out`` in a safe order (the module's docstring), planned
    as they go; yields whenever ``out`` is due to let the transport write. The diff records
    what the switch will hold once they are committed."""
    stats = diff.stats
    kinds = stats.kinds
    plans = diff.plans
    installed_groups = installed.groups
    unknown_groups = installed.unknown_groups
    replay_groups = installed.replay_groups
    streamed = diff.streamed_groups
    group_deletes: list[int] = []
    adds = flow_adds(diff, desired, installed)
    after_groups: list[Flow] = []  # flow adds that use a group not sent yet
    dirty_groups = sorted(diff.plan_groups)
    pending = set(dirty_groups)  # groups whose messages are still to come
    per_group = len(adds) // len(dirty_groups) if dirty_groups else 0
    at = 0
    for gid in dirty_groups:
        want = desired.group(gid)
        sent = streamed.get(gid)
        # what the switch holds once the messages before these are applied
        if sent is None:
            have = installed_groups.get(gid)
            unknown = gid in unknown_groups
        else:
            have, _ = sent
            unknown = False
        if want is None:
            if have is not None or unknown:
                group_deletes.append(gid)
                stats.groups_deleted += 1
            plans[gid] = _DELETED
            continue
        replay = replay_groups.get(gid) if have is None else None
        plan = plan_group(want, have, present_unknown=unknown, replay=replay)
        kind = plan.kind
        plans[gid] = (plan.result, kind)
        if kind == "add":
            stats.groups_added += 1
        elif kind == "modify":
            stats.groups_modified += 1
        elif kind == "incremental":
            stats.groups_incremental += 1
        messages = plan.messages
        if messages:
            for msg in messages:
                name = _GROUP_KINDS[msg.command]
                kinds[name] = kinds.get(name, 0) + 1
            # The bundle keeps what it is given until its commit (to name failures): the
            # encodings only, not the buckets' values.
            out.add_bodies(GROUP_MOD, [msg.wire for msg in messages])
            stats.group_messages += len(messages)
        pending.discard(gid)
        if per_group:
            _write_flows(adds[at : at + per_group], pending, after_groups, out)
            at += per_group
        if out.due:
            yield
    # Groups before the flows that use them...
    if after_groups:
        _write_adds(after_groups, out)
    step = max(1, out.batch)
    for start in range(at, len(adds), step):
        _write_adds(adds[start : start + step], out)
        if out.due:
            yield
    add_flows, delete_keys = diff.add_flows, diff.delete_keys
    for command, count in _commands(add_flows).items():
        _count(kinds, _FLOW_KINDS.get(command, "flow"), count)
    stats.flows_added = len(add_flows)
    # ...flows before the groups they used.
    for key in delete_keys:
        out.add(delete_strict(key))
        if out.due:
            yield
    if delete_keys:
        _count(kinds, "flow_delete_strict", len(delete_keys))
    for gen in sorted(diff.stale):
        out.add(
            of.FlowMod.delete(
                cookie=(pl.COOKIE_APP << pl.COOKIE_APP_SHIFT) | (gen << pl.COOKIE_GENERATION_SHIFT),
                cookie_mask=pl.COOKIE_APP_GENERATION_MASK,
            )
        )
    if diff.stale:
        _count(kinds, "flow_delete", len(diff.stale))
    stats.flows_deleted = len(delete_keys) + len(diff.stale)
    for gid in group_deletes:
        out.add(delete_group(gid))
        if out.due:
            yield
    if group_deletes:
        _count(kinds, "group_delete", len(group_deletes))
    stats.group_messages += len(group_deletes)
    stats.flow_messages = stats.flows_added + stats.flows_deleted
    stats.messages = stats.group_messages + stats.flow_messages


def write_owner(
    owner: Owner,
    written: Written,
    dirty_groups: set[int],
    replay_groups: dict[int, InstalledGroup],
    bundle: Sink,
) -> None:
    """Write what a newly staged owner wants into the adopting commit's bundle, as that
    commit would: every group whole with ADD_OR_MOD (the switch may hold an older agent's
    version of it), then the flows that use no group still to come (``dirty_groups``: the
    groups the commit will plan). ``written`` records what was written."""
    sent_groups, sent_flows = written.groups, written.flows
    stats = written.stats
    kinds = stats.kinds
    bodies: list[bytes] = []
    for gid, spec in owner.groups.items():
        if gid in sent_groups:  # written for an owner that gave it up
            written.recheck_groups.add(gid)
            continue
        plan = plan_group(spec, None, present_unknown=True, replay=replay_groups.get(gid))
        for msg in plan.messages:
            name = _GROUP_KINDS[msg.command]
            kinds[name] = kinds.get(name, 0) + 1
            bodies.append(msg.wire)
        sent_groups[gid] = (plan.result, plan.kind)
        stats.groups_added += 1
        stats.group_messages += len(plan.messages)
    if bodies:
        bundle.add_bodies(GROUP_MOD, bodies)

    def ready(flow: of.FlowMod) -> bool:  # its groups are written or not to come
        used = groups_used(flow)
        return used is not None and not any(
            g in dirty_groups and g not in sent_groups for g in used
        )

    flows = owner.flows
    # values as they are (see _write_flows), the encoded flows as one run
    values = [f for f in flows.values() if not isinstance(f, bytes)]
    if sent_flows.keys().isdisjoint(flows) and all(map(ready, values)):
        # the usual case: in C but for the owner's few flow values
        sent_flows.update(flows)
        bundle.add_bodies(FLOW_MOD, [f for f in flows.values() if isinstance(f, bytes)])
        for value in values:
            bundle.add(value)
        return
    bodies = []
    add = bodies.append
    for key, flow in flows.items():
        if key in sent_flows:  # shared: the commit decides which owner's it is
            written.recheck_flows.add(key)
            continue
        if isinstance(flow, bytes):
            add(flow)
        elif ready(flow):
            bundle.add(flow)
        else:
            continue  # after its group: the commit sends it
        sent_flows[key] = flow
    if bodies:
        bundle.add_bodies(FLOW_MOD, bodies)


def fold_written(diff: Diff, written: Written) -> None:
    """What the bundle written while staging carries, folded into the commit's diff: recorded
    as added, and planned again only where staged since (or shared)."""
    sent_flows, sent_groups = written.flows, written.groups
    recheck_flows, recheck_groups = written.recheck_flows, written.recheck_groups
    plan_flows = [k for k in diff.dirty_flows if k not in sent_flows]
    plan_flows += [k for k in recheck_flows if k in sent_flows]
    diff.plan_flows = plan_flows
    diff.plan_groups = {g for g in diff.dirty_groups if g not in sent_groups}
    diff.plan_groups.update(g for g in recheck_groups if g in sent_groups)
    diff.streamed_flows, diff.streamed_groups = sent_flows, sent_groups
    diff.add_keys.extend(sent_flows)
    diff.add_flows.extend(sent_flows.values())
    diff.plans.update(sent_groups)
    done, stats = written.stats, diff.stats
    stats.groups_added += done.groups_added
    stats.group_messages += done.group_messages
    for name, count in done.kinds.items():
        _count(stats.kinds, name, count)


def owners_of(failures: Iterable[of.Message | None], desired: DesiredState) -> list[Hashable]:
    """Who wanted the messages the switch refused (adds and changes only: a refused delete
    belongs to nobody any more)."""
    owners: dict[Hashable, None] = {}
    for msg in failures:
        found: Any = None
        if isinstance(msg, (of.EncodedFlowMod, of.EncodedGroupMod)):
            msg = msg.decoded()
        if isinstance(msg, of.FlowMod):
            found = desired.flow_refs.get(flow_key(msg))
        elif isinstance(msg, of.GroupMod):
            found = desired.group_owner.get(msg.group_id)
        if isinstance(found, Owner):
            owners[found.key] = None
        elif isinstance(found, dict):
            owners.update(dict.fromkeys(o.key for o in found))
    return list(owners)
