"""The installed-state cache: desired groups and flows by owner, diffed and committed to OVS
as one ordered, atomic bundle.

Owners (a Service port, the fixed pipeline, a local pod) ``stage`` the complete set of groups and
flows they want; nothing is sent until ``commit``. ``commit`` looks only at what staged owners
touched (its cost follows the size of the change, not the number of Services), builds the
messages in a safe order — group adds/changes, then flow adds, then flow deletes, then group
deletes; flows that use no group may go among the group messages — and sends them as one
bundle. The cache records the new state only when the bundle
committed; a failed commit leaves everything dirty, so the next commit retries the same diff.

Flows are identified as OpenFlow identifies them: (table, priority, match), kept as one bytes
key (its hash is computed once and cached by Python). A flow several owners want (an
EndpointDNAT flow shared by two Services) is installed while any of them wants it.

Flows are kept as their encodings (``FlowMod.wire``), desired and installed: a flow's value
tree (match, instructions, actions, each with its own encoding) costs several times its bytes.
``installed_flows``, ``desired_flow`` and ``owner_flows`` decode on reading; what is sent is
``EncodedFlowMod``/``EncodedGroupMod`` (a bundle keeps every message until its commit, to name
failures: the encodings only, not the values of a group's buckets).

Streaming: the bundle is streamed (``Switch.bundle()``): messages are planned, encoded and
written while Open vSwitch decodes the ones before them, so a full sync costs about
max(planning, OVS) instead of their sum. To keep both sides busy, the flows that use no group
are interleaved with the group messages: a group costs us far more to plan than it costs OVS
to take in, a flow the other way round (with every flow after the groups, OVS was the
bottleneck for the flows and idle during the groups; bench ``full-sync`` reports the tail).
Messages go out by their encodings, a run per group or owner (``add_bodies``): no object per
message is made for the bundle, which names a failing one by decoding its bytes.

Streaming while staging: the adopting (first) commit writes everything the switch should hold,
whatever it holds, so its messages do not wait for the commit. Once ``STREAM_WHILE_STAGING_AFTER``
groups and flows are staged, its bundle is opened and every owner staged from then on is
written into it (a few dozen owners at a time; every group whole with ADD_OR_MOD, then the
owner's flows that use no group still to come), as long as the socket takes what is written;
Open vSwitch takes a cold start in while the rest of it is still being built. Nothing of it is
applied before the commit, which adopts the switch as usual and plans only what was not
written, or was staged again (or shared) since: those are planned against what the bundle
already carries, and sent into the same bundle. If the bundle is lost (its connection went),
the commit discards it and sends everything in a new one.

Garbage collection: a full sync builds over a million long-lived, acyclic values (flows,
buckets, their matches and actions; CPython never untracks tuple subclasses), and every
collection of the cyclic collector would traverse them again (most of a 10,000-Service sync
with the default thresholds, and every full collection afterwards; bench ``full-sync`` reports
the time still spent in the collector). So:

* the agent's sync runs with the collector paused (``agent.sync``: the proxier stages every
  changed Service, then awaits the commit; the datapath itself does not switch it for staging);
* a commit touching more than ``GC_PAUSE_THRESHOLD`` groups and flows runs paused too, and
  when it succeeds (with ``Datapath.freeze_gc``, the default) everything alive is moved to the
  permanent generation (``gc.freeze()``) before the collector resumes: the new state is never
  traversed again. Reference counting still frees whatever becomes garbage later; only
  reference cycles that exist at that moment (and cycles through frozen objects) are never
  collected, which for this state (acyclic values in dicts) is nothing.

On (re)connection, :meth:`Datapath.resync_switch` adopts whatever the switch holds: every group id
it has in our range is rewritten (MODIFY) or deleted, every flow is re-added with the current
generation's cookie, and the flows of older generations are deleted, all in one bundle. This is
replay after an ovs-vswitchd restart and the hitless hand-over after an agent restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import struct
import time
from collections import Counter
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath.groups import (
    GroupSpec,
    InstalledGroup,
    SelectionMethod,
    delete_group,
    plan_group,
)
from ovsproxy.gcpause import gc_paused  # process-wide, nests across threads
from ovsproxy.heap import release_free_memory
from ovsproxy.openflow import protocol as of
from ovsproxy.openflow.errors import BundleError, ChannelError

log = logging.getLogger(__name__)

FlowKey = bytes  # table (1 byte), priority (2 bytes), then the match's wire encoding

_KEY_HEAD = struct.Struct("!BH")
_GROUP_KINDS = {int(c): f"group_{c.name.lower()}" for c in of.GroupModCommand}
_FLOW_KINDS = {int(c): f"flow_{c.name.lower()}" for c in of.FlowModCommand}
_DELETED: tuple[InstalledGroup | None, str] = (None, "delete")


_ENCODED_FLOW = of.EncodedFlowMod
_ENCODED_GROUP = of.EncodedGroupMod
_new_tuple = tuple.__new__
# A commit that touches more groups + flows than this pauses the cyclic GC while it runs.
GC_PAUSE_THRESHOLD = 5000
# Streaming: yield to the event loop (so the transport writes) every this many messages.
_STREAM_YIELD_EVERY = 512
# The adopting commit is streamed while staging once this many groups + flows are pending...
STREAM_WHILE_STAGING_AFTER = 5000
# ...as long as the socket takes what is written (beyond this backlog the commit sends the rest,
# with flow control).
STREAM_WHILE_STAGING_BACKLOG = 1 << 20
_STREAM_OWNERS_EVERY = 64
_FLOW_MOD = int(of.MsgType.FLOW_MOD)
_GROUP_MOD = int(of.MsgType.GROUP_MOD)


def _groups_used(flow: of.FlowMod) -> tuple[int, ...] | None:
    """The ids of the groups a flow sends to; None when it may use groups we cannot tell (an
    action or instruction the codec does not model)."""
    used: tuple[int, ...] = ()
    for instruction in flow[4]:
        if type(instruction) is _APPLY_ACTIONS:
            for action in instruction[1]:
                kind = type(action)
                if kind is _GROUP_ACTION:
                    used += (action[1],)
                elif kind is _RAW_ACTION:
                    return None
        elif type(instruction) is not _GOTO_TABLE:
            return None
    return used


_APPLY_ACTIONS, _GOTO_TABLE = of.ApplyActions, of.GotoTable
_GROUP_ACTION, _RAW_ACTION = of.GroupAction, of.RawAction
_GROUP_USERS = frozenset({of.GroupAction, of.RawAction})


def flow_key(flow: of.FlowMod) -> FlowKey:
    """The identity of a flow in its table: (table, priority, match), as bytes."""
    return _KEY_HEAD.pack(flow.table_id, flow.priority) + flow.match.wire


class EncodedFlow(NamedTuple):
    """A flow staged as its encoding: its key and its ``FlowMod.wire``, for the shapes built
    by the hundred thousand (EndpointDNAT), without the value. Only for a flow that sends to
    no group (the datapath orders flows after the groups they use by reading the values)."""

    key: FlowKey
    wire: bytes


_MATCH_AT = 40  # where a FlowMod's match starts in its wire
_U16 = struct.Struct("!H")


def encoded_flow(wire: bytes) -> EncodedFlow:
    """The ``EncodedFlow`` of a FlowMod's wire: the key is read from it (the mid-stream
    flows are staged from their wires, ``proxy.mid_stream``)."""
    end = _MATCH_AT + ((_U16.unpack_from(wire, _MATCH_AT + 2)[0] + 7) & ~7)
    key = b"".join((wire[16:17], wire[22:24], wire[_MATCH_AT:end]))
    return _new_tuple(EncodedFlow, (key, wire))


def _delete_strict(key: FlowKey) -> of.FlowMod:
    """The DELETE_STRICT of the flow with this key (any cookie)."""
    table, priority = _KEY_HEAD.unpack_from(key)
    match, _ = of.Match.decode(key, _KEY_HEAD.size)
    return of.FlowMod.delete(table, match, priority=priority, strict=True)


def _value(flow: _Flow) -> of.FlowMod:
    return of.decode_flow_mod(flow) if isinstance(flow, bytes) else flow


class InstalledFlows(Mapping[FlowKey, of.FlowMod]):
    """The installed flows by key, read-only; those kept encoded are decoded as read."""

    __slots__ = ("_wires",)

    def __init__(self, wires: dict[FlowKey, _Flow]) -> None:
        self._wires = wires

    def __getitem__(self, key: FlowKey) -> of.FlowMod:
        return _value(self._wires[key])

    def __contains__(self, key: object) -> bool:
        return key in self._wires

    def __iter__(self) -> Iterator[FlowKey]:
        return iter(self._wires)

    def __len__(self) -> int:
        return len(self._wires)


class StreamingBundle(Protocol):
    """A bundle being written (``openflow.connection.Bundle``)."""

    @property
    def state(self) -> str:
        """``open`` while messages may be added."""

    @property
    def backlog(self) -> int:
        """Bytes added but not yet taken by the socket."""

    def add(self, msg: of.Message) -> int:
        """Buffer one message into the bundle (written in chunks); returns its xid."""

    def add_bodies(self, msg_type: int, bodies: Sequence[bytes]) -> None:
        """Buffer one ``msg_type`` message per body (its encoding without the header)."""

    async def drain(self) -> None:
        """Write what is buffered and wait until the transport can take more."""

    async def commit(self) -> None:
        """Close and commit; raise ``BundleError`` (after discarding) if anything failed."""

    async def discard(self) -> None:
        """Throw the bundle away (nothing from it is applied)."""


class Switch(Protocol):
    """What the datapath needs from an OpenFlow connection (``openflow.connection.Channel``)."""

    @property
    def connected(self) -> bool: ...

    def bundle(self) -> StreamingBundle:
        """A new atomic, ordered bundle, streamed as messages are added."""

    async def group_ids(self) -> set[int]:
        """Ids of every group the switch holds."""

    async def flow_cookies(self, cookie: int, mask: int) -> list[int]:
        """Cookies of the flows whose cookie matches cookie/mask."""


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


@dataclass(slots=True, eq=False)
class _Owner:
    """What one owner wants. Compared and hashed by identity: the merged state refers to
    owners by this object (updated in place by each ``stage``), not by their key, so the
    commit never hashes an owner key (a dataclass ServicePortName hashes in Python)."""

    key: Hashable
    groups: dict[int, GroupSpec] = field(default_factory=dict)
    # each flow as staged: a value, or (staged as an ``EncodedFlow``) its encoding only
    flows: dict[FlowKey, _Flow] = field(default_factory=dict)


# A flow as the datapath keeps it: a value, or the wire of one (bytes; see EncodedFlow).
_Flow = of.FlowMod | bytes
# Who wants a flow: its one owner, or (shared) the owners in the order they asked.
_FlowRef = _Owner | dict[_Owner, None]


class DatapathError(RuntimeError):
    """A commit failed. ``owners``: the owners whose messages the switch refused (when it
    said which), so the caller can set them aside and commit everything else."""

    def __init__(self, message: str, owners: Sequence[Hashable] = ()) -> None:
        super().__init__(message)
        self.owners = list(owners)


@contextlib.contextmanager
def _gc_paused(active: bool) -> Iterator[None]:
    if not active:
        yield
        return
    with gc_paused():
        yield


class _Commit:
    """One commit's diff: filled while its messages are generated, applied on success."""

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
        self.stale = stale
        # what is still to plan: the dirty sets, less what was streamed while staging
        self.plan_groups: set[int] = dirty_groups
        self.plan_flows: Iterable[FlowKey] = dirty_flows
        # written into the bundle while staging (see _Streaming): the switch holds these once
        # the bundle's earlier messages are applied
        self.streamed_groups: dict[int, tuple[InstalledGroup | None, str]] = {}
        self.streamed_flows: dict[FlowKey, _Flow] = {}
        # each dirty group's (installed state once committed, plan kind): not the plan's
        # messages, which are garbage once written (a full sync's would all stay alive)
        self.plans: dict[int, tuple[InstalledGroup | None, str]] = {}
        self.add_keys: list[FlowKey] = []
        self.add_flows: list[_Flow] = []
        self.delete_keys: list[FlowKey] = []
        self.stats = CommitStats()
        self.committing = False  # past this point a failure may hide a successful commit

    @property
    def size(self) -> int:
        return len(self.dirty_groups) + len(self.dirty_flows)


