"""OpenFlow 1.5 messages: values, ``encode(msg, xid)`` and ``decode(data)``.

A message value's wire is its body (everything after the 8-byte header), encoded once;
``encode`` only prepends the header for a given xid. ``to_text()`` renders a message the
way ``ovs-ofctl ofp-print`` does (``header_text`` gives the ``OFPT_... (OF1.5) (xid=..):``
prefix), so the same strings serve logs, the dump command and oracle tests.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

from . import constants as c
from ._value import Value
from .actions import (
    Action,
    ApplyActions,
    Instruction,
    canonical_instructions,
    decode_actions,
    decode_instructions,
    format_actions,
    format_instructions,
    iter_props,
    join_actions,
)
from .errors import MessageTooLarge, OpenFlowDecodeError, OpenFlowEncodeError
from .fields import (
    FIELDS,
    IN_PORT,
    Entry,
    Field,
    Match,
    decode_tlvs,
    field_by_nxm_header,
    format_port,
    get_field,
)

_HEADER = struct.Struct("!BBHI")
_U16 = struct.Struct("!H")
_U32 = struct.Struct("!I")
_ZEROS = bytes(8)


class Header(NamedTuple):
    version: int
    msg_type: int
    length: int
    xid: int


def parse_header(data: bytes) -> Header:
    """The header of a message (no validation beyond its presence)."""
    if len(data) < c.OFP_HEADER_LEN:
        raise OpenFlowDecodeError("message shorter than an OpenFlow header")
    return Header(*_HEADER.unpack_from(data))


class Message(Value):
    """Base of all messages. ``msg_type`` is the OFPT_* type in the header."""

    __slots__ = ()
    msg_type: ClassVar[int]
    # Name ovs-ofctl prints in the header line (ofpraw name).
    raw_name: ClassVar[str] = ""

    def encode(self, xid: int) -> bytes:
        body = self[0]
        length = 8 + len(body)
        if length > c.OFP_MAX_MESSAGE_LEN:
            raise MessageTooLarge(type(self).__name__, length, c.OFP_MAX_MESSAGE_LEN)
        return _HEADER.pack(c.OFP_VERSION, self.msg_type, length, xid) + body

    @property
    def length(self) -> int:
        """The encoded length, header included."""
        return 8 + len(self[0])

    def header_text(self, xid: int) -> str:
        return f"{self.raw_name} (OF1.5) (xid={xid:#x}):"

    def to_text(self, xid: int = 0) -> str:
        """The body as ``ovs-ofctl ofp-print`` prints it after the header line (``xid``
        only matters for messages that embed another message)."""
        return ""


def encode(msg: Message, xid: int) -> bytes:
    """The bytes of ``msg`` with transaction id ``xid``."""
    return msg.encode(xid)


def to_text(msg: Message, xid: int | None = None) -> str:
    """``ofp-print`` text of a message; with ``xid``, including its header line."""
    if xid is None:
        return msg.to_text().strip()
    return (msg.header_text(xid) + msg.to_text(xid)).rstrip()


# -- simple messages ---------------------------------------------------------------------------


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
        body = self[0]
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

    def __new__(cls, data: bytes = b"") -> Any:
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

    def __new__(cls) -> Any:
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


_NX_MSG = struct.Struct("!II")


class SetPacketInFormat(Message):
    """NXT_SET_PACKET_IN_FORMAT: ask for NXT_PACKET_IN2 packet-ins (which carry userdata)."""

    __slots__ = ()
    _fields = ("packet_in_format",)
    packet_in_format: int
    msg_type = c.MsgType.EXPERIMENTER
    raw_name = "NXT_SET_PACKET_IN_FORMAT"

    def __new__(cls, packet_in_format: int = c.NXPIF_NXT_PACKET_IN2) -> SetPacketInFormat:
        wire = _NX_MSG.pack(c.NX_VENDOR_ID, c.NXT_SET_PACKET_IN_FORMAT) + _U32.pack(
            packet_in_format
        )
        return tuple.__new__(cls, (wire, packet_in_format))

    def to_text(self, xid: int = 0) -> str:
        names = {0: "standard", 1: "nxt_packet_in", 2: "nxt_packet_in2"}
        return f" format={names.get(self[1], str(self[1]))}"


# -- FLOW_MOD --------------------------------------------------------------------------------

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
        if (
            type(instructions) is tuple
            and len(instructions) == 1
            and type(instructions[0]) is ApplyActions
            and instructions[0][1]
        ):
            canonical = instructions
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
                return instruction[1]
        return ()

    def as_delete(self, strict: bool = True) -> FlowMod:
        """A DELETE(_STRICT) of this flow (same table, priority, match and cookie)."""
        return FlowMod(
            self[1],
            self[2],
            self[3],
            (),
            cookie=self[5],
            cookie_mask=0xFFFFFFFFFFFFFFFF if self[5] else 0,
            command=c.FlowModCommand.DELETE_STRICT if strict else c.FlowModCommand.DELETE,
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


# -- GROUP_MOD ----------------------------------------------------------------------------------

_BUCKET = struct.Struct("!HHI")
_PROP_U16 = struct.Struct("!HHH2x")
_PROP_U32 = struct.Struct("!HHI")


class Bucket(Value):
    """A group bucket (OpenFlow 1.5 form, with a bucket id and a weight property).

    ``weight=None`` leaves the weight out (for non-select groups). The bucket's bytes are
    computed once, so re-encoding a group with the same buckets is a join.
    """

    __slots__ = ()
    _fields = ("bucket_id", "actions", "weight", "watch_port", "watch_group")
    bucket_id: int
    actions: tuple[Action, ...]
    weight: int | None
    watch_port: int | None
    watch_group: int | None

    def __new__(
        cls,
        bucket_id: int,
        actions: Iterable[Action],
        weight: int | None = 100,
        watch_port: int | None = None,
        watch_group: int | None = None,
    ) -> Bucket:
        actions, body = join_actions(actions, "bucket")
        if bucket_id > c.OFPG_BUCKET_MAX or bucket_id < 0:
            raise OpenFlowEncodeError(f"bucket id {bucket_id} is out of range")
        try:
            props = b""
            if weight is not None:
                props = _PROP_U16.pack(c.OFPGBPT_WEIGHT, 8, weight)
            if watch_port is not None:
                props += _PROP_U32.pack(c.OFPGBPT_WATCH_PORT, 8, watch_port)
            if watch_group is not None:
                props += _PROP_U32.pack(c.OFPGBPT_WATCH_GROUP, 8, watch_group)
            length = 8 + len(body) + len(props)
            if length > 0xFFFF:
                raise MessageTooLarge("bucket", length, 0xFFFF)
            wire = _BUCKET.pack(length, len(body), bucket_id) + body + props
        except struct.error as exc:
            raise OpenFlowEncodeError(f"bucket: {exc}") from None
        return tuple.__new__(cls, (wire, bucket_id, actions, weight, watch_port, watch_group))

    def to_text(self, group_type: int = c.GroupType.SELECT) -> str:
        """``ofputil_bucket_format``."""
        _, bucket_id, actions, weight, watch_port, watch_group = self
        text = f"bucket=bucket_id:{bucket_id},"
        default_weight = 1 if group_type == c.GroupType.SELECT else 0
        effective = default_weight if weight is None else weight
        if effective != default_weight:
            text += f"weight:{effective},"
        if watch_port is not None and watch_port != c.OFPP_ANY:
            text += f"watch_port:{format_port(watch_port)},"
        if watch_group is not None and watch_group != c.OFPG_ANY:
            text += f"watch_group:{watch_group},"
        return text + "actions=" + format_actions(actions)


_GROUP_MOD = struct.Struct("!HBxIH2xI")
_SELECTION_METHOD = struct.Struct("!HHII4x16sQ")


def _selection_method_prop(method: str, param: int, fields: tuple[Field, ...]) -> bytes:
    if not param and not fields:
        prop = _PLAIN_SELECTION_PROPS.get(method)
        if prop is not None:
            return prop
    return _encode_selection_method_prop(method, param, fields)


def _encode_selection_method_prop(method: str, param: int, fields: tuple[Field, ...]) -> bytes:
    raw = method.encode()
    if len(raw) >= c.NTR_MAX_SELECTION_METHOD_LEN:
        raise OpenFlowEncodeError(f"selection method {method!r} is too long")
    # Open vSwitch writes each field as its (unmasked) header followed by an all-ones mask.
    field_headers = b"".join(_U32.pack(f.oxm_header) + b"\xff" * f.n_bytes for f in fields)
    length = _SELECTION_METHOD.size + len(field_headers)
    return (
        _SELECTION_METHOD.pack(
            c.OFPGPT_EXPERIMENTER, length, c.NTR_VENDOR_ID, c.NTRT_SELECTION_METHOD, raw, param
        )
        + field_headers
        + _ZEROS[: -length % 8]
    )


# Open vSwitch's two methods, encoded once (a fixed table: decoding adds nothing to it).
_PLAIN_SELECTION_PROPS = {m: _encode_selection_method_prop(m, 0, ()) for m in ("hash", "dp_hash")}


class GroupMod(Message):
    """OFPT_GROUP_MOD (OpenFlow 1.5): ADD, MODIFY, DELETE, INSERT_BUCKET, REMOVE_BUCKET.

    ``command_bucket_id`` defaults to ``OFPG_BUCKET_LAST`` for INSERT_BUCKET and to
    ``OFPG_BUCKET_ALL`` otherwise (REMOVE_BUCKET then removes every bucket; pass a bucket
    id to remove one). ``selection_method`` is Open vSwitch's ``"dp_hash"`` or ``"hash"``
    (with ``fields``). A group whose buckets exceed 65,535 bytes raises ``MessageTooLarge``;
    ``split_group_mod`` builds the ADD/MODIFY + INSERT_BUCKET chunks.
    """

    __slots__ = ()
    _fields = (
        "command",
        "group_id",
        "group_type",
        "buckets",
        "command_bucket_id",
        "selection_method",
        "selection_method_param",
        "fields",
    )
    command: int
    group_id: int
    group_type: int
    buckets: tuple[Bucket, ...]
    command_bucket_id: int
    selection_method: str | None
    selection_method_param: int
    msg_type = c.MsgType.GROUP_MOD
    raw_name = "OFPT_GROUP_MOD"

    def __new__(
        cls,
        command: int,
        group_id: int,
        group_type: int = c.GroupType.SELECT,
        buckets: Iterable[Bucket] = (),
        *,
        command_bucket_id: int | None = None,
        selection_method: str | None = None,
        selection_method_param: int = 0,
        fields: Iterable[str | Field] | None = None,
    ) -> GroupMod:
        buckets = tuple(buckets)
        if command_bucket_id is None:
            command_bucket_id = (
                c.OFPG_BUCKET_LAST
                if command == c.GroupModCommand.INSERT_BUCKET
                else c.OFPG_BUCKET_ALL
            )
        field_list = tuple(get_field(f) for f in fields) if fields else ()
        if selection_method == "":
            selection_method = None
        if field_list and selection_method != "hash":
            raise OpenFlowEncodeError("group: fields need selection_method='hash'")
        if selection_method is None and selection_method_param:
            raise OpenFlowEncodeError("group: selection_method_param needs a selection_method")
        if selection_method is not None and command not in (
            c.GroupModCommand.ADD,
            c.GroupModCommand.MODIFY,
            c.GroupModCommand.ADD_OR_MOD,
        ):
            # Open vSwitch rejects the property on other commands (OFPBPC_BAD_VALUE).
            raise OpenFlowEncodeError(
                "group: selection_method is only allowed on ADD/MODIFY/ADD_OR_MOD"
            )
        if command in (c.GroupModCommand.DELETE, c.GroupModCommand.REMOVE_BUCKET) and buckets:
            raise OpenFlowEncodeError("group: DELETE and REMOVE_BUCKET carry no buckets")
        try:
            body = b"".join([b[0] for b in buckets])
        except TypeError:
            raise OpenFlowEncodeError(f"group: not a list of buckets: {buckets!r}") from None
        for b in buckets:
            if type(b) is not Bucket:
                raise OpenFlowEncodeError(f"group: {b!r} is not a Bucket")
        if len(body) > 0xFFFF:
            raise MessageTooLarge(f"group {group_id} buckets", len(body), 0xFFFF)
        try:
            head = _GROUP_MOD.pack(command, group_type, group_id, len(body), command_bucket_id)
        except struct.error as exc:
            raise OpenFlowEncodeError(f"group_mod: {exc}") from None
        props = (
            b""
            if selection_method is None
            else _selection_method_prop(selection_method, selection_method_param, field_list)
        )
        return tuple.__new__(
            cls,
            (
                head + body + props,
                command,
                group_id,
                group_type,
                buckets,
                command_bucket_id,
                selection_method,
                selection_method_param,
                tuple(f.name for f in field_list),
            ),
        )

    def to_text(self, xid: int = 0) -> str:
        """``ofputil_group_mod_format``."""
        command = self[1]
        bucket_command = command in (
            c.GroupModCommand.INSERT_BUCKET,
            c.GroupModCommand.REMOVE_BUCKET,
        )
        text = "\n " + c.GROUP_MOD_COMMAND_NAMES.get(command, f"cmd:{command}") + " "
        if bucket_command:
            text += f"command_bucket_id:{_bucket_id_text(self[5])},"
        return text + format_group(self, suppress_type=bucket_command)

    def format_group(self) -> str:
        return format_group(self)

    @property
    def fields(self) -> tuple[Field, ...]:
        """The hash fields of selection_method="hash" (kept by name in the value)."""
        return tuple(FIELDS[name] for name in self[8])


def bucket_length(bucket: Bucket) -> int:
    """Encoded size of a bucket, for sizing GroupMod chunks."""
    return len(bucket[0])


def group_mod_length(group: GroupMod) -> int:
    """Encoded size of a group mod message, header included."""
    return 8 + len(group[0])


def group_mod_overhead(
    selection_method: str | None = None, fields: Iterable[str | Field] = ()
) -> int:
    """Size of a group mod message without buckets (header, group header, properties)."""
    props = (
        0
        if selection_method is None
        else len(_selection_method_prop(selection_method, 0, tuple(get_field(f) for f in fields)))
    )
    return 8 + _GROUP_MOD.size + props


def _bucket_id_text(bucket_id: int) -> str:
    return c.BUCKET_ID_NAMES.get(bucket_id, str(bucket_id))


def format_group(group: GroupMod, suppress_type: bool = False) -> str:
    """``ofputil_group_format``: ``group_id=5,type=select,...,bucket=...`` (dump-groups)."""
    text = f"group_id={group.group_id}"
    if not suppress_type:
        text += f",type={c.GROUP_TYPE_NAMES.get(group.group_type, 'unknown')}"
    if group.selection_method:
        text += f",selection_method={group.selection_method}"
        if group.selection_method_param:
            text += f",selection_method_param={group.selection_method_param}"
        fields = group.fields
        if len(fields) == 1:
            text += f",fields={fields[0].mf_name}"
        elif fields:
            text += f",fields({','.join(f.mf_name for f in fields)})"
    if group.buckets:
        text += "," + ",".join(b.to_text(group.group_type) for b in group.buckets)
    return text


def group_mod_chunks(
    command: int,
    group_id: int,
    buckets: Iterable[Bucket],
    *,
    group_type: int = c.GroupType.SELECT,
    command_bucket_id: int | None = None,
    selection_method: str | None = None,
    selection_method_param: int = 0,
    fields: Iterable[str | Field] | None = None,
    limit: int = c.MAX_BUNDLED_MESSAGE_LEN,
) -> list[GroupMod]:
    """The messages that install a group of any size: ``command`` (ADD, MODIFY or
    INSERT_BUCKET) with the buckets that fit in ``limit`` bytes, then INSERT_BUCKET
    messages, each inserting after the last bucket of the one before, so the switch ends
    up with the buckets in the given order. Send them in order in one ordered, atomic
    bundle. The default limit leaves room for the BUNDLE_ADD header; use
    ``OFP_MAX_MESSAGE_LEN`` outside bundles. Sizes are the buckets' real encoded lengths.
    """
    buckets = tuple(buckets)
    first_overhead = group_mod_overhead(selection_method, fields or ())
    later_overhead = group_mod_overhead()
    chunks: list[list[Bucket]] = [[]]
    budget = limit - first_overhead
    for bucket in buckets:
        size = len(bucket[0])
        if size > limit - later_overhead:
            raise MessageTooLarge(f"bucket {bucket.bucket_id}", size, limit - later_overhead)
        if size > budget and chunks[-1]:
            if command not in (
                c.GroupModCommand.ADD,
                c.GroupModCommand.MODIFY,
                c.GroupModCommand.ADD_OR_MOD,
                c.GroupModCommand.INSERT_BUCKET,
            ):
                raise MessageTooLarge("group mod", limit - budget + size, limit)
            chunks.append([])
            budget = limit - later_overhead
        chunks[-1].append(bucket)
        budget -= size
    result = [
        GroupMod(
            command,
            group_id,
            group_type,
            chunks[0],
            command_bucket_id=command_bucket_id,
            selection_method=selection_method,
            selection_method_param=selection_method_param,
            fields=fields,
        )
    ]
    for previous, chunk in itertools.pairwise(chunks):
        result.append(
            GroupMod(
                c.GroupModCommand.INSERT_BUCKET,
                group_id,
                group_type,
                chunk,
                command_bucket_id=previous[-1].bucket_id,
            )
        )
    return result


def split_group_mod(group: GroupMod, limit: int = c.MAX_BUNDLED_MESSAGE_LEN) -> list[GroupMod]:
    """``group_mod_chunks`` for an existing GroupMod: ``[group]`` if it fits in ``limit``."""
    if 8 + len(group[0]) <= limit:
        return [group]
    return group_mod_chunks(
        group.command,
        group.group_id,
        group.buckets,
        group_type=group.group_type,
        command_bucket_id=group.command_bucket_id,
        selection_method=group.selection_method,
        selection_method_param=group.selection_method_param,
        fields=group.fields,
        limit=limit,
    )


# -- PACKET_OUT / PACKET_IN -----------------------------------------------------------------------

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
        return self[4].get("in_port")

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
    return _U16.unpack_from(match[0], 2)[0]


def _prop(prop_type: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("!HH", prop_type, length) + payload + _ZEROS[: -length % 8]


# -- bundles ------------------------------------------------------------------------------------

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
        return 16 + self[2].length

    def to_text(self, xid: int = 0) -> str:
        inner = self[2]
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
    body = message[0]
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


def bundle_add(
    bundle_id: int,
    inner: bytes,
    xid: int,
    flags: int = c.BundleFlags.ATOMIC | c.BundleFlags.ORDERED,
) -> bytes:
    """Wraps an already-encoded message in a BUNDLE_ADD without re-encoding it.

    The inner xid is rewritten to ``xid`` if it differs (Open vSwitch requires equality).
    """
    total = 16 + len(inner)
    if len(inner) < 8:
        raise OpenFlowEncodeError("bundle_add: inner message shorter than a header")
    if total > c.OFP_MAX_MESSAGE_LEN:
        raise MessageTooLarge("message in a bundle", len(inner), c.MAX_BUNDLED_MESSAGE_LEN)
    head = _HEADER.pack(c.OFP_VERSION, c.MsgType.BUNDLE_ADD_MESSAGE, total, xid) + struct.pack(
        "!I2xH", bundle_id, flags
    )
    if _U32.unpack_from(inner, 4)[0] != xid:
        return b"".join((head, inner[:4], _U32.pack(xid), inner[8:]))
    return head + inner


# -- multipart ----------------------------------------------------------------------------------

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
        return text + " " + self[6].to_text()


class _GroupRequest(Message):
    """A multipart request about one group or all of them (group_id=ALL)."""

    __slots__ = ()
    _fields = ("group_id",)
    group_id: int
    msg_type = c.MsgType.MULTIPART_REQUEST
    multipart_type: ClassVar[int]
    raw_name = ""

    def __new__(cls, group_id: int = c.OFPG_ALL) -> Any:
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
        rest = flow.match[0] + stats_raw + b"".join(i[0] for i in flow.instructions)
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
    """OFPMP_FLOW_DESC reply: installed flows. ``more`` means more replies follow."""

    __slots__ = ()
    _fields = ("flows", "more")
    flows: tuple[FlowDesc, ...]
    more: bool
    msg_type = c.MsgType.MULTIPART_REPLY
    raw_name = "OFPST_FLOW reply"

    def __new__(cls, flows: Iterable[FlowDesc] = (), more: bool = False) -> FlowDescReply:
        flows = tuple(flows)
        wire = _MULTIPART.pack(c.MultipartType.FLOW_DESC, c.OFPMPF_MORE if more else 0) + b"".join(
            f.encode() for f in flows
        )
        return tuple.__new__(cls, (wire, flows, bool(more)))

    def to_text(self, xid: int = 0) -> str:
        return "".join("\n " + f.format_flow() for f in self[1])


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


# -- decoding ---------------------------------------------------------------------------------


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


def decode_with_xid(data: bytes) -> tuple[int, Message]:
    msg = decode(data)
    return _U32.unpack_from(data, 4)[0], msg


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


def _dec_opaque(cls: type) -> Any:
    return lambda data, version: cls(data[8:])


def _dec_empty(cls: type) -> Any:
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
        return FlowDescReply(_decode_flow_descs(data, 16), more)
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


def _decode_flow_descs(data: bytes, pos: int) -> Iterator[FlowDesc]:
    while pos < len(data):
        if pos + 24 > len(data):
            raise OpenFlowDecodeError("truncated flow desc")
        (length, table_id, priority, idle, hard, flags, importance, cookie) = (
            _FLOW_DESC.unpack_from(data, pos)
        )
        end = pos + length
        if length < 24 or end > len(data):
            raise OpenFlowDecodeError(f"bad flow desc length {length}")
        match, match_len = Match.decode(data[:end], pos + 24)
        stats_pos = pos + 24 + match_len
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
        pos = end


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


_DECODERS: dict[int, Any] = {
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

# Message kinds for counters and logs, by header type.
MESSAGE_KIND = {t: c.MsgType(t).name for t in c.MsgType}


def message_kind(msg_type: int) -> str:
    return MESSAGE_KIND.get(msg_type, f"TYPE_{msg_type}")
