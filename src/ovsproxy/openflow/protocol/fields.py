"""Match fields (OXM/NXM), subfields and the ``Match`` value.

One ``Field`` describes everything the codec needs about a packet field: its name in our
API and in ``ovs-ofctl`` text, its OXM header in OpenFlow 1.5 messages, its NXM header in
Nicira actions (learn, ct zone), its width, and where it goes in a canonical match.

Canonical match encoding follows Open vSwitch's own OpenFlow 1.5 encoding (field order,
registers as 64-bit ``xreg`` pairs), so our bytes equal ``ovs-ofctl``'s and a flow decoded
from a FLOW_DESC reply equals the flow we sent.
"""

from __future__ import annotations

import ipaddress
import re
import struct
from typing import Any, Literal

from . import constants as c
from ._value import Value
from .errors import OpenFlowDecodeError, OpenFlowEncodeError

_U32 = struct.Struct("!I")
_ORDER_REGS_END = 96
_IPV4 = ipaddress.IPv4Address

# Value kinds: how a field's value is parsed from Python values and printed.
DEC = "dec"  # decimal integer (ports, protocols)
HEX = "hex"  # hexadecimal integer (registers, marks)
IPV4 = "ipv4"
IPV6 = "ipv6"
MAC = "mac"
PORT = "port"  # OpenFlow port number, printed with reserved-port names
CT_STATE = "ct_state"


