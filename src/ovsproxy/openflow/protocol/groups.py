"""OFPT_GROUP_MOD (OpenFlow 1.5, with bucket ids and Open vSwitch's selection method
property), buckets, and the dump-groups text form. Splitting a group over the message limit
into chunks is the datapath's policy (``ovsproxy.datapath.groups``)."""

from __future__ import annotations

import struct
from collections.abc import Iterable

from . import constants as c
from ._value import Value
from .actions import Action, format_actions, join_actions
from .errors import MessageTooLarge, OpenFlowEncodeError
from .fields import FIELDS, Field, format_port, get_field
from .message import Message

_U32 = struct.Struct("!I")
_ZEROS = bytes(8)


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
    ``ovsproxy.datapath.groups.group_mod_chunks`` builds ADD/MODIFY + INSERT_BUCKET chunks.
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
