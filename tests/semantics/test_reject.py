"""The reject packet builders, byte for byte, and their properties; the Rejector's handling."""

from __future__ import annotations

import asyncio
import ipaddress
import struct

from hypothesis import given
from hypothesis import strategies as st

from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath.reject import Rejector, TokenBucket, checksum, reject_reply
from ovsproxy.openflow import protocol as of
from tests.fakes.switch import FakeSwitch

CLIENT_MAC = bytes.fromhex("0a580a000002")
GW_MAC = bytes.fromhex("663afb922951")
CLIENT4, SVC4 = ipaddress.ip_address("10.244.0.2").packed, ipaddress.ip_address("10.96.0.10").packed
CLIENT6 = ipaddress.ip_address("fd00:10:244::2").packed
SVC6 = ipaddress.ip_address("fd00:10:96::10").packed


def ref_checksum(data: bytes) -> int:
    """An independent RFC 1071 checksum: fold a big integer sum of 16-bit words."""
    if len(data) % 2:
        data += b"\0"
    total = sum(int.from_bytes(data[i : i + 2], "big") for i in range(0, len(data), 2))
    total = (total % 0xFFFF) or (0xFFFF if total else 0)
    return 0xFFFF - total


def eth(dst: bytes, src: bytes, ethertype: int) -> bytes:
    return dst + src + ethertype.to_bytes(2, "big")


def ipv4(src: bytes, dst: bytes, proto: int, payload: bytes, *, tos=0, ident=0, flags=0, ttl=64):
    header = struct.pack(
        "!BBHHHBBH4s4s", 0x45, tos, 20 + len(payload), ident, flags, ttl, proto, 0, src, dst
    )
    header = header[:10] + ref_checksum(header).to_bytes(2, "big") + header[12:]
    return header + payload


def ipv6(src: bytes, dst: bytes, next_header: int, payload: bytes, hop_limit: int = 64) -> bytes:
    return struct.pack("!IHBB", 6 << 28, len(payload), next_header, hop_limit) + src + dst + payload


def tcp(sport, dport, seq, ack, flags, payload=b"", *, src=CLIENT4, dst=SVC4, options=b""):
    offset = (20 + len(options)) // 4
    seg = struct.pack("!HHIIBBHHH", sport, dport, seq, ack, offset << 4, flags, 64240, 0, 0)
    seg += options + payload
    pseudo = (
        src + dst + struct.pack("!BBH", 0, 6, len(seg))
        if len(src) == 4
        else src + dst + struct.pack("!I3xB", len(seg), 6)
    )
    return seg[:16] + ref_checksum(pseudo + seg).to_bytes(2, "big") + seg[18:]


def udp(sport, dport, payload=b"ping"):
    return struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload


# -- byte for byte --------------------------------------------------------------------------


def test_checksum_known_answer() -> None:
    header = bytes.fromhex("450000730000400040110000c0a80001c0a800c7")
    assert checksum(header) == 0xB861 == ref_checksum(header)


def test_syn_gets_rst_ack_from_the_service_address_byte_for_byte() -> None:
    options = bytes.fromhex("020405b40402080a0001e2400000000001030307")  # a Linux SYN's
    syn = tcp(40000, 80, 1000, 0, 0x02, options=options)
    frame = eth(GW_MAC, CLIENT_MAC, 0x0800) + ipv4(CLIENT4, SVC4, 6, syn, tos=0x10, flags=0x4000)
    rst = struct.pack("!HHIIBBHHH", 80, 40000, 0, 1001, 5 << 4, 0x14, 0, 0, 0)
    pseudo = SVC4 + CLIENT4 + struct.pack("!BBH", 0, 6, 20)
    rst = rst[:16] + ref_checksum(pseudo + rst).to_bytes(2, "big") + rst[18:]
    expected = eth(CLIENT_MAC, GW_MAC, 0x0800) + ipv4(SVC4, CLIENT4, 6, rst, tos=0x10, flags=0x4000)
    assert reject_reply(frame) == expected


