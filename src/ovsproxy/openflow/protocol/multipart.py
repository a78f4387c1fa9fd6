"""Multipart requests and replies: FLOW_DESC (dump-flows), GROUP_DESC (dump-groups),
GROUP_STATS, and the raw reply of any other type."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import ClassVar, Self

from . import constants as c
from .actions import decode_instructions
from .errors import OpenFlowDecodeError, OpenFlowEncodeError
from .fields import Match, format_port
from .flows import FlowMod, format_flow
from .groups import _GROUP_MOD, GroupMod, format_group
from .message import Message

_U16 = struct.Struct("!H")
_U32 = struct.Struct("!I")
_U64 = struct.Struct("!Q")
_ZEROS = bytes(8)
_EMPTY_MATCH = Match()
_EMPTY_MATCH = Match()


_MULTIPART = struct.Struct("!HH4x")
_FLOW_DESC_REQUEST = struct.Struct("!B3xII4xQQ")


class FlowDescRequest(Message):
    """OFPMP_FLOW_DESC request (what ``ovs-ofctl dump-flows`` sends in OpenFlow 1.5)."""

    __slots__ = ()
    _fields = ("table_id", "out_port", "out_group", "cookie", "cookie_mask", "match")
    table_id: int
    out_port: int
    out_group: int
    cookie: int
    cookie_mask: int
    match: Match
    msg_type = c.MsgType.MULTIPART_REQUEST
    raw_name = "OFPST_FLOW request"

    def __new__(
        cls,
        table_id: int = c.OFPTT_ALL,
        *,
        out_port: int = c.OFPP_ANY,
        out_group: int = c.OFPG_ANY,
        cookie: int = 0,
        cookie_mask: int = 0,
        match: Match | None = None,
    ) -> FlowDescRequest:
        match = _EMPTY_MATCH if match is None else match
        try:
            wire = (
                _MULTIPART.pack(c.MultipartType.FLOW_DESC, 0)
                + _FLOW_DESC_REQUEST.pack(table_id, out_port, out_group, cookie, cookie_mask)
                + match[0]
            )
        except struct.error as exc:
            raise OpenFlowEncodeError(f"flow_desc request: {exc}") from None
        return tuple.__new__(cls, (wire, table_id, out_port, out_group, cookie, cookie_mask, match))

    def to_text(self, xid: int = 0) -> str:
        """``ofputil_flow_stats_request_format`` (it does not print cookies)."""
        text = ""
        if self[1] != c.OFPTT_ALL:
            text += f" table={self[1]}"
        if self[2] != c.OFPP_ANY:
            text += f" out_port={format_port(self[2])}"
        return text + " " + self.match.to_text()


class _GroupRequest(Message):
    """A multipart request about one group or all of them (group_id=ALL)."""

    __slots__ = ()
    _fields = ("group_id",)
    group_id: int
    msg_type = c.MsgType.MULTIPART_REQUEST
    multipart_type: ClassVar[int]
    raw_name = ""

    def __new__(cls, group_id: int = c.OFPG_ALL) -> Self:
        try:
            wire = _MULTIPART.pack(cls.multipart_type, 0) + struct.pack("!I4x", group_id)
        except struct.error as exc:
            raise OpenFlowEncodeError(f"{cls.raw_name}: {exc}") from None
        return tuple.__new__(cls, (wire, group_id))

    def to_text(self, xid: int = 0) -> str:
        group = "ALL" if self[1] == c.OFPG_ALL else str(self[1])
        return f" group_id={group}"


class GroupDescRequest(_GroupRequest):
    """OFPMP_GROUP_DESC request (``ovs-ofctl dump-groups``)."""

    __slots__ = ()
    multipart_type = c.MultipartType.GROUP_DESC
    raw_name = "OFPST_GROUP_DESC request"


_FLOW_DESC = struct.Struct("!H2xBxHHHHHQ")
_OXS_STAT = struct.Struct("!HH")
_OXS_CLASS = 0x8002
_OXS_DURATION, _OXS_IDLE_TIME, _OXS_FLOW_COUNT, _OXS_PACKET_COUNT, _OXS_BYTE_COUNT = 0, 1, 3, 4, 5


@dataclass(frozen=True, slots=True)
class FlowDesc:
    """One installed flow from a FLOW_DESC reply: the flow (as an ADD FlowMod) and stats."""

    flow: FlowMod
    duration_sec: int = 0
    duration_nsec: int = 0
    idle_age: int | None = None
    packet_count: int | None = None
    byte_count: int | None = None

    def encode(self) -> bytes:
        flow = self.flow
        stats = []
        if self.duration_sec or self.duration_nsec:
            stats.append(_oxs(_OXS_DURATION, (self.duration_sec << 32) | self.duration_nsec))
        if self.idle_age is not None:
            stats.append(_oxs(_OXS_IDLE_TIME, self.idle_age << 32))
        if self.packet_count is not None:
            stats.append(_oxs(_OXS_PACKET_COUNT, self.packet_count))
        if self.byte_count is not None:
            stats.append(_oxs(_OXS_BYTE_COUNT, self.byte_count))
        stats_body = b"".join(stats)
        stats_len = 4 + len(stats_body)
        stats_raw = _OXS_STAT.pack(0, stats_len) + stats_body + _ZEROS[: -stats_len % 8]
        rest = flow.match.wire + stats_raw + b"".join(i.wire for i in flow.instructions)
        return (
            _FLOW_DESC.pack(
                24 + len(rest),
                flow.table_id,
                flow.priority,
                flow.idle_timeout,
                flow.hard_timeout,
                flow.flags,
                flow.importance,
                flow.cookie,
            )
            + rest
        )

    def format_flow(self) -> str:
        return format_flow(self.flow)


def _oxs(field: int, value: int) -> bytes:
    return _U32.pack((_OXS_CLASS << 16) | (field << 9) | 8) + struct.pack("!Q", value)


class FlowDescReply(Message):
    """OFPMP_FLOW_DESC reply: installed flows. ``more`` means more replies follow.

    Decoded from the wire, the flows stay bytes until read (``flows``): a full switch
    answers with hundreds of thousands, and what the adoption and the drift check need of
    each is its cookie (``cookies`` reads that field alone). The entries' framing is checked
    when the reply is decoded; a flow's own encoding when it is read."""

    __slots__ = ()
    _fields = ("more",)
    more: bool
    msg_type = c.MsgType.MULTIPART_REPLY
    raw_name = "OFPST_FLOW reply"

    def __new__(cls, flows: Iterable[FlowDesc] = (), more: bool = False) -> FlowDescReply:
        wire = _MULTIPART.pack(c.MultipartType.FLOW_DESC, c.OFPMPF_MORE if more else 0) + b"".join(
            f.encode() for f in flows
        )
        return tuple.__new__(cls, (wire, bool(more)))

    @classmethod
    def decoded(cls, body: bytes, more: bool) -> FlowDescReply:
        """The reply whose body (after the OpenFlow header) is ``body``."""
        for _ in _flow_desc_entries(body, _MULTIPART.size):
            pass
        return tuple.__new__(cls, (body, bool(more)))

    @property
    def flows(self) -> tuple[FlowDesc, ...]:
        return tuple(_decode_flow_descs(self[0], _MULTIPART.size))

    @property
    def cookies(self) -> list[int]:
        """Each flow's cookie, in order (nothing else decoded)."""
        return [cookie for _, _, cookie in _flow_desc_entries(self[0], _MULTIPART.size)]

    @property
    def keyed_cookies(self) -> list[tuple[int, bytes]]:
        """Each flow's cookie and its identity in its table, in order: the table (one byte),
        the priority (two) and the match as encoded, padding included (``datapath.desired.
        flow_key``'s form). Open vSwitch encodes the match of a flow it describes as we
        encoded it when we added it, so the keys are comparable."""
        body = self[0]
        out = []
        for start, end, cookie in _flow_desc_entries(body, _MULTIPART.size):
            match_at = start + _MATCH_AT
            if match_at + 4 > end:
                raise OpenFlowDecodeError("flow desc without a match")
            match_end = match_at + ((_U16.unpack_from(body, match_at + 2)[0] + 7) & ~7)
            if match_end > end:
                raise OpenFlowDecodeError("flow desc match runs past its entry")
            out.append(
                (
                    cookie,
                    body[start + _TABLE_AT : start + _TABLE_AT + 1]
                    + body[start + _PRIORITY_AT : start + _PRIORITY_AT + 2]
                    + body[match_at:match_end],
                )
            )
        return out

    def to_text(self, xid: int = 0) -> str:
        return "".join("\n " + f.format_flow() for f in self.flows)


