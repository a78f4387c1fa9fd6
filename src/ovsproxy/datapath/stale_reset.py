"""Invalid TCP RSTs after an ovs-vswitchd restart: flush the conntrack entry they belong to.

What happens (found by restarting vswitchd under load; tests/e2e/test_restart_time_wait.py):

1. A restart empties Open vSwitch's conntrack; endpoints keep their TIME_WAIT sockets.
2. Before the restart, a new connection whose 4-tuple after DNAT was still held by an old
   entry got another source port from conntrack's NAT (it keeps reply tuples unique). After
   it, nothing remembers the old connection: the SYN reaches the endpoint with the 4-tuple of
   one of its TIME_WAIT sockets. When the SYN's sequence number (and timestamp) is not newer
   than the old connection's, Linux answers with an ACK of the old connection instead of a
   SYN-ACK.
3. Conntrack takes that ACK as the first packet from the endpoint's side and records the old
   connection's sequence numbers for it. The client answers the stray ACK with an RST whose
   sequence number is the ACK's: Open vSwitch's userspace conntrack wants an exact sequence
   match on RSTs and marks it invalid, and the pipeline dropped invalid packets. The endpoint
   kept its TIME_WAIT and answered every SYN retransmission the same way, until the client
   gave up (``conntrack_tcp_seq_chk_failed`` counts those RSTs). Even with the RST delivered,
   the entry stays wrong: the endpoint's real SYN-ACK fails the check against the old
   sequence numbers.

What a proxy does (Linux's conntrack, and so kube-proxy, accepts an RST that answers such an
ACK; two Linux hosts without conntrack recover the same way): ConntrackState lets an invalid
RST without ACK (how a TCP answers a segment of no connection of its own) go on, NATed like
its connection by the ct(nat) before (so the endpoint's TIME_WAIT ends),
and sends a copy to the agent (metered with the reject meter), which deletes the connection's
entry with NXT_CT_FLUSH (the zone from the packet-in, the reply tuple from the NATed RST: Open
vSwitch gives no conntrack tuple for an invalid packet). The client's next SYN retransmission
starts a fresh entry and connects.

Without the agent (it restarts, or its flush comes after the client's quick SYN retry): the
same collision happens without a vswitchd restart whenever Open vSwitch has forgotten a closed
connection (30 s) that the endpoint still holds in TIME_WAIT (60 s). The switch then undoes the
entry itself (``pipeline.PRIORITY_INVALID_SYN_ACK``): the endpoint's SYN-ACK, invalid in the
spoiled entry, is committed with ``force`` in the reply direction, which deletes the entry (a
SYN-ACK can create none), and dropped, so the client's next retransmission (1 s) starts afresh;
an invalid SYN (a stale entry of the same tuple, e.g. on the endpoint's node) goes on NATed
like that entry (``PRIORITY_INVALID_SYN``). The flush here only saves that second.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import struct
from dataclasses import asdict, dataclass
from typing import Any

from ovsproxy.datapath import pipeline as pl
from ovsproxy.openflow import protocol as of
from ovsproxy.openflow.protocol.ct_flush import CtFlush

log = logging.getLogger(__name__)

IPPROTO_TCP = 6
ETH_IPV4, ETH_IPV6 = 0x0800, 0x86DD


@dataclass
class StaleResetStats:
    packet_ins: int = 0  # invalid RSTs reported by the switch
    flushes: int = 0  # entries flushed
    unreadable: int = 0  # packet-ins that are no TCP packet (or lack the zone)
    errors: int = 0  # flushes the switch refused

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def flush_for(packet_in: of.PacketIn) -> CtFlush | None:
    """The NXT_CT_FLUSH of the connection an invalid RST belongs to: its zone from the
    packet-in, its reply tuple from the RST itself, which ct(nat) has already rewritten
    (endpoint -> client). None for a frame that is not an IPv4/IPv6 TCP packet."""
    zone = packet_in.match.get("ct_zone")
    addresses = _tcp_addresses(packet_in.data)
    if zone is None or addresses is None:
        return None
    src, dst, sport, dport = addresses
    return CtFlush(zone=int(zone), ip_proto=IPPROTO_TCP, reply=(dst, src, dport, sport))


IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def _tcp_addresses(frame: bytes) -> tuple[IPAddress, IPAddress, int, int] | None:
    """(src, dst, src port, dst port) of an Ethernet + IPv4/IPv6 + TCP frame (no VLAN tags,
    no IPv6 extension headers: what the pipeline sees from pods and the gateway)."""
    if len(frame) < 14:
        return None
    ethertype = struct.unpack_from("!H", frame, 12)[0]
    if ethertype == ETH_IPV4 and len(frame) >= 34 and frame[23] == IPPROTO_TCP:
        ihl = (frame[14] & 0x0F) * 4
        l4 = 14 + ihl
        src: IPAddress = ipaddress.IPv4Address(frame[26:30])
        dst: IPAddress = ipaddress.IPv4Address(frame[30:34])
    elif ethertype == ETH_IPV6 and len(frame) >= 54 and frame[20] == IPPROTO_TCP:
        l4 = 54
        src, dst = ipaddress.IPv6Address(frame[22:38]), ipaddress.IPv6Address(frame[38:54])
    else:
        return None
    if len(frame) < l4 + 4:
        return None
    sport, dport = struct.unpack_from("!HH", frame, l4)
    return src, dst, int(sport), int(dport)


class StaleResetFlusher:
    """``handle`` is the channel's packet-in callback for ``pl.INVALID_RST_USERDATA``."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self.stats = StaleResetStats()
        self._tasks: set[asyncio.Task[None]] = set()

    def handle(self, packet_in: of.PacketIn) -> None:
        self.stats.packet_ins += 1
        flush = flush_for(packet_in)
        if flush is None:
            self.stats.unreadable += 1
            log.warning("invalid RST packet-in not understood: %s", packet_in.match.to_text())
            return
        log.debug("invalid RST: flushing %s", of.to_text(flush))
        task = asyncio.get_running_loop().create_task(self._send(flush))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, flush: CtFlush) -> None:
        try:
            await self.channel.send([flush])
            self.stats.flushes += 1
        except Exception as exc:  # logged and counted: the next RST tries again
            self.stats.errors += 1
            log.warning("flushing the conntrack entry of an invalid RST failed: %s", exc)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def is_invalid_rst(packet_in: of.PacketIn) -> bool:
    return packet_in.userdata == pl.INVALID_RST_USERDATA