def test_segment_with_ack_gets_a_bare_rst_with_its_ack_as_sequence() -> None:
    seg = tcp(40000, 80, 5000, 0xDEADBEEF, 0x18, b"GET / HTTP/1.0\r\n\r\n")  # PSH|ACK
    frame = eth(GW_MAC, CLIENT_MAC, 0x0800) + ipv4(CLIENT4, SVC4, 6, seg)
    reply = reject_reply(frame)
    assert reply is not None
    sport, dport, seq, ack, offset, flags = struct.unpack_from("!HHIIBB", reply, 34)
    assert (sport, dport, seq, ack, offset, flags) == (80, 40000, 0xDEADBEEF, 0, 0x50, 0x04)


def test_udp_gets_icmp_port_unreachable_quoting_the_datagram_byte_for_byte() -> None:
    original = ipv4(CLIENT4, SVC4, 17, udp(40000, 53), ident=0x1234)
    frame = eth(GW_MAC, CLIENT_MAC, 0x0800) + original
    icmp = struct.pack("!BBHI", 3, 3, 0, 0) + original
    icmp = icmp[:2] + ref_checksum(icmp).to_bytes(2, "big") + icmp[4:]
    expected = eth(CLIENT_MAC, GW_MAC, 0x0800) + ipv4(SVC4, CLIENT4, 1, icmp, tos=0xC0)
    assert reject_reply(frame) == expected


def test_udp6_gets_icmpv6_port_unreachable_byte_for_byte() -> None:
    original = ipv6(CLIENT6, SVC6, 17, udp(40000, 53))
    frame = eth(GW_MAC, CLIENT_MAC, 0x86DD) + original
    icmp = struct.pack("!BBHI", 1, 4, 0, 0) + original
    pseudo = SVC6 + CLIENT6 + struct.pack("!I3xB", len(icmp), 58)
    icmp = icmp[:2] + ref_checksum(pseudo + icmp).to_bytes(2, "big") + icmp[4:]
    expected = eth(CLIENT_MAC, GW_MAC, 0x86DD) + ipv6(SVC6, CLIENT6, 58, icmp)
    assert reject_reply(frame) == expected


def test_tcp6_syn_gets_rst_ack_byte_for_byte() -> None:
    syn = tcp(40000, 443, 7, 0, 0x02, src=CLIENT6, dst=SVC6)
    frame = eth(GW_MAC, CLIENT_MAC, 0x86DD) + ipv6(CLIENT6, SVC6, 6, syn)
    rst = struct.pack("!HHIIBBHHH", 443, 40000, 0, 8, 5 << 4, 0x14, 0, 0, 0)
    pseudo = SVC6 + CLIENT6 + struct.pack("!I3xB", 20, 6)
    rst = rst[:16] + ref_checksum(pseudo + rst).to_bytes(2, "big") + rst[18:]
    assert reject_reply(frame) == eth(CLIENT_MAC, GW_MAC, 0x86DD) + ipv6(SVC6, CLIENT6, 6, rst)


def test_vlan_tag_is_kept_and_ipv6_extension_headers_are_walked() -> None:
    hop_by_hop = bytes([17, 0]) + bytes(6)  # next header UDP, 8 bytes
    original = ipv6(CLIENT6, SVC6, 0, hop_by_hop + udp(40000, 53))
    tag = (0x8100).to_bytes(2, "big") + (0x0064).to_bytes(2, "big")
    frame = GW_MAC + CLIENT_MAC + tag + (0x86DD).to_bytes(2, "big") + original
    reply = reject_reply(frame)
    assert reply is not None
    assert reply[:18] == CLIENT_MAC + GW_MAC + tag + (0x86DD).to_bytes(2, "big")
    assert reply[18 + 6] == 58 and reply[18 + 40] == 1 and reply[18 + 41] == 4


