"""OFPT_PACKET_OUT, and packet-ins (OFPT_PACKET_IN and NXT_PACKET_IN2, decoded alike)."""

from __future__ import annotations

import struct
from collections.abc import Iterable

from . import constants as c
from .actions import Action, format_actions
from .errors import OpenFlowEncodeError
from .fields import IN_PORT, Entry, Match, format_port
from .message import Message

_U16 = struct.Struct("!H")
_U32 = struct.Struct("!I")
_ZEROS = bytes(8)
_EMPTY_MATCH = Match()
_NX_MSG = struct.Struct("!II")
_EMPTY_MATCH = Match()
_NX_MSG = struct.Struct("!II")


_PACKET_OUT = struct.Struct("!IH2x")


class PacketOut(Message):
    """OFPT_PACKET_OUT: send ``data`` through ``actions`` as if it arrived on ``in_port``.

    ``match`` may carry other pipeline fields (registers...); ``in_port`` is always set.
    """

    __slots__ = ()
    _fields = ("actions", "data", "in_port", "buffer_id", "match")
    actions: tuple[Action, ...]
    data: bytes
    in_port: int
    buffer_id: int
    match: Match
    msg_type = c.MsgType.PACKET_OUT
    raw_name = "OFPT_PACKET_OUT"

    def __new__(
        cls,
        actions: Iterable[Action],
        data: bytes = b"",
        in_port: int = c.OFPP_CONTROLLER,
        buffer_id: int = c.OFP_NO_BUFFER,
        match: Match | None = None,
    ) -> PacketOut:
        actions = tuple(actions)
        if match is None:
            match = Match(in_port=in_port)
        elif match.get("in_port") != in_port:
            match = _without_in_port(match, (IN_PORT, in_port, None))
        try:
            body = b"".join([a[0] for a in actions])
            wire = _PACKET_OUT.pack(buffer_id, len(body)) + match[0] + body + bytes(data)
        except (struct.error, TypeError) as exc:
            raise OpenFlowEncodeError(f"packet_out: {exc}") from None
        return tuple.__new__(cls, (wire, actions, bytes(data), in_port, buffer_id, match))

    def to_text(self, xid: int = 0) -> str:
        text = f" in_port={format_port(self[3])}"
        other = _without_in_port(self[5]).to_text()
        if other:
            text += f" {other}"
        text += f" actions={format_actions(self[1])}"
        if self[4] != c.OFP_NO_BUFFER:
            return text + f" buffer={self[4]:#010x}"
        return text + f" data_len={len(self[2])}"


def _without_in_port(match: Match, *extra: Entry) -> Match:
    """``match`` without its in_port, plus ``extra`` entries (built from the entries, not
    from keywords: a decoded match may hold fields we do not model)."""
    return Match.from_entries([e for e in match.entries if e[0] is not IN_PORT] + list(extra))


_PACKET_IN = struct.Struct("!IHBBQ")


class PacketIn(Message):
    """A packet sent to the controller (OFPT_PACKET_IN or NXT_PACKET_IN2, decoded alike).

    ``match`` holds the pipeline metadata (``in_port``, registers, ct state...),
    ``userdata`` the bytes of a ``Controller(userdata=...)`` action (NXT_PACKET_IN2 only).
    Encoded as NXT_PACKET_IN2, the form that carries every field.
    """

    __slots__ = ()
    _fields = (
        "reason",
        "table_id",
        "cookie",
        "match",
        "data",
        "total_len",
        "buffer_id",
        "userdata",
    )
    reason: int
    table_id: int
    cookie: int
    match: Match
    data: bytes
    total_len: int
    buffer_id: int
    userdata: bytes
    msg_type = c.MsgType.EXPERIMENTER
    raw_name = "NXT_PACKET_IN2"

    def __new__(
        cls,
        reason: int,
        table_id: int,
        cookie: int,
        match: Match | None = None,
        data: bytes = b"",
        *,
        total_len: int | None = None,
        buffer_id: int = c.OFP_NO_BUFFER,
        userdata: bytes = b"",
    ) -> PacketIn:
        match = _EMPTY_MATCH if match is None else match
        data = bytes(data)
        userdata = bytes(userdata)
        if total_len is None:
            total_len = len(data)
        try:
            props = [_prop(c.NXPINT_PACKET, data)]
            if total_len != len(data):
                props.append(_prop(c.NXPINT_FULL_LEN, _U32.pack(total_len)))
            if buffer_id != c.OFP_NO_BUFFER:
                props.append(_prop(c.NXPINT_BUFFER_ID, _U32.pack(buffer_id)))
            props.append(_prop(c.NXPINT_TABLE_ID, bytes([table_id])))
            if cookie != 0xFFFFFFFFFFFFFFFF:
                props.append(_prop(c.NXPINT_COOKIE, bytes(4) + struct.pack("!Q", cookie)))
            props.append(_prop(c.NXPINT_REASON, bytes([reason])))
            props.append(_prop(c.NXPINT_METADATA, match[0][4 : _match_tlv_end(match)]))
            if userdata:
                props.append(_prop(c.NXPINT_USERDATA, userdata))
        except (struct.error, ValueError) as exc:
            raise OpenFlowEncodeError(f"packet_in: {exc}") from None
        wire = _NX_MSG.pack(c.NX_VENDOR_ID, c.NXT_PACKET_IN2) + b"".join(props)
        return tuple.__new__(
            cls, (wire, reason, table_id, cookie, match, data, total_len, buffer_id, userdata)
        )

    @property
    def in_port(self) -> int | None:
        in_port: int | None = self.match.get("in_port")
        return in_port

    def to_text(self, xid: int = 0) -> str:
        text = f" total_len={self[6]} {self[4].to_text()}".rstrip()
        text += f" (via {c.PACKET_IN_REASON_NAMES.get(self[1], str(self[1]))})"
        text += f" data_len={len(self[5])}"
        if self[3] != 0xFFFFFFFFFFFFFFFF:
            text += f" cookie={self[3]:#x}"
        if self[8]:
            text += " userdata=" + ".".join(f"{b:02x}" for b in self[8])
        return text


def _match_tlv_end(match: Match) -> int:
    end: int = _U16.unpack_from(match[0], 2)[0]
    return end


def _prop(prop_type: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("!HH", prop_type, length) + payload + _ZEROS[: -length % 8]