class _Streaming:
    """The adopting commit's bundle, opened and written while the owners are staged, so that
    Open vSwitch takes a full sync in while the rest of it is still being built (a cold start
    builds everything, then commits: the build is most of our time, and OVS would idle
    through it). Nothing of it is applied before the commit, which plans only what was not
    streamed (or was re-staged since) and sends it into the same bundle."""

    __slots__ = ("bundle", "flows", "groups", "queue", "recheck_flows", "recheck_groups", "stats")

    def __init__(self, bundle: StreamingBundle) -> None:
        self.bundle = bundle
        self.flows: dict[FlowKey, _Flow] = {}  # written, by key
        self.groups: dict[int, tuple[InstalledGroup | None, str]] = {}  # written: plans
        # written, then staged again (or shared): planned again by the commit
        self.recheck_flows: set[FlowKey] = set()
        self.recheck_groups: set[int] = set()
        self.stats = CommitStats()
        self.queue: list[_Owner] = []  # staged, to write


class _Out:
    """Where a commit's messages go: its bundle, opened with the first message."""

    __slots__ = ("_switch", "bundle", "since")

    def __init__(self, switch: Switch, bundle: StreamingBundle | None = None) -> None:
        self._switch = switch
        self.bundle = bundle
        self.since = 0  # messages since the caller last let the transport write

    def _bundle(self) -> StreamingBundle:
        bundle = self.bundle  # (not `or`: a bundle's truth is its length)
        if bundle is None:
            bundle = self.bundle = self._switch.bundle()
        return bundle

    def bodies(self, msg_type: int, bodies: Sequence[bytes]) -> None:
        if bodies:
            self._bundle().add_bodies(msg_type, bodies)
            self.since += len(bodies)

    def message(self, msg: of.Message) -> None:
        self._bundle().add(msg)
        self.since += 1

    @property
    def due(self) -> bool:
        return self.since >= _STREAM_YIELD_EVERY


