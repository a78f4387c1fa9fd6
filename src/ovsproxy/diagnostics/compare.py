"""What differs between the switch state a fresh agent would install and what a switch holds.

Pure: values in, ``Difference`` values out (``ovsproxy verify`` reads both sides). The desired
side comes from a real ``SwitchSync`` that committed into a ``RecordingSwitch`` (the same
staging and planning code as the agent, no OVS); the installed side from OVS's own dumps.

What is compared, and what is not (on purpose):

* Flows by OpenFlow's identity (table, priority, match), then everything else OVS keeps
  (instructions, timeouts, flags, importance) and the cookie's app and category. The cookie's
  generation differs between any two agent runs, so it is compared separately
  (``generation_differences``). Learned flows (generation 0, session affinity) are state, not
  configuration: left out.
* Group ids are an allocation, not a requirement: a fresh agent numbers its groups from the
  lowest id, a running one keeps the ids it handed out. Desired groups are matched to the
  installed ones through the flows that use them (the ServiceLB flow of the same match sends
  to group G on the switch: desired group g *is* G); only unmatched groups keep their id.
* Buckets are compared as a multiset of (weight, actions): bucket ids are stable per endpoint
  in a running agent and 0..n-1 in a fresh one, both right.
* A group OVS cannot describe (GROUP_DESC over 64 KB) is compared by its bucket count only
  (``InstalledGroup.buckets`` is None); the caller probes bucket ids and adds notes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath.desired import FlowKey, flow_key
from ovsproxy.datapath.groups import InstalledGroup, SelectionMethod
from ovsproxy.openflow import protocol as of
from ovsproxy.openflow.protocol.actions import format_instructions

MISSING, UNEXPECTED, DIFFERS = "missing", "unexpected", "differs"
# The cookie bits a desired flow must match on the switch: app and category (not generation).
_COOKIE_COMPARED = pl.COOKIE_APP_MASK | (0xFF << pl.COOKIE_CATEGORY_SHIFT)


@dataclass(frozen=True, slots=True)
class Difference:
    """One difference, readable: ``kind`` missing/unexpected/differs, ``what`` flow, group,
    route or ovsdb (the steering table's are ``steering.compare``'s), ``text`` the object in
    ovs-ofctl (or ip route) syntax, ``detail`` what exactly differs (for ``differs``)."""

    kind: str
    what: str
    text: str
    detail: str = ""

    def __str__(self) -> str:
        lines = [f"{self.kind} {self.what}: {self.text}"]
        lines += [f"    {part}" for part in self.detail.splitlines()]
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class GroupView:
    """A select group as compared: ``buckets`` as (weight, actions text) multiset, None when
    OVS cannot describe it (then only ``n_buckets`` is known)."""

    group_id: int
    selection_method: str | None
    n_buckets: int
    buckets: Counter[tuple[int, str]] | None
    text: str  # ovs-ofctl dump-groups syntax (or a summary for a group too large to dump)


class _RecordedBundle:
    """A ``datapath.StreamingBundle`` that counts its messages (keeps them, if its switch
    keeps) and commits them nowhere."""

    backlog = 0  # nothing is ever waiting for a socket

    def __init__(self, switch: RecordingSwitch) -> None:
        self.switch = switch
        self.count = 0
        self.kept: list[of.Message] | None = [] if switch.keep else None
        self.state = "open"

    def add(self, msg: of.Message) -> int:
        self.count += 1
        if self.kept is not None:
            self.kept.append(msg)
        return self.count

    def add_bodies(self, msg_type: int, bodies: Sequence[bytes]) -> None:
        self.count += len(bodies)
        if self.kept is not None:
            kind = _ENCODED[msg_type]
            self.kept.extend(kind(body) for body in bodies)

    async def drain(self) -> None:
        return None

    async def commit(self) -> None:
        self.state = "committed"
        self.switch.messages += self.count
        if self.kept is not None:
            self.switch.bundles.append(self.kept)

    async def discard(self) -> None:
        self.state = "discarded"
        self.count = 0
        self.kept = [] if self.kept is not None else None


_ENCODED: dict[int, type[of.EncodedFlowMod] | type[of.EncodedGroupMod]] = {
    int(of.MsgType.FLOW_MOD): of.EncodedFlowMod,
    int(of.MsgType.GROUP_MOD): of.EncodedGroupMod,
}


class RecordingSwitch:
    """A ``switch_sync.Switch`` that holds nothing and accepts every bundle: a ``SwitchSync`` over
    it computes, stages and plans exactly what it would send to an empty switch. With
    ``keep``, ``bundles`` holds each committed bundle's messages, in order (the benchmarks'
    baselines are made of them)."""

    connected = True

    def __init__(self, *, keep: bool = False) -> None:
        self.keep = keep
        self.messages = 0  # messages committed, over all bundles
        self.bundles: list[list[of.Message]] = []

    def bundle(self) -> _RecordedBundle:
        return _RecordedBundle(self)

    async def group_ids(self) -> set[int]:
        return set()

    async def flow_cookies(self, cookie: int, mask: int) -> list[int]:
        return []

    async def flow_keys(self, cookie: int, mask: int) -> list[tuple[int, bytes]]:
        return []


# -- views --------------------------------------------------------------------------------


def _bucket_text(weight: int | None, actions: Iterable[of.Action]) -> tuple[int, str]:
    return (1 if weight is None else weight, of.format_actions(actions))


def desired_group_view(group: InstalledGroup) -> GroupView:
    buckets: Counter[tuple[int, str]] = Counter(
        _bucket_text(spec.weight, spec.actions) for spec in group.buckets.values()
    )
    ordered = sorted(group.buckets.values(), key=lambda s: group.ids[s.key])
    method = group.selection_method.to_text() if group.selection_method is not None else None
    text = f"group_id={group.group_id},type=select"
    if method:
        text += f",{method}"
    for spec in ordered:
        text += "," + of.Bucket(group.ids[spec.key], spec.actions, spec.weight).to_text()
    return GroupView(group.group_id, method, len(ordered), buckets, text)


def installed_selection_method(group: of.GroupMod) -> SelectionMethod | None:
    """A dumped group's selection method as the datapath keeps it."""
    if not group.selection_method:
        return None
    return SelectionMethod(group.selection_method, tuple(f.name for f in group.fields))