# in a flow desc entry
_TABLE_AT = 4
_PRIORITY_AT = 6
_COOKIE_AT = 16
_MATCH_AT = 24


def _flow_desc_entries(data: bytes, pos: int) -> Iterator[tuple[int, int, int]]:
    """(start, end, cookie) of each flow desc entry from ``pos``; checks the lengths."""
    size = len(data)
    unpack_length, unpack_cookie = _U16.unpack_from, _U64.unpack_from
    while pos < size:
        if pos + 24 > size:
            raise OpenFlowDecodeError("truncated flow desc")
        length = unpack_length(data, pos)[0]
        end = pos + length
        if length < 24 or end > size:
            raise OpenFlowDecodeError(f"bad flow desc length {length}")
        yield pos, end, unpack_cookie(data, pos + _COOKIE_AT)[0]
        pos = end


def _decode_flow_descs(data: bytes, pos: int) -> Iterator[FlowDesc]:
    for start, end, cookie in _flow_desc_entries(data, pos):
        _, table_id, priority, idle, hard, flags, importance, _ = _FLOW_DESC.unpack_from(
            data, start
        )
        match, match_len = Match.decode(data[:end], start + _MATCH_AT)
        stats_pos = start + _MATCH_AT + match_len
        if stats_pos + 4 > end:
            raise OpenFlowDecodeError("flow desc without stats")
        _, stats_len = _OXS_STAT.unpack_from(data, stats_pos)
        stats_end = stats_pos + (stats_len + 7) // 8 * 8
        if stats_len < 4 or stats_end > end:
            raise OpenFlowDecodeError("bad flow desc stats length")
        stats = _decode_oxs(data, stats_pos + 4, stats_pos + stats_len)
        instructions = decode_instructions(data, stats_end, end)
        flow = FlowMod(
            table_id,
            priority,
            match,
            instructions,
            cookie=cookie,
            idle_timeout=idle,
            hard_timeout=hard,
            flags=flags,
            importance=importance,
        )
        yield FlowDesc(flow, **stats)


