"""The switch's own messages: HELLO and version negotiation, ERROR, echo, features,
barrier and SET_CONFIG."""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Self

from . import constants as c
from .errors import OpenFlowEncodeError
from .message import Header, Message

_HEADER = struct.Struct("!BBHI")


class Hello(Message):
    """HELLO with a version bitmap. ``versions`` are OpenFlow wire versions (6 = 1.5)."""

    __slots__ = ()
    _fields = ("versions",)
    versions: tuple[int, ...]
    msg_type = c.MsgType.HELLO
    raw_name = "OFPT_HELLO"

    def __new__(cls, versions: Iterable[int] = (c.OFP_VERSION,)) -> Hello:
        versions = tuple(sorted(set(versions)))
        if not versions or versions[0] < 1 or versions[-1] > 31:
            raise OpenFlowEncodeError("hello: versions must be in 1..31")
        bitmap = 0
        for v in versions:
            bitmap |= 1 << v
        wire = struct.pack("!HHI", c.OFPHET_VERSIONBITMAP, 8, bitmap)
        return tuple.__new__(cls, (wire, versions))

    def encode(self, xid: int) -> bytes:
        body: bytes = self[0]
        return _HEADER.pack(self[1][-1], self.msg_type, 8 + len(body), xid) + body

    def header_text(self, xid: int) -> str:
        return f"OFPT_HELLO ({_version_text(self[1][-1])}) (xid={xid:#x}):"

    def to_text(self, xid: int = 0) -> str:
        return "\n version bitmap: " + ", ".join(f"{v:#04x}" for v in self[1])


def _version_text(version: int) -> str:
    return f"OF1.{version - 1}"


class Error(Message):
    """OFPT_ERROR. ``name`` is e.g. ``OFPET_GROUP_MOD_FAILED/OFPGMFC_GROUP_EXISTS``;
    ``data`` holds the first bytes of the message that failed."""

    __slots__ = ()
    _fields = ("type", "code", "data", "experimenter")
    type: int
    code: int
    data: bytes
    experimenter: int
    msg_type = c.MsgType.ERROR
    raw_name = "OFPT_ERROR"

    def __new__(cls, type: int, code: int, data: bytes = b"", experimenter: int = 0) -> Error:
        data = bytes(data)
        try:
            if type == c.OFPET_EXPERIMENTER:
                wire = struct.pack("!HHI", type, code, experimenter) + data
            else:
                wire = struct.pack("!HH", type, code) + data
                experimenter = 0
        except struct.error as exc:
            raise OpenFlowEncodeError(f"error: {exc}") from None
        return tuple.__new__(cls, (wire, type, code, data, experimenter))

    @property
    def type_name(self) -> str:
        return c.ERROR_TYPE_NAMES.get(self[1], f"OFPET_{self[1]}")

    @property
    def code_name(self) -> str:
        if self[1] == c.OFPET_EXPERIMENTER:
            return c.EXPERIMENTER_ERROR_NAMES.get(
                (self[4], self[2]), f"EXPERIMENTER_{self[4]:#x}_{self[2]}"
            )
        return c.ERROR_CODE_NAMES.get((self[1], self[2]), f"{self.type_name}_CODE_{self[2]}")

    @property
    def name(self) -> str:
        return f"{self.type_name}/{self.code_name}"

    @property
    def failed_header(self) -> Header | None:
        """The header of the message that failed, if the error carries it."""
        data = self[3]
        return Header(*_HEADER.unpack_from(data)) if len(data) >= 8 else None

    def to_text(self, xid: int = 0) -> str:
        text = f" {self.code_name}"
        header = self.failed_header
        if header is not None:
            try:
                kind = c.MsgType(header.msg_type).name
            except ValueError:
                kind = str(header.msg_type)
            text += f"\n (failed message: OFPT_{kind}, xid={header.xid:#x})"
        return text


class _Opaque(Message):
    """A message whose body is opaque bytes (echo)."""

    __slots__ = ()
    _fields = ("data",)
    data: bytes

    def __new__(cls, data: bytes = b"") -> Self:
        return tuple.__new__(cls, (bytes(data), bytes(data)))

    def to_text(self, xid: int = 0) -> str:
        return f" {len(self[1])} bytes of payload"


