"""NXT_CT_FLUSH (Open vSwitch 3.1+): flush the conntrack entries matching a partial tuple.

Wire format (``include/openflow/nicira-ext.h``)::

    ofp_header | experimenter=NX_VENDOR_ID | subtype=32
    struct nx_ct_flush { uint8 ip_proto; uint8 pad[7]; }
    properties (type u16, length u16, value, padded to 8):
        0 NXT_CT_ORIG_TUPLE   4 pad bytes, then nested properties: 0 SRC, 1 DST (16 bytes:
        1 NXT_CT_REPLY_TUPLE  IPv6 or IPv4-mapped), 2 SRC_PORT, 3 DST_PORT (be16)
        2 NXT_CT_ZONE_ID      be16

Every field is optional; an entry is flushed when it matches every field given (OVS dumps the
zone and filters unless a full original 5-tuple is given). There is no reply: errors come back
as OFPT_ERROR (an OVS older than 3.1 answers OFPBRC_BAD_SUBTYPE), so send it followed by a
barrier (``Channel.send`` does).
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from collections.abc import Iterable
from typing import Any

from . import constants as c
from .message import Message

NXT_CT_FLUSH = 32
NXT_CT_ORIG_TUPLE = 0
NXT_CT_REPLY_TUPLE = 1
NXT_CT_ZONE_ID = 2
NXT_CT_TUPLE_SRC = 0
NXT_CT_TUPLE_DST = 1
NXT_CT_TUPLE_SRC_PORT = 2
NXT_CT_TUPLE_DST_PORT = 3

_NX_MSG = struct.Struct("!II")
_PROP = struct.Struct("!HH")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Tuple = tuple[IPAddress | None, IPAddress | None, int, int]  # src, dst, src port, dst port
_EMPTY: Tuple = (None, None, 0, 0)


def _prop(prop_type: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return _PROP.pack(prop_type, length) + payload + bytes(-length % 8)


def _addr16(ip: IPAddress) -> bytes:
    if ip.version == 4:
        return bytes(10) + b"\xff\xff" + ip.packed  # IPv4-mapped
    return ip.packed


def _tuple_props(t: Tuple) -> bytes:
    src, dst, sport, dport = t
    out = b""
    if src is not None:
        out += _prop(NXT_CT_TUPLE_SRC, _addr16(src))
    if dst is not None:
        out += _prop(NXT_CT_TUPLE_DST, _addr16(dst))
    if sport:  # 16-bit values are padded to 4 bytes (ofpprop_put_be16)
        out += _prop(NXT_CT_TUPLE_SRC_PORT, sport.to_bytes(2, "big") + bytes(2))
    if dport:
        out += _prop(NXT_CT_TUPLE_DST_PORT, dport.to_bytes(2, "big") + bytes(2))
    return out


def _check(t: Iterable[Any], what: str) -> Tuple:
    """The tuple (any 4-item iterable: untyped callers pass lists), checked."""
    src, dst, sport, dport = t
    versions = {ip.version for ip in (src, dst) if ip is not None}
    if len(versions) > 1:
        raise ValueError(f"ct_flush: {what} tuple mixes IPv4 and IPv6")
    for port in (sport, dport):
        if not 0 <= port <= 0xFFFF:
            raise ValueError(f"ct_flush: port {port} out of range")
    return (src, dst, sport, dport)


class CtFlush(Message):
    """``ovs-ofctl ct-flush [zone=N] ORIG_TUPLE REPLY_TUPLE`` as a message.

    ``orig``/``reply`` are ``(src, dst, src_port, dst_port)`` with None/0 for "any".
    ``ip_proto`` 0 is any protocol; ports need a protocol.
    """

    __slots__ = ()
    _fields = ("zone", "ip_proto", "orig", "reply")
    zone: int | None
    ip_proto: int
    orig: Tuple
    reply: Tuple
    msg_type = c.MsgType.EXPERIMENTER
    raw_name = "NXT_CT_FLUSH"

    def __new__(
        cls,
        zone: int | None = None,
        ip_proto: int = 0,
        orig: Tuple = _EMPTY,
        reply: Tuple = _EMPTY,
    ) -> CtFlush:
        orig = _check(orig, "original")
        reply = _check(reply, "reply")
        versions = {ip.version for ip in (*orig[:2], *reply[:2]) if ip is not None}
        if len(versions) > 1:
            raise ValueError("ct_flush: original and reply tuples differ in IP version")
        if not ip_proto and any((orig[2], orig[3], reply[2], reply[3])):
            raise ValueError("ct_flush: ports need ip_proto")
        if zone is not None and not 0 <= zone <= 0xFFFF:
            raise ValueError(f"ct_flush: zone {zone} out of range")
        body = _NX_MSG.pack(c.NX_VENDOR_ID, NXT_CT_FLUSH) + bytes([ip_proto]) + bytes(7)
        for prop_type, t in ((NXT_CT_ORIG_TUPLE, orig), (NXT_CT_REPLY_TUPLE, reply)):
            nested = _tuple_props(t)
            if nested:  # a nested property's own header is padded to 8 bytes
                body += _prop(prop_type, bytes(4) + nested)
        if zone is not None:
            body += _prop(NXT_CT_ZONE_ID, zone.to_bytes(2, "big") + bytes(2))
        return tuple.__new__(cls, (body, zone, ip_proto, orig, reply))

    def _family(self) -> int:
        for ip in (*self.orig[:2], *self.reply[:2]):
            if ip is not None:
                return ip.version
        return 6

    def to_text(self, xid: int = 0) -> str:
        """As Open vSwitch 3.1's ``ofp-print`` prints it."""
        v4 = self._family() == 4

        def addr(ip: IPAddress | None) -> str:
            if ip is None:
                return "::"
            family = socket.AF_INET if ip.version == 4 else socket.AF_INET6
            return socket.inet_ntop(family, ip.packed)  # as OVS formats (e.g. ::0.1.0.0)

        def tup(t: Tuple) -> str:
            src, dst, sport, dport = t
            key = "ct_nw_" if v4 else "ct_ipv6_"
            return f"{key}src={addr(src)},{key}dst={addr(dst)},ct_tp_src={sport},ct_tp_dst={dport}"

        return f" zone={self[1] or 0} '{tup(self[3])},ct_nw_proto={self[2]}' '{tup(self[4])}'"
