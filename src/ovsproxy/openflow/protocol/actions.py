"""Actions and instructions (OpenFlow 1.5 and the Nicira extensions Open vSwitch needs).

Every action is a ``Value`` whose wire is its complete, padded TLV, computed once when it
is built; an action list encodes as a ``b"".join``. ``to_text()`` gives the ``ovs-ofctl``
syntax. Encodings follow what Open vSwitch itself emits in OpenFlow 1.5 (``set_field``
rather than NX ``reg_load``, the standard ``copy_field`` rather than NX ``reg_move``).
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Iterable
from typing import Any

from . import constants as c
from ._value import Value
from .errors import OpenFlowDecodeError, OpenFlowEncodeError
from .fields import (
    FIELDS as _FIELDS,
)
from .fields import (
    IN_PORT,
    Field,
    Subfield,
    decode_tlvs,
    field_by_nxm_header,
    field_named,
    format_hex,
    format_ipv6,
    format_port,
    get_field,
)

_HEADER = struct.Struct("!HH")
_APPLY = struct.Struct("!HH4x")
_NX_HEADER = struct.Struct("!HHIH")
_U16 = struct.Struct("!H")
_U32 = struct.Struct("!I")
_ZEROS = bytes(16)
_IP_TYPES = (ipaddress.IPv4Address, ipaddress.IPv6Address)


def _pad8(length: int) -> bytes:
    return _ZEROS[: -length % 8]


def _prop(prop_type: int, payload: bytes) -> bytes:
    """An OpenFlow 1.4+ property: its length excludes the padding to 8 bytes."""
    length = 4 + len(payload)
    return _HEADER.pack(prop_type, length) + payload + _pad8(length)


class Action(Value):
    """Base of all actions."""

    __slots__ = ()

    def to_text(self) -> str:
        raise NotImplementedError


def _encode_error(action: str, exc: Exception) -> OpenFlowEncodeError:
    return OpenFlowEncodeError(f"{action}: {exc}")


# -- standard actions ------------------------------------------------------------------------

_OUTPUT = struct.Struct("!HHIH6x")


class Output(Action):
    """``output:PORT`` (``CONTROLLER:max_len`` for the controller port)."""

    __slots__ = ()
    _fields = ("port", "max_len")
    port: int
    max_len: int

    def __new__(cls, port: int, max_len: int | None = None) -> Output:
        if max_len is None:
            max_len = 0xFFFF if port == c.OFPP_CONTROLLER else 0
        try:
            wire = _OUTPUT.pack(c.OFPAT_OUTPUT, 16, port, max_len)
        except struct.error as exc:
            raise _encode_error("output", exc) from None
        return tuple.__new__(cls, (wire, port, max_len))

    def to_text(self) -> str:
        port = self[1]
        if port == c.OFPP_CONTROLLER:
            return f"CONTROLLER:{self[2]}"
        if port < c.OFPP_MAX:
            return f"output:{port}"
        return format_port(port)


_GROUP = struct.Struct("!HHI")


class GroupAction(Action):
    """``group:ID``."""

    __slots__ = ()
    _fields = ("group_id",)
    group_id: int

    def __new__(cls, group_id: int) -> GroupAction:
        try:
            wire = _GROUP.pack(c.OFPAT_GROUP, 8, group_id)
        except struct.error as exc:
            raise _encode_error("group", exc) from None
        return tuple.__new__(cls, (wire, group_id))

    def to_text(self) -> str:
        return f"group:{self[1]}"


class DecTTL(Action):
    """``dec_ttl`` (OFPAT_DEC_NW_TTL)."""

    __slots__ = ()
    _fields = ()

    def __new__(cls) -> DecTTL:
        return _DEC_TTL

    def to_text(self) -> str:
        return "dec_ttl"


_DEC_TTL = tuple.__new__(DecTTL, (struct.pack("!HH4x", c.OFPAT_DEC_NW_TTL, 8),))


class SetField(Action):
    """``set_field:VALUE[/MASK]->FIELD``: OpenFlow 1.5 Set-Field, optionally masked.

    ``SetField("reg3", ip)``, ``SetField("reg4", port, mask=0xffff)``,
    ``SetField("eth_dst", "aa:bb:cc:dd:ee:ff")``. A full mask is the same as no mask.
    """

    __slots__ = ()
    _fields = ("field", "value", "mask")
    value: int
    mask: int | None

    @property
    def field(self) -> Field:
        return field_named(self[1])

    def __new__(cls, field: str | Field, value: Any, mask: Any = None) -> SetField:
        f = _FIELDS.get(field) if type(field) is str else None
        if f is None:
            f = get_field(field)
        v = value if type(value) is int and 0 <= value < f.limit else f.to_int(value)
        n = f.n_bytes
        if mask is not None:
            m = mask if type(mask) is int and 0 <= mask < f.limit else f.to_int(mask)
            if m != f.limit - 1:
                if not f.maskable:
                    raise OpenFlowEncodeError(f"set_field: {f.name} cannot be masked")
                v &= m
                prefix, pad = f.set_field_masked
                wire = prefix + v.to_bytes(n, "big") + m.to_bytes(n, "big") + pad
                return tuple.__new__(cls, (wire, f.name, v, m))
        prefix, pad = f.set_field_exact
        return tuple.__new__(cls, (prefix + v.to_bytes(n, "big") + pad, f.name, v, None))

    def replace(self, **changes: Any) -> SetField:
        kwargs = {"field": self[1], "value": self[2], "mask": self[3], **changes}
        return SetField(**kwargs)

    def __repr__(self) -> str:
        mask = "" if self[3] is None else f", mask={self[3]:#x}"
        return f"SetField({self[1]!r}, {self.field.python_value(self[2])!r}{mask})"

    def to_text(self) -> str:
        f = self.field
        return f"set_field:{f.format_value(self[2], self[3])}->{f.mf_name}"


_COPY_FIELD = struct.Struct("!HHHHH2x")


def _copy_header(field: Field) -> int:
    # OpenFlow 1.5 copy_field uses each field's OF1.5 header; in_port as a subfield is
    # Open vSwitch's 16-bit NXM_OF_IN_PORT.
    return field.nxm_header if field is IN_PORT else field.oxm_header


class CopyField(Action):
    """``move:SRC[...]->DST[...]`` encoded as OpenFlow 1.5 copy_field.

    ``CopyField("reg0", "reg1", n_bits=16, src_offset=0, dst_offset=16)`` or with subfield
    text: ``CopyField("NXM_NX_REG0[0..15]", "NXM_NX_REG1[16..31]")``.
    """

    __slots__ = ()
    _fields = ("src", "dst", "n_bits", "src_offset", "dst_offset")
    n_bits: int
    src_offset: int
    dst_offset: int

    def __new__(
        cls,
        src: str | Field | Subfield,
        dst: str | Field | Subfield,
        n_bits: int | None = None,
        src_offset: int | None = None,
        dst_offset: int | None = None,
    ) -> CopyField:
        s = _subfield_arg(src, src_offset, n_bits)
        d = _subfield_arg(dst, dst_offset, n_bits)
        if n_bits is None:
            n_bits = min(s.n_bits, d.n_bits)
            s = Subfield(s.field, s.offset, n_bits)
            d = Subfield(d.field, d.offset, n_bits)
        if s.n_bits != d.n_bits:
            raise OpenFlowEncodeError(f"move: {s.to_text()} and {d.to_text()} differ in width")
        wire = (
            _COPY_FIELD.pack(c.OFPAT_COPY_FIELD, 24, n_bits, s.offset, d.offset)
            + _U32.pack(_copy_header(s.field))
            + _U32.pack(_copy_header(d.field))
            + bytes(4)
        )
        return tuple.__new__(cls, (wire, s[1], d[1], n_bits, s.offset, d.offset))

    @property
    def src(self) -> Field:
        return field_named(self[1])

    @property
    def dst(self) -> Field:
        return field_named(self[2])

    def to_text(self) -> str:
        src = Subfield(self[1], self[4], self[3])
        dst = Subfield(self[2], self[5], self[3])
        return f"move:{src.to_text()}->{dst.to_text()}"


def _subfield_arg(spec: str | Field | Subfield, offset: int | None, n_bits: int | None) -> Subfield:
    if isinstance(spec, Subfield):
        sub = spec
    elif isinstance(spec, str) and "[" in spec:
        sub = Subfield.parse(spec)
    else:
        f = get_field(spec)
        return Subfield(f, offset or 0, n_bits)
    if offset is not None and offset != sub.offset:
        raise OpenFlowEncodeError(f"{sub.to_text()}: offset {offset} contradicts the subfield")
    return sub


# -- Nicira extension actions ------------------------------------------------------------------

_RESUBMIT = struct.Struct("!HHIHHB3x")


def _port_to_16(port: int) -> int:
    if port >= c.OFPP_MAX:
        return port - 0xFFFF0000
    if port >= c.OFPP10_MAX:
        raise OpenFlowEncodeError(f"port {port} cannot be expressed in a Nicira action")
    return port


def _port_from_16(port: int) -> int:
    return port + 0xFFFF0000 if port >= c.OFPP10_MAX else port


class Resubmit(Action):
    """``resubmit([in_port],[table][,ct])``: NX resubmit_table."""

    __slots__ = ()
    _fields = ("table", "in_port", "with_ct")
    table: int | None
    in_port: int
    with_ct: bool

    def __new__(
        cls, table: int | None = None, in_port: int = c.OFPP_IN_PORT, with_ct: bool = False
    ) -> Resubmit:
        table_id = 0xFF if table is None else table
        if table_id == 0xFF:
            table = None
        if table is None and in_port == c.OFPP_IN_PORT:
            raise OpenFlowEncodeError("resubmit needs a table or an in_port")
        subtype = c.NXAST_RESUBMIT_TABLE_CT if with_ct else c.NXAST_RESUBMIT_TABLE
        try:
            wire = _RESUBMIT.pack(
                c.OFPAT_EXPERIMENTER, 16, c.NX_VENDOR_ID, subtype, _port_to_16(in_port), table_id
            )
        except struct.error as exc:
            raise _encode_error("resubmit", exc) from None
        return tuple.__new__(cls, (wire, table, in_port, bool(with_ct)))

    def to_text(self) -> str:
        table, in_port, with_ct = self[1], self[2], self[3]
        if in_port != c.OFPP_IN_PORT and table is None and not with_ct:
            return f"resubmit:{format_port(in_port)}"
        port_text = "" if in_port == c.OFPP_IN_PORT else format_port(in_port)
        table_text = "" if table is None else str(table)
        return f"resubmit({port_text},{table_text}{',ct' if with_ct else ''})"


_NAT = struct.Struct("!HHIH2xHH")
_IPV4 = ipaddress.IPv4Address
_NAT_DST_IPV4_PORT = _NAT.pack(
    c.OFPAT_EXPERIMENTER,
    24,
    c.NX_VENDOR_ID,
    c.NXAST_NAT,
    c.NX_NAT_F_DST,
    c.NX_NAT_RANGE_IPV4_MIN | c.NX_NAT_RANGE_PROTO_MIN,
)


class NAT(Action):
    """``nat[(src|dst[=IP[-IP][:PORT[-PORT]]][,persistent][,hash][,random])]``.

    Only valid inside ``CT``; ``CT(nat=NAT(...))`` places it first, as Open vSwitch does.
    The encoding is padded to a multiple of 8 bytes (the length field says so, too).
    """

    __slots__ = ()
    _fields = (
        "src",
        "dst",
        "ip_min",
        "ip_max",
        "port_min",
        "port_max",
        "persistent",
        "hash",
        "random",
    )
    src: bool
    dst: bool
    port_min: int | None
    port_max: int | None
    persistent: bool
    hash: bool
    random: bool

    def __new__(
        cls,
        *,
        src: bool = False,
        dst: bool = False,
        ip_min: Any = None,
        ip_max: Any = None,
        port_min: int | None = None,
        port_max: int | None = None,
        persistent: bool = False,
        hash: bool = False,
        random: bool = False,
    ) -> NAT:
        if (
            dst is True
            and type(ip_min) is _IPV4
            and type(port_min) is int
            and 0 < port_min <= 0xFFFF
            and ip_max is None
            and port_max is None
            and not (src or persistent or hash or random)
            and ip_min._ip  # type: ignore[attr-defined]  # hot path: int(ip) without the call
        ):
            # The endpoint DNAT of every Service: nat(dst=IP:PORT), built a lot.
            packed = ip_min.packed
            wire = _NAT_DST_IPV4_PORT + packed + port_min.to_bytes(2, "big") + b"\0\0"
            return tuple.__new__(
                cls, (wire, False, True, packed, None, port_min, None, False, False, False)
            )
        if src and dst:
            raise OpenFlowEncodeError("nat: src and dst are exclusive")
        if hash and random:
            raise OpenFlowEncodeError("nat: hash and random are exclusive")
        if (ip_min is not None or port_min is not None) and not (src or dst):
            raise OpenFlowEncodeError("nat: an address or port range needs src or dst")
        ip_lo = _nat_ip(ip_min)
        ip_hi = _nat_ip(ip_max)
        if ip_hi is not None and (
            ip_lo is None or ip_hi.version != ip_lo.version or int(ip_hi) < int(ip_lo)
        ):
            raise OpenFlowEncodeError("nat: ip_max needs ip_min of the same family, <= ip_max")
        if port_min == 0:
            port_min = None
        if port_max == 0:
            port_max = None
        if port_min is not None and ip_lo is None:
            raise OpenFlowEncodeError("nat: a port range needs an address")
        if port_max is not None and (port_min is None or port_max < port_min):
            raise OpenFlowEncodeError("nat: port_max needs port_min <= port_max")
        flags = (
            (c.NX_NAT_F_SRC if src else 0)
            | (c.NX_NAT_F_DST if dst else 0)
            | (c.NX_NAT_F_PERSISTENT if persistent else 0)
            | (c.NX_NAT_F_PROTO_HASH if hash else 0)
            | (c.NX_NAT_F_PROTO_RANDOM if random else 0)
        )
        present = 0
        ranges = []
        if ip_lo is not None:
            v6 = ip_lo.version == 6
            present |= c.NX_NAT_RANGE_IPV6_MIN if v6 else c.NX_NAT_RANGE_IPV4_MIN
            ranges.append(ip_lo.packed)
            if ip_hi is not None:
                present |= c.NX_NAT_RANGE_IPV6_MAX if v6 else c.NX_NAT_RANGE_IPV4_MAX
                ranges.append(ip_hi.packed)
        try:
            if port_min is not None:
                present |= c.NX_NAT_RANGE_PROTO_MIN
                ranges.append(_U16.pack(port_min))
                if port_max is not None:
                    present |= c.NX_NAT_RANGE_PROTO_MAX
                    ranges.append(_U16.pack(port_max))
        except struct.error as exc:
            raise _encode_error("nat", exc) from None
        body = b"".join(ranges)
        length = (16 + len(body) + 7) // 8 * 8
        wire = (
            _NAT.pack(c.OFPAT_EXPERIMENTER, length, c.NX_VENDOR_ID, c.NXAST_NAT, flags, present)
            + body
            + _pad8(16 + len(body))
        )
        return tuple.__new__(
            cls,
            (
                wire,
                bool(src),
                bool(dst),
                None if ip_lo is None else ip_lo.packed,
                None if ip_hi is None else ip_hi.packed,
                port_min,
                port_max,
                bool(persistent),
                bool(hash),
                bool(random),
            ),
        )

    @property
    def ip_min(self) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
        # Kept packed in the value (atomic, untracked by the garbage collector).
        return None if self[3] is None else ipaddress.ip_address(self[3])

    @property
    def ip_max(self) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
        return None if self[4] is None else ipaddress.ip_address(self[4])

    def to_text(self) -> str:
        (_, src, dst, _, _, port_lo, port_hi, persistent, hash_, random_) = self
        ip_lo, ip_hi = self.ip_min, self.ip_max
        if not (src or dst):
            return "nat"
        text = "src" if src else "dst"
        if ip_lo is not None:
            bracket = ip_lo.version == 6 and port_lo is not None
            text += "=" + (f"[{_ip_text(ip_lo)}]" if bracket else _ip_text(ip_lo))
            if ip_hi is not None and ip_hi != ip_lo:
                text += "-" + (f"[{_ip_text(ip_hi)}]" if bracket else _ip_text(ip_hi))
            if port_lo is not None:
                text += f":{port_lo}"
                if port_hi is not None and port_hi != port_lo:
                    text += f"-{port_hi}"
            for flag, name in ((persistent, "persistent"), (hash_, "hash"), (random_, "random")):
                if flag:
                    text += "," + name
        return f"nat({text})"


def _ip_text(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    return str(ip) if ip.version == 4 else format_ipv6(int(ip))


def _nat_ip(value: Any) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if value is None:
        return None
    if isinstance(value, bytes) and len(value) in (4, 16):
        value = ipaddress.ip_address(value)
    if isinstance(value, _IP_TYPES):
        if not int(value):
            raise OpenFlowEncodeError("nat: address 0 is not a valid NAT address")
        return value
    try:
        ip = ipaddress.ip_address(value)
    except ValueError as exc:
        raise OpenFlowEncodeError(f"nat: {exc}") from None
    if int(ip) == 0:
        raise OpenFlowEncodeError("nat: address 0 is not a valid NAT address")
    return ip


_CT = struct.Struct("!HHIHHIHB3xH")
_CT_COMMIT, _CT_FORCE = c.NX_CT_F_COMMIT, c.NX_CT_F_FORCE
_NX, _NXAST_CT = c.NX_VENDOR_ID, c.NXAST_CT


class CT(Action):
    """``ct(commit,zone=Z,table=T,nat(...),exec(...))``: NX conntrack.

    ``zone`` is an immediate zone (int) or a 16-bit subfield to take it from (``"reg5"``
    means its low 16 bits, or a ``Subfield``). ``nat`` goes first among the nested actions;
    ``actions`` (e.g. ``SetField("ct_mark", 1)``) follow and require ``commit``.
    """

    __slots__ = ()
    _fields = ("commit", "zone", "table", "alg", "nat", "actions", "force")
    commit: bool
    zone: int | Subfield
    table: int | None
    alg: int
    nat: NAT | None
    actions: tuple[Action, ...]
    force: bool

    def __new__(
        cls,
        *,
        commit: bool = False,
        zone: int | str | Subfield = 0,
        table: int | None = None,
        alg: int = 0,
        nat: NAT | None = None,
        actions: Iterable[Action] = (),
        force: bool = False,
    ) -> CT:
        if type(actions) is tuple and all(isinstance(a, Action) for a in actions):
            nested = b"".join([a[0] for a in actions])
        else:
            actions, nested = join_actions(actions, "ct")
        if force and not commit:
            raise OpenFlowEncodeError("ct: force requires commit")
        if actions and not commit:
            raise OpenFlowEncodeError("ct: exec actions require commit")
        if nat is not None and not isinstance(nat, NAT):
            raise OpenFlowEncodeError("ct: nat must be a NAT action")
        if actions and _list_depth(actions) >= c.MAX_ACTION_DEPTH:
            raise OpenFlowEncodeError(
                f"ct: actions nested more than {c.MAX_ACTION_DEPTH} lists deep"
            )
        flags = (_CT_COMMIT if commit else 0) | (_CT_FORCE if force else 0)
        if type(zone) is int or isinstance(zone, int):
            zone_src, zone_value = 0, zone
            zone_arg: int | Subfield = zone
        else:
            sub = Subfield.of(zone)
            if sub.n_bits != 16:
                if isinstance(zone, str) and "[" not in zone:
                    sub = Subfield(sub.field, 0, 16)
                else:
                    raise OpenFlowEncodeError("ct: the zone subfield must be 16 bits wide")
            zone_src = sub.field.nxm_header
            zone_value = (sub.offset << 6) | (sub.n_bits - 1)
            zone_arg = sub
        table_id = 0xFF if table is None else table
        if table_id == 0xFF:
            table = None
        if nat is not None:
            nested = nat[0] + nested
        try:
            head = _CT.pack(
                0xFFFF,
                24 + len(nested),
                _NX,
                _NXAST_CT,
                flags,
                zone_src,
                zone_value,
                table_id,
                alg,
            )
        except struct.error as exc:
            raise _encode_error("ct", exc) from None
        return tuple.__new__(
            cls, (head + nested, bool(commit), zone_arg, table, alg, nat, actions, bool(force))
        )

    def to_text(self) -> str:
        _, commit, zone, table, alg, nat, actions, force = self
        parts = []
        if commit:
            parts.append("commit")
        if force:
            parts.append("force")
        if table is not None:
            parts.append(f"table={table}")
        if isinstance(zone, Subfield):
            parts.append(f"zone={zone.to_text()}")
        elif zone:
            parts.append(f"zone={zone}")
        if nat is not None:
            parts.append(nat.to_text())
        if actions:
            parts.append(f"exec({format_actions(actions)})")
        if alg:
            parts.append({21: "alg=ftp", 69: "alg=tftp"}.get(alg, f"alg={alg}"))
        return f"ct({','.join(parts)})"


def _list_depth(actions: tuple[Action, ...]) -> int:
    """How many action lists deep ``actions`` is (1 without a nested ct). The recursion is
    bounded: every nested ct was checked when it was built."""
    depth = 1
    for action in actions:
        if type(action) is CT and action[6]:
            depth = max(depth, 1 + _list_depth(action[6]))
    return depth


class CTClear(Action):
    """``ct_clear``."""

    __slots__ = ()
    _fields = ()

    def __new__(cls) -> CTClear:
        return _CT_CLEAR

    def to_text(self) -> str:
        return "ct_clear"


_CT_CLEAR = tuple.__new__(
    CTClear,
    (_NX_HEADER.pack(c.OFPAT_EXPERIMENTER, 16, c.NX_VENDOR_ID, c.NXAST_CT_CLEAR) + bytes(6),),
)

_CONTROLLER = struct.Struct("!HHIHHHBx")


class Controller(Action):
    """``controller(reason=...,max_len=...,id=...,userdata=...,pause)``.

    Encoded as NX controller, or NX controller2 when it carries userdata or pause (as
    Open vSwitch does). Userdata reaches the controller in NXT_PACKET_IN2 packet-ins.
    """

    __slots__ = ()
    _fields = ("max_len", "reason", "controller_id", "userdata", "pause")
    max_len: int
    reason: int
    controller_id: int
    userdata: bytes
    pause: bool

    def __new__(
        cls,
        max_len: int = 0xFFFF,
        reason: int = c.PacketInReason.ACTION,
        *,
        controller_id: int = 0,
        userdata: bytes = b"",
        pause: bool = False,
    ) -> Controller:
        userdata = bytes(userdata)
        try:
            if userdata or pause:
                props = []
                if max_len != 0xFFFF:
                    props.append(_prop(c.NXAC2PT_MAX_LEN, _U16.pack(max_len) + bytes(2)))
                if controller_id:
                    props.append(
                        _prop(c.NXAC2PT_CONTROLLER_ID, _U16.pack(controller_id) + bytes(2))
                    )
                if reason != c.PacketInReason.ACTION:
                    props.append(_prop(c.NXAC2PT_REASON, bytes([reason])))
                if userdata:
                    props.append(_prop(c.NXAC2PT_USERDATA, userdata))
                if pause:
                    props.append(_prop(c.NXAC2PT_PAUSE, b""))
                body = b"".join(props)
                wire = (
                    _NX_HEADER.pack(
                        c.OFPAT_EXPERIMENTER, 16 + len(body), c.NX_VENDOR_ID, c.NXAST_CONTROLLER2
                    )
                    + bytes(6)
                    + body
                )
                if len(wire) > 0xFFFF:
                    raise OpenFlowEncodeError("controller: userdata too long")
            else:
                wire = _CONTROLLER.pack(
                    c.OFPAT_EXPERIMENTER,
                    16,
                    c.NX_VENDOR_ID,
                    c.NXAST_CONTROLLER,
                    max_len,
                    controller_id,
                    reason,
                )
        except (struct.error, ValueError) as exc:
            raise _encode_error("controller", exc) from None
        return tuple.__new__(
            cls, (wire, max_len, int(reason), controller_id, userdata, bool(pause))
        )

    def to_text(self) -> str:
        _, max_len, reason, controller_id, userdata, pause = self
        if reason == c.PacketInReason.ACTION and not controller_id and not userdata and not pause:
            return f"CONTROLLER:{max_len}"
        parts = []
        if reason != c.PacketInReason.ACTION:
            parts.append(f"reason={c.PACKET_IN_REASON_NAMES.get(reason, str(reason))}")
        if max_len != 0xFFFF:
            parts.append(f"max_len={max_len}")
        if controller_id:
            parts.append(f"id={controller_id}")
        if userdata:
            parts.append("userdata=" + ".".join(f"{b:02x}" for b in userdata))
        if pause:
            parts.append("pause")
        return f"controller({','.join(parts)})"


# -- learn ------------------------------------------------------------------------------------


class LearnSpec(Value):
    """One flow_mod_spec of a learn action."""

    __slots__ = ()

    def to_text(self) -> str:
        raise NotImplementedError


def _spec_header(src_type: int, dst_type: int, n_bits: int) -> bytes:
    return _U16.pack(src_type | dst_type | n_bits)


def _immediate(value: Any, dst: Subfield) -> tuple[int, bytes]:
    n_bits = dst.n_bits
    if isinstance(value, bytes):
        value = int.from_bytes(value, "big")
    elif not isinstance(value, int) or isinstance(value, bool):
        value = dst.field.to_int(value) if n_bits == dst.field.subfield_bits else int(value)
    if value < 0 or value >> n_bits:
        raise OpenFlowEncodeError(f"learn: {value:#x} does not fit in {n_bits} bits")
    return value, value.to_bytes(2 * ((n_bits + 15) // 16), "big")


def _spec_subfield(spec: str | Field | Subfield, offset: int, n_bits: int | None) -> Subfield:
    if isinstance(spec, Subfield) or (isinstance(spec, str) and "[" in spec):
        sub = Subfield.of(spec)
        if (offset and offset != sub.offset) or (n_bits is not None and n_bits != sub.n_bits):
            raise OpenFlowEncodeError(f"learn: {sub.to_text()} contradicts offset/n_bits")
        return sub
    return Subfield(get_field(spec), offset, n_bits)


class LearnMatchField(LearnSpec):
    """The learned flow matches ``dst`` (default: the same field as ``src``) on the value
    ``src`` has now: ``LearnMatchField("ipv4_src")`` is ``NXM_OF_IP_SRC[]``."""

    __slots__ = ()
    _fields = ("src", "dst")
    src: Subfield
    dst: Subfield

    def __new__(
        cls,
        src: str | Field | Subfield,
        dst: str | Field | Subfield | None = None,
        n_bits: int | None = None,
        src_offset: int = 0,
        dst_offset: int = 0,
    ) -> LearnMatchField:
        s = _spec_subfield(src, src_offset, n_bits)
        d = s if dst is None else _spec_subfield(dst, dst_offset, s.n_bits)
        if s.n_bits != d.n_bits:
            raise OpenFlowEncodeError("learn: source and destination differ in width")
        wire = _spec_header(c.NX_LEARN_SRC_FIELD, c.NX_LEARN_DST_MATCH, d.n_bits) + s[0] + d[0]
        return tuple.__new__(cls, (wire, s, d))

    def to_text(self) -> str:
        s, d = self[1], self[2]
        return d.to_text() if s == d else f"{d.to_text()}={s.to_text()}"


class LearnMatchValue(LearnSpec):
    """The learned flow matches ``dst`` on an immediate ``value``:
    ``LearnMatchValue("eth_type", 0x800)`` is ``eth_type=0x800``."""

    __slots__ = ()
    _fields = ("dst", "value")
    dst: Subfield
    value: int

    def __new__(
        cls, dst: str | Field | Subfield, value: Any, n_bits: int | None = None, dst_offset: int = 0
    ) -> LearnMatchValue:
        d = _spec_subfield(dst, dst_offset, n_bits)
        v, raw = _immediate(value, d)
        wire = _spec_header(c.NX_LEARN_SRC_IMMEDIATE, c.NX_LEARN_DST_MATCH, d.n_bits) + raw + d[0]
        return tuple.__new__(cls, (wire, d, v))

    def to_text(self) -> str:
        d, v = self[1], self[2]
        if d.offset == 0 and d.n_bits == d.field.n_bits:
            return f"{d.field.mf_name}={d.field.format_value(v)}"
        return f"{d.to_text()}={format_hex(v)}"


class LearnLoadField(LearnSpec):
    """The learned flow loads the value ``src`` has now into ``dst``:
    ``load:NXM_NX_REG3[]->NXM_NX_REG3[]``."""

    __slots__ = ()
    _fields = ("src", "dst")
    src: Subfield
    dst: Subfield

    def __new__(
        cls,
        src: str | Field | Subfield,
        dst: str | Field | Subfield,
        n_bits: int | None = None,
        src_offset: int = 0,
        dst_offset: int = 0,
    ) -> LearnLoadField:
        s = _spec_subfield(src, src_offset, n_bits)
        d = _spec_subfield(dst, dst_offset, s.n_bits)
        if s.n_bits != d.n_bits:
            raise OpenFlowEncodeError("learn: source and destination differ in width")
        wire = _spec_header(c.NX_LEARN_SRC_FIELD, c.NX_LEARN_DST_LOAD, d.n_bits) + s[0] + d[0]
        return tuple.__new__(cls, (wire, s, d))

    def to_text(self) -> str:
        return f"load:{self[1].to_text()}->{self[2].to_text()}"


class LearnLoadValue(LearnSpec):
    """The learned flow loads an immediate ``value`` into ``dst``:
    ``LearnLoadValue("reg4", 1, n_bits=3, dst_offset=16)`` is ``load:0x1->NXM_NX_REG4[16..18]``."""

    __slots__ = ()
    _fields = ("dst", "value")
    dst: Subfield
    value: int

    def __new__(
        cls, dst: str | Field | Subfield, value: Any, n_bits: int | None = None, dst_offset: int = 0
    ) -> LearnLoadValue:
        d = _spec_subfield(dst, dst_offset, n_bits)
        v, raw = _immediate(value, d)
        wire = _spec_header(c.NX_LEARN_SRC_IMMEDIATE, c.NX_LEARN_DST_LOAD, d.n_bits) + raw + d[0]
        return tuple.__new__(cls, (wire, d, v))

    def to_text(self) -> str:
        return f"load:{format_hex(self[2])}->{self[1].to_text()}"


class LearnOutput(LearnSpec):
    """The learned flow outputs to the port ``src`` holds now: ``output:NXM_NX_REG1[]``."""

    __slots__ = ()
    _fields = ("src",)
    src: Subfield

    def __new__(
        cls, src: str | Field | Subfield, n_bits: int | None = None, src_offset: int = 0
    ) -> LearnOutput:
        s = _spec_subfield(src, src_offset, n_bits)
        wire = _spec_header(c.NX_LEARN_SRC_FIELD, c.NX_LEARN_DST_OUTPUT, s.n_bits) + s[0]
        return tuple.__new__(cls, (wire, s))

    def to_text(self) -> str:
        return f"output:{self[1].to_text()}"


_LEARN = struct.Struct("!HHIHHHHQHBxHH")


class Learn(Action):
    """``learn(table=...,idle_timeout=...,...,specs)``: NX learn.

    ``specs`` are ``LearnMatchField``, ``LearnMatchValue``, ``LearnLoadField``,
    ``LearnLoadValue`` and ``LearnOutput`` values, in order (a learned match needs its
    prerequisites first, as immediate values: ``LearnMatchValue("eth_type", 0x800)`` before
    ``LearnMatchField("ipv4_src")``).
    """

    __slots__ = ()
    _fields = (
        "table",
        "specs",
        "idle_timeout",
        "hard_timeout",
        "priority",
        "cookie",
        "send_flow_rem",
        "delete_learned",
        "fin_idle_timeout",
        "fin_hard_timeout",
    )
    table: int
    specs: tuple[LearnSpec, ...]
    idle_timeout: int
    hard_timeout: int
    priority: int
    cookie: int
    send_flow_rem: bool
    delete_learned: bool
    fin_idle_timeout: int
    fin_hard_timeout: int

    def __new__(
        cls,
        table: int,
        specs: Iterable[LearnSpec] = (),
        *,
        idle_timeout: int = 0,
        hard_timeout: int = 0,
        priority: int = c.OFP_DEFAULT_PRIORITY,
        cookie: int = 0,
        send_flow_rem: bool = False,
        delete_learned: bool = False,
        fin_idle_timeout: int = 0,
        fin_hard_timeout: int = 0,
    ) -> Learn:
        specs = tuple(specs)
        for spec in specs:
            if not isinstance(spec, LearnSpec):
                raise OpenFlowEncodeError(f"learn: {spec!r} is not a learn spec")
        flags = (c.NX_LEARN_F_SEND_FLOW_REM if send_flow_rem else 0) | (
            c.NX_LEARN_F_DELETE_LEARNED if delete_learned else 0
        )
        body = b"".join(s[0] for s in specs)
        length = (32 + len(body) + 7) // 8 * 8
        try:
            head = _LEARN.pack(
                c.OFPAT_EXPERIMENTER,
                length,
                c.NX_VENDOR_ID,
                c.NXAST_LEARN,
                idle_timeout,
                hard_timeout,
                priority,
                cookie,
                flags,
                table,
                fin_idle_timeout,
                fin_hard_timeout,
            )
        except struct.error as exc:
            raise _encode_error("learn", exc) from None
        wire = head + body + _pad8(32 + len(body))
        return tuple.__new__(
            cls,
            (
                wire,
                table,
                specs,
                idle_timeout,
                hard_timeout,
                priority,
                cookie,
                bool(send_flow_rem),
                bool(delete_learned),
                fin_idle_timeout,
                fin_hard_timeout,
            ),
        )

    def to_text(self) -> str:
        (
            _,
            table,
            specs,
            idle,
            hard,
            priority,
            cookie,
            send_flow_rem,
            delete_learned,
            fin_idle,
            fin_hard,
        ) = self
        parts = [f"table={table}"]
        if idle:
            parts.append(f"idle_timeout={idle}")
        if hard:
            parts.append(f"hard_timeout={hard}")
        if fin_idle:
            parts.append(f"fin_idle_timeout={fin_idle}")
        if fin_hard:
            parts.append(f"fin_hard_timeout={fin_hard}")
        if priority != c.OFP_DEFAULT_PRIORITY:
            parts.append(f"priority={priority}")
        if send_flow_rem:
            parts.append("send_flow_rem")
        if delete_learned:
            parts.append("delete_learned")
        if cookie:
            parts.append(f"cookie={cookie:#x}")
        parts.extend(s.to_text() for s in specs)
        return f"learn({','.join(parts)})"


class RawAction(Action):
    """An action this codec does not model, kept as its bytes (decoding foreign flows)."""

    __slots__ = ()
    _fields = ()

    def __new__(cls, wire: bytes) -> RawAction:
        if len(wire) < 8 or len(wire) % 8:
            raise OpenFlowEncodeError("a raw action is a multiple of 8 bytes, at least 8")
        return tuple.__new__(cls, (bytes(wire),))

    def replace(self, **changes: Any) -> RawAction:
        return self

    def __repr__(self) -> str:
        return f"RawAction({self[0].hex()})"

    def to_text(self) -> str:
        atype = _U16.unpack_from(self[0], 0)[0]
        if atype == c.OFPAT_EXPERIMENTER and len(self[0]) >= 10:
            vendor, subtype = struct.unpack_from("!IH", self[0], 4)
            return f"experimenter({vendor:#x},{subtype})"
        return f"action({atype})"


def join_actions(actions: Iterable[Action], what: str) -> tuple[tuple[Action, ...], bytes]:
    """The actions as a tuple and their concatenated encodings (checking they are actions)."""
    if type(actions) is not tuple:
        actions = tuple(actions)
    for a in actions:
        if not isinstance(a, Action):
            raise OpenFlowEncodeError(f"{what}: {a!r} is not an action")
    return actions, b"".join([a[0] for a in actions])


def format_actions(actions: Iterable[Action]) -> str:
    text = ",".join(a.to_text() for a in actions)
    return text or "drop"


# -- instructions -------------------------------------------------------------------------------


class Instruction(Value):
    """Base of instructions; ``rank`` is their canonical order in a flow."""

    __slots__ = ()
    rank = 9

    def to_text(self) -> str:
        raise NotImplementedError


class ApplyActions(Instruction):
    """Apply-Actions instruction. ``ApplyActions(())`` is a drop (and is omitted)."""

    __slots__ = ()
    _fields = ("actions",)
    actions: tuple[Action, ...]
    rank = 1

    def __new__(cls, actions: Iterable[Action]) -> ApplyActions:
        actions, body = join_actions(actions, "apply_actions")
        if len(body) + 8 > 0xFFFF:
            raise OpenFlowEncodeError("apply_actions: actions too long for one instruction")
        return tuple.__new__(
            cls, (_APPLY.pack(c.OFPIT_APPLY_ACTIONS, 8 + len(body)) + body, actions)
        )

    def to_text(self) -> str:
        return format_actions(self[1])


class GotoTable(Instruction):
    """``goto_table:N``."""

    __slots__ = ()
    _fields = ("table",)
    table: int
    rank = 6

    def __new__(cls, table: int) -> GotoTable:
        try:
            wire = struct.pack("!HHB3x", c.OFPIT_GOTO_TABLE, 8, table)
        except struct.error as exc:
            raise _encode_error("goto_table", exc) from None
        return tuple.__new__(cls, (wire, table))

    def to_text(self) -> str:
        return f"goto_table:{self[1]}"


class RawInstruction(Instruction):
    """An instruction this codec does not model, kept as its bytes."""

    __slots__ = ()
    _fields = ()

    def __new__(cls, wire: bytes) -> RawInstruction:
        return tuple.__new__(cls, (bytes(wire),))

    def replace(self, **changes: Any) -> RawInstruction:
        return self

    def __repr__(self) -> str:
        return f"RawInstruction({self[0].hex()})"

    def to_text(self) -> str:
        return f"instruction({_U16.unpack_from(self[0], 0)[0]})"


def canonical_instructions(instructions: Iterable[Instruction | Action]) -> tuple[Instruction, ...]:
    """Instructions in Open vSwitch's order (apply-actions before goto-table), without an
    empty apply-actions; bare actions are gathered into one ApplyActions."""
    items: tuple[object, ...] = tuple(instructions)  # untyped callers pass anything
    loose = [i for i in items if isinstance(i, Action)]
    result = [i for i in items if isinstance(i, Instruction)]
    if len(loose) + len(result) != len(items):
        bad = next(i for i in items if not isinstance(i, (Action, Instruction)))
        raise OpenFlowEncodeError(f"{bad!r} is neither an action nor an instruction")
    if loose:
        result.append(ApplyActions(loose))
    result = [i for i in result if not (isinstance(i, ApplyActions) and not i[1])]
    if len(result) > 1:
        result.sort(key=_rank)
        kinds = [type(i) for i in result if not isinstance(i, RawInstruction)]
        if len(kinds) != len(set(kinds)):
            raise OpenFlowEncodeError("an instruction type appears twice")
    return tuple(result)


def _rank(instruction: Instruction) -> int:
    return instruction.rank


def format_instructions(instructions: Iterable[Instruction]) -> str:
    parts = [i.to_text() for i in instructions]
    return ",".join(parts) if parts else "drop"


# -- decoding -----------------------------------------------------------------------------------


def decode_actions(data: bytes, start: int, end: int, depth: int = 1) -> tuple[Action, ...]:
    """Decodes the action list in ``data[start:end]``; ``depth`` is how many lists deep it
    is (a ct's exec actions are one deeper than the ct), bounded by ``MAX_ACTION_DEPTH``."""
    if depth > c.MAX_ACTION_DEPTH and start < end:
        raise OpenFlowDecodeError(f"actions nested more than {c.MAX_ACTION_DEPTH} lists deep")
    actions: list[Action] = []
    pos = start
    while pos < end:
        if pos + 4 > end:
            raise OpenFlowDecodeError("truncated action header")
        atype, length = _HEADER.unpack_from(data, pos)
        if length < 8 or length % 8 or pos + length > end:
            raise OpenFlowDecodeError(f"bad action length {length} (type {atype})")
        actions.append(_decode_action(data, pos, length, atype, depth))
        pos += length
    return tuple(actions)


def _decode_action(data: bytes, pos: int, length: int, atype: int, depth: int) -> Action:
    raw = data[pos : pos + length]
    try:
        if atype == c.OFPAT_EXPERIMENTER:
            if length < 16:
                return RawAction(raw)
            vendor, subtype = struct.unpack_from("!IH", raw, 4)
            if vendor == c.NX_VENDOR_ID:
                if subtype == c.NXAST_CT:
                    return _dec_ct(raw, depth)
                decoder = _NX_DECODERS.get(subtype)
                if decoder is not None:
                    return decoder(raw)
            return RawAction(raw)
        decoder = _OF_DECODERS.get(atype)
        return decoder(raw) if decoder is not None else RawAction(raw)
    except OpenFlowEncodeError as exc:
        raise OpenFlowDecodeError(f"invalid action: {exc}") from None


def _need(raw: bytes, length: int, what: str) -> None:
    if len(raw) < length:
        raise OpenFlowDecodeError(f"{what} action too short")


def _dec_output(raw: bytes) -> Action:
    _need(raw, 16, "output")
    _, _, port, max_len = _OUTPUT.unpack_from(raw)
    return Output(port, max_len)


def _dec_group(raw: bytes) -> Action:
    return GroupAction(_GROUP.unpack_from(raw)[2])


def _dec_dec_ttl(raw: bytes) -> Action:
    return DecTTL()


def _dec_set_field(raw: bytes) -> Action:
    entries = decode_tlvs(raw, 4, 4 + _tlv_extent(raw, 4))
    if len(entries) != 1:
        raise OpenFlowDecodeError("set_field carries one field")
    field, value, mask = entries[0]
    return SetField(field, value, mask)


def _tlv_extent(raw: bytes, pos: int) -> int:
    if pos + 4 > len(raw):
        raise OpenFlowDecodeError("truncated field header")
    header: int = _U32.unpack_from(raw, pos)[0]
    extent = 4 + (header & 0xFF)
    if pos + extent > len(raw):
        raise OpenFlowDecodeError("field runs past its action")
    return extent


def _dec_copy_field(raw: bytes) -> Action:
    _need(raw, 20, "copy_field")
    _, _, n_bits, src_ofs, dst_ofs = _COPY_FIELD.unpack_from(raw)
    src = field_by_nxm_header(_U32.unpack_from(raw, 12)[0])
    dst = field_by_nxm_header(_U32.unpack_from(raw, 16)[0])
    return CopyField(src, dst, n_bits, src_ofs, dst_ofs)


def _dec_resubmit(raw: bytes) -> Action:
    _, _, _, subtype, in_port, table = _RESUBMIT.unpack_from(raw)
    return Resubmit(
        None if table == 0xFF else table,
        _port_from_16(in_port),
        with_ct=subtype == c.NXAST_RESUBMIT_TABLE_CT,
    )


def _dec_nat(raw: bytes) -> Action:
    _, _, _, _, flags, present = _NAT.unpack_from(raw)
    pos = 16
    values: dict[str, Any] = {}

    def take(n: int) -> bytes:
        nonlocal pos
        if pos + n > len(raw):
            raise OpenFlowDecodeError("nat range runs past the action")
        chunk = raw[pos : pos + n]
        pos += n
        return chunk

    if present & c.NX_NAT_RANGE_IPV4_MIN:
        values["ip_min"] = ipaddress.IPv4Address(take(4))
        if present & c.NX_NAT_RANGE_IPV4_MAX:
            values["ip_max"] = ipaddress.IPv4Address(take(4))
    elif present & c.NX_NAT_RANGE_IPV6_MIN:
        values["ip_min"] = ipaddress.IPv6Address(take(16))
        if present & c.NX_NAT_RANGE_IPV6_MAX:
            values["ip_max"] = ipaddress.IPv6Address(take(16))
    if present & c.NX_NAT_RANGE_PROTO_MIN:
        values["port_min"] = _U16.unpack(take(2))[0]
        if present & c.NX_NAT_RANGE_PROTO_MAX:
            values["port_max"] = _U16.unpack(take(2))[0]
    return NAT(
        src=bool(flags & c.NX_NAT_F_SRC),
        dst=bool(flags & c.NX_NAT_F_DST),
        persistent=bool(flags & c.NX_NAT_F_PERSISTENT),
        hash=bool(flags & c.NX_NAT_F_PROTO_HASH),
        random=bool(flags & c.NX_NAT_F_PROTO_RANDOM),
        **values,
    )


def _dec_ct(raw: bytes, depth: int) -> Action:
    _need(raw, 24, "ct")
    _, _, _, _, flags, zone_src, zone_value, table, alg = _CT.unpack_from(raw)
    if zone_src:
        field = field_by_nxm_header(zone_src)
        zone: int | Subfield = Subfield(field, zone_value >> 6, (zone_value & 0x3F) + 1)
    else:
        zone = zone_value
    nested = list(decode_actions(raw, 24, len(raw), depth + 1))
    first = nested[0] if nested else None
    nat = first if isinstance(first, NAT) else None
    if nat is not None:
        del nested[0]
    return CT(
        commit=bool(flags & c.NX_CT_F_COMMIT),
        zone=zone,
        table=None if table == c.NX_CT_RECIRC_NONE else table,
        alg=alg,
        nat=nat,
        actions=nested,
        force=bool(flags & c.NX_CT_F_FORCE),
    )


def _dec_ct_clear(raw: bytes) -> Action:
    return CTClear()


def _dec_controller(raw: bytes) -> Action:
    _, _, _, _, max_len, controller_id, reason = _CONTROLLER.unpack_from(raw)
    return Controller(max_len, reason, controller_id=controller_id)


def _dec_controller2(raw: bytes) -> Action:
    values: dict[str, Any] = {}
    for ptype, payload in iter_props(raw, 16, len(raw)):
        if ptype == c.NXAC2PT_MAX_LEN:
            values["max_len"] = _U16.unpack_from(payload)[0]
        elif ptype == c.NXAC2PT_CONTROLLER_ID:
            values["controller_id"] = _U16.unpack_from(payload)[0]
        elif ptype == c.NXAC2PT_REASON:
            values["reason"] = payload[0]
        elif ptype == c.NXAC2PT_USERDATA:
            values["userdata"] = payload
        elif ptype == c.NXAC2PT_PAUSE:
            values["pause"] = True
        else:
            return RawAction(raw)
    return Controller(**values)


def _read_subfield(raw: bytes, pos: int, n_bits: int) -> tuple[Subfield, int]:
    if pos + 6 > len(raw):
        raise OpenFlowDecodeError("learn spec runs past the action")
    field = field_by_nxm_header(_U32.unpack_from(raw, pos)[0])
    offset = _U16.unpack_from(raw, pos + 4)[0]
    return Subfield(field, offset, n_bits), pos + 6


def _dec_learn(raw: bytes) -> Action:
    _need(raw, 32, "learn")
    (_, _, _, _, idle, hard, priority, cookie, flags, table, fin_idle, fin_hard) = (
        _LEARN.unpack_from(raw)
    )
    specs: list[LearnSpec] = []
    pos = 32
    while pos + 2 <= len(raw):
        header = _U16.unpack_from(raw, pos)[0]
        if header == 0:
            break
        pos += 2
        n_bits = header & 0x7FF
        src_type = header & (1 << 13)
        dst_type = header & (3 << 11)
        if n_bits == 0:
            raise OpenFlowDecodeError("learn spec with 0 bits")
        if src_type == c.NX_LEARN_SRC_IMMEDIATE:
            n_bytes = 2 * ((n_bits + 15) // 16)
            if pos + n_bytes > len(raw):
                raise OpenFlowDecodeError("learn immediate runs past the action")
            value = int.from_bytes(raw[pos : pos + n_bytes], "big")
            pos += n_bytes
            if dst_type == c.NX_LEARN_DST_OUTPUT:
                raise OpenFlowDecodeError("learn output from an immediate")
            dst, pos = _read_subfield(raw, pos, n_bits)
            specs.append(
                LearnMatchValue(dst, value)
                if dst_type == c.NX_LEARN_DST_MATCH
                else LearnLoadValue(dst, value)
            )
        else:
            src, pos = _read_subfield(raw, pos, n_bits)
            if dst_type == c.NX_LEARN_DST_OUTPUT:
                specs.append(LearnOutput(src))
            elif dst_type in (c.NX_LEARN_DST_MATCH, c.NX_LEARN_DST_LOAD):
                dst, pos = _read_subfield(raw, pos, n_bits)
                specs.append(
                    LearnMatchField(src, dst)
                    if dst_type == c.NX_LEARN_DST_MATCH
                    else LearnLoadField(src, dst)
                )
            else:
                raise OpenFlowDecodeError("bad learn spec destination")
    if flags & ~(c.NX_LEARN_F_SEND_FLOW_REM | c.NX_LEARN_F_DELETE_LEARNED):
        return RawAction(raw)
    return Learn(
        table,
        specs,
        idle_timeout=idle,
        hard_timeout=hard,
        priority=priority,
        cookie=cookie,
        send_flow_rem=bool(flags & c.NX_LEARN_F_SEND_FLOW_REM),
        delete_learned=bool(flags & c.NX_LEARN_F_DELETE_LEARNED),
        fin_idle_timeout=fin_idle,
        fin_hard_timeout=fin_hard,
    )


def iter_props(data: bytes, start: int, end: int) -> Iterable[tuple[int, bytes]]:
    """Yields (type, payload) of OpenFlow 1.4+ properties in ``data[start:end]``."""
    pos = start
    while pos < end:
        if pos + 4 > end:
            raise OpenFlowDecodeError("truncated property header")
        ptype, length = _HEADER.unpack_from(data, pos)
        padded = (length + 7) // 8 * 8
        if length < 4 or pos + padded > end:
            raise OpenFlowDecodeError(f"bad property length {length}")
        yield ptype, bytes(data[pos + 4 : pos + length])
        pos += padded


_OF_DECODERS = {
    c.OFPAT_OUTPUT: _dec_output,
    c.OFPAT_GROUP: _dec_group,
    c.OFPAT_DEC_NW_TTL: _dec_dec_ttl,
    c.OFPAT_SET_FIELD: _dec_set_field,
    c.OFPAT_COPY_FIELD: _dec_copy_field,
}
_NX_DECODERS = {
    c.NXAST_RESUBMIT_TABLE: _dec_resubmit,
    c.NXAST_RESUBMIT_TABLE_CT: _dec_resubmit,
    c.NXAST_NAT: _dec_nat,
    c.NXAST_CT_CLEAR: _dec_ct_clear,
    c.NXAST_CONTROLLER: _dec_controller,
    c.NXAST_CONTROLLER2: _dec_controller2,
    c.NXAST_LEARN: _dec_learn,
}


def decode_instructions(data: bytes, start: int, end: int) -> tuple[Instruction, ...]:
    instructions: list[Instruction] = []
    pos = start
    while pos < end:
        if pos + 4 > end:
            raise OpenFlowDecodeError("truncated instruction header")
        itype, length = _HEADER.unpack_from(data, pos)
        if length < 8 or length % 8 or pos + length > end:
            raise OpenFlowDecodeError(f"bad instruction length {length} (type {itype})")
        if itype == c.OFPIT_APPLY_ACTIONS:
            instructions.append(ApplyActions(decode_actions(data, pos + 8, pos + length)))
        elif itype == c.OFPIT_GOTO_TABLE:
            instructions.append(GotoTable(data[pos + 4]))
        else:
            instructions.append(RawInstruction(data[pos : pos + length]))
        pos += length
    try:
        return canonical_instructions(instructions)
    except OpenFlowEncodeError as exc:
        raise OpenFlowDecodeError(str(exc)) from None