class EchoRequest(_Opaque):
    __slots__ = ()
    msg_type = c.MsgType.ECHO_REQUEST
    raw_name = "OFPT_ECHO_REQUEST"


class EchoReply(_Opaque):
    __slots__ = ()
    msg_type = c.MsgType.ECHO_REPLY
    raw_name = "OFPT_ECHO_REPLY"


class _Empty(Message):
    __slots__ = ()
    _fields = ()

    def __new__(cls) -> Self:
        return tuple.__new__(cls, (b"",))


class FeaturesRequest(_Empty):
    __slots__ = ()
    msg_type = c.MsgType.FEATURES_REQUEST
    raw_name = "OFPT_FEATURES_REQUEST"


class BarrierRequest(_Empty):
    __slots__ = ()
    msg_type = c.MsgType.BARRIER_REQUEST
    raw_name = "OFPT_BARRIER_REQUEST"


class BarrierReply(_Empty):
    __slots__ = ()
    msg_type = c.MsgType.BARRIER_REPLY
    raw_name = "OFPT_BARRIER_REPLY"


_FEATURES = struct.Struct("!QIBB2xII")
_CAPABILITIES = (
    (1, "FLOW_STATS"),
    (2, "TABLE_STATS"),
    (4, "PORT_STATS"),
    (8, "GROUP_STATS"),
    (0x20, "IP_REASM"),
    (0x40, "QUEUE_STATS"),
    (0x100, "PORT_BLOCKED"),
    (0x200, "BUNDLES"),
    (0x400, "FLOW_MONITORING"),
)


class FeaturesReply(Message):
    __slots__ = ()
    _fields = ("datapath_id", "n_buffers", "n_tables", "auxiliary_id", "capabilities")
    datapath_id: int
    n_buffers: int
    n_tables: int
    auxiliary_id: int
    capabilities: int
    msg_type = c.MsgType.FEATURES_REPLY
    raw_name = "OFPT_FEATURES_REPLY"

    def __new__(
        cls,
        datapath_id: int,
        n_buffers: int = 0,
        n_tables: int = 254,
        auxiliary_id: int = 0,
        capabilities: int = 0,
    ) -> FeaturesReply:
        try:
            wire = _FEATURES.pack(datapath_id, n_buffers, n_tables, auxiliary_id, capabilities, 0)
        except struct.error as exc:
            raise OpenFlowEncodeError(f"features reply: {exc}") from None
        return tuple.__new__(
            cls, (wire, datapath_id, n_buffers, n_tables, auxiliary_id, capabilities)
        )

    def to_text(self, xid: int = 0) -> str:
        text = f" dpid:{self[1]:016x}\nn_tables:{self[3]}, n_buffers:{self[2]}"
        names = [name for bit, name in _CAPABILITIES if self[5] & bit]
        return text + "\ncapabilities: " + " ".join(names) if names else text


class SetConfig(Message):
    """OFPT_SET_CONFIG. A nonzero ``miss_send_len`` lets a management (service) connection
    receive asynchronous messages such as packet-ins."""

    __slots__ = ()
    _fields = ("flags", "miss_send_len")
    flags: int
    miss_send_len: int
    msg_type = c.MsgType.SET_CONFIG
    raw_name = "OFPT_SET_CONFIG"

    def __new__(cls, flags: int = 0, miss_send_len: int = c.OFPCML_NO_BUFFER) -> SetConfig:
        try:
            wire = struct.pack("!HH", flags, miss_send_len)
        except struct.error as exc:
            raise OpenFlowEncodeError(f"set_config: {exc}") from None
        return tuple.__new__(cls, (wire, flags, miss_send_len))

    def to_text(self, xid: int = 0) -> str:
        frags = {0: "normal", 1: "drop", 2: "reassemble", 3: "nx-match"}.get(self[1] & 3, "?")
        return f" frags={frags} miss_send_len={self[2]}"
