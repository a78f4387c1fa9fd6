"""Messages kept as their encoding only: ``EncodedFlowMod`` and ``EncodedGroupMod``.

A ``FlowMod`` or ``GroupMod`` value keeps its parts as values, each with its own encoding (a
flow's match, instructions and actions; a group's buckets): several times the message's
bytes. What holds a hundred thousand of them (a datapath's installed state, a bundle being
streamed) keeps these instead: ``(wire,)``, the message body, which encodes and frames like
any message. ``decoded()`` gives the full value back (equal to the one encoded), and the text
form is the decoded value's.
"""

from __future__ import annotations

import struct

from . import constants as c
from .decode import decode
from .flows import FlowMod
from .groups import GroupMod
from .message import Message

_HEADER = struct.Struct("!BBHI")
_U16 = struct.Struct("!H")
_U32 = struct.Struct("!I")


def _decoded(msg_type: int, body: bytes) -> Message:
    return decode(_HEADER.pack(c.OFP_VERSION, msg_type, 8 + len(body), 0) + body)


def decode_flow_mod(wire: bytes) -> FlowMod:
    """The ``FlowMod`` whose body (``flow.wire``) is ``wire``; raises
    ``OpenFlowDecodeError`` if it is not one."""
    msg = _decoded(c.MsgType.FLOW_MOD, bytes(wire))
    assert type(msg) is FlowMod
    command = msg[7]
    if type(command) is int and command in _FLOW_MOD_COMMANDS:
        # as the constructor keeps it (its default is the enum): the same value, field by field
        return tuple.__new__(FlowMod, (*msg[:7], c.FlowModCommand(command), *msg[8:]))
    return msg


_FLOW_MOD_COMMANDS = frozenset(int(command) for command in c.FlowModCommand)


class EncodedFlowMod(Message):
    """A FLOW_MOD as its body only (``FlowMod.wire``)."""

    __slots__ = ()
    msg_type = c.MsgType.FLOW_MOD
    raw_name = "OFPT_FLOW_MOD"

    def __new__(cls, wire: bytes) -> EncodedFlowMod:
        return tuple.__new__(cls, (bytes(wire),))

    @classmethod
    def of(cls, flow: FlowMod) -> EncodedFlowMod:
        return tuple.__new__(cls, (flow[0],))

    def decoded(self) -> FlowMod:
        return decode_flow_mod(self[0])

    def to_text(self, xid: int = 0) -> str:
        return self.decoded().to_text(xid)

    def __repr__(self) -> str:
        return f"EncodedFlowMod({self.decoded()!r})"


class EncodedGroupMod(Message):
    """A GROUP_MOD as its body only (``GroupMod.wire``; its buckets' values are not kept)."""

    __slots__ = ()
    msg_type = c.MsgType.GROUP_MOD
    raw_name = "OFPT_GROUP_MOD"

    def __new__(cls, wire: bytes) -> EncodedGroupMod:
        return tuple.__new__(cls, (bytes(wire),))

    @classmethod
    def of(cls, group: GroupMod) -> EncodedGroupMod:
        return tuple.__new__(cls, (group[0],))

    @property
    def command(self) -> int:
        command: int = _U16.unpack_from(self[0])[0]
        return command

    @property
    def group_id(self) -> int:
        group_id: int = _U32.unpack_from(self[0], 4)[0]
        return group_id

    def decoded(self) -> GroupMod:
        msg = _decoded(c.MsgType.GROUP_MOD, self[0])
        assert type(msg) is GroupMod
        return msg

    def to_text(self, xid: int = 0) -> str:
        return self.decoded().to_text(xid)

    def __repr__(self) -> str:
        return f"EncodedGroupMod({self.decoded()!r})"