class Field:
    """One packet or metadata field. Fields are singletons: compared by identity.

    Besides its names, headers and width, a field keeps the pieces its encoders need
    precomputed (TLV headers, Set-Field prefixes), because values are built by the
    hundred thousand during a full sync.
    """

    __slots__ = (
        "hdr",
        "hdr_masked",
        "kind",
        "limit",
        "maskable",
        "mf_name",
        "n_bytes",
        "name",
        "nxm_header",
        "nxm_name",
        "order",
        "oxm_header",
        "prereq_eth",
        "prereq_proto",
        "reg_index",
        "set_field_exact",
        "set_field_masked",
        "sub_bits",
        "wide",
    )

    def __init__(  # noqa: PLR0917 - a table row
        self,
        name: str,
        mf_name: str,
        nxm_name: str,
        n_bytes: int,
        oxm_header: int,
        nxm_header: int,
        kind: str,
        maskable: bool,
        order: int,
        sub_bits: int = 0,
        reg_index: int = -1,
    ) -> None:
        self.name = name  # our name (Match keyword, SetField field), e.g. "ipv4_dst"
        self.mf_name = mf_name  # Open vSwitch name, printed by set_field, e.g. "ip_dst"
        self.nxm_name = nxm_name  # name in subfield syntax, e.g. "NXM_OF_IP_DST"
        self.n_bytes = n_bytes
        self.oxm_header = oxm_header  # header (hasmask=0) in OF1.5 match/set_field/copy_field
        self.nxm_header = nxm_header  # header in Nicira actions (learn, ct zone_src)
        self.kind = kind
        self.maskable = maskable
        self.order = order  # position in a canonical (Open vSwitch) match encoding
        self.sub_bits = sub_bits  # width in subfield contexts if not 8 * n_bytes (in_port)
        self.reg_index = reg_index  # for reg0..reg15: the 32-bit register number
        self.limit = 1 << (8 * n_bytes)
        # xreg/xxreg: a match stores them as the 32-bit registers they overlay.
        self.wide = n_bytes > 4 and kind == HEX and 80 <= order < _ORDER_REGS_END
        self.prereq_eth: frozenset[int] | None = None
        self.prereq_proto: int | None = None
        self.hdr = _U32.pack(oxm_header)
        self.hdr_masked = _U32.pack((oxm_header & ~0xFF) | 0x100 | (2 * n_bytes))
        exact_len = 4 + 4 + n_bytes
        masked_len = 4 + 4 + 2 * n_bytes
        self.set_field_exact = (
            struct.pack("!HH", c.OFPAT_SET_FIELD, (exact_len + 7) // 8 * 8) + self.hdr,
            bytes(-exact_len % 8),
        )
        self.set_field_masked = (
            struct.pack("!HH", c.OFPAT_SET_FIELD, (masked_len + 7) // 8 * 8) + self.hdr_masked,
            bytes(-masked_len % 8),
        )

    @property
    def n_bits(self) -> int:
        return self.n_bytes * 8

    @property
    def subfield_bits(self) -> int:
        return self.sub_bits or self.n_bytes * 8

    def __repr__(self) -> str:
        return f"Field({self.name})"

    # -- values ------------------------------------------------------------------------

    def to_int(self, value: Any) -> int:
        """Converts a Python value (int, ipaddress object, MAC string...) to an integer."""
        if type(value) is int:
            result = value
        elif isinstance(value, (ipaddress.IPv4Address, ipaddress.IPv6Address)):
            result = int(value)
        elif isinstance(value, str):
            result = self._parse_text(value)
        elif isinstance(value, (bytes, bytearray)) and len(value) == self.n_bytes:
            result = int.from_bytes(value, "big")
        elif isinstance(value, int) and not isinstance(value, bool):
            result = int(value)
        else:
            raise OpenFlowEncodeError(f"{self.name}: cannot use {value!r} as a value")
        if result < 0 or result >> (self.n_bytes * 8):
            raise OpenFlowEncodeError(f"{self.name}: {value!r} does not fit in {self.n_bits} bits")
        return result

    def _parse_text(self, text: str) -> int:
        try:
            if self.kind == IPV4:
                return int(ipaddress.IPv4Address(text))
            if self.kind == IPV6:
                return int(ipaddress.IPv6Address(text))
            if self.kind == MAC:
                parts = text.split(":")
                if len(parts) != 6:
                    raise ValueError(text)
                return int("".join(f"{int(p, 16):02x}" for p in parts), 16)
            if self.kind == HEX and ("." in text or ":" in text):
                # registers often hold addresses: reg3="10.0.0.1", xxreg3="fd00::1"
                return int(ipaddress.ip_address(text))
            return int(text, 0)
        except ValueError as exc:
            raise OpenFlowEncodeError(f"{self.name}: cannot parse {text!r}") from exc

    def value_and_mask(self, value: Any) -> tuple[int, int | None]:
        """Splits a match value into (value, mask or None for exact). The value is masked."""
        if isinstance(value, tuple):
            if len(value) != 2:
                raise OpenFlowEncodeError(f"{self.name}: a masked value is (value, mask)")
            v = self.to_int(value[0])
            m = self.to_int(value[1])
        elif isinstance(value, (ipaddress.IPv4Network, ipaddress.IPv6Network)):
            v = self.to_int(value.network_address)
            m = self.to_int(value.netmask)
        else:
            return self.to_int(value), None
        if m == (1 << (self.n_bytes * 8)) - 1:
            return v, None
        if not self.maskable and m != 0:
            raise OpenFlowEncodeError(f"{self.name} cannot be masked")
        return v & m, m

    def python_value(self, value: int) -> Any:
        """The natural Python form of an integer value (ipaddress objects for addresses)."""
        if self.kind == IPV4:
            return ipaddress.IPv4Address(value)
        if self.kind == IPV6:
            return ipaddress.IPv6Address(value)
        if self.kind == MAC:
            return format_mac(value)
        return value

    # -- text ----------------------------------------------------------------------------

    def format_value(self, value: int, mask: int | None = None) -> str:
        """Open vSwitch's ``mf_format``: the value syntax of set_field and learn."""
        full = (1 << (self.n_bytes * 8)) - 1
        if mask == full:
            mask = None
        if mask == 0:
            return "ANY"
        kind = self.kind
        if kind == IPV4:
            return format_ipv4_masked(value, full if mask is None else mask)
        if kind == IPV6:
            return format_ipv6_masked(value, mask)
        if kind == MAC:
            text = format_mac(value)
            return text if mask is None else f"{text}/{format_mac(mask)}"
        if kind == CT_STATE:
            return format_flags_masked(value, full if mask is None else mask, 0xFFFF)
        if kind == PORT and mask is None:
            return format_port(value)
        text = format_hex(value, self.n_bytes) if kind == HEX else str(value)
        if mask is not None:
            text += "/" + format_hex(mask, self.n_bytes)
        return text


# -- text helpers (Open vSwitch formats) ----------------------------------------------


def format_hex(value: int, n_bytes: int = 0) -> str:
    """``ds_put_hex``: 0x-prefixed without leading zero bytes; zero prints as ``0``."""
    return "0" if value == 0 else f"{value:#x}"


def format_mac(value: int) -> str:
    raw = value.to_bytes(6, "big")
    return ":".join(f"{b:02x}" for b in raw)


def format_ipv4(value: int) -> str:
    return str(ipaddress.IPv4Address(value))


def _cidr_len(mask: int, bits: int) -> int | None:
    inverted = ~mask & ((1 << bits) - 1)
    if inverted & (inverted + 1):
        return None
    return bits - inverted.bit_length()


def format_ipv4_masked(value: int, mask: int) -> str:
    text = format_ipv4(value)
    if mask != 0xFFFFFFFF:
        prefix = _cidr_len(mask, 32)
        text += f"/{prefix}" if prefix is not None else f"/{format_ipv4(mask)}"
    return text


def format_ipv6(value: int) -> str:
    """An IPv6 address as glibc's ``inet_ntop`` (and so Open vSwitch) writes it: like
    Python's compressed form, except IPv4-compatible and -mapped addresses, which end in
    dotted quads (``::0.1.0.0``, ``::ffff:10.0.0.1``)."""
    words = [(value >> (112 - 16 * i)) & 0xFFFF for i in range(8)]
    best_base = best_len = 0
    run_base = run_len = 0
    for i, word in enumerate(words):
        if word == 0:
            if run_len == 0:
                run_base = i
            run_len += 1
            if run_len > best_len:
                best_base, best_len = run_base, run_len
        else:
            run_len = 0
    if best_base == 0 and (best_len == 6 or (best_len == 5 and words[5] == 0xFFFF)):
        prefix = "::" if best_len == 6 else "::ffff:"
        return prefix + format_ipv4(value & 0xFFFFFFFF)
    return str(ipaddress.IPv6Address(value))


def format_ipv6_masked(value: int, mask: int | None) -> str:
    text = format_ipv6(value)
    if mask is not None and mask != (1 << 128) - 1:
        prefix = _cidr_len(mask, 128)
        text += f"/{prefix}" if prefix is not None else f"/{format_ipv6(mask)}"
    return text


def format_port(port: int) -> str:
    """``ofputil_format_port`` for a 32-bit port number."""
    name = c.PORT_NAMES.get(port)
    return name if name is not None else str(port)


def format_ct_flags(value: int, separator: str = "|") -> str:
    names = []
    bit = 1
    remaining = value
    while remaining:
        if remaining & bit:
            names.append(c.CT_STATE_NAMES.get(bit, f"{bit:#x}"))
            remaining &= ~bit
        bit <<= 1
    return separator.join(names) if names else "0"


def format_flags_masked(value: int, mask: int, max_mask: int) -> str:
    """``format_flags_masked`` for ct_state: ``+new-est+trk``."""
    if mask == max_mask:
        return format_ct_flags(value)
    if not mask:
        return "0/0"
    parts = []
    remaining = mask
    while remaining:
        bit = remaining & -remaining
        name = c.CT_STATE_NAMES.get(bit, f"{bit:#x}")
        parts.append(("+" if value & bit else "-") + name)
        remaining &= ~bit
    return "".join(parts)


TCP_FLAG_NAMES = ("fin", "syn", "rst", "psh", "ack", "urg", "ece", "cwr", "ns")
TCP_FLAGS_MAX = 0x0FFF


def format_tcp_flags_masked(value: int, mask: int | None) -> str:
    """``format_flags_masked`` for tcp_flags: ``+rst``, ``+syn-ack`` (``ovs-ofctl``'s
    ``packet_tcp_flag_to_string`` names; a full mask prints the flags joined by ``|``)."""
    if mask is None or mask & TCP_FLAGS_MAX == TCP_FLAGS_MAX:
        set_bits = [n for i, n in enumerate(TCP_FLAG_NAMES) if value & (1 << i)]
        return "|".join(set_bits) if set_bits else "0"
    parts = []
    for i, name in enumerate(TCP_FLAG_NAMES):
        bit = 1 << i
        if mask & bit:
            parts.append(("+" if value & bit else "-") + name)
    return "".join(parts) if parts else "0/0"


# -- the field table ----------------------------------------------------------------------


def _hdr(oxm_class: int, field: int, n_bytes: int) -> int:
    return (oxm_class << 16) | (field << 9) | n_bytes


_BASIC = c.OFPXMC_OPENFLOW_BASIC
_NXM0 = c.OFPXMC_NXM_0
_NXM1 = c.OFPXMC_NXM_1

FIELDS: dict[str, Field] = {}  # by our name and by every alias
_BY_OXM_HEADER: dict[int, Field] = {}  # by oxm_header (and nxm_header), hasmask bit cleared
_ORDERED: list[Field] = []


def _define(  # noqa: PLR0917 - a table row
    name: str,
    mf_name: str,
    nxm_name: str,
    n_bytes: int,
    oxm: tuple[int, int],
    nxm: tuple[int, int] | None,
    kind: str,
    maskable: bool,
    order: int,
    aliases: tuple[str, ...] = (),
    sub_bits: int = 0,
    nxm_bytes: int | None = None,
    reg_index: int = -1,
) -> Field:
    oxm_header = _hdr(oxm[0], oxm[1], n_bytes)
    nxm_header = _hdr(nxm[0], nxm[1], nxm_bytes or n_bytes) if nxm else oxm_header
    field = Field(
        name,
        mf_name,
        nxm_name,
        n_bytes,
        oxm_header,
        nxm_header,
        kind,
        maskable,
        order,
        sub_bits,
        reg_index,
    )
    for key in (name, mf_name, *aliases):
        FIELDS.setdefault(key, field)
    _BY_OXM_HEADER[oxm_header] = field
    _BY_OXM_HEADER.setdefault(nxm_header, field)
    _ORDERED.append(field)
    return field


IN_PORT = _define(
    "in_port",
    "in_port",
    "NXM_OF_IN_PORT",
    4,
    (_BASIC, 0),
    (_NXM0, 0),
    PORT,
    False,
    10,
    ("in_port_oxm",),
    sub_bits=16,
    nxm_bytes=2,
)
ETH_SRC = _define(
    "eth_src", "eth_src", "NXM_OF_ETH_SRC", 6, (_BASIC, 4), (_NXM0, 2), MAC, True, 20, ("dl_src",)
)
ETH_DST = _define(
    "eth_dst", "eth_dst", "NXM_OF_ETH_DST", 6, (_BASIC, 3), (_NXM0, 1), MAC, True, 21, ("dl_dst",)
)
ETH_TYPE = _define(
    "eth_type",
    "eth_type",
    "NXM_OF_ETH_TYPE",
    2,
    (_BASIC, 5),
    (_NXM0, 3),
    HEX,
    False,
    22,
    ("dl_type",),
)
IPV4_SRC = _define(
    "ipv4_src", "ip_src", "NXM_OF_IP_SRC", 4, (_BASIC, 11), (_NXM0, 7), IPV4, True, 30, ("nw_src",)
)
IPV4_DST = _define(
    "ipv4_dst", "ip_dst", "NXM_OF_IP_DST", 4, (_BASIC, 12), (_NXM0, 8), IPV4, True, 31, ("nw_dst",)
)
IPV6_SRC = _define(
    "ipv6_src", "ipv6_src", "NXM_NX_IPV6_SRC", 16, (_BASIC, 26), (_NXM1, 19), IPV6, True, 32
)
IPV6_DST = _define(
    "ipv6_dst", "ipv6_dst", "NXM_NX_IPV6_DST", 16, (_BASIC, 27), (_NXM1, 20), IPV6, True, 33
)
IP_PROTO = _define(
    "ip_proto", "nw_proto", "NXM_OF_IP_PROTO", 1, (_BASIC, 10), (_NXM0, 6), DEC, False, 40
)
TCP_SRC = _define(
    "tcp_src", "tcp_src", "NXM_OF_TCP_SRC", 2, (_BASIC, 13), (_NXM0, 9), DEC, True, 41
)
TCP_DST = _define(
    "tcp_dst", "tcp_dst", "NXM_OF_TCP_DST", 2, (_BASIC, 14), (_NXM0, 10), DEC, True, 42
)
# OpenFlow 1.5's OXM_OF_TCP_FLAGS (12 bits); Open vSwitch encodes it after the TCP ports.
TCP_FLAGS = _define(
    "tcp_flags", "tcp_flags", "NXM_NX_TCP_FLAGS", 2, (_BASIC, 42), (_NXM1, 34), HEX, True, 43
)
UDP_SRC = _define(
    "udp_src", "udp_src", "NXM_OF_UDP_SRC", 2, (_BASIC, 15), (_NXM0, 11), DEC, True, 44
)
UDP_DST = _define(
    "udp_dst", "udp_dst", "NXM_OF_UDP_DST", 2, (_BASIC, 16), (_NXM0, 12), DEC, True, 45
)
SCTP_SRC = _define("sctp_src", "sctp_src", "OXM_OF_SCTP_SRC", 2, (_BASIC, 17), None, DEC, True, 46)
SCTP_DST = _define("sctp_dst", "sctp_dst", "OXM_OF_SCTP_DST", 2, (_BASIC, 18), None, DEC, True, 47)
ICMP_TYPE = _define(
    "icmp_type",
    "icmp_type",
    "NXM_OF_ICMP_TYPE",
    1,
    (_BASIC, 19),
    (_NXM0, 13),
    DEC,
    False,
    48,
    ("icmpv4_type",),
)
ICMP_CODE = _define(
    "icmp_code",
    "icmp_code",
    "NXM_OF_ICMP_CODE",
    1,
    (_BASIC, 20),
    (_NXM0, 14),
    DEC,
    False,
    49,
    ("icmpv4_code",),
)
ICMPV6_TYPE = _define(
    "icmpv6_type", "icmpv6_type", "NXM_NX_ICMPV6_TYPE", 1, (_BASIC, 29), (_NXM1, 21), DEC, False, 50
)
ICMPV6_CODE = _define(
    "icmpv6_code", "icmpv6_code", "NXM_NX_ICMPV6_CODE", 1, (_BASIC, 30), (_NXM1, 22), DEC, False, 51
)
ARP_OP = _define("arp_op", "arp_op", "NXM_OF_ARP_OP", 2, (_BASIC, 21), (_NXM0, 15), DEC, False, 60)
ARP_SPA = _define(
    "arp_spa", "arp_spa", "NXM_OF_ARP_SPA", 4, (_BASIC, 22), (_NXM0, 16), IPV4, True, 61
)
ARP_TPA = _define(
    "arp_tpa", "arp_tpa", "NXM_OF_ARP_TPA", 4, (_BASIC, 23), (_NXM0, 17), IPV4, True, 62
)
ARP_SHA = _define(
    "arp_sha", "arp_sha", "NXM_NX_ARP_SHA", 6, (_BASIC, 24), (_NXM1, 17), MAC, True, 63
)
ARP_THA = _define(
    "arp_tha", "arp_tha", "NXM_NX_ARP_THA", 6, (_BASIC, 25), (_NXM1, 18), MAC, True, 64
)
REGS = tuple(
    _define(
        f"reg{i}",
        f"reg{i}",
        f"NXM_NX_REG{i}",
        4,
        (_NXM1, i),
        (_NXM1, i),
        HEX,
        True,
        80 + i,
        reg_index=i,
    )
    for i in range(16)
)
PKT_MARK = _define(
    "pkt_mark", "pkt_mark", "NXM_NX_PKT_MARK", 4, (_NXM1, 33), (_NXM1, 33), HEX, True, 100
)
CT_STATE_FIELD = _define(
    "ct_state", "ct_state", "NXM_NX_CT_STATE", 4, (_NXM1, 105), (_NXM1, 105), CT_STATE, True, 101
)
CT_ZONE = _define(
    "ct_zone", "ct_zone", "NXM_NX_CT_ZONE", 2, (_NXM1, 106), (_NXM1, 106), HEX, False, 102
)
CT_MARK = _define(
    "ct_mark", "ct_mark", "NXM_NX_CT_MARK", 4, (_NXM1, 107), (_NXM1, 107), HEX, True, 103
)
CT_LABEL = _define(
    "ct_label", "ct_label", "NXM_NX_CT_LABEL", 16, (_NXM1, 108), (_NXM1, 108), HEX, True, 104
)
CT_NW_SRC = _define(
    "ct_nw_src", "ct_nw_src", "NXM_NX_CT_NW_SRC", 4, (_NXM1, 120), (_NXM1, 120), IPV4, True, 105
)
CT_IPV6_SRC = _define(
    "ct_ipv6_src",
    "ct_ipv6_src",
    "NXM_NX_CT_IPV6_SRC",
    16,
    (_NXM1, 122),
    (_NXM1, 122),
    IPV6,
    True,
    106,
)
CT_NW_DST = _define(
    "ct_nw_dst", "ct_nw_dst", "NXM_NX_CT_NW_DST", 4, (_NXM1, 121), (_NXM1, 121), IPV4, True, 107
)
CT_IPV6_DST = _define(
    "ct_ipv6_dst",
    "ct_ipv6_dst",
    "NXM_NX_CT_IPV6_DST",
    16,
    (_NXM1, 123),
    (_NXM1, 123),
    IPV6,
    True,
    108,
)
CT_NW_PROTO = _define(
    "ct_nw_proto",
    "ct_nw_proto",
    "NXM_NX_CT_NW_PROTO",
    1,
    (_NXM1, 119),
    (_NXM1, 119),
    DEC,
    False,
    109,
)
CT_TP_SRC = _define(
    "ct_tp_src", "ct_tp_src", "NXM_NX_CT_TP_SRC", 2, (_NXM1, 124), (_NXM1, 124), DEC, True, 110
)
CT_TP_DST = _define(
    "ct_tp_dst", "ct_tp_dst", "NXM_NX_CT_TP_DST", 2, (_NXM1, 125), (_NXM1, 125), DEC, True, 111
)
METADATA = _define("metadata", "metadata", "OXM_OF_METADATA", 8, (_BASIC, 2), None, HEX, True, 120)
# Wide registers: set_field, learn and move use them directly; a match stores them as the
# 32-bit registers they overlay (xxreg0 = reg0..reg3, most significant first).
XXREGS = tuple(
    _define(
        f"xxreg{i}",
        f"xxreg{i}",
        f"NXM_NX_XXREG{i}",
        16,
        (_NXM1, 111 + i),
        (_NXM1, 111 + i),
        HEX,
        True,
        80 + 4 * i,
    )
    for i in range(4)
)
XREGS = tuple(
    _define(
        f"xreg{i}",
        f"xreg{i}",
        f"OXM_OF_PKT_REG{i}",
        8,
        (c.OFPXMC_PACKET_REGS, i),
        None,
        HEX,
        True,
        80 + 2 * i,
    )
    for i in range(8)
)
PACKET_TYPE_HEADER = _hdr(_BASIC, 44, 4)

# Prerequisites (checked as the canonical order puts them first: eth_type, then ip_proto).
_IP_TYPES = frozenset([c.ETH_TYPE_IP, c.ETH_TYPE_IPV6])
for _field, _eth, _proto in (
    (IPV4_SRC, {c.ETH_TYPE_IP}, None),
    (IPV4_DST, {c.ETH_TYPE_IP}, None),
    (IPV6_SRC, {c.ETH_TYPE_IPV6}, None),
    (IPV6_DST, {c.ETH_TYPE_IPV6}, None),
    (IP_PROTO, _IP_TYPES, None),
    (TCP_SRC, _IP_TYPES, c.IPPROTO_TCP),
    (TCP_DST, _IP_TYPES, c.IPPROTO_TCP),
    (UDP_SRC, _IP_TYPES, c.IPPROTO_UDP),
    (UDP_DST, _IP_TYPES, c.IPPROTO_UDP),
    (SCTP_SRC, _IP_TYPES, c.IPPROTO_SCTP),
    (SCTP_DST, _IP_TYPES, c.IPPROTO_SCTP),
    (ICMP_TYPE, {c.ETH_TYPE_IP}, c.IPPROTO_ICMP),
    (ICMP_CODE, {c.ETH_TYPE_IP}, c.IPPROTO_ICMP),
    (ICMPV6_TYPE, {c.ETH_TYPE_IPV6}, c.IPPROTO_ICMPV6),
    (ICMPV6_CODE, {c.ETH_TYPE_IPV6}, c.IPPROTO_ICMPV6),
    (ARP_OP, {c.ETH_TYPE_ARP, c.ETH_TYPE_RARP}, None),
    (ARP_SPA, {c.ETH_TYPE_ARP, c.ETH_TYPE_RARP}, None),
    (ARP_TPA, {c.ETH_TYPE_ARP, c.ETH_TYPE_RARP}, None),
    (ARP_SHA, {c.ETH_TYPE_ARP, c.ETH_TYPE_RARP}, None),
    (ARP_THA, {c.ETH_TYPE_ARP, c.ETH_TYPE_RARP}, None),
):
    _field.prereq_eth = frozenset(_eth)
    _field.prereq_proto = _proto


def get_field(name: str | Field) -> Field:
    """The field called ``name`` (our names, Open vSwitch names and aliases all work, and the
    ``oxm_CLASS_FIELD_BYTES`` names decoding gives fields we do not model)."""
    if isinstance(name, Field):
        return name
    field = FIELDS.get(name)
    if field is None:
        field = _unknown_field_named(name)
        if field is None:
            raise OpenFlowEncodeError(f"unknown field {name!r}")
    return field


def _unknown_field(header: int) -> Field:
    """A stand-in for a field we do not model, so foreign flows still decode and re-encode.

    Built afresh from the header every time and never registered: decoding must not grow
    the field table, nor decode differently after it has seen some message. Values keep it
    by its name, which gives the header back (``_unknown_field_named``).
    """
    oxm_class, field_no = header >> 16, (header >> 9) & 0x7F
    n_bytes = header & 0xFF
    name = f"oxm_{oxm_class:04x}_{field_no}_{n_bytes}"
    return Field(
        name,
        name,
        name.upper(),
        n_bytes,
        header & ~0x100,
        header & ~0x100,
        HEX,
        True,
        1000 + (oxm_class << 7) + field_no,  # after every known field, unique per header
    )


_UNKNOWN_NAME = re.compile(r"oxm_([0-9a-f]{4})_([0-9]{1,3})_([0-9]{1,3})")


def _unknown_field_named(name: str) -> Field | None:
    """The field an ``oxm_CLASS_FIELD_BYTES`` name stands for, or None for other names."""
    parsed = _UNKNOWN_NAME.fullmatch(name)
    if parsed is None:
        return None
    oxm_class, field_no, n_bytes = int(parsed[1], 16), int(parsed[2]), int(parsed[3])
    if oxm_class == c.OFPXMC_EXPERIMENTER or field_no > 0x7F or not 0 < n_bytes <= 0xFF:
        return None
    header = _hdr(oxm_class, field_no, n_bytes)
    known = _BY_OXM_HEADER.get(header)
    return known if known is not None else _unknown_field(header)


def field_named(name: str) -> Field:
    """The field a value refers to by ``name`` (a known field, or one decoding made up)."""
    field = FIELDS.get(name)
    return field if field is not None else get_field(name)


# -- OXM TLV encoding ------------------------------------------------------------------------

Entry = tuple[Field, int, "int | None"]


def decode_tlvs(data: bytes, start: int, end: int) -> list[Entry]:
    """Decodes OXM/NXM TLVs in ``data[start:end]`` into (field, value, mask) entries.

    64-bit ``xreg`` entries are split into the 32-bit registers they hold; an explicit
    default packet_type (Ethernet) is dropped, as Open vSwitch treats it as implied.
    """
    entries: list[Entry] = []
    pos = start
    while pos < end:
        if pos + 4 > end:
            raise OpenFlowDecodeError("truncated OXM header")
        header = _U32.unpack_from(data, pos)[0]
        length = header & 0xFF
        masked = bool(header & 0x100)
        head_len = 4
        if header >> 16 == c.OFPXMC_EXPERIMENTER:
            head_len = 8
            length -= 4
        body = pos + head_len
        if length < 0 or body + length > end:
            raise OpenFlowDecodeError("OXM entry runs past the end of the match")
        if masked and length % 2:
            raise OpenFlowDecodeError("masked OXM entry with an odd length")
        n_bytes = length // 2 if masked else length
        if n_bytes == 0:
            raise OpenFlowDecodeError("empty OXM entry")
        value = int.from_bytes(data[body : body + n_bytes], "big")
        mask = int.from_bytes(data[body + n_bytes : body + length], "big") if masked else None
        key = (header & ~0x1FF) | n_bytes  # hasmask cleared, unmasked length
        pos = body + length
        if key == PACKET_TYPE_HEADER and value == 0 and mask is None:
            continue
        field = _BY_OXM_HEADER.get(key)
        if field is None:
            if head_len == 8:
                raise OpenFlowDecodeError("experimenter OXM fields are not supported")
            field = _unknown_field(key)
        elif field.n_bytes != n_bytes:
            raise OpenFlowDecodeError(f"{field.name}: bad OXM length {length}")
        if mask is not None:
            full = (1 << (8 * n_bytes)) - 1
            if mask == full:
                mask = None
            value &= mask if mask is not None else full
        entries.append((field, value, mask))
    return entries


# -- Subfield ----------------------------------------------------------------------------


class Subfield(Value):
    """Bits ``[offset, offset + n_bits)`` of a field, as Nicira actions address them.

    ``Subfield("reg4", 16, 3)`` is ``NXM_NX_REG4[16..18]``. ``Subfield.parse`` accepts the
    ``ovs-ofctl`` syntax (``NXM_NX_REG4[16..18]``, ``reg4[16..18]``, ``reg4[]``, ``reg4``).
    The wire is the NXM header followed by the 16-bit offset, as in a learn spec.
    """

    __slots__ = ()
    _fields = ("field", "offset", "n_bits")
    offset: int
    n_bits: int

    @property
    def field(self) -> Field:
        return field_named(self[1])

    def __new__(cls, field: str | Field, offset: int = 0, n_bits: int | None = None) -> Subfield:
        f = get_field(field)
        width = f.subfield_bits
        if n_bits is None:
            n_bits = width - offset
        if offset < 0 or n_bits < 1 or offset + n_bits > width:
            raise OpenFlowEncodeError(
                f"{f.name}[{offset}..{offset + (n_bits or 0) - 1}] is outside the {width}-bit field"
            )
        wire = _U32.pack(f.nxm_header) + offset.to_bytes(2, "big")
        return tuple.__new__(cls, (wire, f.name, offset, n_bits))

    @classmethod
    def parse(cls, text: str) -> Subfield:
        name, _, rest = text.partition("[")
        field = _BY_NXM_NAME.get(name) or get_field(name)
        if not rest or rest == "]":
            return cls(field)
        inner = rest.rstrip("]")
        try:
            if ".." in inner:
                lo, hi = (int(x) for x in inner.split(".."))
            else:
                lo = hi = int(inner)
        except ValueError:
            raise OpenFlowEncodeError(f"bad subfield {text!r}") from None
        return cls(field, lo, hi - lo + 1)

    @classmethod
    def of(cls, spec: str | Field | Subfield) -> Subfield:
        """Accepts a Subfield, a Field (whole field) or subfield text."""
        if isinstance(spec, Subfield):
            return spec
        if isinstance(spec, Field):
            return cls(spec)
        return cls.parse(spec)

    def to_text(self) -> str:
        """``mf_format_subfield``."""
        f = self.field
        if self.offset == 0 and self.n_bits == f.subfield_bits:
            return f"{f.nxm_name}[]"
        if self.n_bits == 1:
            return f"{f.nxm_name}[{self.offset}]"
        return f"{f.nxm_name}[{self.offset}..{self.offset + self.n_bits - 1}]"

    def __repr__(self) -> str:
        return f"Subfield({self.to_text()})"


_BY_NXM_NAME: dict[str, Field] = {f.nxm_name: f for f in _ORDERED}


def field_by_nxm_header(header: int) -> Field:
    field = _BY_OXM_HEADER.get(header & ~0x100)
    if field is None:
        raise OpenFlowDecodeError(f"unknown NXM/OXM field header {header:#010x}")
    if header not in (field.nxm_header, field.oxm_header):
        raise OpenFlowDecodeError(f"bad NXM/OXM field header {header:#010x}")
    return field


# -- Match -----------------------------------------------------------------------------------

_MATCH_HEADER = struct.Struct("!HH")
_ZEROS = bytes(8)
_FULL32 = 0xFFFFFFFF


def _split_wide(field: Field, value: int, mask: int | None) -> list[Entry]:
    """xreg/xxreg values as the 32-bit register entries they overlay."""
    words = field.n_bytes // 4
    first = field.order - 80  # xregN/xxregN are ordered at their first 32-bit register
    entries: list[Entry] = []
    for i in range(words):
        shift = 32 * (words - 1 - i)
        word_mask = _FULL32 if mask is None else (mask >> shift) & _FULL32
        if word_mask == 0:
            continue
        word_value = (value >> shift) & word_mask
        entries.append((REGS[first + i], word_value, None if word_mask == _FULL32 else word_mask))
    return entries


def _prerequisite_error(field: Field) -> OpenFlowEncodeError:
    need = []
    if field.prereq_eth is not None:
        need.append("eth_type=" + " or ".join(f"{t:#06x}" for t in sorted(field.prereq_eth)))
    if field.prereq_proto is not None:
        need.append(f"ip_proto={field.prereq_proto}")
    return OpenFlowEncodeError(f"a match on {field.name} needs {' and '.join(need)}")


def _build_match(keyed: list[tuple[int, Field, int, int | None]]) -> Match:
    """Canonical match from (order, field, value, mask) items: sort, check, encode."""
    if len(keyed) > 1:
        try:
            keyed.sort()  # orders are unique per field; equal orders mean a repeated field
        except TypeError:
            raise OpenFlowEncodeError("a field is matched twice") from None
    parts: list[bytes] = []
    append = parts.append
    eth_type = ip_proto = None
    previous = None
    i = 0
    n = len(keyed)
    while i < n:
        _, field, value, mask = keyed[i]
        if field is previous:
            raise OpenFlowEncodeError(f"field {field.name} is matched twice")
        previous = field
        i += 1
        reg = field.reg_index
        if reg < 0:
            if field.prereq_eth is not None and (
                eth_type not in field.prereq_eth
                or (field.prereq_proto is not None and ip_proto != field.prereq_proto)
            ):
                raise _prerequisite_error(field)
            if field is ETH_TYPE:
                eth_type = value
            elif field is IP_PROTO:
                ip_proto = value
            if mask is None:
                append(field.hdr + value.to_bytes(field.n_bytes, "big"))
            else:
                n_bytes = field.n_bytes
                append(
                    field.hdr_masked
                    + value.to_bytes(n_bytes, "big")
                    + mask.to_bytes(n_bytes, "big")
                )
            continue
        # Open vSwitch matches registers in OpenFlow 1.5 as 64-bit xregs: reg(2k) is the
        # high half of xreg(k), reg(2k+1) the low half.
        high_value = high_mask = low_value = low_mask = 0
        if reg & 1:
            low_value, low_mask = value, _FULL32 if mask is None else mask
        else:
            high_value, high_mask = value, _FULL32 if mask is None else mask
            if i < n and keyed[i][1].reg_index == reg + 1:
                _, previous, low_value, low = keyed[i]
                low_mask = _FULL32 if low is None else low
                i += 1
        x_value = (high_value << 32) | low_value
        x_mask = (high_mask << 32) | low_mask
        xfield = XREGS[reg >> 1]
        if x_mask == 0xFFFFFFFFFFFFFFFF:
            append(xfield.hdr + x_value.to_bytes(8, "big"))
        else:
            append(xfield.hdr_masked + x_value.to_bytes(8, "big") + x_mask.to_bytes(8, "big"))
    body = b"".join(parts)
    length = 4 + len(body)
    wire = _MATCH_HEADER.pack(c.OFPMT_OXM, length) + body + _ZEROS[: -length % 8]
    # Only the encoding is kept (the items are decoded again when asked for): the value
    # then holds no object the garbage collector would have to track.
    return tuple.__new__(Match, (wire, None))


def _regs_split(entries: list[Entry]) -> list[Entry]:
    result: list[Entry] = []
    for field, value, mask in entries:
        if field.wide:
            result.extend(_split_wide(field, value, mask))
        else:
            result.append((field, value, mask))
    return result


# Fast path. Flows are built by the hundred thousand with the same few field sets, so the
# canonical order, the register pairing and the prerequisites of a set of keywords are worked
# out once (a "plan"); building a match is then encoding its values in that order.
# (kind, field or xreg field, index of the value or of the high register, index of the low)
_PLAIN, _XREG = 0, 1
# (kind, field, first index, second index, TLV header, value bytes, value limit)
_PlanOp = tuple[int, Field, int, int, bytes, int, int]
# (ops, eth_index, proto_index, eth_allowed, proto_required): see _make_plan
_Plan = tuple[tuple[_PlanOp, ...], int, int, frozenset[int] | None, int | None]
_PLANS: dict[tuple[str, ...], _Plan | Literal[False]] = {}


def _make_plan(names: tuple[str, ...]) -> _Plan | Literal[False]:
    """The plan for a keyword set, or False when the general path must handle it.

    A plan is (ops, eth_index, proto_index, eth_allowed, proto_required): the fields in
    canonical order, registers paired into xregs, with what each encoding needs at hand,
    and the prerequisites folded into one check on the eth_type and ip_proto values.
    """
    fields: list[Field] = []
    for name in names:
        known = FIELDS.get(name)
        if known is None:
            return False
        fields.append(known)
    seen = set()
    for field in fields:
        if field.wide or field in seen:
            return False
        seen.add(field)
    order = sorted(range(len(fields)), key=lambda i: fields[i].order)
    eth_index = next((i for i, f in enumerate(fields) if f is ETH_TYPE), -1)
    proto_index = next((i for i, f in enumerate(fields) if f is IP_PROTO), -1)
    eth_allowed: frozenset[int] | None = None
    protos: set[int] = set()
    ops: list[_PlanOp] = []
    position = 0
    while position < len(order):
        index = order[position]
        field = fields[index]
        position += 1
        if field.prereq_eth is not None:
            if eth_index < 0 or (field.prereq_proto is not None and proto_index < 0):
                return False  # the general path raises the prerequisite error
            eth_allowed = (
                field.prereq_eth if eth_allowed is None else eth_allowed & field.prereq_eth
            )
            if field.prereq_proto is not None:
                protos.add(field.prereq_proto)
        if field.reg_index < 0:
            ops.append((_PLAIN, field, index, -1, field.hdr, field.n_bytes, field.limit))
            continue
        reg = field.reg_index
        high = low = -1
        if reg & 1:
            low = index
        else:
            high = index
            if position < len(order):
                nxt = fields[order[position]]
                if nxt.reg_index == reg + 1:
                    low = order[position]
                    position += 1
        xfield = XREGS[reg >> 1]
        ops.append((_XREG, xfield, high, low, xfield.hdr, 8, 0))
    if len(protos) > 1:
        return False
    return (tuple(ops), eth_index, proto_index, eth_allowed, protos.pop() if protos else None)


def _plain_value(field: Field, raw: Any) -> tuple[int, int | None] | None:
    """(value, mask) for the spellings the fast path handles, else None."""
    kind = type(raw)
    if kind is int:
        return (raw, None) if 0 <= raw < field.limit else None
    if kind is _IPV4 and field.n_bytes == 4:
        return raw._ip, None
    if kind is tuple and len(raw) == 2:
        value, mask = raw
        if type(value) is int and type(mask) is int and 0 <= value < field.limit:
            if mask == field.limit - 1:
                return value, None
            if 0 < mask < field.limit and field.maskable:
                return value & mask, mask
    return None


def _encode_with_plan(plan: _Plan, values: tuple[Any, ...]) -> bytes | None:
    ops, eth_index, proto_index, eth_allowed, proto_required = plan
    if eth_allowed is not None and (
        values[eth_index] not in eth_allowed
        or (proto_required is not None and values[proto_index] != proto_required)
    ):
        return None  # the general path raises the prerequisite error
    parts: list[bytes] = []
    append = parts.append
    for kind, field, first, second, hdr, n_bytes, limit in ops:
        if kind == _PLAIN:
            raw = values[first]
            raw_type = type(raw)
            if raw_type is int and 0 <= raw < limit:
                append(hdr + raw.to_bytes(n_bytes, "big"))
                continue
            if raw_type is _IPV4 and n_bytes == 4:
                append(hdr + raw._ip.to_bytes(4, "big"))
                continue
            pair = _plain_value(field, raw)
            if pair is None:
                return None
            value, mask = pair
            if mask is None:
                append(hdr + value.to_bytes(n_bytes, "big"))
            else:
                append(
                    field.hdr_masked
                    + value.to_bytes(n_bytes, "big")
                    + mask.to_bytes(n_bytes, "big")
                )
            continue
        x_value = x_mask = 0
        for index, shift in ((first, 32), (second, 0)):
            if index < 0:
                continue
            raw = values[index]
            raw_type = type(raw)
            if raw_type is int and 0 <= raw <= _FULL32:
                x_value |= raw << shift
                x_mask |= _FULL32 << shift
            elif raw_type is _IPV4:
                x_value |= raw._ip << shift
                x_mask |= _FULL32 << shift
            else:
                pair = _plain_value(REGS[0], raw)
                if pair is None:
                    return None
                x_value |= pair[0] << shift
                x_mask |= (_FULL32 if pair[1] is None else pair[1]) << shift
        if x_mask == 0xFFFFFFFFFFFFFFFF:
            append(hdr + x_value.to_bytes(8, "big"))
        else:
            append(field.hdr_masked + x_value.to_bytes(8, "big") + x_mask.to_bytes(8, "big"))
    body = b"".join(parts)
    length = 4 + len(body)
    return _MATCH_HEADER.pack(1, length) + body + _ZEROS[: -length % 8]


class Match(Value):
    """A flow match: ``Match(eth_type=0x0800, ip_proto=6, ipv4_dst=ip, tcp_dst=80)``.

    Values may be ints, ``ipaddress`` objects, MAC strings, ``(value, mask)`` tuples or
    ``ipaddress`` networks. ``xreg``/``xxreg`` keywords are stored as the 32-bit registers
    they overlay, so ``Match(xxreg3=ip)`` equals ``Match(reg12=..., ..., reg15=...)``.
    A mask of 0 means "don't care" and drops the field. Prerequisites are checked (e.g.
    ``tcp_dst`` needs ``ip_proto=6`` and an IP ``eth_type``).
    """

    __slots__ = ()
    _fields = ()

    @property
    def items(self) -> tuple[tuple[int, Field, int, int | None], ...]:
        """(order, field, value, mask) in canonical order (decoded from the wire when the
        match was built on the fast path, which only produces the encoding)."""
        items: tuple[tuple[int, Field, int, int | None], ...] | None = self[1]
        if items is None:
            length = _MATCH_HEADER.unpack_from(self[0], 0)[1]
            items = tuple(
                (f.order, f, v, m) for f, v, m in _regs_split(decode_tlvs(self[0], 4, length))
            )
        return items

    @property
    def entries(self) -> tuple[Entry, ...]:
        """The (field, value, mask) entries in canonical order; mask None means exact."""
        return tuple((f, v, m) for _, f, v, m in self.items)

    def __new__(cls, **fields: Any) -> Match:
        if not fields:
            return _EMPTY_MATCH
        names = tuple(fields)
        plan = _PLANS.get(names)
        if plan is None:
            plan = _make_plan(names)
            if len(_PLANS) < 4096:  # a few keyword sets in practice; never unbounded
                _PLANS[names] = plan
        if plan:
            wire = _encode_with_plan(plan, tuple(fields.values()))
            if wire is not None:
                return tuple.__new__(cls, (wire, None))
        keyed: list[tuple[int, Field, int, int | None]] = []
        append = keyed.append
        get = FIELDS.get
        for name, raw in fields.items():
            field = get(name) or _unknown_field_named(name)
            if field is None:
                raise OpenFlowEncodeError(f"unknown match field {name!r}")
            if raw is None:
                continue
            value, mask = field.value_and_mask(raw)
            if mask == 0:
                continue
            if field.wide:
                for sub in _split_wide(field, value, mask):
                    append((sub[0].order, *sub))
            else:
                append((field.order, field, value, mask))
        return _build_match(keyed)

    @classmethod
    def from_entries(cls, entries: list[Entry] | tuple[Entry, ...]) -> Match:
        """Builds a match from decoded (field, value, mask) entries."""
        keyed: list[tuple[int, Field, int, int | None]] = []
        for field, value, mask in entries:
            if field.wide:
                keyed.extend((s[0].order, *s) for s in _split_wide(field, value, mask))
            else:
                keyed.append((field.order, field, value, mask))
        return _build_match(keyed)

    @classmethod
    def decode(cls, data: bytes, offset: int = 0) -> tuple[Match, int]:
        """Decodes an ofp_match at ``offset``; returns the match and the padded length."""
        if offset + 4 > len(data):
            raise OpenFlowDecodeError("truncated match")
        match_type, length = _MATCH_HEADER.unpack_from(data, offset)
        if match_type != c.OFPMT_OXM:
            raise OpenFlowDecodeError(f"unsupported match type {match_type}")
        padded = (length + 7) // 8 * 8
        if length < 4 or offset + padded > len(data):
            raise OpenFlowDecodeError(f"bad match length {length}")
        entries = decode_tlvs(data, offset + 4, offset + length)
        try:
            return cls.from_entries(entries), padded
        except OpenFlowEncodeError as exc:
            raise OpenFlowDecodeError(f"invalid match: {exc}") from None

    # -- access ------------------------------------------------------------------------

    def get(self, name: str, default: Any = None) -> Any:
        """The value of a field: its natural form, or ``(value, mask)`` when masked."""
        field = FIELDS.get(name) or _unknown_field_named(name)
        if field is None:
            raise KeyError(name)
        if field.wide:
            return self._get_wide(field, default)
        for _, f, value, mask in self.items:
            if f is field or (f.order >= 1000 and f.name == field.name):  # (made up: a copy)
                py = field.python_value(value)
                return py if mask is None else (py, field.python_value(mask))
        return default

    def _get_wide(self, field: Field, default: Any) -> Any:
        words = field.n_bytes // 4
        first = field.order - 80
        value = mask = 0
        found = False
        regs = {f.reg_index: (v, m) for _, f, v, m in self.items if f.reg_index >= 0}
        for i in range(words):
            v, reg_mask = regs.get(first + i, (0, 0))
            if (first + i) in regs:
                found = True
            m = _FULL32 if reg_mask is None else reg_mask  # None: an exact register
            value = (value << 32) | v
            mask = (mask << 32) | m
        if not found:
            return default
        return value if mask == (1 << (32 * words)) - 1 else (value, mask)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in FIELDS:
            raise AttributeError(name)
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def as_kwargs(self) -> dict[str, Any]:
        """The match as ``Match(**kwargs)`` keywords (registers as 32-bit regs)."""
        return {f.name: (v if m is None else (v, m)) for _, f, v, m in self.items}

    def replace(self, **changes: Any) -> Match:
        kwargs = self.as_kwargs()
        kwargs.update(changes)
        return Match(**kwargs)

    def __repr__(self) -> str:
        args = ", ".join(
            f"{f.name}={f.python_value(v)!r}"
            if m is None
            else f"{f.name}=({f.python_value(v)!r}, {f.python_value(m)!r})"
            for _, f, v, m in self.items
        )
        return f"Match({args})"

    def to_text(self, priority: int | None = None) -> str:
        """``match_format``: the match as ``ovs-ofctl`` prints it (priority first)."""
        return format_match(self, priority)


_EMPTY_MATCH = _build_match([])


# -- match text (match_format) -----------------------------------------------------------


def _fmt_hex_nonzero(value: int) -> str:
    # C's "%#x" prints 0 as "0".
    return f"{value:#x}" if value else "0"


def _fmt_dec16(name: str, value: int, mask: int | None) -> str:
    if mask is None:
        return f"{name}={value}"
    # format_be16_masked prints "0x%x/0x%x" (so zero is "0x0", unlike "%#x").
    return f"{name}=0x{value:x}/0x{mask:x}"


def format_match(match: Match, priority: int | None = None) -> str:
    """Open vSwitch's ``match_format`` for the fields we model."""
    values: dict[str, tuple[int, int | None]] = {f.name: (v, m) for _, f, v, m in match.items}
    out: list[str] = []
    if priority is not None and priority != c.OFP_DEFAULT_PRIORITY:
        out.append(f"priority={priority}")

    def hex32(name: str, key: str | None = None) -> None:
        item = values.get(key or name)
        if item is not None:
            v, m = item
            text = f"{name}={_fmt_hex_nonzero(v)}"
            if m is not None:
                text += f"/{_fmt_hex_nonzero(m)}"
            out.append(text)

    def ipv4(name: str, key: str) -> None:
        item = values.get(key)
        if item is not None:
            v, m = item
            out.append(f"{name}={format_ipv4_masked(v, 0xFFFFFFFF if m is None else m)}")

    def ipv6(name: str, key: str) -> None:
        item = values.get(key)
        if item is not None:
            out.append(f"{name}={format_ipv6_masked(item[0], item[1])}")

    def dec16(name: str, key: str) -> None:
        item = values.get(key)
        if item is not None:
            out.append(_fmt_dec16(name, *item))

    def mac(name: str, key: str) -> None:
        item = values.get(key)
        if item is not None:
            v, m = item
            out.append(f"{name}={format_mac(v)}" + ("" if m is None else f"/{format_mac(m)}"))

    hex32("pkt_mark")
    item = values.get("ct_state")
    if item is not None:
        v, m = item
        if m is None or (m & 0xFF) == 0xFF:
            out.append(f"ct_state={format_ct_flags(v & 0xFF)}")
        else:
            out.append(f"ct_state={format_flags_masked(v, m & 0xFF, 0xFF)}")
    dec16("ct_zone", "ct_zone")
    hex32("ct_mark")
    item = values.get("ct_label")
    if item is not None:
        v, m = item
        out.append(f"ct_label={format_hex(v)}" + ("" if m is None else f"/{format_hex(m)}"))
    ipv4("ct_nw_src", "ct_nw_src")
    ipv6("ct_ipv6_src", "ct_ipv6_src")
    ipv4("ct_nw_dst", "ct_nw_dst")
    ipv6("ct_ipv6_dst", "ct_ipv6_dst")
    if "ct_nw_proto" in values:
        out.append(f"ct_nw_proto={values['ct_nw_proto'][0]}")
        dec16("ct_tp_src", "ct_tp_src")
        dec16("ct_tp_dst", "ct_tp_dst")

    eth_type = values.get("eth_type", (None, None))[0]
    ip_proto = values.get("ip_proto", (None, None))[0]
    skip_type = skip_proto = False
    if eth_type is not None:
        skip_type = True
        if eth_type == c.ETH_TYPE_IP:
            names = {
                c.IPPROTO_ICMP: "icmp",
                c.IPPROTO_TCP: "tcp",
                c.IPPROTO_UDP: "udp",
                c.IPPROTO_SCTP: "sctp",
            }
            shorthand = names.get(ip_proto, "ip") if ip_proto is not None else "ip"
            skip_proto = ip_proto in names
            out.append(shorthand)
        elif eth_type == c.ETH_TYPE_IPV6:
            names = {
                c.IPPROTO_ICMPV6: "icmp6",
                c.IPPROTO_TCP: "tcp6",
                c.IPPROTO_UDP: "udp6",
                c.IPPROTO_SCTP: "sctp6",
            }
            shorthand = names.get(ip_proto, "ipv6") if ip_proto is not None else "ipv6"
            skip_proto = ip_proto in names
            out.append(shorthand)
        elif eth_type == c.ETH_TYPE_ARP:
            out.append("arp")
        elif eth_type == c.ETH_TYPE_RARP:
            out.append("rarp")
        else:
            skip_type = False
    for i in range(16):
        hex32(f"reg{i}")
    item = values.get("metadata")
    if item is not None:
        v, m = item
        out.append(f"metadata={_fmt_hex_nonzero(v)}" + ("" if m is None else f"/{m:#x}"))
    if "in_port" in values:
        out.append(f"in_port={format_port16(values['in_port'][0])}")
    mac("dl_src", "eth_src")
    mac("dl_dst", "eth_dst")
    if not skip_type and eth_type is not None:
        out.append(f"dl_type=0x{eth_type:04x}")
    if eth_type == c.ETH_TYPE_IPV6:
        ipv6("ipv6_src", "ipv6_src")
        ipv6("ipv6_dst", "ipv6_dst")
    elif eth_type in (c.ETH_TYPE_ARP, c.ETH_TYPE_RARP):
        ipv4("arp_spa", "arp_spa")
        ipv4("arp_tpa", "arp_tpa")
    else:
        ipv4("nw_src", "ipv4_src")
        ipv4("nw_dst", "ipv4_dst")
    if eth_type in (c.ETH_TYPE_ARP, c.ETH_TYPE_RARP):
        if "arp_op" in values:
            out.append(f"arp_op={values['arp_op'][0]}")
        mac("arp_sha", "arp_sha")
        mac("arp_tha", "arp_tha")
    elif not skip_proto and ip_proto is not None:
        out.append(f"nw_proto={ip_proto}")
    if eth_type == c.ETH_TYPE_IP and ip_proto == c.IPPROTO_ICMP:
        dec16("icmp_type", "icmp_type")
        dec16("icmp_code", "icmp_code")
    elif eth_type == c.ETH_TYPE_IPV6 and ip_proto == c.IPPROTO_ICMPV6:
        dec16("icmp_type", "icmpv6_type")
        dec16("icmp_code", "icmpv6_code")
    else:
        for proto in ("tcp", "udp", "sctp"):
            dec16("tp_src", f"{proto}_src")
            dec16("tp_dst", f"{proto}_dst")
        item = values.get("tcp_flags")
        if item is not None:
            out.append(f"tcp_flags={format_tcp_flags_masked(item[0], item[1])}")
    for _, f, v, m in match.items:
        if f.order >= 1000:  # fields we do not model, printed raw
            out.append(f"{f.name}={format_hex(v)}" + ("" if m is None else f"/{format_hex(m)}"))
    return ",".join(out)


def format_port16(port: int) -> str:
    """A port as Open vSwitch prints it after mapping it to its 16-bit numbering."""
    return format_port(port)