def test_no_answer_where_none_is_due() -> None:
    rst = tcp(40000, 80, 1, 0, 0x04)
    assert reject_reply(eth(GW_MAC, CLIENT_MAC, 0x0800) + ipv4(CLIENT4, SVC4, 6, rst)) is None
    ping = struct.pack("!BBHHH", 8, 0, 0, 1, 1)
    assert reject_reply(eth(GW_MAC, CLIENT_MAC, 0x0800) + ipv4(CLIENT4, SVC4, 1, ping)) is None
    later_fragment = ipv4(CLIENT4, SVC4, 17, udp(1, 2), flags=0x0010)
    assert reject_reply(eth(GW_MAC, CLIENT_MAC, 0x0800) + later_fragment) is None
    bcast = ipv4(CLIENT4, b"\xff" * 4, 17, udp(1, 2))
    assert reject_reply(eth(GW_MAC, CLIENT_MAC, 0x0800) + bcast) is None
    mcast_src = ipv4(bytes([224, 0, 0, 1]), SVC4, 17, udp(1, 2))
    assert reject_reply(eth(GW_MAC, CLIENT_MAC, 0x0800) + mcast_src) is None
    group_mac = eth(GW_MAC, b"\x01" + CLIENT_MAC[1:], 0x0800) + ipv4(CLIENT4, SVC4, 17, udp(1, 2))
    assert reject_reply(group_mac) is None
    assert reject_reply(eth(GW_MAC, CLIENT_MAC, 0x0806) + bytes(28)) is None  # ARP
    assert reject_reply(b"\x00" * 10) is None


# -- properties -----------------------------------------------------------------------------


@given(
    flags=st.integers(0, 0x3F).filter(lambda f: not f & 0x04),
    seq=st.integers(0, 2**32 - 1),
    ack=st.integers(0, 2**32 - 1),
    payload=st.binary(max_size=64),
    v6=st.booleans(),
)
def test_every_rst_answers_rfc_793(flags, seq, ack, payload, v6) -> None:
    src, dst = (CLIENT6, SVC6) if v6 else (CLIENT4, SVC4)
    seg = tcp(40000, 80, seq, ack, flags, payload, src=src, dst=dst)
    ip = ipv6(src, dst, 6, seg) if v6 else ipv4(src, dst, 6, seg)
    reply = reject_reply(eth(GW_MAC, CLIENT_MAC, 0x86DD if v6 else 0x0800) + ip)
    assert reply is not None
    l3 = reply[14:]
    if v6:
        r_src, r_dst, l4 = l3[8:24], l3[24:40], l3[40:]
        pseudo = r_src + r_dst + struct.pack("!I3xB", len(l4), 6)
    else:
        assert ref_checksum(l3[:20]) == 0
        r_src, r_dst, l4 = l3[12:16], l3[16:20], l3[20:]
        pseudo = r_src + r_dst + struct.pack("!BBH", 0, 6, len(l4))
    assert (r_src, r_dst) == (dst, src)
    assert ref_checksum(pseudo + l4) == 0
    sport, dport, r_seq, r_ack, _, r_flags = struct.unpack_from("!HHIIBB", l4)
    assert (sport, dport) == (80, 40000)
    if flags & 0x10:
        assert (r_seq, r_ack, r_flags) == (ack, 0, 0x04)
    else:
        seg_len = len(payload) + bool(flags & 0x02) + bool(flags & 0x01)
        assert (r_seq, r_ack, r_flags) == (0, (seq + seg_len) % 2**32, 0x14)


@given(payload=st.binary(max_size=2000), v6=st.booleans(), proto=st.sampled_from([17, 132]))
def test_every_icmp_error_quotes_the_packet_within_the_minimum_mtu(payload, v6, proto) -> None:
    src, dst = (CLIENT6, SVC6) if v6 else (CLIENT4, SVC4)
    datagram = udp(40000, 53, payload)
    ip = ipv6(src, dst, proto, datagram) if v6 else ipv4(src, dst, proto, datagram)
    reply = reject_reply(eth(GW_MAC, CLIENT_MAC, 0x86DD if v6 else 0x0800) + ip)
    assert reply is not None
    l3 = reply[14:]
    if v6:
        icmp = l3[40:]
        assert len(l3) <= 1280 and icmp[:2] == bytes([1, 4])
        pseudo = l3[8:24] + l3[24:40] + struct.pack("!I3xB", len(icmp), 58)
        assert ref_checksum(pseudo + icmp) == 0
    else:
        icmp = l3[20:]
        assert len(l3) <= 576 and icmp[:2] == bytes([3, 3]) and ref_checksum(icmp) == 0
    limit = 1280 - 48 if v6 else 576 - 28
    assert icmp[8:] == ip[:limit]  # the packet, as much of it as fits