def installed_group_view(group: of.GroupMod) -> GroupView:
    buckets: Counter[tuple[int, str]] = Counter(
        _bucket_text(b.weight, b.actions) for b in group.buckets
    )
    method = installed_selection_method(group)
    return GroupView(
        group.group_id,
        method.to_text() if method is not None else None,
        len(group.buckets),
        buckets,
        of.format_group(group),
    )


def undescribed_group_view(group_id: int, n_buckets: int) -> GroupView:
    text = f"group_id={group_id},type=select ({n_buckets} buckets, too large to dump)"
    return GroupView(group_id, None, n_buckets, None, text)


def comparable_flow(flow: of.FlowMod) -> of.FlowMod:
    """The flow with its cookie's generation cleared (what two agent runs agree on)."""
    return flow.replace(cookie=flow.cookie & _COOKIE_COMPARED, command=of.FlowModCommand.ADD)


def is_learned(flow: of.FlowMod) -> bool:
    return pl.cookie_generation(flow.cookie) == pl.LEARNED_GENERATION


def _groups_of(flow: of.FlowMod) -> list[int]:
    return [
        action.group_id
        for instruction in flow.instructions
        if isinstance(instruction, of.ApplyActions)
        for action in instruction.actions
        if isinstance(action, of.GroupAction)
    ]


def _renumber(flow: of.FlowMod, mapping: Mapping[int, int]) -> of.FlowMod:
    if not mapping or not _groups_of(flow):
        return flow
    instructions: list[of.Instruction] = []
    for instruction in flow.instructions:
        if isinstance(instruction, of.ApplyActions):
            actions = [
                of.GroupAction(mapping.get(a.group_id, a.group_id))
                if isinstance(a, of.GroupAction)
                else a
                for a in instruction.actions
            ]
            instruction = of.ApplyActions(actions)
        instructions.append(instruction)
    return flow.replace(instructions=tuple(instructions))


# -- the comparison ----------------------------------------------------------------------


def group_mapping(
    desired_flows: Mapping[FlowKey, of.FlowMod],
    installed_flows: Mapping[FlowKey, of.FlowMod],
    desired_groups: Mapping[int, GroupView],
    installed_groups: Mapping[int, GroupView],
) -> dict[int, int]:
    """Desired group id -> the installed group that plays its part: first through the flows
    of the same identity that use them; a desired group no flow ties (its flow is gone) is
    matched to an untied installed group of the same buckets, else keeps its own id if that is
    untied (else it has no installed counterpart and is left out)."""
    mapping: dict[int, int] = {}
    taken: set[int] = set()
    for key, want in desired_flows.items():
        have = installed_flows.get(key)
        if have is None:
            continue
        wanted, found = _groups_of(want), _groups_of(have)
        if len(wanted) != len(found):
            continue
        for gid, installed in zip(wanted, found, strict=True):
            if gid not in mapping and installed not in taken:
                mapping[gid] = installed
                taken.add(installed)
    untied = [gid for gid in sorted(desired_groups) if gid not in mapping]
    for gid in untied:
        wanted_group = desired_groups[gid]
        for candidate in sorted(installed_groups):
            found_group = installed_groups[candidate]
            if (
                candidate not in taken
                and found_group.buckets is not None
                and found_group.buckets == wanted_group.buckets
            ):
                mapping[gid] = candidate
                taken.add(candidate)
                break
    for gid in untied:
        if gid not in mapping and gid not in taken:
            mapping[gid] = gid
            taken.add(gid)
    return mapping


