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
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from ovsproxy.openflow import protocol as of

MAX_MESSAGE = 0xFFFF
BUNDLE_ADD_OVERHEAD = 16
MAX_BUNDLED_MESSAGE = MAX_MESSAGE - BUNDLE_ADD_OVERHEAD
MAX_BUCKET_ID = 0xFFFFFF00 - 1  # above are OFPG_BUCKET_FIRST/LAST/ALL


@dataclass(frozen=True, slots=True)
class BucketSpec:
    """One endpoint's bucket, before it has an id."""

    key: Hashable  # the endpoint's identity in its group, e.g. (ip, port)
    actions: tuple[of.Action, ...]
    weight: int = 100


@dataclass(frozen=True, slots=True)
class GroupSpec:
    group_id: int
    buckets: tuple[BucketSpec, ...]
    selection_method: str | None = None

    def by_key(self) -> dict[Hashable, BucketSpec]:
        return {b.key: b for b in self.buckets}


@dataclass(slots=True)
class InstalledGroup:
    """What the switch holds for a group we own: bucket ids by endpoint key."""

    group_id: int
    ids: dict[Hashable, int] = field(default_factory=dict)
    buckets: dict[Hashable, BucketSpec] = field(default_factory=dict)
    selection_method: str | None = None

    @property
    def endpoint_count(self) -> int:
        return len(self.buckets)


def bucket_of(spec: BucketSpec, bucket_id: int) -> of.Bucket:
    return of.Bucket(bucket_id=bucket_id, actions=spec.actions, weight=spec.weight)


def _assign_ids(
    desired: GroupSpec, installed: InstalledGroup | None
) -> tuple[dict[Hashable, int], dict[Hashable, BucketSpec]]:
    """Keep every surviving endpoint's bucket id; give new endpoints the lowest free ids."""
    ids: dict[Hashable, int] = {}
    old_ids = installed.ids if installed is not None else {}
    wanted = desired.by_key()
    for key in wanted:
        if key in old_ids:
            ids[key] = old_ids[key]
    used = set(ids.values())
    next_id = 0
    for key in wanted:
        if key in ids:
            continue
        while next_id in used:
            next_id += 1
        if next_id > MAX_BUCKET_ID:
            raise ValueError(f"group {desired.group_id}: more than {MAX_BUCKET_ID} buckets")
        ids[key] = next_id
        used.add(next_id)
    return ids, wanted


def _group_mod(
    command: of.GroupModCommand,
    group_id: int,
    buckets: Sequence[of.Bucket],
    selection_method: str | None,
    command_bucket_id: int = of.OFPG_BUCKET_ALL,
) -> of.GroupMod:
    return of.GroupMod(
        command=command,
        group_id=group_id,
        group_type=of.GroupType.SELECT,
        buckets=tuple(buckets),
        command_bucket_id=command_bucket_id,
        selection_method=selection_method,
    )


def _chunked(
    command: of.GroupModCommand,
    group_id: int,
    buckets: Sequence[of.Bucket],
    selection_method: str | None,
) -> list[of.GroupMod]:
    """ADD/MODIFY with as many buckets as fit, then INSERT_BUCKET(LAST) chunks."""
    base = of.group_mod_overhead(selection_method)
    messages: list[of.GroupMod] = []
    chunk: list[of.Bucket] = []
    size = base
    first = True
    for bucket in buckets:
        blen = of.bucket_length(bucket)
        if chunk and size + blen > MAX_BUNDLED_MESSAGE:
            messages.append(
                _group_mod(
                    command if first else of.GroupModCommand.INSERT_BUCKET,
                    group_id,
                    chunk,
                    selection_method,
                    of.OFPG_BUCKET_ALL if first else of.OFPG_BUCKET_LAST,
                )
            )
            first = False
            chunk, size = [], of.group_mod_overhead(None)
        chunk.append(bucket)
        size += blen
    messages.append(
        _group_mod(
            command if first else of.GroupModCommand.INSERT_BUCKET,
            group_id,
            chunk,
            selection_method,
            of.OFPG_BUCKET_ALL if first else of.OFPG_BUCKET_LAST,
        )
    )
    return messages


def _size(messages: Sequence[of.GroupMod]) -> int:
    return sum(of.group_mod_length(m) for m in messages)


@dataclass(frozen=True, slots=True)
class GroupPlan:
    messages: tuple[of.GroupMod, ...]
    result: InstalledGroup | None  # the installed state once the messages are applied
    kind: str  # "none", "add", "modify", "incremental", "delete"


def plan_group(
    desired: GroupSpec | None, installed: InstalledGroup | None, *, present_unknown: bool = False
) -> GroupPlan:
    """The GroupMods that take the switch from ``installed`` to ``desired``.

    ``present_unknown``: the switch has a group with this id whose content we do not know
    (after an agent restart or an uncertain commit): it is rewritten whole with MODIFY.
    """
    if desired is None:
        if installed is None and not present_unknown:
            return GroupPlan((), None, "none")
        group_id = installed.group_id if installed is not None else None
        assert group_id is not None or present_unknown
        return GroupPlan((), None, "delete")  # deletes are emitted by the datapath, after flows
    ids, wanted = _assign_ids(desired, installed)
    result = InstalledGroup(desired.group_id, ids, wanted, desired.selection_method)
    ordered = sorted(wanted, key=ids.__getitem__)
    all_buckets = [bucket_of(wanted[k], ids[k]) for k in ordered]
    if installed is None:
        command = of.GroupModCommand.MODIFY if present_unknown else of.GroupModCommand.ADD
        return GroupPlan(
            tuple(_chunked(command, desired.group_id, all_buckets, desired.selection_method)),
            result,
            "add",
        )
    if (
        installed.selection_method == desired.selection_method
        and installed.ids == ids
        and all(installed.buckets[k] == wanted[k] for k in wanted)
    ):
        return GroupPlan((), result, "none")
    full = _chunked(
        of.GroupModCommand.MODIFY, desired.group_id, all_buckets, desired.selection_method
    )
    if installed.selection_method != desired.selection_method:
        return GroupPlan(tuple(full), result, "modify")
    removed = [k for k in installed.ids if k not in wanted or installed.buckets[k] != wanted[k]]
    inserted = [k for k in ordered if k not in installed.ids or k in removed]
    incremental: list[of.GroupMod] = [
        _group_mod(of.GroupModCommand.REMOVE_BUCKET, desired.group_id, (), None, installed.ids[k])
        for k in removed
    ]
    if inserted:
        incremental += _chunked(
            of.GroupModCommand.INSERT_BUCKET,
            desired.group_id,
            [bucket_of(wanted[k], ids[k]) for k in inserted],
            None,
        )
        # INSERT_BUCKET chunks all append at the end.
        incremental = [
            m
            if m.command != of.GroupModCommand.INSERT_BUCKET
            else _group_mod(m.command, m.group_id, m.buckets, None, of.OFPG_BUCKET_LAST)
            for m in incremental
        ]
    if _size(incremental) < _size(full):
        return GroupPlan(tuple(incremental), result, "incremental")
    return GroupPlan(tuple(full), result, "modify")


def delete_group(group_id: int) -> of.GroupMod:
    return of.GroupMod(
        command=of.GroupModCommand.DELETE, group_id=group_id, group_type=of.GroupType.SELECT
    )