# -- the agent side -------------------------------------------------------------------------


def packet_in(data: bytes, in_port: int = 7, userdata: bytes = pl.REJECT_USERDATA) -> of.PacketIn:
    return of.PacketIn(
        of.PacketInReason.ACTION, 13, 0, of.Match(in_port=in_port), data, userdata=userdata
    )


def test_token_bucket() -> None:
    now = [0.0]
    bucket = TokenBucket(rate=10, burst=3, clock=lambda: now[0])
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]
    now[0] += 0.1
    assert bucket.take() and not bucket.take()
    now[0] += 10
    assert sum(bucket.take() for _ in range(10)) == 3


async def test_rejector_answers_out_of_the_in_port_and_limits_itself() -> None:
    now = [0.0]
    channel = FakeSwitch()  # the Rejector only sends (Channel.send)
    rejector = Rejector(channel, rate=5, burst=2, clock=lambda: now[0])
    (action,) = rejector.reject_action
    assert "meter_id=24177" in action.to_text() and "max_len=256" in action.to_text()
    syn = eth(GW_MAC, CLIENT_MAC, 0x0800) + ipv4(CLIENT4, SVC4, 6, tcp(40000, 80, 1, 0, 2))
    rejector.handle(packet_in(syn, in_port=7))
    rejector.handle(packet_in(syn, in_port=9))
    rejector.handle(packet_in(syn))  # over the burst
    rejector.handle(packet_in(syn, userdata=b"other"))  # not ours
    await asyncio.sleep(0)
    await rejector.flush()
    outs = [m for batch in channel.take("send") for m in batch]  # type: ignore[attr-defined]
    assert [m.actions for m in outs] == [(of.Output(7),), (of.Output(9),)]
    assert all(m.in_port == of.OFPP_CONTROLLER and m.data == reject_reply(syn) for m in outs)
    s = rejector.stats
    assert (s.packet_ins, s.answered, s.rate_limited, s.foreign) == (3, 2, 1, 1)
    assert s.by_protocol == {"tcp-rst": 2}


async def test_a_packet_in_of_a_frontend_that_forwards_by_now_is_not_refused() -> None:
    """A datapath flow cached before the commit that gave the frontend endpoints can still
    send a connection's first packet to the agent: it gets no answer (the retransmission
    meets the new flows), not a refusal. A frontend that still rejects is answered."""
    channel = FakeSwitch()
    rejector = Rejector(channel)
    forwarding = {(6, ipaddress.ip_address(SVC4), 80), (17, ipaddress.ip_address(SVC4), 53)}
    rejector.forwards = lambda proto, ip, port: (proto, ip, port) in forwarding
    syn = eth(GW_MAC, CLIENT_MAC, 0x0800) + ipv4(CLIENT4, SVC4, 6, tcp(40000, 80, 1, 0, 2))
    other = eth(GW_MAC, CLIENT_MAC, 0x0800) + ipv4(CLIENT4, SVC4, 6, tcp(40000, 81, 1, 0, 2))
    datagram = eth(GW_MAC, CLIENT_MAC, 0x0800) + ipv4(CLIENT4, SVC4, 17, udp(40000, 53))
    for frame in (syn, other, datagram):
        rejector.handle(packet_in(frame, in_port=7))
    await asyncio.sleep(0)
    await rejector.flush()
    outs = [m for batch in channel.take("send") for m in batch]  # type: ignore[attr-defined]
    assert [(m.actions, m.data) for m in outs] == [((of.Output(7),), reject_reply(other))]
    assert rejector.stats.forwarding_now == 2 and rejector.stats.by_protocol == {"tcp-rst": 1}