def _write_flows(
    flows: Sequence[_Flow], pending: set[int], after_groups: list[_Flow], out: _Out
) -> None:
    """Write flow adds: the encoded ones as one run, values as they are (the bundle keeps
    what it is given, to name a failure: a value keeps its own text, which decoding an
    action the codec does not model would not give back); those that use a group still to
    come (or groups we cannot tell) go to ``after_groups``."""
    bodies: list[bytes] = []
    add = bodies.append
    values: list[of.FlowMod] = []
    for flow in flows:
        if isinstance(flow, bytes):  # an EncodedFlow: sends to no group
            add(flow)
            continue
        # (inline for the usual shape: one apply-actions instruction of one action)
        instructions = flow[4]
        if (
            len(instructions) == 1
            and type(instructions[0]) is _APPLY_ACTIONS
            and len(instructions[0][1]) == 1
            and type(instructions[0][1][0]) not in _GROUP_USERS
        ):
            values.append(flow)
            continue
        used = _groups_used(flow)
        if used is None or not pending.isdisjoint(used):
            after_groups.append(flow)  # after its group(s), or every group
        else:
            values.append(flow)
    out.bodies(_FLOW_MOD, bodies)
    for value in values:
        out.message(value)


def _write_adds(flows: Sequence[_Flow], out: _Out) -> None:
    """Write flow adds that need no ordering: encoded ones as a run, values as they are."""
    out.bodies(_FLOW_MOD, [f for f in flows if isinstance(f, bytes)])
    for flow in flows:
        if not isinstance(flow, bytes):
            out.message(flow)


def _commands(flows: Sequence[_Flow]) -> Counter[int]:
    """How many of the flows have each command (read from the wires' bytes in C)."""
    counts: Counter[int] = Counter([f[7] for f in flows if not isinstance(f, bytes)])
    wires = bytes([f[17] for f in flows if isinstance(f, bytes)])
    for command in set(wires):
        counts[command] += wires.count(command)
    return counts


class GroupRegistry(Protocol):
    """Where the ids of the groups we installed are kept across restarts (the agent keeps them
    in OVSDB). Needed because OpenFlow cannot list groups reliably: OVS 3.1 overflows the
    16-bit entry length of GROUP_DESC (over ~1,000 buckets) and GROUP_STATS (over ~4,000)."""

    async def load(self) -> set[int] | None: ...

    async def save(self, group_ids: set[int]) -> None: ...


# A GROUP_STATS entry is 40 + 16 bytes per bucket, with a 16-bit length.
STATS_SAFE_BUCKETS = (0xFFFF - 40) // 16
# GROUP_DESC entries overflow their 16-bit length above about 1,000 Service buckets.
DESCRIBE_SAFE_BUCKETS = 1000


@dataclass(frozen=True, slots=True)
class Removal:
    """What ``Datapath.remove_all`` found and deleted: the number of our flows, the group ids."""

    flows: int
    groups: tuple[int, ...]


