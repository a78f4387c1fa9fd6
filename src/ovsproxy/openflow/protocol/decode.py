"""Bytes to message values: ``decode(data)`` for one complete message.

Raises only ``OpenFlowDecodeError`` (with the header's type and xid when it could be read),
whatever the input: a malformed or hostile message is the codec's error, never a crash.
Decoding keeps no state between messages and adds nothing to any table.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import Any

from . import constants as c
from .actions import decode_actions, decode_instructions, iter_props
from .bundles import _BUNDLE_CTRL, BundleAdd, BundleCtrl
from .errors import OpenFlowDecodeError
from .fields import Match, decode_tlvs, field_by_nxm_header
from .flows import _FLOW_MOD, FlowMod
from .groups import _BUCKET, _GROUP_MOD, _SELECTION_METHOD, Bucket, GroupMod
from .message import Message
from .multipart import (
    _FLOW_DESC_REQUEST,
    _GROUP_STATS,
    _MULTIPART,
    FlowDescReply,
    FlowDescRequest,
    GroupDescReply,
    GroupDescRequest,
    GroupStats,
    GroupStatsReply,
    GroupStatsRequest,
    MultipartReply,
)
from .nicira import _NX_MSG, SetPacketInFormat
from .packets import _PACKET_IN, _PACKET_OUT, PacketIn, PacketOut
from .switch import (
    _FEATURES,
    BarrierReply,
    BarrierRequest,
    EchoReply,
    EchoRequest,
    Error,
    FeaturesReply,
    FeaturesRequest,
    Hello,
    SetConfig,
)

_HEADER = struct.Struct("!BBHI")
_U16 = struct.Struct("!H")
_U32 = struct.Struct("!I")


def decode(data: bytes) -> Message:
    """Decodes one complete message. Raises only ``OpenFlowDecodeError``."""
    data = bytes(data)
    if len(data) < 8:
        raise OpenFlowDecodeError("message shorter than an OpenFlow header")
    version, msg_type, length, xid = _HEADER.unpack_from(data)
    if length != len(data):
        raise OpenFlowDecodeError(
            f"header length {length} but {len(data)} bytes", msg_type=msg_type, xid=xid
        )
    if version != c.OFP_VERSION and msg_type not in (c.MsgType.HELLO, c.MsgType.ERROR):
        raise OpenFlowDecodeError(
            f"OpenFlow version {version:#x} is not 1.5", msg_type=msg_type, xid=xid
        )
    decoder = _DECODERS.get(msg_type)
    if decoder is None:
        raise OpenFlowDecodeError(
            f"unsupported message type {msg_type}", msg_type=msg_type, xid=xid
        )
    try:
        return decoder(data, version)
    except OpenFlowDecodeError as exc:
        if exc.msg_type is None:
            exc.msg_type, exc.xid = msg_type, xid
        raise
    except (struct.error, IndexError, ValueError, KeyError, OverflowError) as exc:
        raise OpenFlowDecodeError(
            f"malformed message type {msg_type}: {exc}", msg_type=msg_type, xid=xid
        ) from None


def _dec_hello(data: bytes, version: int) -> Message:
    versions: set[int] = set()
    pos = 8
    saw_bitmap = False
    while pos + 4 <= len(data):
        etype, elen = struct.unpack_from("!HH", data, pos)
        if elen < 4 or pos + elen > len(data):
            raise OpenFlowDecodeError("bad hello element length")
        if etype == c.OFPHET_VERSIONBITMAP:
            saw_bitmap = True
            for i in range((elen - 4) // 4):
                bitmap = _U32.unpack_from(data, pos + 4 + 4 * i)[0]
                versions.update(32 * i + b for b in range(32) if bitmap >> b & 1)
        pos += (elen + 7) // 8 * 8
    if not saw_bitmap:
        versions = set(range(1, version + 1))
    versions = {v for v in versions if 1 <= v <= 31}
    if not versions:
        raise OpenFlowDecodeError("hello advertises no version")
    return Hello(versions)


def _dec_error(data: bytes, version: int) -> Message:
    etype, code = struct.unpack_from("!HH", data, 8)
    if etype == c.OFPET_EXPERIMENTER:
        experimenter = _U32.unpack_from(data, 12)[0]
        return Error(etype, code, data[16:], experimenter)
    return Error(etype, code, data[12:])


# A message's body decoder: (the whole message, its header's version) -> the message.
_Decoder = Callable[[bytes, int], Message]


def _dec_opaque(cls: Callable[[bytes], Message]) -> _Decoder:
    return lambda data, version: cls(data[8:])


def _dec_empty(cls: type[Message]) -> _Decoder:
    def decoder(data: bytes, version: int) -> Message:
        if len(data) != 8:
            raise OpenFlowDecodeError(f"{cls.__name__} with a body")
        return cls()

    return decoder


def _dec_features(data: bytes, version: int) -> Message:
    dpid, n_buffers, n_tables, aux, caps, _ = _FEATURES.unpack_from(data, 8)
    return FeaturesReply(dpid, n_buffers, n_tables, aux, caps)


def _dec_set_config(data: bytes, version: int) -> Message:
    return SetConfig(*struct.unpack_from("!HH", data, 8))


def _dec_experimenter(data: bytes, version: int) -> Message:
    vendor, subtype = _NX_MSG.unpack_from(data, 8)
    if vendor == c.NX_VENDOR_ID and subtype == c.NXT_PACKET_IN2:
        return _dec_packet_in2(data)
    if vendor == c.NX_VENDOR_ID and subtype == c.NXT_SET_PACKET_IN_FORMAT:
        return SetPacketInFormat(_U32.unpack_from(data, 16)[0])
    raise OpenFlowDecodeError(f"unsupported experimenter message {vendor:#x}/{subtype}")


def _dec_flow_mod(data: bytes, version: int) -> Message:
    (
        cookie,
        cookie_mask,
        table_id,
        command,
        idle,
        hard,
        priority,
        buffer_id,
        out_port,
        out_group,
        flags,
        importance,
    ) = _FLOW_MOD.unpack_from(data, 8)
    match, match_len = Match.decode(data, 48)
    instructions = decode_instructions(data, 48 + match_len, len(data))
    return FlowMod(
        table_id,
        priority,
        match,
        instructions,
        cookie=cookie,
        cookie_mask=cookie_mask,
        command=command,
        idle_timeout=idle,
        hard_timeout=hard,
        flags=flags,
        out_port=out_port,
        out_group=out_group,
        importance=importance,
        buffer_id=buffer_id,
    )


def _decode_buckets(data: bytes, start: int, end: int) -> tuple[Bucket, ...]:
    buckets = []
    pos = start
    while pos < end:
        if pos + 8 > end:
            raise OpenFlowDecodeError("truncated bucket")
        length, actions_len, bucket_id = _BUCKET.unpack_from(data, pos)
        if length < 8 or pos + length > end or 8 + actions_len > length:
            raise OpenFlowDecodeError(f"bad bucket length {length}")
        actions = decode_actions(data, pos + 8, pos + 8 + actions_len)
        values: dict[str, int | None] = {"weight": None}
        for ptype, payload in iter_props(data, pos + 8 + actions_len, pos + length):
            if ptype == c.OFPGBPT_WEIGHT:
                values["weight"] = _U16.unpack_from(payload)[0]
            elif ptype == c.OFPGBPT_WATCH_PORT:
                values["watch_port"] = _U32.unpack_from(payload)[0]
            elif ptype == c.OFPGBPT_WATCH_GROUP:
                values["watch_group"] = _U32.unpack_from(payload)[0]
            else:
                raise OpenFlowDecodeError(f"unknown bucket property {ptype}")
        buckets.append(Bucket(bucket_id, actions, **values))
        pos += length
    return tuple(buckets)


def _decode_group_props(data: bytes, start: int, end: int) -> dict[str, Any]:
    values: dict[str, Any] = {}
    pos = start
    while pos < end:
        if pos + 4 > end:
            raise OpenFlowDecodeError("truncated group property")
        ptype, length = struct.unpack_from("!HH", data, pos)
        padded = (length + 7) // 8 * 8
        if length < 4 or pos + padded > end:
            raise OpenFlowDecodeError("bad group property length")
        if ptype != c.OFPGPT_EXPERIMENTER or length < _SELECTION_METHOD.size:
            raise OpenFlowDecodeError(f"unknown group property {ptype}")
        _, _, vendor, exp_type, method, param = _SELECTION_METHOD.unpack_from(data, pos)
        if (
            vendor not in (c.NTR_VENDOR_ID, c.NTR_COMPAT_VENDOR_ID)
            or exp_type != c.NTRT_SELECTION_METHOD
        ):
            raise OpenFlowDecodeError("unknown group experimenter property")
        values["selection_method"] = method.split(b"\0", 1)[0].decode("ascii")
        values["selection_method_param"] = param
        fields = []
        fpos = pos + _SELECTION_METHOD.size
        while fpos + 4 <= pos + length:
            header = _U32.unpack_from(data, fpos)[0]
            if header & 0x100:
                raise OpenFlowDecodeError("bad selection method field header")
            fields.append(field_by_nxm_header(header))
            fpos += 4 + (header & 0xFF)
        values["fields"] = fields
        pos += padded
    return values


def _dec_group_mod(data: bytes, version: int) -> Message:
    command, group_type, group_id, buckets_len, command_bucket_id = _GROUP_MOD.unpack_from(data, 8)
    end = 24 + buckets_len
    if end > len(data):
        raise OpenFlowDecodeError("group buckets run past the message")
    buckets = _decode_buckets(data, 24, end)
    props = _decode_group_props(data, end, len(data))
    return GroupMod(
        command, group_id, group_type, buckets, command_bucket_id=command_bucket_id, **props
    )


def _dec_packet_out(data: bytes, version: int) -> Message:
    buffer_id, actions_len = _PACKET_OUT.unpack_from(data, 8)
    match, match_len = Match.decode(data, 16)
    start = 16 + match_len
    if start + actions_len > len(data):
        raise OpenFlowDecodeError("packet_out actions run past the message")
    actions = decode_actions(data, start, start + actions_len)
    in_port = match.get("in_port", c.OFPP_ANY)
    return PacketOut(actions, data[start + actions_len :], in_port, buffer_id, match)


def _dec_packet_in(data: bytes, version: int) -> Message:
    buffer_id, total_len, reason, table_id, cookie = _PACKET_IN.unpack_from(data, 8)
    match, match_len = Match.decode(data, 24)
    start = 24 + match_len + 2
    if start > len(data):
        raise OpenFlowDecodeError("packet_in data offset past the message")
    return PacketIn(
        reason, table_id, cookie, match, data[start:], total_len=total_len, buffer_id=buffer_id
    )


def _dec_packet_in2(data: bytes) -> Message:
    values: dict[str, Any] = {"cookie": 0xFFFFFFFFFFFFFFFF, "reason": 0, "table_id": 0}
    for ptype, payload in iter_props(data, 16, len(data)):
        if ptype == c.NXPINT_PACKET:
            values["data"] = payload
        elif ptype == c.NXPINT_FULL_LEN:
            values["total_len"] = _U32.unpack_from(payload)[0]
        elif ptype == c.NXPINT_BUFFER_ID:
            values["buffer_id"] = _U32.unpack_from(payload)[0]
        elif ptype == c.NXPINT_TABLE_ID:
            values["table_id"] = payload[0]
        elif ptype == c.NXPINT_COOKIE:
            values["cookie"] = struct.unpack_from("!Q", payload, 4)[0]
        elif ptype == c.NXPINT_REASON:
            values["reason"] = payload[0]
        elif ptype == c.NXPINT_METADATA:
            values["match"] = Match.from_entries(decode_tlvs(payload, 0, len(payload)))
        elif ptype == c.NXPINT_USERDATA:
            values["userdata"] = payload
        # NXPINT_CONTINUATION and future properties are of no use to us.
    return PacketIn(**values)


def _dec_bundle_ctrl(data: bytes, version: int) -> Message:
    bundle_id, ctrl_type, flags = _BUNDLE_CTRL.unpack_from(data, 8)
    return BundleCtrl(bundle_id, ctrl_type, flags, data[16:])


def _dec_bundle_add(data: bytes, version: int) -> Message:
    bundle_id, flags = struct.unpack_from("!I2xH", data, 8)
    inner = data[16:]
    if len(inner) < 8 or _U16.unpack_from(inner, 2)[0] != len(inner):
        raise OpenFlowDecodeError("bundle_add inner message length mismatch")
    if inner[1] == c.MsgType.BUNDLE_ADD_MESSAGE:
        raise OpenFlowDecodeError("nested bundle_add")
    return BundleAdd(bundle_id, decode(inner), flags)


def _dec_multipart_request(data: bytes, version: int) -> Message:
    mp_type, _ = _MULTIPART.unpack_from(data, 8)
    if mp_type == c.MultipartType.FLOW_DESC:
        table_id, out_port, out_group, cookie, cookie_mask = _FLOW_DESC_REQUEST.unpack_from(
            data, 16
        )
        match, _ = Match.decode(data, 48)
        return FlowDescRequest(
            table_id,
            out_port=out_port,
            out_group=out_group,
            cookie=cookie,
            cookie_mask=cookie_mask,
            match=match,
        )
    if mp_type == c.MultipartType.GROUP_DESC:
        return GroupDescRequest(_U32.unpack_from(data, 16)[0])
    if mp_type == c.MultipartType.GROUP_STATS:
        return GroupStatsRequest(_U32.unpack_from(data, 16)[0])
    raise OpenFlowDecodeError(f"unsupported multipart request {mp_type}")


def _dec_multipart_reply(data: bytes, version: int) -> Message:
    mp_type, flags = _MULTIPART.unpack_from(data, 8)
    more = bool(flags & c.OFPMPF_MORE)
    if mp_type == c.MultipartType.FLOW_DESC:
        return FlowDescReply.decoded(data[8:], more)
    if mp_type == c.MultipartType.GROUP_DESC:
        return GroupDescReply(_decode_group_descs(data, 16), more)
    if mp_type == c.MultipartType.GROUP_STATS:
        return GroupStatsReply(_decode_group_stats(data, 16), more)
    return MultipartReply(mp_type, flags, data[16:])


def _decode_group_stats(data: bytes, pos: int) -> Iterator[GroupStats]:
    while pos < len(data):
        if pos + 40 > len(data):
            raise OpenFlowDecodeError("truncated group stats")
        (length, group_id, ref_count, packets, octets, sec, nsec) = _GROUP_STATS.unpack_from(
            data, pos
        )
        end = pos + length
        if length < 40 or (length - 40) % 16 or end > len(data):
            raise OpenFlowDecodeError(f"bad group stats length {length}")
        buckets = tuple(struct.unpack_from("!QQ", data, p) for p in range(pos + 40, end, 16))
        yield GroupStats(group_id, ref_count, packets, octets, sec, nsec, buckets)
        pos = end


def _decode_group_descs(data: bytes, pos: int) -> Iterator[GroupMod]:
    while pos < len(data):
        if pos + 16 > len(data):
            raise OpenFlowDecodeError("truncated group desc")
        length, group_type, group_id, buckets_len = struct.unpack_from("!HBxIH6x", data, pos)
        end = pos + length
        if length < 16 or end > len(data) or 16 + buckets_len > length:
            raise OpenFlowDecodeError(f"bad group desc length {length}")
        buckets = _decode_buckets(data, pos + 16, pos + 16 + buckets_len)
        props = _decode_group_props(data, pos + 16 + buckets_len, end)
        yield GroupMod(c.GroupModCommand.ADD, group_id, group_type, buckets, **props)
        pos = end


_DECODERS: dict[int, _Decoder] = {
    c.MsgType.HELLO: _dec_hello,
    c.MsgType.ERROR: _dec_error,
    c.MsgType.ECHO_REQUEST: _dec_opaque(EchoRequest),
    c.MsgType.ECHO_REPLY: _dec_opaque(EchoReply),
    c.MsgType.EXPERIMENTER: _dec_experimenter,
    c.MsgType.FEATURES_REQUEST: _dec_empty(FeaturesRequest),
    c.MsgType.FEATURES_REPLY: _dec_features,
    c.MsgType.SET_CONFIG: _dec_set_config,
    c.MsgType.PACKET_IN: _dec_packet_in,
    c.MsgType.PACKET_OUT: _dec_packet_out,
    c.MsgType.FLOW_MOD: _dec_flow_mod,
    c.MsgType.GROUP_MOD: _dec_group_mod,
    c.MsgType.MULTIPART_REQUEST: _dec_multipart_request,
    c.MsgType.MULTIPART_REPLY: _dec_multipart_reply,
    c.MsgType.BARRIER_REQUEST: _dec_empty(BarrierRequest),
    c.MsgType.BARRIER_REPLY: _dec_empty(BarrierReply),
    c.MsgType.BUNDLE_CONTROL: _dec_bundle_ctrl,
    c.MsgType.BUNDLE_ADD_MESSAGE: _dec_bundle_add,
}
