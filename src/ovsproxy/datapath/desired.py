"""The desired state: the groups and flows each owner wants, merged over owners. Pure: no
switch, no I/O; the datapath (``switch_sync.SwitchSync``) holds one and commits what it marks
dirty.

Owners (a Service port, the fixed pipeline, a local pod) ``stage`` the complete set of groups
and flows they want; ``stage`` replaces the owner's sets and marks dirty exactly what changed
(its cost is the size of the owner's old and new sets, not the number of owners). A group has
one owner; a flow several owners want (an EndpointDNAT or mid-stream flow shared by two
Services) is wanted while any of them wants it, and when they disagree the newest asker wins
(with a warning).

Flows are identified as OpenFlow identifies them: (table, priority, match), kept as one bytes
key (its hash is computed once and cached by Python). A flow is kept as staged: a value
(``of.FlowMod``), or its encoding (``FlowMod.wire``) when staged as an ``EncodedFlow`` -- a
flow's value tree (match, instructions, actions, each with its own encoding) costs several
times its bytes, and a 10,000-Service cluster stages 100,000 mid-stream flows.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ovsproxy.datapath.groups import GroupSpec
from ovsproxy.openflow import protocol as of

log = logging.getLogger("ovsproxy.datapath.switch_sync")

FlowKey = bytes  # table (1 byte), priority (2 bytes), then the match's wire encoding

KEY_HEAD = struct.Struct("!BH")
_new_tuple = tuple.__new__


def flow_key(flow: of.FlowMod) -> FlowKey:
    """The identity of a flow in its table: (table, priority, match), as bytes."""
    return KEY_HEAD.pack(flow.table_id, flow.priority) + flow.match.wire


class EncodedFlow(NamedTuple):
    """A flow staged as its encoding: its key and its ``FlowMod.wire``, for the shapes built
    by the hundred thousand (EndpointDNAT), without the value. Only for a flow that sends to
    no group (the planner orders flows after the groups they use by reading the values)."""

    key: FlowKey
    wire: bytes


# Where the parts of a FlowMod's key are in its wire (its body: ``FlowMod.wire``).
_TABLE_AT = 16  # table_id, one byte
_PRIORITY_AT = 22  # priority, two bytes
_MATCH_AT = 40  # the match, its length at +2, padded to 8 bytes
_U16 = struct.Struct("!H")


def encoded_flow(wire: bytes) -> EncodedFlow:
    """The ``EncodedFlow`` of a FlowMod's wire: the key is read from it (the mid-stream
    flows are staged from their wires, ``proxy.mid_stream``)."""
    end = _MATCH_AT + ((_U16.unpack_from(wire, _MATCH_AT + 2)[0] + 7) & ~7)
    key = b"".join(
        (
            wire[_TABLE_AT : _TABLE_AT + 1],
            wire[_PRIORITY_AT : _PRIORITY_AT + 2],
            wire[_MATCH_AT:end],
        )
    )
    return _new_tuple(EncodedFlow, (key, wire))


# A flow as the datapath keeps it: a value, or the wire of one (bytes; see EncodedFlow).
Flow = of.FlowMod | bytes


def flow_value(flow: Flow) -> of.FlowMod:
    """The value of a kept flow (decoded when it is kept as its wire)."""
    return of.decode_flow_mod(flow) if isinstance(flow, bytes) else flow


class DatapathError(RuntimeError):
    """A datapath operation failed: a commit, or a stage that would take a group another
    owner holds. ``owners``: the owners whose messages the switch refused (when it said
    which), so the caller can set them aside and commit everything else."""

    def __init__(self, message: str, owners: Sequence[Hashable] = ()) -> None:
        super().__init__(message)
        self.owners = list(owners)


@dataclass(slots=True, eq=False)
class Owner:
    """What one owner wants. Compared and hashed by identity: the merged state refers to
    owners by this object (updated in place by each ``stage``), not by their key, so a commit
    never hashes an owner key (a dataclass ServicePortName hashes in Python)."""

    key: Hashable
    groups: dict[int, GroupSpec] = field(default_factory=dict)
    # each flow as staged: a value, or (staged as an ``EncodedFlow``) its encoding only
    flows: dict[FlowKey, Flow] = field(default_factory=dict)


# Who wants a flow: its one owner, or (shared) the owners in the order they asked.
FlowRef = Owner | dict[Owner, None]


class DesiredState:
    """Every owner's groups and flows, merged: who wants each flow (``flow_refs``) and owns
    each group (``group_owner``), and what changed since the dirty sets were last taken
    (``dirty_flows``: an ordered set, a dict whose values mean nothing; ``dirty_groups``)."""

    __slots__ = ("dirty_flows", "dirty_groups", "flow_refs", "group_owner", "owners")

    def __init__(self) -> None:
        self.owners: dict[Hashable, Owner] = {}
        self.flow_refs: dict[FlowKey, FlowRef] = {}
        self.group_owner: dict[int, Owner] = {}
        self.dirty_flows: dict[FlowKey, Any] = {}
        self.dirty_groups: set[int] = set()

    def stage(
        self,
        owner: Hashable,
        groups: Iterable[GroupSpec],
        flows: Iterable[of.FlowMod | EncodedFlow],
        restaged: Callable[[Owner, Iterable[int], Iterable[FlowKey]], None] | None = None,
    ) -> Owner | None:
        """Replace everything ``owner`` wants; returns its ``Owner`` when it is new (it wanted
        nothing before and wants something now), else None. ``restaged`` is told of an owner
        staged again, before its sets are replaced: the ``Owner`` (its sets still the old
        ones) and the ids of its groups and the keys of its flows now. Raises
        ``DatapathError`` (and changes nothing) for a group another owner holds."""
        pack = KEY_HEAD.pack
        new_groups = {g.group_id: g for g in groups}
        new_flows: dict[FlowKey, Flow] = {}
        for f in flows:
            if isinstance(f, EncodedFlow):
                key, wire = f
                new_flows[key] = wire
            else:  # flow_key(f): table, priority, the match's wire
                new_flows[pack(f.table_id, f.priority) + f.match.wire] = f
        old = self.owners.get(owner)
        group_owner = self.group_owner
        for gid in new_groups:
            holder = group_owner.get(gid)
            if holder is not None and holder is not old:
                raise DatapathError(f"group {gid} is already owned by {holder.key}, not {owner}")
        refs = self.flow_refs
        dirty_flows = self.dirty_flows
        if old is None:
            if not (new_groups or new_flows):
                return None
            me = self.owners[owner] = Owner(owner, new_groups, new_flows)
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
            self.dirty_groups.update(new_groups)
            return me
        if restaged is not None:
            restaged(old, new_groups, new_flows)
        old_flows = old.flows
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
                self.dirty_groups.add(gid)
                if gid not in new_groups:
                    group_owner.pop(gid, None)
        for gid, spec in new_groups.items():
            group_owner[gid] = old
            if old_groups.get(gid) != spec:
                self.dirty_groups.add(gid)
        if new_groups or new_flows:
            old.groups, old.flows = new_groups, new_flows
        else:
            del self.owners[owner]
        return None

    def _ref_shared(self, key: FlowKey, ref: FlowRef, owner: Owner) -> None:
        if isinstance(ref, dict):
            ref.pop(owner, None)
            ref[owner] = None  # the newest asker goes last
        elif ref is not owner:
            self.flow_refs[key] = {ref: None, owner: None}

    def _unref_flow(self, key: FlowKey, owner: Owner) -> None:
        refs = self.flow_refs
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
        self.dirty_flows[key] = None

    def shared_owner(self, key: FlowKey, sharers: dict[Owner, None]) -> Owner:
        """Of the owners that share a flow, whose flow is wanted: they should want the same
        one; if not, the newest asker wins (and we say so)."""
        flows = [o.flows[key] for o in sharers]
        if any(f != flows[0] for f in flows[1:]):
            log.warning("owners %s want different flows for %r", [o.key for o in sharers], key)
        return next(reversed(sharers))

    def flow(self, key: FlowKey) -> Flow | None:
        """The flow wanted with this key, as kept (a value or its wire), or None."""
        ref = self.flow_refs.get(key)
        if ref is None:
            return None
        owner = ref if isinstance(ref, Owner) else self.shared_owner(key, ref)
        return owner.flows[key]

    def group(self, gid: int) -> GroupSpec | None:
        owner = self.group_owner.get(gid)
        if owner is None:
            return None
        return owner.groups.get(gid)

    def largest_group(self) -> int:
        """The number of buckets of the largest group wanted (0 for none)."""
        return max(
            (len(spec.buckets) for owner in self.owners.values() for spec in owner.groups.values()),
            default=0,
        )

    def take_dirty(self) -> tuple[set[int], dict[FlowKey, Any]]:
        """The dirty groups and flows, handed over (a commit takes them); both sets are new
        and empty afterwards."""
        taken = self.dirty_groups, self.dirty_flows
        self.dirty_groups, self.dirty_flows = set(), {}
        return taken

    def restore_dirty(self, groups: set[int], flows: dict[FlowKey, Any]) -> None:
        """A commit failed: what it took is dirty again (ahead of what was staged since)."""
        self.dirty_groups |= groups
        flows.update(self.dirty_flows)
        self.dirty_flows = flows

    def clear(self) -> None:
        """Nothing wanted, nothing dirty."""
        self.owners.clear()
        self.flow_refs.clear()
        self.group_owner.clear()
        self.dirty_flows.clear()
        self.dirty_groups.clear()