def _group_detail(want: GroupView, have: GroupView) -> str:
    parts: list[str] = []
    if want.selection_method != have.selection_method and have.buckets is not None:
        parts.append(
            f"{have.selection_method or 'selection_method=default'}, "
            f"wanted {want.selection_method or 'selection_method=default'}"
        )
    if want.buckets is None or have.buckets is None:
        if want.n_buckets != have.n_buckets:
            parts.append(f"{have.n_buckets} buckets, wanted {want.n_buckets}")
        return "\n".join(parts)
    for label, side in (
        ("missing", want.buckets - have.buckets),
        ("unexpected", have.buckets - want.buckets),
    ):
        for (weight, actions), count in sorted(side.items(), key=lambda kv: kv[0][1]):
            times = f" x{count}" if count > 1 else ""
            parts.append(f"bucket {label}{times}: weight:{weight},actions={actions}")
    return "\n".join(parts)


def _flow_detail(want: of.FlowMod, have: of.FlowMod) -> str:
    parts: list[str] = []
    if want.instructions != have.instructions:
        parts.append(
            f"actions={format_instructions(have.instructions)}, "
            f"wanted actions={format_instructions(want.instructions)}"
        )
    for name in ("idle_timeout", "hard_timeout", "flags", "importance"):
        if getattr(want, name) != getattr(have, name):
            parts.append(f"{name} {getattr(have, name)}, wanted {getattr(want, name)}")
    if (want.cookie ^ have.cookie) & _COOKIE_COMPARED:
        parts.append(f"cookie {have.cookie:#x}, wanted category of {want.cookie:#x}")
    return "\n".join(parts)


def compare_switch(
    desired_flows: Mapping[FlowKey, of.FlowMod],
    desired_groups: Mapping[int, GroupView],
    installed_flows: Mapping[FlowKey, of.FlowMod],
    installed_groups: Mapping[int, GroupView],
) -> list[Difference]:
    """Every difference in flows and groups, groups first, each list in a stable order."""
    mapping = group_mapping(desired_flows, installed_flows, desired_groups, installed_groups)
    diffs: list[Difference] = []
    wanted_ids: set[int] = set()
    for gid in sorted(desired_groups):
        want_group = desired_groups[gid]
        target = mapping.get(gid)
        if target is None:  # its id is another group's on the switch: not installed
            diffs.append(Difference(MISSING, "group", want_group.text))
            continue
        wanted_ids.add(target)
        have_group = installed_groups.get(target)
        shown = want_group if target == gid else _renumber_view(want_group, target)
        if have_group is None:
            diffs.append(Difference(MISSING, "group", shown.text))
            continue
        detail = _group_detail(want_group, have_group)
        if detail:
            diffs.append(Difference(DIFFERS, "group", have_group.text, detail))
    for gid in sorted(set(installed_groups) - wanted_ids):
        diffs.append(Difference(UNEXPECTED, "group", installed_groups[gid].text))
    for key in sorted(
        desired_flows.keys() | installed_flows.keys(),
        key=_flow_order(desired_flows, installed_flows),
    ):
        want_raw, have = desired_flows.get(key), installed_flows.get(key)
        want = _renumber(want_raw, mapping) if want_raw is not None else None
        if have is None:
            assert want is not None
            diffs.append(Difference(MISSING, "flow", of.format_flow(want)))
        elif want is None:
            diffs.append(Difference(UNEXPECTED, "flow", of.format_flow(have)))
        elif comparable_flow(want) != comparable_flow(have):
            diffs.append(
                Difference(DIFFERS, "flow", of.format_flow(have), _flow_detail(want, have))
            )
    return diffs


def _renumber_view(view: GroupView, group_id: int) -> GroupView:
    text = view.text.replace(f"group_id={view.group_id},", f"group_id={group_id},", 1)
    return GroupView(group_id, view.selection_method, view.n_buckets, view.buckets, text)


def _flow_order(
    desired: Mapping[FlowKey, of.FlowMod], installed: Mapping[FlowKey, of.FlowMod]
) -> Callable[[FlowKey], tuple[int, int, str]]:
    def order(key: FlowKey) -> tuple[int, int, str]:
        flow = desired.get(key) or installed[key]
        return (flow.table_id, -flow.priority, of.format_flow(flow))

    return order


def generation_differences(
    installed_flows: Mapping[FlowKey, of.FlowMod], generation: int | None
) -> list[Difference]:
    """Flows of another agent run than the one OVSDB records (``generation``): a hand-over
    that never finished. One line per generation, with a count."""
    if generation is None:
        return []
    other: Counter[int] = Counter()
    example: dict[int, of.FlowMod] = {}
    for flow in installed_flows.values():
        gen = pl.cookie_generation(flow.cookie)
        if gen is not None and gen != generation:
            other[gen] += 1
            example.setdefault(gen, flow)
    return [
        Difference(
            DIFFERS,
            "flow",
            of.format_flow(example[gen]),
            f"{count} flow(s) of cookie generation {gen}; OVSDB records generation {generation}",
        )
        for gen, count in sorted(other.items())
    ]


def flows_by_key(flows: Iterable[of.FlowMod]) -> dict[FlowKey, of.FlowMod]:
    return {flow_key(f): f for f in flows}