def _decode_oxs(data: bytes, pos: int, end: int) -> dict[str, int]:
    stats: dict[str, int] = {}
    while pos < end:
        if pos + 4 > end:
            raise OpenFlowDecodeError("truncated OXS header")
        header = _U32.unpack_from(data, pos)[0]
        length = header & 0xFF
        if pos + 4 + length > end or length not in (4, 8):
            raise OpenFlowDecodeError("bad OXS entry")
        value = int.from_bytes(data[pos + 4 : pos + 4 + length], "big")
        if header >> 16 == _OXS_CLASS:
            field = (header >> 9) & 0x7F
            if field == _OXS_DURATION:
                stats["duration_sec"], stats["duration_nsec"] = value >> 32, value & 0xFFFFFFFF
            elif field == _OXS_IDLE_TIME:
                stats["idle_age"] = value >> 32
            elif field == _OXS_PACKET_COUNT:
                stats["packet_count"] = value
            elif field == _OXS_BYTE_COUNT:
                stats["byte_count"] = value
        pos += 4 + length
    return stats


class GroupDescReply(Message):
    """OFPMP_GROUP_DESC reply: installed groups as ADD GroupMods."""

    __slots__ = ()
    _fields = ("groups", "more")
    groups: tuple[GroupMod, ...]
    more: bool
    msg_type = c.MsgType.MULTIPART_REPLY
    raw_name = "OFPST_GROUP_DESC reply"

    def __new__(cls, groups: Iterable[GroupMod] = (), more: bool = False) -> GroupDescReply:
        groups = tuple(groups)
        entries = []
        for g in groups:
            # A group desc entry is the group mod body with a different 16-byte header.
            rest = g[0][_GROUP_MOD.size :]
            buckets_len = sum(len(b[0]) for b in g.buckets)
            entries.append(
                struct.pack("!HBxIH6x", 16 + len(rest), g.group_type, g.group_id, buckets_len)
                + rest
            )
        wire = _MULTIPART.pack(c.MultipartType.GROUP_DESC, c.OFPMPF_MORE if more else 0) + b"".join(
            entries
        )
        return tuple.__new__(cls, (wire, groups, bool(more)))

    def to_text(self, xid: int = 0) -> str:
        return "".join("\n " + format_group(g) for g in self[1])


