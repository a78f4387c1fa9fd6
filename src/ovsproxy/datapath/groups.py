"""Select-group planning: what to send to move one group from its installed to its desired
state. Pure: values in, a list of GroupMods out; the datapath sends them.

Rules (seed 003, and beyond Antrea):

* A group is built completely in memory and sent once; nothing is sent when the desired group
  equals the installed one.
* Every endpoint keeps a stable bucket id within its group. An added endpoint is one
  INSERT_BUCKET carrying only its bucket; a removed endpoint is one REMOVE_BUCKET by id. A full
  MODIFY is sent instead whenever it is smaller on the wire (so a change that touches most of a
  group is one MODIFY, and a one-endpoint change to a 1,000-endpoint group is ~60 bytes).
* A message may not exceed 65,535 bytes, and inside a bundle the BUNDLE_ADD wrapper takes 16 of
  them. A group whose encoding is larger goes as ADD/MODIFY with the buckets that fit, then
  INSERT_BUCKET chunks, sized from the real encoded length of each bucket.

Memory: a group is kept as what it sends. A bucket's actions are kept as their encoding
(``BucketSpec.wire``), decoded only when read (``BucketSpec.actions``); the installed state of a
group written whole shares the desired group's tuple of buckets (ids 0..n-1 in its order), and
its messages are built from those encodings (``EncodedGroupMod``), so a full sync makes no value
per bucket at all.

Cost: planning a new group is one bucket encoding per endpoint and one GroupMod (a full sync
plans 10,000 of them); planning a change costs a dict pass over the group's endpoints plus the
encodings of the buckets that changed -- the size of the full MODIFY it is compared with comes
from the installed group's running byte count, not from encoding the whole group again.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ovsproxy.openflow import protocol as of
from ovsproxy.openflow.protocol.actions import decode_actions
from ovsproxy.openflow.protocol.templates import BUCKET_OVERHEAD, bucket_wire, encoded_group_mod

MAX_MESSAGE = 0xFFFF
BUNDLE_ADD_OVERHEAD = 16
MAX_BUNDLED_MESSAGE = MAX_MESSAGE - BUNDLE_ADD_OVERHEAD
MAX_BUCKET_ID = 0xFFFFFF00 - 1  # above are OFPG_BUCKET_FIRST/LAST/ALL

_SELECT = of.GroupType.SELECT
_ADD = of.GroupModCommand.ADD
_MODIFY = of.GroupModCommand.MODIFY
_ADD_OR_MOD = of.GroupModCommand.ADD_OR_MOD
_INSERT = of.GroupModCommand.INSERT_BUCKET
_REMOVE = of.GroupModCommand.REMOVE_BUCKET
_BASE_OVERHEAD = of.group_mod_overhead(None)


# Named tuples, not dataclasses: a full sync builds 100,000 bucket specs, and staging compares
# groups bucket by bucket; tuple construction and equality run in C.
class BucketSpec(NamedTuple):
    """One endpoint's bucket, before it has an id: its actions as their encoding (the
    concatenated ``Action.wire``s; ``bucket_spec`` makes one from values)."""

    key: Hashable  # the endpoint's identity in its group (services: an int, see service_flows.py)
    wire: bytes
    weight: int = 100

    @property
    def actions(self) -> tuple[of.Action, ...]:
        """The actions as values (decoded: they are kept encoded)."""
        wire = self.wire
        return decode_actions(wire, 0, len(wire))


def bucket_spec(key: Hashable, actions: Sequence[of.Action], weight: int = 100) -> BucketSpec:
    return BucketSpec(key, b"".join([a.wire for a in actions]), weight)


class SelectionMethod(NamedTuple):
    """A select group's selection method: Open vSwitch's ``name`` ("hash", "dp_hash") and,
    for "hash", the fields it hashes (none: OVS's default hash). INSERT_BUCKET and
    REMOVE_BUCKET do not carry it: OVS keeps the group's own (EXT-570)."""

    name: str
    fields: tuple[str, ...] = ()

    def to_text(self) -> str:
        """As ``ovs-ofctl dump-groups`` prints it."""
        text = f"selection_method={self.name}"
        names = [of.get_field(f).mf_name for f in self.fields]
        if len(names) == 1:
            return f"{text},fields={names[0]}"
        return f"{text},fields({','.join(names)})" if names else text


class GroupSpec(NamedTuple):
    group_id: int
    buckets: tuple[BucketSpec, ...]
    selection_method: SelectionMethod | None = None

    def by_key(self) -> dict[Hashable, BucketSpec]:
        return {b.key: b for b in self.buckets}


class InstalledGroup:
    """What the switch holds for a group we own: bucket ids by endpoint key.

    ``bucket_bytes`` is the encoded size of all its buckets (what a full MODIFY carries
    besides its header), or -1 when unknown (then it is computed when needed).

    A group written whole (most groups: a full sync writes every group whole, and most never
    change) keeps only the desired group's tuple of buckets (``specs``, shared with the
    ``GroupSpec``): its ids are 0..n-1 in that order, and ``buckets`` and ``ids`` are built from
    it when read (``ids`` is then kept: readers look ids up one by one). A group changed bucket
    by bucket keeps both dicts.
    """

    __slots__ = ("_buckets", "_ids", "_specs", "bucket_bytes", "group_id", "selection_method")

    def __init__(
        self,
        group_id: int,
        ids: dict[Hashable, int] | None = None,
        buckets: dict[Hashable, BucketSpec] | None = None,
        selection_method: SelectionMethod | None = None,
        bucket_bytes: int = -1,
        *,
        specs: tuple[BucketSpec, ...] | None = None,
    ) -> None:
        self.group_id = group_id
        self._ids = ids
        self._buckets = buckets if buckets is not None or specs is not None else {}
        self._specs = specs if buckets is None else None
        self.selection_method = selection_method
        self.bucket_bytes = bucket_bytes

    @property
    def buckets(self) -> dict[Hashable, BucketSpec]:
        buckets = self._buckets
        if buckets is None:
            specs = self._specs
            assert specs is not None
            return {b.key: b for b in specs}  # not kept: see the class docstring
        return buckets

    @property
    def specs(self) -> tuple[BucketSpec, ...] | None:
        """The buckets in id order 0..n-1, when the group was written whole."""
        return self._specs

    @property
    def ids(self) -> dict[Hashable, int]:
        ids = self._ids
        if ids is None:
            keys = self.buckets
            ids = self._ids = dict(zip(keys, range(len(keys)), strict=True))
        return ids

    @ids.setter
    def ids(self, value: dict[Hashable, int]) -> None:
        self._ids = value

    @property
    def endpoint_count(self) -> int:
        specs = self._specs
        return len(specs) if specs is not None else len(self.buckets)

    def _key(self) -> tuple[Any, ...]:
        return (self.group_id, self.ids, self.buckets, self.selection_method, self.bucket_bytes)

    def __eq__(self, other: object) -> bool:
        if type(other) is not InstalledGroup:
            return NotImplemented
        return self._key() == other._key()

    # Unhashable: mutable, like the dataclass it replaced (typeshed types __hash__ a method).
    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"InstalledGroup(group_id={self.group_id}, ids={self.ids!r}, "
            f"buckets={self.buckets!r}, selection_method={self.selection_method!r}, "
            f"bucket_bytes={self.bucket_bytes})"
        )


