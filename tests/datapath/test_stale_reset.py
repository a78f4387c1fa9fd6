"""datapath.stale_reset: the flush an invalid RST's packet-in asks for, and the tcp_flags match
its flow uses (checked against ovs-ofctl)."""

from __future__ import annotations

import ipaddress
import struct

import pytest

from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath.stale_reset import flush_for, is_invalid_rst
from ovsproxy.openflow import protocol as of
from tests.openflow.ofctl import encode_flow, ofp_print


def _frame(src: str, dst: str, sport: int, dport: int) -> bytes:
    s, d = ipaddress.ip_address(src), ipaddress.ip_address(dst)
    tcp = struct.pack("!HHIIBBHHH", sport, dport, 1, 0, 5 << 4, 0x04, 0, 0, 0)
    if s.version == 4:
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 40, 0, 0, 64, 6, 0, s.packed, d.packed)
        eth = b"\x02" * 6 + b"\x04" * 6 + b"\x08\x00"
    else:
        ip = struct.pack("!IHBB16s16s", 6 << 28, 20, 6, 64, s.packed, d.packed)
        eth = b"\x02" * 6 + b"\x04" * 6 + b"\x86\xdd"
    return eth + ip + tcp


@pytest.mark.parametrize(
    ("client", "endpoint", "zone"),
    [("10.244.0.100", "10.244.0.11", pl.CT_ZONE_V4), ("fd00::100", "fd00::11", pl.CT_ZONE_V6)],
)
def test_flush_names_the_reply_tuple_of_the_natted_rst(
    client: str, endpoint: str, zone: int
) -> None:
    packet_in = of.PacketIn(
        1,
        11,
        0,
        of.Match(ct_zone=zone),
        _frame(client, endpoint, 41000, 8080),  # after ct(nat): client -> endpoint
        userdata=pl.INVALID_RST_USERDATA,
    )
    assert is_invalid_rst(packet_in)
    flush = flush_for(packet_in)
    assert flush is not None and flush.zone == zone and flush.ip_proto == 6
    ep, cl = ipaddress.ip_address(endpoint), ipaddress.ip_address(client)
    assert flush.reply == (ep, cl, 8080, 41000)
    assert flush.orig == (None, None, 0, 0)


def test_flush_refuses_what_is_not_tcp_or_lacks_the_zone() -> None:
    frame = _frame("10.244.0.100", "10.244.0.11", 1, 2)
    assert flush_for(of.PacketIn(1, 11, 0, of.Match(), frame)) is None
    udp = frame[:23] + b"\x11" + frame[24:]
    assert flush_for(of.PacketIn(1, 11, 0, of.Match(ct_zone=1), udp)) is None
    assert not is_invalid_rst(of.PacketIn(1, 11, 0, userdata=pl.REJECT_USERDATA))


def test_tcp_flags_match_encodes_as_ovs_ofctl_reads_it_and_round_trips() -> None:
    match = of.Match(
        eth_type=0x86DD,
        ip_proto=6,
        ct_state=pl.CT_STATE_INVALID,
        tcp_flags=(0x004, 0x004),
    )
    flow = of.FlowMod(11, pl.PRIORITY_INVALID_RST, match, ())
    assert of.format_flow(flow) == (
        "table=11, priority=215,ct_state=+inv+trk,tcp6,tcp_flags=+rst actions=drop"
    )
    raw = of.encode(flow, 7)
    assert "priority=215,ct_state=+inv+trk,tcp6,tcp_flags=+rst actions=drop" in ofp_print(raw)
    assert of.decode(raw) == flow
    # ...byte for byte what ovs-ofctl encodes (the field's place in the canonical order)
    theirs = encode_flow("table=11,priority=215,ct_state=+inv+trk,tcp6,tcp_flags=+rst,actions=drop")
    assert of.decode(theirs) == flow
    syn_not_ack = of.Match(eth_type=0x0800, ip_proto=6, tcp_flags=(0x002, 0x012))
    assert "tcp_flags=+syn-ack" in syn_not_ack.to_text(1)