class GroupStatsRequest(_GroupRequest):
    """OFPMP_GROUP_STATS request. Each reply entry costs 40 + 16 bytes per bucket, against
    GROUP_DESC's full buckets, so it lists big groups that GROUP_DESC cannot (Open vSwitch
    overflows a GROUP_DESC entry's 16-bit length for a group over 64 KB)."""

    __slots__ = ()
    multipart_type = c.MultipartType.GROUP_STATS
    raw_name = "OFPST_GROUP request"


_GROUP_STATS = struct.Struct("!H2xII4xQQII")


@dataclass(frozen=True, slots=True)
class GroupStats:
    """One group from a GROUP_STATS reply; ``bucket_stats`` holds (packets, bytes) per bucket."""

    group_id: int
    ref_count: int = 0
    packet_count: int = 0
    byte_count: int = 0
    duration_sec: int = 0
    duration_nsec: int = 0
    bucket_stats: tuple[tuple[int, int], ...] = ()

    @property
    def n_buckets(self) -> int:
        return len(self.bucket_stats)

    def encode(self) -> bytes:
        return _GROUP_STATS.pack(
            40 + 16 * len(self.bucket_stats),
            self.group_id,
            self.ref_count,
            self.packet_count,
            self.byte_count,
            self.duration_sec,
            self.duration_nsec,
        ) + b"".join(struct.pack("!QQ", p, b) for p, b in self.bucket_stats)


class GroupStatsReply(Message):
    """OFPMP_GROUP_STATS reply."""

    __slots__ = ()
    _fields = ("stats", "more")
    stats: tuple[GroupStats, ...]
    more: bool
    msg_type = c.MsgType.MULTIPART_REPLY
    raw_name = "OFPST_GROUP reply"

    def __new__(cls, stats: Iterable[GroupStats] = (), more: bool = False) -> GroupStatsReply:
        stats = tuple(stats)
        wire = _MULTIPART.pack(c.MultipartType.GROUP_STATS, c.OFPMPF_MORE if more else 0) + (
            b"".join(s.encode() for s in stats)
        )
        return tuple.__new__(cls, (wire, stats, bool(more)))

    def to_text(self, xid: int = 0) -> str:
        return "".join(
            f"\n group_id={s.group_id},duration={s.duration_sec}.{s.duration_nsec // 1000000:03d}s,"
            f"ref_count={s.ref_count},packet_count={s.packet_count},byte_count={s.byte_count}"
            + "".join(
                f",bucket{i}:packet_count={p},byte_count={b}"
                for i, (p, b) in enumerate(s.bucket_stats)
            )
            for s in self[1]
        )


class MultipartReply(Message):
    """A multipart reply of a type this codec does not model (kept raw)."""

    __slots__ = ()
    _fields = ("mp_type", "flags", "body")
    mp_type: int
    flags: int
    body: bytes
    msg_type = c.MsgType.MULTIPART_REPLY
    raw_name = "OFPST reply"

    def __new__(cls, mp_type: int, flags: int = 0, body: bytes = b"") -> MultipartReply:
        wire = _MULTIPART.pack(mp_type, flags) + bytes(body)
        return tuple.__new__(cls, (wire, mp_type, flags, bytes(body)))

    @property
    def more(self) -> bool:
        return bool(self[2] & c.OFPMPF_MORE)
