"""Bundles: OFPT_BUNDLE_CONTROL and OFPT_BUNDLE_ADD_MESSAGE (encoded with one pack)."""

from __future__ import annotations

import struct

from . import constants as c
from .errors import MessageTooLarge, OpenFlowEncodeError
from .message import Message
from .switch import Hello

_BUNDLE_CTRL = struct.Struct("!IHH")
_BUNDLE_ADD_HEADERS = struct.Struct("!BBHII2xHBBHI")  # outer header, bundle part, inner header
_pack_bundle_add_headers = _BUNDLE_ADD_HEADERS.pack


class BundleCtrl(Message):
    """OFPT_BUNDLE_CONTROL: OPEN/CLOSE/COMMIT/DISCARD requests and their replies."""

    __slots__ = ()
    _fields = ("bundle_id", "ctrl_type", "flags", "properties")
    bundle_id: int
    ctrl_type: int
    flags: int
    properties: bytes
    msg_type = c.MsgType.BUNDLE_CONTROL
    raw_name = "OFPT_BUNDLE_CONTROL"

    def __new__(
        cls,
        bundle_id: int,
        ctrl_type: int,
        flags: int = c.BundleFlags.ATOMIC | c.BundleFlags.ORDERED,
        properties: bytes = b"",
    ) -> BundleCtrl:
        try:
            wire = _BUNDLE_CTRL.pack(bundle_id, ctrl_type, flags) + bytes(properties)
        except struct.error as exc:
            raise OpenFlowEncodeError(f"bundle_ctrl: {exc}") from None
        return tuple.__new__(cls, (wire, bundle_id, int(ctrl_type), int(flags), bytes(properties)))

    def to_text(self, xid: int = 0) -> str:
        try:
            kind = c.BundleCtrlType(self[2]).name
        except ValueError:
            kind = str(self[2])
        return f"\n bundle_id={self[1]:#x} type={kind} flags=" + _bundle_flags_text(self[3])


def _bundle_flags_text(flags: int) -> str:
    names = []
    if flags & c.BundleFlags.ATOMIC:
        names.append("atomic")
    if flags & c.BundleFlags.ORDERED:
        names.append("ordered")
    return " ".join(names) if names else "0"


class BundleAdd(Message):
    """OFPT_BUNDLE_ADD_MESSAGE wrapping ``message``; its xid is the outer message's xid
    (Open vSwitch requires them equal)."""

    __slots__ = ()
    _fields = ("bundle_id", "message", "flags")
    bundle_id: int
    message: Message
    flags: int
    msg_type = c.MsgType.BUNDLE_ADD_MESSAGE
    raw_name = "OFPT_BUNDLE_ADD_MESSAGE"

    def __new__(
        cls,
        bundle_id: int,
        message: Message,
        flags: int = c.BundleFlags.ATOMIC | c.BundleFlags.ORDERED,
    ) -> BundleAdd:
        if not isinstance(message, Message):
            raise OpenFlowEncodeError("bundle_add: message must be a Message")
        try:
            _BUNDLE_CTRL.pack(bundle_id, 0, flags)
        except struct.error as exc:
            raise OpenFlowEncodeError(f"bundle_add: {exc}") from None
        # The wire (minus the inner header, which needs the xid) is bundle part + body.
        wire = struct.pack("!I2xH", bundle_id, flags) + message[0]
        return tuple.__new__(cls, (wire, bundle_id, message, int(flags)))

    def encode(self, xid: int) -> bytes:
        return encode_bundle_add(self[1], self[2], xid, self[3])

    @property
    def length(self) -> int:
        return 16 + self.message.length

    def to_text(self, xid: int = 0) -> str:
        inner = self.message
        return (
            f"\n bundle_id={self[1]:#x} flags={_bundle_flags_text(self[3])}\n"
            + inner.header_text(xid)
            + inner.to_text(xid)
        )


def encode_bundle_add(
    bundle_id: int,
    message: Message,
    xid: int,
    flags: int = c.BundleFlags.ATOMIC | c.BundleFlags.ORDERED,
) -> bytes:
    """BUNDLE_ADD of ``message`` with outer and inner xid ``xid``: one pack and one concat."""
    body: bytes = message[0]
    inner_len = 8 + len(body)
    total = 16 + inner_len
    if total > c.OFP_MAX_MESSAGE_LEN:
        raise MessageTooLarge(
            f"{type(message).__name__} in a bundle", inner_len, c.MAX_BUNDLED_MESSAGE_LEN
        )
    inner_version = message[1][-1] if type(message) is Hello else _VERSION
    return (
        _pack_bundle_add_headers(
            _VERSION,
            _BUNDLE_ADD_TYPE,
            total,
            xid,
            bundle_id,
            flags,
            inner_version,
            message.msg_type,
            inner_len,
            xid,
        )
        + body
    )


# (plain ints, bound once: this runs for every message of a full sync)
_VERSION = int(c.OFP_VERSION)
_BUNDLE_ADD_TYPE = int(c.MsgType.BUNDLE_ADD_MESSAGE)
