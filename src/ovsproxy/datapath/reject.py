"""Rejecting connections to a Service without endpoints, as kube-proxy does, through the agent.

OVS cannot synthesise a TCP RST or an ICMP error, so ServiceLB sends the first packet of such a
connection to the agent: ``controller(max_len=256, userdata="ovsp-rej", meter_id=M)``. The
meter (pktps, 100/s, burst 200 by default) drops a flood in the datapath before it reaches the
slow path; the agent applies its own token bucket on top (a flood cannot cost more than that).
The agent answers with a PACKET_OUT of the reply, output to the packet's ``in_port``:

* TCP: a RST from the Service address (RFC 793 reset generation: ``seq = SEG.ACK`` if the
  segment had ACK, else ``RST|ACK`` with ``ack = SEG.SEQ + SEG.LEN``): ``connect()`` fails at
  once with "connection refused". kube-proxy's iptables/nftables send ICMP port unreachable
  for TCP too, which Linux also reports as ECONNREFUSED; a RST is what every client stack
  takes as a refusal (Windows retries SYNs on ICMP).
* UDP, SCTP: ICMP port unreachable (type 3 code 3) or ICMPv6 port unreachable (type 1 code 4),
  from the Service address, quoting the packet as far as it was captured (RFC 1812: 576 bytes
  in all for IPv4; RFC 4443: 1280 for IPv6). A connected UDP socket then gets ECONNREFUSED.

No answer is sent to a RST, to an ICMP packet, to a non-first fragment or to a packet from
or to a multicast, broadcast or unspecified address. The reply goes straight out of the port
the packet came in on (``in_port``), with the Ethernet addresses swapped: the client is on
this bridge (a pod, or the node via the gateway port). A client behind a tunnel port (in an
integrated CNI bridge) would need tunnel metadata on the PACKET_OUT: not handled.

The packet builders are pure functions (``reject_reply``), tested byte for byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ovsproxy.datapath import pipeline as pl
from ovsproxy.model import IPAddress
from ovsproxy.openflow import protocol as of
from ovsproxy.openflow.errors import OpenFlowError
from ovsproxy.openflow.protocol import MeterCommand, MeteredController, meter_add

log = logging.getLogger(__name__)

ETH_IPV4 = 0x0800
ETH_IPV6 = 0x86DD
ETH_VLAN = (0x8100, 0x88A8)
IPPROTO_TCP = 6
IPPROTO_UDP = 17
IPPROTO_ICMP = 1
IPPROTO_ICMPV6 = 58
IPV6_EXTENSIONS = (0, 43, 60)  # hop-by-hop, routing, destination options (walked)
IPV6_FRAGMENT = 44
TCP_FIN, TCP_SYN, TCP_RST, TCP_ACK = 0x01, 0x02, 0x04, 0x10
ICMP4_MAX_TOTAL = 576
ICMP6_MAX_TOTAL = 1280
REPLY_TTL = 64


def checksum(data: bytes) -> int:
    """The Internet checksum (RFC 1071) of data."""
    if len(data) % 2:
        data += b"\0"
    total: int = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def _pseudo_header(src: bytes, dst: bytes, proto: int, length: int) -> bytes:
    if len(src) == 4:
        return src + dst + struct.pack("!BBH", 0, proto, length)
    return src + dst + struct.pack("!IxxxB", length, proto)


def _ipv4_header(
    src: bytes, dst: bytes, proto: int, payload_len: int, *, tos: int, df: bool
) -> bytes:
    header = struct.pack(
        "!BBHHHBBH4s4s",
        0x45,
        tos,
        20 + payload_len,
        0,
        0x4000 if df else 0,
        REPLY_TTL,
        proto,
        0,
        src,
        dst,
    )
    return header[:10] + struct.pack("!H", checksum(header)) + header[12:]


def _ipv6_header(src: bytes, dst: bytes, next_header: int, payload_len: int) -> bytes:
    return struct.pack("!IHBB16s16s", 6 << 28, payload_len, next_header, REPLY_TTL, src, dst)


@dataclass(frozen=True, slots=True)
class _Packet:
    l2: bytes  # Ethernet header of the reply (addresses swapped, VLAN tags kept)
    version: int
    src: bytes
    dst: bytes
    proto: int
    ip_start: int  # offset of the IP header in the frame
    l4_start: int  # offset of the transport header
    l4_len: int  # transport header + payload, from the IP lengths (not the capture)
    tos: int


def _unicast(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if ip.is_multicast or ip.is_unspecified:
        return False
    return not (ip.version == 4 and ip == ipaddress.IPv4Address("255.255.255.255"))


def _parse(frame: bytes) -> _Packet | None:
    if len(frame) < 14 or frame[0] & 1 or frame[6] & 1:  # multicast/broadcast MACs
        return None
    pos = 12
    ethertype = struct.unpack_from("!H", frame, pos)[0]
    while ethertype in ETH_VLAN and len(frame) >= pos + 6:
        pos += 4
        ethertype = struct.unpack_from("!H", frame, pos)[0]
    pos += 2
    l2 = frame[6:12] + frame[0:6] + frame[12:pos]
    if ethertype == ETH_IPV4:
        if len(frame) < pos + 20 or frame[pos] >> 4 != 4:
            return None
        ihl = (frame[pos] & 0x0F) * 4
        tos, total = struct.unpack_from("!xBH", frame, pos)
        frag = struct.unpack_from("!H", frame, pos + 6)[0]
        if ihl < 20 or total < ihl or frag & 0x1FFF:  # non-first fragment: no ports
            return None
        src, dst = frame[pos + 12 : pos + 16], frame[pos + 16 : pos + 20]
        if not (_unicast(ipaddress.IPv4Address(src)) and _unicast(ipaddress.IPv4Address(dst))):
            return None
        return _Packet(l2, 4, src, dst, frame[pos + 9], pos, pos + ihl, total - ihl, tos)
    if ethertype == ETH_IPV6:
        if len(frame) < pos + 40 or frame[pos] >> 4 != 6:
            return None
        payload_len, next_header = struct.unpack_from("!HB", frame, pos + 4)
        src, dst = frame[pos + 8 : pos + 24], frame[pos + 24 : pos + 40]
        if not (_unicast(ipaddress.IPv6Address(src)) and _unicast(ipaddress.IPv6Address(dst))):
            return None
        l4 = pos + 40
        while next_header in (*IPV6_EXTENSIONS, IPV6_FRAGMENT):
            if len(frame) < l4 + 8:
                return None
            if next_header == IPV6_FRAGMENT:
                if struct.unpack_from("!H", frame, l4 + 2)[0] & 0xFFF8:  # offset != 0
                    return None
                ext_len = 8
            else:
                ext_len = (frame[l4 + 1] + 1) * 8
            next_header = frame[l4]
            l4 += ext_len
        l4_len = payload_len - (l4 - pos - 40)
        if l4_len < 0:
            return None
        tc = (struct.unpack_from("!I", frame, pos)[0] >> 20) & 0xFF
        return _Packet(l2, 6, src, dst, next_header, pos, l4, l4_len, tc)
    return None


def _tcp_reset(p: _Packet, frame: bytes) -> bytes | None:
    if len(frame) < p.l4_start + 20:
        return None
    sport, dport, seq, ack, offset, flags = struct.unpack_from("!HHIIBB", frame, p.l4_start)
    if flags & TCP_RST:
        return None
    header_len = (offset >> 4) * 4
    seg_len = p.l4_len - header_len + (1 if flags & TCP_SYN else 0) + (1 if flags & TCP_FIN else 0)
    if flags & TCP_ACK:
        r_seq, r_ack, r_flags = ack, 0, TCP_RST
    else:
        r_seq, r_ack, r_flags = 0, (seq + seg_len) & 0xFFFFFFFF, TCP_RST | TCP_ACK
    tcp = struct.pack("!HHIIBBHHH", dport, sport, r_seq, r_ack, 5 << 4, r_flags, 0, 0, 0)
    csum = checksum(_pseudo_header(p.dst, p.src, IPPROTO_TCP, len(tcp)) + tcp)
    tcp = tcp[:16] + struct.pack("!H", csum) + tcp[18:]
    if p.version == 4:
        return p.l2 + _ipv4_header(p.dst, p.src, IPPROTO_TCP, len(tcp), tos=p.tos, df=True) + tcp
    return p.l2 + _ipv6_header(p.dst, p.src, IPPROTO_TCP, len(tcp)) + tcp


def _port_unreachable(p: _Packet, frame: bytes) -> bytes:
    quoted = frame[p.ip_start :]
    if p.version == 4:
        quoted = quoted[: ICMP4_MAX_TOTAL - 20 - 8]
        icmp = struct.pack("!BBHI", 3, 3, 0, 0) + quoted
        icmp = icmp[:2] + struct.pack("!H", checksum(icmp)) + icmp[4:]
        tos = (p.tos & 0x1E) | 0xC0  # as Linux: internetwork-control precedence
        return p.l2 + _ipv4_header(p.dst, p.src, IPPROTO_ICMP, len(icmp), tos=tos, df=False) + icmp
    quoted = quoted[: ICMP6_MAX_TOTAL - 40 - 8]
    icmp = struct.pack("!BBHI", 1, 4, 0, 0) + quoted
    csum = checksum(_pseudo_header(p.dst, p.src, IPPROTO_ICMPV6, len(icmp)) + icmp)
    icmp = icmp[:2] + struct.pack("!H", csum) + icmp[4:]
    return p.l2 + _ipv6_header(p.dst, p.src, IPPROTO_ICMPV6, len(icmp)) + icmp


def destination(frame: bytes) -> tuple[int, IPAddress, int] | None:
    """(IP protocol, destination address, destination port) of a TCP, UDP or SCTP packet;
    None for anything else."""
    p = _parse(frame)
    if p is None or p.proto in (IPPROTO_ICMP, IPPROTO_ICMPV6) or len(frame) < p.l4_start + 4:
        return None
    ip: IPAddress = ipaddress.IPv4Address(p.dst) if p.version == 4 else ipaddress.IPv6Address(p.dst)
    return p.proto, ip, struct.unpack_from("!H", frame, p.l4_start + 2)[0]


def reject_reply(frame: bytes) -> bytes | None:
    """The frame that refuses `frame` (the start of a rejected packet, from its Ethernet
    header): a TCP RST, an ICMP(v6) port unreachable, or None when no answer is due."""
    p = _parse(frame)
    if p is None or p.proto in (IPPROTO_ICMP, IPPROTO_ICMPV6):
        return None
    if p.proto == IPPROTO_TCP:
        return _tcp_reset(p, frame)
    return _port_unreachable(p, frame)


# -- the agent side -------------------------------------------------------------------------


class TokenBucket:
    """`rate` tokens per second, at most `burst` saved."""

    def __init__(
        self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate, self.burst, self.clock = rate, burst, clock
        self.tokens = burst
        self.stamp = clock()

    def take(self) -> bool:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


@dataclass
class RejectStats:
    packet_ins: int = 0  # ours (by userdata)
    answered: int = 0  # PACKET_OUTs sent
    rate_limited: int = 0
    no_answer: int = 0  # RST, ICMP, fragments, broadcast...: nothing is due
    foreign: int = 0  # packet-ins of other controllers' flows (ignored)
    send_errors: int = 0
    # not refused: its frontend forwards by now (a datapath flow cached before the commit
    # that gave it endpoints still sent it here); the client's retransmission meets the new
    # flows
    forwarding_now: int = 0
    meter: str = "not installed"  # "installed", "unsupported: ..."
    by_protocol: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "packet_ins": self.packet_ins,
            "answered": self.answered,
            "rate_limited": self.rate_limited,
            "no_answer": self.no_answer,
            "foreign": self.foreign,
            "send_errors": self.send_errors,
            "forwarding_now": self.forwarding_now,
            "meter": self.meter,
            "by_protocol": dict(self.by_protocol),
        }


class Rejector:
    """Answers the reject packet-ins of ServiceLB. Wire it to the channel::

        rejector = Rejector(channel)
        channel = Channel(endpoint, on_packet_in=rejector.handle, ...)   # or set it after
        proxier = Proxier(..., reject_action=rejector.reject_action)
        # in the on_connected hook, before the datapath replays:
        await rejector.install_meter()

    ``handle`` is synchronous (the channel's callback); replies are batched into one
    ``send`` (PACKET_OUTs and a barrier) per event-loop turn.

    ``forwards(ip_proto, address, port)`` (the proxier's, set by the agent) says whether that
    frontend has usable endpoints now. Open vSwitch applies a commit to the datapath flows it
    has cached only when its revalidators get to them, so a connection opened just after the
    commit that gave a rejecting frontend its first endpoints can still be sent here. Such a
    packet is not refused (a RST would fail a connect that the Service now serves): it gets
    no answer, and the client's retransmission meets the new flows. (Sending it back through
    the pipeline does not help: after conntrack it recirculates into the same stale cached
    flow and comes back here, packet after packet, until the revalidators run.)
    """

    def __init__(
        self,
        channel: Any,
        *,
        rate: float = pl.REJECT_METER_RATE,
        burst: int = pl.REJECT_METER_BURST,
        meter_id: int = pl.REJECT_METER_ID,
        max_len: int = pl.REJECT_MAX_LEN,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.channel = channel
        self.meter_id = meter_id
        self.rate, self.burst = rate, burst
        self.bucket = TokenBucket(rate, burst, clock)
        self.reject_action: tuple[of.Action, ...] = (
            MeteredController(max_len, userdata=pl.REJECT_USERDATA, meter_id=meter_id),
        )
        self.stats = RejectStats()
        self.forwards: Callable[[int, IPAddress, int], bool] | None = None
        self._pending: list[of.PacketOut] = []
        self._flush_task: asyncio.Task[None] | None = None

    # -- packet-ins --------------------------------------------------------------------------
    def handle(self, packet_in: of.PacketIn) -> None:
        if packet_in.userdata != pl.REJECT_USERDATA:
            self.stats.foreign += 1
            return
        self.stats.packet_ins += 1
        in_port = packet_in.in_port
        if in_port is None:
            self.stats.no_answer += 1
            return
        if not self.bucket.take():
            self.stats.rate_limited += 1
            return
        if self.forwards is not None:
            target = destination(packet_in.data)
            if target is not None and self.forwards(*target):
                self.stats.forwarding_now += 1
                return
        reply = reject_reply(packet_in.data)
        if reply is None:
            self.stats.no_answer += 1
            return
        kind = _kind(reply)
        self.stats.by_protocol[kind] = self.stats.by_protocol.get(kind, 0) + 1
        self._queue(of.PacketOut((of.Output(in_port),), reply))

    def _queue(self, packet_out: of.PacketOut) -> None:
        self._pending.append(packet_out)
        if self._flush_task is None or self._flush_task.done():
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop (a synchronous caller): keep it for flush()
                return
            self._flush_task = loop.create_task(self.flush(), name="reject packet-outs")

    async def flush(self) -> None:
        """Send the replies built so far, batch after batch until none is left (each batch is
        one ``send``: PACKET_OUTs, then a barrier)."""
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                await self.channel.send(batch)
                self.stats.answered += len(batch)
            except Exception as exc:
                self.stats.send_errors += len(batch)
                log.warning("reject: %d PACKET_OUT(s) failed: %s", len(batch), exc)

    async def close(self) -> None:
        task, self._flush_task = self._flush_task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- the meter ---------------------------------------------------------------------------
    def meter_messages(self, command: int = MeterCommand.ADD) -> Sequence[of.Message]:
        return [meter_add(self.meter_id, int(self.rate), int(self.burst), command)]

    async def install_meter(self) -> bool:
        """Add (or update) the reject meter. Call it before the datapath replays its flows
        (from the channel's on_connected hook): OVS binds a controller action to its meter
        when the flow is added, and runs flows naming a missing meter unmetered."""
        try:
            await self.channel.send(self.meter_messages())
        except Exception as exc:
            if "METER_EXISTS" in str(getattr(exc, "name", exc)):
                try:
                    await self.channel.send(self.meter_messages(MeterCommand.MODIFY))
                except Exception as exc2:
                    return self._meter_failed(exc2)
            else:
                return self._meter_failed(exc)
        self.stats.meter = "installed"
        return True

    async def remove_meter(self) -> bool:
        """Delete the reject meter; True when the switch held it. OpenFlow has no reply that
        says whether a DELETE found its meter, so an ADD asks first (METER_EXISTS: it was
        there; accepted: it was not, and the DELETE removes it again). Remove the flows that
        name it first: deleting a meter deletes them too."""
        try:
            await self.channel.send(self.meter_messages())
            existed = False
        except OpenFlowError as exc:
            if "METER_EXISTS" not in exc.name:
                return False  # a switch refusing meters holds none of ours
            existed = True
        await self.channel.send([of.MeterMod(MeterCommand.DELETE, self.meter_id)])
        self.stats.meter = "removed"
        return existed

    def _meter_failed(self, exc: Exception) -> bool:
        self.stats.meter = f"unsupported: {exc}"
        log.warning(
            "reject: cannot install meter %d (%s); reject packet-ins are limited by the "
            "agent only (%.0f/s)",
            self.meter_id,
            exc,
            self.rate,
        )
        return False


def _kind(frame: bytes) -> str:
    p = _parse(frame)
    if p is None:
        return "?"
    return {IPPROTO_TCP: "tcp-rst", IPPROTO_ICMP: "icmp", IPPROTO_ICMPV6: "icmpv6"}.get(
        p.proto, str(p.proto)
    )