class Datapath:
    """``freeze_gc``: after a big commit, move what is alive out of the cyclic collector's
    sight (see above; a one-shot process has nothing to keep out of it).
    ``stream_while_staging``: stream the adopting commit's bundle while its owners are staged
    (see ``_Streaming``)."""

    def __init__(
        self,
        switch: Switch,
        config: pl.PipelineConfig,
        generation: int,
        registry: GroupRegistry | None = None,
        *,
        freeze_gc: bool = True,
        stream_while_staging: bool = True,
    ) -> None:
        self.freeze_gc = freeze_gc
        self.stream_while_staging = stream_while_staging
        self.switch = switch
        self.registry = registry
        self._saved_group_ids: set[int] | None = None
        # set when the ids of installed_groups may have changed since the last save (most
        # commits change buckets only: no set of every id is built for them)
        self._group_ids_changed = True
        self.config = config
        self.tables = pl.Tables.for_config(config)
        self.generation = generation
        self._owners: dict[Hashable, _Owner] = {}
        # desired state, merged over owners: the owner that wants a flow, or (shared) a dict
        # of them in the order they asked
        self._flow_refs: dict[FlowKey, _FlowRef] = {}
        self._group_owner: dict[int, _Owner] = {}
        # installed state (what the switch holds once the last commit succeeded)
        # (flows as staged, values or wires: ``installed_flows`` decodes the wires)
        self._installed_flows: dict[FlowKey, _Flow] = {}
        self.installed_groups: dict[int, InstalledGroup] = {}
        # groups the switch may hold with content we do not know (agent restart, uncertain
        # commit): rewritten whole, or deleted, before their id is trusted
        self._unknown_groups: set[int] = set()
        # what the switch held of groups a reconnection made unknown: rewritten whole with the
        # same bucket ids and order (groups.plan_group's ``replay``), until recorded again
        self._replay_groups: dict[int, InstalledGroup] = {}
        # old-generation cookies to delete with the next commit
        self._stale_generations: set[int] = set()
        # dirty flows: an ordered set (a dict; the values mean nothing)
        self._dirty_flows: dict[FlowKey, Any] = {}
        self._dirty_groups: set[int] = set()
        self._lock = asyncio.Lock()
        # The first commit adopts what the switch holds (an older agent's state): it must carry
        # the complete desired state, so adoption waits for it instead of wiping the switch.
        self._adopt = True
        self.last_commit = CommitStats()
        self.commits = 0
        self._streaming: _Streaming | None = None
        self._abandoned: list[StreamingBundle] = []  # streamed bundles to discard

    # -- staging ----------------------------------------------------------------------------
    def stage(
        self,
        owner: Hashable,
        groups: Iterable[GroupSpec],
        flows: Iterable[of.FlowMod | EncodedFlow],
    ) -> None:
        """Replace everything `owner` wants. Cost: the size of the owner's old + new sets."""
        pack = _KEY_HEAD.pack
        new_groups = {g.group_id: g for g in groups}
        new_flows: dict[FlowKey, _Flow] = {}
        for f in flows:
            if isinstance(f, EncodedFlow):
                new_flows[f[0]] = f[1]
            else:  # flow_key(f): table, priority, the match's wire
                new_flows[pack(f[1], f[2]) + f[3][0]] = f
        old = self._owners.get(owner)
        group_owner = self._group_owner
        for gid in new_groups:
            holder = group_owner.get(gid)
            if holder is not None and holder is not old:
                raise DatapathError(f"group {gid} is already owned by {holder.key}, not {owner}")
        refs = self._flow_refs
        dirty_flows = self._dirty_flows
        if old is None:
            if not (new_groups or new_flows):
                return
            me = self._owners[owner] = _Owner(owner, new_groups, new_flows)
            if refs.keys().isdisjoint(new_flows):  # the usual case: no flow shared yet
                refs.update(dict.fromkeys(new_flows, me))
            else:
                for key in new_flows:
                    ref = refs.get(key)
                    if ref is None:
                        refs[key] = me
                    else:
                        self._ref_shared(key, ref, me)
            dirty_flows.update(new_flows)
            for gid in new_groups:
                group_owner[gid] = me
            self._dirty_groups.update(new_groups)
            streaming = self._streaming
            if streaming is not None:
                queue = streaming.queue
                queue.append(me)
                if len(queue) >= _STREAM_OWNERS_EVERY:
                    self._stream_queued(streaming)
            elif self._adopt:
                self._start_streaming()
            return
        old_flows = old.flows
        streaming = self._streaming
        if streaming is not None:  # what was written for this owner is planned again
            streaming.recheck_flows.update(old_flows, new_flows)
            streaming.recheck_groups.update(old.groups, new_groups)
        for key, flow in old_flows.items():
            now = new_flows.get(key)
            if now is not flow and now != flow:
                self._unref_flow(key, old)
        for key, flow in new_flows.items():
            was = old_flows.get(key)
            if was is not flow and was != flow:
                ref = refs.get(key)
                if ref is None:
                    refs[key] = old
                else:
                    self._ref_shared(key, ref, old)
                dirty_flows[key] = None
        old_groups = old.groups
        for gid, spec in old_groups.items():
            if new_groups.get(gid) != spec:
                self._dirty_groups.add(gid)
                if gid not in new_groups:
                    group_owner.pop(gid, None)
        for gid, spec in new_groups.items():
            group_owner[gid] = old
            if old_groups.get(gid) != spec:
                self._dirty_groups.add(gid)
        if new_groups or new_flows:
            old.groups, old.flows = new_groups, new_flows
        else:
            del self._owners[owner]

    def unstage(self, owner: Hashable) -> None:
        self.stage(owner, (), ())

    # -- streaming while staging (see _Streaming) -----------------------------------------------
    def _start_streaming(self) -> None:
        """Open the adopting commit's bundle once enough is staged, and write what is."""
        if (
            not self.stream_while_staging
            or len(self._dirty_flows) + len(self._dirty_groups) < STREAM_WHILE_STAGING_AFTER
            or self._lock.locked()
            or not self.switch.connected
        ):
            return
        try:
            asyncio.get_running_loop()  # a bundle needs the loop (its replies are futures)
            bundle = self.switch.bundle()
        except (RuntimeError, ChannelError):
            return
        streaming = self._streaming = _Streaming(bundle)
        streaming.queue.extend(self._owners.values())
        self._stream_queued(streaming)

    def _stream_queued(self, streaming: _Streaming) -> None:
        """Write the owners staged since the last write (a few dozen at a time: building and
        encoding each in its own tight loop is cheaper than alternating per owner)."""
        queue, streaming.queue = streaming.queue, []
        owners = self._owners
        for owner in queue:
            if self._streaming is not streaming:
                return  # abandoned
            if owners.get(owner.key) is owner:  # (not unstaged since)
                self._stream_owner(streaming, owner)

    def _stream_owner(self, streaming: _Streaming, owner: _Owner) -> None:
        """Write what a newly staged owner wants into the streamed bundle, as the adopting
        commit would: every group whole with ADD_OR_MOD (the switch may hold an older agent's
        version of it), then the flows that use no group still to come. Skipped while the
        socket does not keep up (the commit plans what was not written)."""
        bundle = streaming.bundle
        try:
            if bundle.state != "open":
                self._abandon_streaming()
                return
            if bundle.backlog > STREAM_WHILE_STAGING_BACKLOG:
                return
            sent_groups, sent_flows = streaming.groups, streaming.flows
            stats = streaming.stats
            kinds = stats.kinds
            bodies: list[bytes] = []
            for gid, spec in owner.groups.items():
                if gid in sent_groups:  # written for an owner that gave it up
                    streaming.recheck_groups.add(gid)
                    continue
                plan = plan_group(
                    spec, None, present_unknown=True, replay=self._replay_groups.get(gid)
                )
                for msg in plan.messages:
                    name = _GROUP_KINDS[msg.command]
                    kinds[name] = kinds.get(name, 0) + 1
                    bodies.append(msg[0])
                sent_groups[gid] = (plan.result, plan.kind)
                stats.groups_added += 1
                stats.group_messages += len(plan.messages)
            if bodies:
                bundle.add_bodies(_GROUP_MOD, bodies)
            dirty_groups = self._dirty_groups

            def ready(flow: of.FlowMod) -> bool:  # its groups are written or not to come
                used = _groups_used(flow)
                return used is not None and not any(
                    g in dirty_groups and g not in sent_groups for g in used
                )

            flows = owner.flows
            # values as they are (see _write_flows), the encoded flows as one run
            values = [f for f in flows.values() if not isinstance(f, bytes)]
            if sent_flows.keys().isdisjoint(flows) and all(map(ready, values)):
                # the usual case: in C but for the owner's few flow values
                sent_flows.update(flows)
                bundle.add_bodies(_FLOW_MOD, [f for f in flows.values() if isinstance(f, bytes)])
                for value in values:
                    bundle.add(value)
                return
            bodies = []
            add = bodies.append
            for key, flow in flows.items():
                if key in sent_flows:  # shared: the commit decides which owner's it is
                    streaming.recheck_flows.add(key)
                    continue
                if isinstance(flow, bytes):
                    add(flow)
                elif ready(flow):
                    bundle.add(flow)
                else:
                    continue  # after its group: the commit sends it
                sent_flows[key] = flow
            if bodies:
                bundle.add_bodies(_FLOW_MOD, bodies)
        except Exception as exc:  # the commit plans everything again, and reports any error
            log.debug("streaming while staging stopped: %s", exc)
            self._abandon_streaming()

    def _abandon_streaming(self) -> None:
        streaming, self._streaming = self._streaming, None
        if streaming is not None:
            self._abandoned.append(streaming.bundle)

    def _take_streamed(self, diff: _Commit) -> StreamingBundle | None:
        """The streamed bundle, if it is still open, with what it holds folded into the diff:
        recorded as added, and planned again only where staged since."""
        streaming, self._streaming = self._streaming, None
        if streaming is None:
            return None  # (owners still queued are planned by the commit)
        if streaming.bundle.state != "open":
            self._abandoned.append(streaming.bundle)
            return None
        sent_flows, sent_groups = streaming.flows, streaming.groups
        recheck_flows, recheck_groups = streaming.recheck_flows, streaming.recheck_groups
        plan_flows = [k for k in diff.dirty_flows if k not in sent_flows]
        plan_flows += [k for k in recheck_flows if k in sent_flows]
        diff.plan_flows = plan_flows
        diff.plan_groups = {g for g in diff.dirty_groups if g not in sent_groups}
        diff.plan_groups.update(g for g in recheck_groups if g in sent_groups)
        diff.streamed_flows, diff.streamed_groups = sent_flows, sent_groups
        diff.add_keys.extend(sent_flows)
        diff.add_flows.extend(sent_flows.values())
        diff.plans.update(sent_groups)
        done, stats = streaming.stats, diff.stats
        stats.groups_added += done.groups_added
        stats.group_messages += done.group_messages
        for name, count in done.kinds.items():
            stats.kinds[name] = stats.kinds.get(name, 0) + count
        return streaming.bundle

    async def _discard_abandoned(self) -> None:
        abandoned, self._abandoned = self._abandoned, []
        for bundle in abandoned:
            with contextlib.suppress(Exception):
                await bundle.discard()

    def _ref_shared(self, key: FlowKey, ref: _FlowRef, owner: _Owner) -> None:
        if isinstance(ref, dict):
            ref.pop(owner, None)
            ref[owner] = None  # the newest asker goes last
        elif ref is not owner:
            self._flow_refs[key] = {ref: None, owner: None}

    def _unref_flow(self, key: FlowKey, owner: _Owner) -> None:
        refs = self._flow_refs
        ref = refs.get(key)
        if ref is not None:
            if isinstance(ref, dict):
                ref.pop(owner, None)
                if len(ref) == 1:
                    refs[key] = next(iter(ref))
                elif not ref:
                    del refs[key]
            elif ref is owner:
                del refs[key]
        self._dirty_flows[key] = None

    def owners(self) -> list[Hashable]:
        return list(self._owners)

    def desired_flow(self, key: FlowKey) -> of.FlowMod | None:
        ref = self._flow_refs.get(key)
        if ref is None:
            return None
        owner = ref if isinstance(ref, _Owner) else self._shared_owner(key, ref)
        return _value(owner.flows[key])

    def owner_flows(self, owner: Hashable) -> list[of.FlowMod]:
        """The flows ``owner`` has staged (decoded)."""
        found = self._owners.get(owner)
        return [] if found is None else [_value(f) for f in found.flows.values()]

    @property
    def installed_flows(self) -> InstalledFlows:
        """What the switch holds once the last commit succeeded: flows by key."""
        return InstalledFlows(self._installed_flows)

    def _shared_owner(self, key: FlowKey, sharers: dict[_Owner, None]) -> _Owner:
        # Owners that share a flow want the same one; if not, the newest wins (and we say so).
        flows = [o.flows[key] for o in sharers]
        if any(f != flows[0] for f in flows[1:]):
            log.warning("owners %s want different flows for %r", [o.key for o in sharers], key)
        return next(reversed(sharers))

    def desired_group(self, gid: int) -> GroupSpec | None:
        owner = self._group_owner.get(gid)
        if owner is None:
            return None
        return owner.groups.get(gid)

    @property
    def pending(self) -> bool:
        return bool(self._dirty_flows or self._dirty_groups or self._stale_generations)

    # -- committing -------------------------------------------------------------------------
    def _emit(self, diff: _Commit, out: _Out) -> Iterator[None]:
        """Write the commit's messages to ``out`` in a safe order, planned as they go (yields
        whenever the caller should let the transport write); the diff records what the switch
        will hold once they are committed.

        Order: group adds and changes, then the flow adds, then flow deletes, then group
        deletes -- except that flow adds are interleaved with the group messages once the
        groups they use (most use none: EndpointDNAT) have been sent, so that Open vSwitch
        takes them in while the next groups are planned (planning a group costs us far more
        than it costs OVS, a flow the other way round; a full sync streams in about max(ours,
        OVS) instead of their sum). Messages go out by their encodings, a run at a time
        (``add_bodies``): no object per message."""
        stats = diff.stats
        kinds = stats.kinds
        plans = diff.plans
        installed_groups = self.installed_groups
        unknown_groups = self._unknown_groups
        streamed = diff.streamed_groups
        group_deletes: list[int] = []
        adds = self._flow_adds(diff)
        after_groups: list[_Flow] = []  # flow adds that use a group not sent yet
        dirty_groups = sorted(diff.plan_groups)
        pending = set(dirty_groups)  # groups whose messages are still to come
        per_group = len(adds) // len(dirty_groups) if dirty_groups else 0
        at = 0
        for gid in dirty_groups:
            desired = self.desired_group(gid)
            sent = streamed.get(gid)
            # what the switch holds once the messages before these are applied
            installed = sent[0] if sent is not None else installed_groups.get(gid)
            unknown = sent is None and gid in unknown_groups
            if desired is None:
                if installed is not None or unknown:
                    group_deletes.append(gid)
                    stats.groups_deleted += 1
                plans[gid] = _DELETED
                continue
            replay = self._replay_groups.get(gid) if installed is None else None
            plan = plan_group(desired, installed, present_unknown=unknown, replay=replay)
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
                out.bodies(_GROUP_MOD, [msg[0] for msg in messages])
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
        step = max(1, _STREAM_YIELD_EVERY)
        for start in range(at, len(adds), step):
            _write_adds(adds[start : start + step], out)
            if out.due:
                yield
        add_flows, delete_keys = diff.add_flows, diff.delete_keys
        for command, count in _commands(add_flows).items():
            name = _FLOW_KINDS.get(command, "flow")
            kinds[name] = kinds.get(name, 0) + count
        stats.flows_added = len(add_flows)
        # ...flows before the groups they used.
        for key in delete_keys:
            out.message(_delete_strict(key))
            if out.due:
                yield
        if delete_keys:
            kinds["flow_delete_strict"] = kinds.get("flow_delete_strict", 0) + len(delete_keys)
        for gen in sorted(diff.stale):
            out.message(
                of.FlowMod.delete(
                    cookie=(pl.COOKIE_APP << pl.COOKIE_APP_SHIFT)
                    | (gen << pl.COOKIE_GENERATION_SHIFT),
                    cookie_mask=pl.COOKIE_APP_GENERATION_MASK,
                )
            )
        if diff.stale:
            kinds["flow_delete"] = kinds.get("flow_delete", 0) + len(diff.stale)
        stats.flows_deleted = len(delete_keys) + len(diff.stale)
        for gid in group_deletes:
            out.message(delete_group(gid))
            if out.due:
                yield
        if group_deletes:
            kinds["group_delete"] = kinds.get("group_delete", 0) + len(group_deletes)
        stats.group_messages += len(group_deletes)
        stats.flow_messages = stats.flows_added + stats.flows_deleted
        stats.messages = stats.group_messages + stats.flow_messages

    def _flow_adds(self, diff: _Commit) -> list[_Flow]:
        """The flows to add (or replace), recorded in the diff; the keys to delete are
        collected on the way. A flow streamed while staging counts as what the switch holds
        (the bundle already carries it)."""
        installed_flows = self._installed_flows
        streamed = diff.streamed_flows
        refs = self._flow_refs
        add_keys, add_flows, delete_keys = diff.add_keys, diff.add_flows, diff.delete_keys
        adds: list[_Flow] = []
        add, add_key = adds.append, add_keys.append
        owner_type = _Owner
        for key in diff.plan_flows:
            ref = refs.get(key)
            have = streamed.get(key) if key in streamed else installed_flows.get(key)
            if ref is None:
                if have is not None:
                    delete_keys.append(key)
                continue
            owner = ref if isinstance(ref, owner_type) else self._shared_owner(key, ref)
            want = owner.flows[key]
            if want is have or want == have:
                continue
            # ADD replaces a flow with the same match and priority
            add_key(key)
            add(want)
        add_flows.extend(adds)
        return adds

    async def commit(self) -> CommitStats:
        """Send what changed since the last successful commit as one bundle (nothing at all
        when nothing changed). Raises on failure; the same diff is retried by the next call."""
        async with self._lock:
            if self._adopt:
                return await self._resync_locked()
            return await self._commit_locked()

    async def on_connected(self) -> None:
        """The channel's (re)connection hook: replay before any new change is sent."""
        async with self._lock:
            if not self._adopt:  # we have installed state: the switch may have lost it
                await self._resync_locked()

    async def _send(self, diff: _Commit, bundle: StreamingBundle | None) -> None:
        """Stream the messages into one bundle (``bundle``: the one streamed while staging)."""
        out = _Out(self.switch, bundle)
        try:
            for _ in self._emit(diff, out):
                # Write what is buffered and let the loop push it to OVS, which decodes
                # these messages while we plan the next ones.
                out.since = 0
                if out.bundle is not None:
                    await out.bundle.drain()
                await asyncio.sleep(0)
        except BaseException:
            if out.bundle is not None:
                with contextlib.suppress(Exception):
                    await out.bundle.discard()
            raise
        if out.bundle is None:
            return  # nothing changed: not even an empty bundle
        diff.committing = True
        await out.bundle.commit()

    async def _commit_locked(self) -> CommitStats:
        started = time.perf_counter()
        # Take the dirty sets: what is staged while the bundle is in flight stays dirty for
        # the next commit.
        diff = _Commit(self._dirty_groups, self._dirty_flows, self._stale_generations)
        self._dirty_groups, self._dirty_flows, self._stale_generations = set(), {}, set()
        streamed = self._take_streamed(diff)
        if self._abandoned:
            await self._discard_abandoned()
        big = diff.size > GC_PAUSE_THRESHOLD
        with _gc_paused(big):
            try:
                await self._send(diff, streamed)
            except asyncio.CancelledError:
                self._restore(diff)
                if diff.committing:
                    self._mark_uncertain(diff.plans)
                raise
            except BundleError as exc:  # refused and discarded: nothing was applied
                self._restore(diff)
                raise DatapathError(f"bundle refused: {exc}", self._owners_of(exc)) from exc
            except Exception as exc:
                self._restore(diff)
                if diff.committing:
                    # A timeout may hide a commit that succeeded: groups this bundle added are
                    # of unknown content now, and are rewritten (not re-added) next time.
                    self._mark_uncertain(diff.plans)
                elif not isinstance(exc, ChannelError):
                    raise  # a planning bug: the bundle was discarded, nothing was applied
                what = (
                    f"bundle of {diff.stats.messages} messages"
                    if diff.stats.messages
                    else "bundle (before all its messages were sent)"
                )
                raise DatapathError(f"{what} failed: {exc}") from exc
            self._record(diff)
            if big and self.freeze_gc:
                gc.freeze()  # the collector is paused here: nothing young is traversed first
        stats = diff.stats
        if big:
            # the diff's dicts and lists (and the bundle's runs) go first: then what the
            # commit freed goes back to the OS (heap.py)
            del diff, streamed
            release_free_memory()
        stats.seconds = time.perf_counter() - started
        self.last_commit = stats
        self.commits += 1
        await self._save_group_ids()
        return stats

    def _owners_of(self, exc: BundleError) -> list[Hashable]:
        """Who wanted the messages the switch refused (adds and changes only: a refused
        delete belongs to nobody any more)."""
        owners: dict[Hashable, None] = {}
        for failure in exc.failures:
            msg = failure.message
            found: Any = None
            if isinstance(msg, (of.EncodedFlowMod, of.EncodedGroupMod)):
                msg = msg.decoded()
            if isinstance(msg, of.FlowMod):
                found = self._flow_refs.get(flow_key(msg))
            elif isinstance(msg, of.GroupMod):
                found = self._group_owner.get(msg.group_id)
            if isinstance(found, _Owner):
                owners[found.key] = None
            elif isinstance(found, dict):
                owners.update(dict.fromkeys(o.key for o in found))
        return list(owners)

    def _record(self, diff: _Commit) -> None:
        installed_groups = self.installed_groups
        unknown = self._unknown_groups
        replay = self._replay_groups
        for gid, (result, _) in diff.plans.items():
            if replay:
                replay.pop(gid, None)
            if result is None:
                if installed_groups.pop(gid, None) is not None:
                    self._group_ids_changed = True
            else:
                if gid not in installed_groups:
                    self._group_ids_changed = True
                installed_groups[gid] = result
            unknown.discard(gid)
        installed_flows = self._installed_flows
        installed_flows.update(zip(diff.add_keys, diff.add_flows, strict=True))
        for key in diff.delete_keys:
            installed_flows.pop(key, None)

    def _restore(self, diff: _Commit) -> None:
        """A failed commit: everything it took is dirty again."""
        self._dirty_groups |= diff.dirty_groups
        diff.dirty_flows.update(self._dirty_flows)
        self._dirty_flows = diff.dirty_flows
        self._stale_generations |= diff.stale

    def _mark_uncertain(self, plans: dict[int, tuple[InstalledGroup | None, str]]) -> None:
        for gid, (_, kind) in plans.items():
            if kind in ("add", "modify", "incremental"):
                self._unknown_groups.add(gid)
                self.installed_groups.pop(gid, None)
                self._group_ids_changed = True

    # -- the switch's own state -------------------------------------------------------------
    def _ours(self, gid: int) -> bool:
        return self.config.group_id_min <= gid <= self.config.group_id_max

    async def resync_switch(self) -> CommitStats:
        """Make the switch hold exactly our desired state, whatever it holds now. Called on
        every (re)connection before any other change is sent."""
        async with self._lock:
            return await self._resync_locked()

    async def drifted(self) -> bool:
        """Drift check for the periodic full resync: does the switch still hold as many flows
        of this generation as the cache says, and our groups with their buckets? Groups are
        read where the switch offers it (``group_stats``/``dump_groups``, the channel does):
        ids and bucket counts from group statistics, and each bucket (id, weight, actions)
        from the group descriptions when no group is too large for OpenFlow to describe
        (GROUP_DESC over 64 KB); above the size statistics can carry, groups are not read."""
        cookie = (pl.COOKIE_APP << pl.COOKIE_APP_SHIFT) | (
            self.generation << pl.COOKIE_GENERATION_SHIFT
        )
        cookies = await self.switch.flow_cookies(cookie, pl.COOKIE_APP_GENERATION_MASK)
        if len(cookies) != len(self._installed_flows):
            return True
        return await self._groups_drifted()

    async def _groups_drifted(self) -> bool:
        group_stats = getattr(self.switch, "group_stats", None)
        dump_groups = getattr(self.switch, "dump_groups", None)
        installed = self.installed_groups
        if group_stats is None or dump_groups is None or self._unknown_groups:
            return False
        largest = max((g.endpoint_count for g in installed.values()), default=0)
        if largest > STATS_SAFE_BUCKETS:
            return False  # the statistics reply itself would overflow
        counts = {s.group_id: s.n_buckets for s in await group_stats() if self._ours(s.group_id)}
        if counts.keys() != installed.keys() or any(
            counts[gid] != group.endpoint_count for gid, group in installed.items()
        ):
            return True
        if largest > DESCRIBE_SAFE_BUCKETS:
            return False
        for group in await dump_groups(max_buckets=DESCRIBE_SAFE_BUCKETS):
            have = installed.get(group.group_id)
            if have is None:
                continue
            method = (
                SelectionMethod(group.selection_method, tuple(f.name for f in group.fields))
                if group.selection_method
                else None
            )
            if method != have.selection_method:
                return True
            ids = have.ids
            want = {(ids[k], spec.weight, spec.actions) for k, spec in have.buckets.items()}
            if {(b.bucket_id, b.weight, b.actions) for b in group.buckets} != want:
                return True
        return False

    async def _group_ids_in_switch(self) -> set[int]:
        """Group ids the switch may hold that are ours (a superset is fine: deleting a missing
        group is harmless, and every group we want is written with ADD_OR_MOD)."""
        believed = set(self.installed_groups) | self._unknown_groups
        if self.registry is not None:
            saved = await self.registry.load()
            if saved is not None:
                return {gid for gid in saved | believed if self._ours(gid)}
        largest = max(
            (
                len(spec.buckets)
                for owner in self._owners.values()
                for spec in owner.groups.values()
            ),
            default=0,
        )
        if largest > STATS_SAFE_BUCKETS:
            log.warning(
                "not listing the switch's groups: a group of %d buckets would overflow "
                "OpenFlow's group statistics; older groups of ours may stay behind",
                largest,
            )
            return {gid for gid in believed if self._ours(gid)}
        listed = await self.switch.group_ids()
        return {gid for gid in listed | believed if self._ours(gid)}

    async def _save_group_ids(self) -> None:
        if self.registry is None or not self._group_ids_changed:
            return
        ids = set(self.installed_groups)
        if ids != self._saved_group_ids:
            await self.registry.save(ids)
            self._saved_group_ids = ids
        self._group_ids_changed = False

    async def _resync_locked(self) -> CommitStats:
        present = await self._group_ids_in_switch()
        cookies = await self.switch.flow_cookies(
            pl.COOKIE_APP << pl.COOKIE_APP_SHIFT, pl.COOKIE_APP_MASK
        )
        generations = {pl.cookie_generation(c) for c in cookies}
        self._stale_generations = {
            g
            for g in generations
            if g is not None and g not in (self.generation, pl.LEARNED_GENERATION)
        }
        # Forget what we thought was installed: rewrite everything we want, and delete what
        # we installed and no longer want (a DELETE_STRICT of a missing flow is harmless).
        refs = self._flow_refs
        self._installed_flows = {k: f for k, f in self._installed_flows.items() if k not in refs}
        # (a lost group is replayed with the bucket ids and order it had: the same endpoint
        # for each connection conntrack picks up again; groups.plan_group)
        self._replay_groups.update(self.installed_groups)
        self.installed_groups.clear()
        self._group_ids_changed = True
        # Every group we want is written whole with ADD_OR_MOD: right whether the switch lost
        # it (vswitchd restart) or holds an older agent's version of it.
        self._unknown_groups = set(present) | set(self._group_owner)
        self._dirty_groups = set(self._unknown_groups)
        self._dirty_flows = dict.fromkeys(self._installed_flows)
        if self._dirty_flows:
            self._dirty_flows.update(dict.fromkeys(refs))
        else:
            self._dirty_flows = dict.fromkeys(refs)
        stats = await self._commit_locked()
        self._adopt = False
        return stats

    # -- removal ----------------------------------------------------------------------------
    async def remove_all(self) -> Removal:
        """Delete everything of ours the switch holds, whatever this run installed: every flow
        with our cookie's app bits (every generation, learned flows too), then every group of
        ours it may hold (the registry's ids, the installed ones, the listed ones in our range),
        in one bundle; then forget the desired and installed state and record no group ids.
        The next commit adopts the switch as at start-up. (``ovsproxy cleanup`` and
        ``--cleanup``.)"""
        async with self._lock:
            app = pl.COOKIE_APP << pl.COOKIE_APP_SHIFT
            flows = len(await self.switch.flow_cookies(app, pl.COOKIE_APP_MASK))
            recorded = await self.registry.load() if self.registry is not None else None
            present = set(self.installed_groups) | self._unknown_groups | (recorded or set())
            listed: set[int] | None = None
            try:
                listed = await self.switch.group_ids()
            except Exception as exc:  # statistics too large to list: the registry's ids only
                log.warning("cannot list the switch's groups (%s): removing recorded ones", exc)
            present = {gid for gid in present | (listed or set()) if self._ours(gid)}
            # What was there: the listed ones when the switch could list them.
            groups = tuple(sorted(present if listed is None else present & listed))
            if flows or present:
                bundle = self.switch.bundle()
                try:
                    bundle.add(of.FlowMod.delete(cookie=app, cookie_mask=pl.COOKIE_APP_MASK))
                    for gid in sorted(present):  # a DELETE of a missing group is a no-op
                        bundle.add(delete_group(gid))
                    await bundle.commit()
                except BaseException:
                    with contextlib.suppress(Exception):
                        await bundle.discard()
                    raise
            self._owners.clear()
            self._flow_refs.clear()
            self._group_owner.clear()
            self._installed_flows.clear()
            self.installed_groups.clear()
            self._unknown_groups.clear()
            self._dirty_flows.clear()
            self._dirty_groups.clear()
            self._stale_generations.clear()
            self._adopt = True
            if self.registry is not None and recorded:
                await self.registry.save(set())
            self._saved_group_ids = set()
            return Removal(flows, groups)

    # -- introspection ----------------------------------------------------------------------
    def dump(self) -> list[str]:
        """Installed groups and flows in ovs-ofctl syntax."""
        lines = []
        for gid in sorted(self.installed_groups):
            group = self.installed_groups[gid]
            # Text is built per bucket: a large group is no single OpenFlow message.
            text = f"group_id={gid},type=select"
            if group.selection_method is not None:
                text += "," + group.selection_method.to_text()
            # in the switch's order, as ovs-ofctl dump-groups prints them
            for key, spec in group.buckets.items():
                bucket = of.Bucket(group.ids[key], spec.actions, spec.weight)
                text += "," + bucket.to_text(of.GroupType.SELECT)
            lines.append(text)
        flows = sorted(
            self.installed_flows.values(),
            key=lambda f: (f.table_id, -f.priority, of.format_flow(f)),
        )
        lines.extend(of.format_flow(f) for f in flows)
        return lines
