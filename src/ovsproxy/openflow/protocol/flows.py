"""OFPT_FLOW_MOD and the dump-flows text form."""

from __future__ import annotations

import struct
from collections.abc import Iterable

from . import constants as c
from .actions import Action, ApplyActions, Instruction, canonical_instructions, format_instructions
from .errors import OpenFlowEncodeError
from .fields import Match, format_port
from .message import Message

_FLOW_MOD = struct.Struct("!QQBBHHHIIIHH")
_EMPTY_MATCH = Match()


class FlowMod(Message):
    """OFPT_FLOW_MOD.

    ``FlowMod(table_id, priority, match, instructions, cookie=..., command=...)``;
    ``instructions`` may also list bare actions, and the keyword ``actions=`` is a
    shorthand for ``instructions=(ApplyActions(actions),)``. Instructions are kept in
    Open vSwitch's canonical order and an empty action list is a drop, so a flow decoded
    from a dump equals the flow that was sent.
    """

    __slots__ = ()
    _fields = (
        "table_id",
        "priority",
        "match",
        "instructions",
        "cookie",
        "cookie_mask",
        "command",
        "idle_timeout",
        "hard_timeout",
        "flags",
        "out_port",
        "out_group",
        "importance",
        "buffer_id",
    )
    table_id: int
    priority: int
    match: Match
    instructions: tuple[Instruction, ...]
    cookie: int
    cookie_mask: int
    command: int
    idle_timeout: int
    hard_timeout: int
    flags: int
    out_port: int
    out_group: int
    importance: int
    buffer_id: int
    msg_type = c.MsgType.FLOW_MOD
    raw_name = "OFPT_FLOW_MOD"

    def __new__(
        cls,
        table_id: int = 0,
        priority: int = c.OFP_DEFAULT_PRIORITY,
        match: Match | None = None,
        instructions: Iterable[Instruction | Action] = (),
        *,
        cookie: int = 0,
        cookie_mask: int = 0,
        command: int = c.FlowModCommand.ADD,
        idle_timeout: int = 0,
        hard_timeout: int = 0,
        flags: int = 0,
        out_port: int = c.OFPP_ANY,
        out_group: int = c.OFPG_ANY,
        importance: int = 0,
        buffer_id: int = c.OFP_NO_BUFFER,
        actions: Iterable[Action] | None = None,
    ) -> FlowMod:
        if match is None:
            match = _EMPTY_MATCH
        elif type(match) is not Match:
            raise OpenFlowEncodeError(f"flow_mod: match must be a Match, not {match!r}")
        if actions is not None:
            instructions = (*instructions, ApplyActions(actions))
        only = instructions[0] if type(instructions) is tuple and len(instructions) == 1 else None
        canonical: tuple[Instruction, ...]
        if type(only) is ApplyActions and only[1]:
            canonical = (only,)
        else:
            canonical = canonical_instructions(instructions)
        try:
            head = _FLOW_MOD.pack(
                cookie,
                cookie_mask,
                table_id,
                command,
                idle_timeout,
                hard_timeout,
                priority,
                buffer_id,
                out_port,
                out_group,
                flags,
                importance,
            )
        except struct.error as exc:
            raise OpenFlowEncodeError(f"flow_mod: {exc}") from None
        if len(canonical) == 1:
            wire = head + match[0] + canonical[0][0]
        else:
            wire = head + match[0] + b"".join([i[0] for i in canonical])
        return tuple.__new__(
            cls,
            (
                wire,
                table_id,
                priority,
                match,
                canonical,
                cookie,
                cookie_mask,
                command,
                idle_timeout,
                hard_timeout,
                flags,
                out_port,
                out_group,
                importance,
                buffer_id,
            ),
        )

    @property
    def actions(self) -> tuple[Action, ...]:
        """The apply-actions of this flow (empty for a drop)."""
        for instruction in self[4]:
            if type(instruction) is ApplyActions:
                actions: tuple[Action, ...] = instruction[1]
                return actions
        return ()

    @classmethod
    def delete(
        cls,
        table_id: int = c.OFPTT_ALL,
        match: Match | None = None,
        *,
        priority: int = 0,
        strict: bool = False,
        cookie: int = 0,
        cookie_mask: int = 0,
    ) -> FlowMod:
        """A DELETE of the flows of ``table_id`` (every table by default) that ``match``
        covers, or with ``strict`` a DELETE_STRICT of the one flow with exactly this match
        and ``priority``; only flows whose cookie equals ``cookie`` in the ``cookie_mask``
        bits. Any out_port and out_group."""
        return cls(
            table_id,
            priority,
            match,
            (),
            cookie=cookie,
            cookie_mask=cookie_mask,
            command=c.FlowModCommand.DELETE_STRICT if strict else c.FlowModCommand.DELETE,
        )

    def as_delete(self, *, same_cookie: bool = True) -> FlowMod:
        """A DELETE_STRICT of this flow (same table, priority and match); with
        ``same_cookie``, and a cookie, only while the switch's flow still has that cookie."""
        with_cookie = same_cookie and self[5] != 0
        return FlowMod.delete(
            self[1],
            self[3],
            priority=self[2],
            strict=True,
            cookie=self[5] if with_cookie else 0,
            cookie_mask=0xFFFFFFFFFFFFFFFF if with_cookie else 0,
        )

    def to_text(self, xid: int = 0) -> str:
        """``ofputil_flow_mod_format``."""
        (
            _,
            table_id,
            priority,
            match,
            instructions,
            cookie,
            cookie_mask,
            command,
            idle,
            hard,
            flags,
            out_port,
            _out_group,
            importance,
            buffer_id,
        ) = self
        parts = [" ", c.FLOW_MOD_COMMAND_NAMES.get(command, f"cmd:{command}")]
        if table_id:
            parts.append(f" table:{table_id}")
        parts.append(" ")
        parts.append(match.to_text(priority))
        text = "".join(parts)
        if not text.endswith(" "):
            text += " "
        if command == c.FlowModCommand.ADD:
            if cookie:
                text += f"cookie:{cookie:#x} "
        elif cookie_mask:
            text += f"cookie:{cookie:#x}/{cookie_mask:#x} "
        if idle:
            text += f"idle:{idle} "
        if hard:
            text += f"hard:{hard} "
        if importance:
            text += f"importance:{importance} "
        if buffer_id != c.OFP_NO_BUFFER:
            text += f"buf:{buffer_id:#x} "
        if out_port != c.OFPP_ANY:
            text += f"out_port:{format_port(out_port)} "
        text += _flow_flags_text(flags, " ")
        return text + "actions=" + format_instructions(instructions)

    def format_flow(self) -> str:
        """The flow as ``ovs-ofctl dump-flows --no-stats`` prints it (add-flow syntax)."""
        return format_flow(self)


def _flow_flags_text(flags: int, end: str) -> str:
    return "".join(name + end for bit, name in c.FLOW_MOD_FLAG_NAMES.items() if flags & bit)


def format_flow(flow: FlowMod, table: bool = True) -> str:
    """``ofputil_flow_stats_format`` without statistics: ``cookie=0x5, table=10, priority=...``."""
    text = ""
    if flow.cookie:
        text += f"cookie={flow.cookie:#x}, "
    if table and flow.table_id:
        text += f"table={flow.table_id}, "
    if flow.idle_timeout:
        text += f"idle_timeout={flow.idle_timeout}, "
    if flow.hard_timeout:
        text += f"hard_timeout={flow.hard_timeout}, "
    text += _flow_flags_text(flow.flags, " ")  # as ovs-ofctl prints them: no commas
    if flow.importance:
        text += f"importance={flow.importance}, "
    match = flow.match.to_text(flow.priority)
    if match:
        text += match + " "
    return text + "actions=" + format_instructions(flow.instructions)