def _bucket_len(spec: BucketSpec) -> int:
    return len(spec.wire) + BUCKET_OVERHEAD


def _assign_ids(
    desired: GroupSpec,
    installed: InstalledGroup | None,
    wanted: dict[Hashable, BucketSpec] | None = None,
) -> tuple[dict[Hashable, int], dict[Hashable, BucketSpec]]:
    """Keep every surviving endpoint's bucket id; give new endpoints the lowest free ids.
    ``wanted``: ``desired.by_key()``, when the caller has it already."""
    if wanted is None:
        wanted = desired.by_key()
    if installed is None or not installed.endpoint_count:
        return dict(zip(wanted, range(len(wanted)), strict=True)), wanted
    old_ids = installed.ids
    ids: dict[Hashable, int] = {}
    new: list[Hashable] = []
    for key in wanted:
        old = old_ids.get(key)
        if old is None:
            new.append(key)
        else:
            ids[key] = old
    if new:
        used = set(ids.values())
        next_id = 0
        for key in new:
            while next_id in used:
                next_id += 1
            if next_id > MAX_BUCKET_ID:
                raise ValueError(f"group {desired.group_id}: more than {MAX_BUCKET_ID} buckets")
            ids[key] = next_id
            used.add(next_id)
    return ids, wanted


_OVERHEADS: dict[SelectionMethod | None, int] = {None: _BASE_OVERHEAD}


def _overhead(selection_method: SelectionMethod | None) -> int:
    """A GroupMod's size without buckets (with its selection method property)."""
    size = _OVERHEADS.get(selection_method)
    if size is None:
        assert selection_method is not None
        size = _OVERHEADS[selection_method] = of.group_mod_overhead(*selection_method)
    return size


def _group_mod(
    command: of.GroupModCommand,
    group_id: int,
    buckets: Sequence[bytes],
    selection_method: SelectionMethod | None,
    command_bucket_id: int = of.OFPG_BUCKET_ALL,
) -> of.EncodedGroupMod:
    if selection_method is None:
        return encoded_group_mod(
            command, group_id, _SELECT, buckets, command_bucket_id=command_bucket_id
        )
    name, fields = selection_method
    return encoded_group_mod(
        command,
        group_id,
        _SELECT,
        buckets,
        command_bucket_id=command_bucket_id,
        selection_method=name,
        fields=fields,
    )


def group_mod_chunks(
    command: of.GroupModCommand,
    group_id: int,
    buckets: Sequence[of.Bucket | bytes],
    selection_method: SelectionMethod | None = None,
    *,
    total: int = -1,
    limit: int = MAX_BUNDLED_MESSAGE,
) -> list[of.EncodedGroupMod]:
    """The messages that write ``buckets`` (values or their encodings) to a select group of
    any size: ``command`` (ADD, MODIFY, ADD_OR_MOD or INSERT_BUCKET) with as many buckets as
    fit in ``limit`` bytes, then INSERT_BUCKET(LAST) chunks, so the switch ends up with the
    buckets in the given order. Sent in order in one atomic bundle; the default limit leaves
    room for the BUNDLE_ADD header. ``total``: the buckets' encoded size, if the caller knows
    it. A bucket that fits in no message raises ``MessageTooLarge``."""
    wires = [b if isinstance(b, bytes) else b.wire for b in buckets]
    base = _BASE_OVERHEAD if selection_method is None else _overhead(selection_method)
    if total < 0:
        total = sum([len(w) for w in wires])
    first_bucket_id = of.OFPG_BUCKET_LAST if command == _INSERT else of.OFPG_BUCKET_ALL
    if base + total <= limit:  # the usual case: one message
        return [_group_mod(command, group_id, wires, selection_method, first_bucket_id)]
    chunks: list[list[bytes]] = [[]]
    size = base
    for wire in wires:
        blen = len(wire)
        if blen > limit - max(base, _BASE_OVERHEAD):
            bucket_id = int.from_bytes(wire[4:8], "big")
            raise of.MessageTooLarge(f"group {group_id} bucket {bucket_id}", blen, limit)
        if chunks[-1] and size + blen > limit:
            chunks.append([])
            size = _BASE_OVERHEAD
        chunks[-1].append(wire)
        size += blen
    first, *rest = chunks
    return [
        _group_mod(command, group_id, first, selection_method, first_bucket_id),
        *(_group_mod(_INSERT, group_id, chunk, None, of.OFPG_BUCKET_LAST) for chunk in rest),
    ]


def _size(messages: Sequence[of.EncodedGroupMod]) -> int:
    return sum([m.length for m in messages])


@dataclass(frozen=True, slots=True)
class GroupPlan:
    messages: tuple[of.EncodedGroupMod, ...]  # (``decoded()`` for their values)
    result: InstalledGroup | None  # the installed state once the messages are applied
    kind: str  # "none", "add", "modify", "incremental", "delete"


def _wires(ids: dict[Hashable, int], wanted: dict[Hashable, BucketSpec], keys: Any) -> list[bytes]:
    wires: list[bytes] = []
    add = wires.append
    for k in keys:
        _, wire, weight = wanted[k]
        add(bucket_wire(ids[k], wire, weight))
    return wires


def plan_group(
    desired: GroupSpec | None,
    installed: InstalledGroup | None,
    *,
    present_unknown: bool = False,
    replay: InstalledGroup | None = None,
) -> GroupPlan:
    """The GroupMods that take the switch from ``installed`` to ``desired``.

    ``present_unknown``: the switch may have a group with this id whose content we do not
    know (after an agent restart, a reconnection or an uncertain commit): it is written whole
    with ADD_OR_MOD, which works whether or not the group exists.

    ``replay`` (with ``installed`` None): what the switch held before it lost the group (an
    ovs-vswitchd restart). The group is written whole, its surviving endpoints with the
    bucket ids, weights and order they had: Open vSwitch's "hash" selection scores each
    bucket by its id and weight, ties going to the later bucket, so a connection conntrack
    picks up mid-stream is sent to the endpoint it had (issue 27).
    """
    if desired is not None and installed is None and replay is not None and replay.endpoint_count:
        return _replay_group(desired, replay, present_unknown)
    if desired is None:
        if installed is None and not present_unknown:
            return GroupPlan((), None, "none")
        group_id = installed.group_id if installed is not None else None
        assert group_id is not None or present_unknown
        return GroupPlan((), None, "delete")  # deletes are emitted by the datapath, after flows
    group_id, specs, method = desired
    if installed is None:
        # A new group: ids 0..n-1 in the order of the endpoints; the installed state shares
        # the desired tuple (unless an endpoint key repeats: then the last spec of a key wins).
        if len({key for key, _, _ in specs}) != len(specs):
            specs = tuple(desired.by_key().values())
        wires = [bucket_wire(i, wire, weight) for i, (_, wire, weight) in enumerate(specs)]
        total = sum([len(w) for w in wires])
        command = _ADD_OR_MOD if present_unknown else _ADD
        return GroupPlan(
            tuple(group_mod_chunks(command, group_id, wires, method, total=total)),
            InstalledGroup(group_id, None, None, method, total, specs=specs),  # ids: 0..n-1
            "add",
        )
    if installed.selection_method == method and installed.specs == specs:
        return GroupPlan((), installed, "none")  # the very buckets, in the same order
    wanted = desired.by_key()
    old_buckets = installed.buckets
    if installed.selection_method == method and old_buckets == wanted:
        # Every endpoint is there with the same bucket: ids are kept, nothing to send.
        return GroupPlan((), installed, "none")
    ids, wanted = _assign_ids(desired, installed, wanted)
    ordered = sorted(wanted, key=ids.__getitem__)
    if installed.selection_method != method:
        all_buckets = _wires(ids, wanted, ordered)
        total = sum([len(w) for w in all_buckets])
        return GroupPlan(
            tuple(group_mod_chunks(_MODIFY, group_id, all_buckets, method, total=total)),
            InstalledGroup(group_id, ids, _in_order(wanted, ordered), method, total),
            "modify",
        )
    old_ids = installed.ids
    removed = [k for k, spec in old_buckets.items() if wanted.get(k) != spec]
    removed_set = set(removed)
    inserted = [k for k in ordered if k not in old_ids or k in removed_set]
    new_buckets = _wires(ids, wanted, inserted)
    inserted_bytes = sum([len(w) for w in new_buckets])
    old_total = installed.bucket_bytes
    if old_total < 0:
        old_total = sum([_bucket_len(s) for s in old_buckets.values()])
    removed_bytes = sum([_bucket_len(old_buckets[k]) for k in removed])
    total = old_total - removed_bytes + inserted_bytes
    # The switch's order: what stays, then INSERT_BUCKET(LAST)'s, appended.
    switch_order = [k for k in old_buckets if k not in removed_set and k in wanted] + inserted
    result = InstalledGroup(group_id, ids, _in_order(wanted, switch_order), method, total)
    incremental: list[of.EncodedGroupMod] = [
        _group_mod(_REMOVE, group_id, (), None, old_ids[k]) for k in removed
    ]
    if new_buckets:
        # INSERT_BUCKET chunks all append at the end.
        incremental += group_mod_chunks(_INSERT, group_id, new_buckets, total=inserted_bytes)
    # A full MODIFY: its header(s) and every bucket (a group over the message limit needs
    # one more header per extra chunk; counting one header is enough to compare).
    full_size = _overhead(method) + total
    if _size(incremental) < full_size:
        return GroupPlan(tuple(incremental), result, "incremental")
    all_buckets = _wires(ids, wanted, ordered)
    return GroupPlan(
        tuple(group_mod_chunks(_MODIFY, group_id, all_buckets, method, total=total)),
        InstalledGroup(group_id, ids, _in_order(wanted, ordered), method, total),
        "modify",
    )


def _in_order(
    wanted: dict[Hashable, BucketSpec], order: Sequence[Hashable]
) -> dict[Hashable, BucketSpec]:
    """``wanted`` in the switch's bucket order (an ``InstalledGroup``'s ``buckets`` are)."""
    if len(order) == len(wanted) and all(
        a is b or a == b for a, b in zip(order, wanted, strict=True)
    ):
        return wanted
    return {k: wanted[k] for k in order}


def _replay_group(desired: GroupSpec, replay: InstalledGroup, present_unknown: bool) -> GroupPlan:
    """``plan_group`` with ``replay``: written whole (ADD, or ADD_OR_MOD), every endpoint the
    group had keeping its bucket id and place; new endpoints get the lowest free ids, after
    them (as INSERT_BUCKET would have appended them)."""
    group_id, _, method = desired
    ids, wanted = _assign_ids(desired, replay)
    order = [k for k in replay.buckets if k in wanted]
    kept = set(order)
    order += [k for k in sorted(wanted, key=ids.__getitem__) if k not in kept]
    wires = _wires(ids, wanted, order)
    total = sum([len(w) for w in wires])
    command = _ADD_OR_MOD if present_unknown else _ADD
    return GroupPlan(
        tuple(group_mod_chunks(command, group_id, wires, method, total=total)),
        InstalledGroup(group_id, ids, _in_order(wanted, order), method, total),
        "add",
    )


def delete_group(group_id: int) -> of.GroupMod:
    return of.GroupMod(
        command=of.GroupModCommand.DELETE, group_id=group_id, group_type=of.GroupType.SELECT
    )
