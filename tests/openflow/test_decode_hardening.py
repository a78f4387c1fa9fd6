"""Decoder findings from fuzzing (issue 17), kept fixed.

1. ``ct()`` actions nested hundreds of levels deep (an 8 KB FLOW_MOD is enough; the same in
   group buckets, PACKET_OUT and BUNDLE_ADD) raised RecursionError out of ``decode``, the
   stream path and ``to_text``. Action lists are now bounded at Open vSwitch's own depth
   (``MAX_ACTION_DEPTH``), and going over is the codec's error.
2. Decoding an unknown OXM field registered it in the process-wide field table, so one big
   message full of unknown fields changed how every later message decoded. Decoding now
   leaves every global table as it was.
"""

from __future__ import annotations

import ipaddress
import random
import struct
import sys
import types
from collections.abc import Callable

import pytest

from ovsproxy.datapath.desired import flow_key
from ovsproxy.openflow import protocol as of
from ovsproxy.openflow.protocol import constants as c

DEEP = 400  # deeper than the old decoder could recurse (3 frames a level) -- 9.6 KB of ct()
LIMIT = c.MAX_ACTION_DEPTH


def nested_ct_wire(levels: int) -> bytes:
    """``levels`` ct(commit) actions, each the only exec action of the one outside it."""
    wire = b""
    for _ in range(levels):
        wire = (
            struct.pack(
                "!HHIHHIHB3xH", 0xFFFF, 24 + len(wire), c.NX_VENDOR_ID, c.NXAST_CT, 1, 0, 0, 0xFF, 0
            )
            + wire
        )
    return wire


def nested_ct(levels: int) -> of.CT:
    action = of.CT(commit=True, table=1)
    for _ in range(levels - 1):
        action = of.CT(commit=True, actions=[action])
    return action


def containers(actions_wire: bytes) -> dict[str, bytes]:
    """The same actions inside each message kind that carries actions, fixed up so every
    length field is right (built with a placeholder action of the right size)."""
    placeholder = of.RawAction(actions_wire)
    flow = of.FlowMod(0, 1, of.Match(reg0=1), actions=[placeholder])
    group = of.GroupMod(of.GroupModCommand.ADD, 5, buckets=[of.Bucket(0, [placeholder])])
    packet_out = of.PacketOut([placeholder], b"\x00" * 60)
    return {
        "flow_mod": of.encode(flow, 1),
        "group_mod": of.encode(group, 2),
        "packet_out": of.encode(packet_out, 3),
        "bundle_add": of.encode_bundle_add(9, flow, 4),
        "flow_desc_reply": of.encode(of.FlowDescReply([of.FlowDesc(flow)]), 5),
        "group_desc_reply": of.encode(of.GroupDescReply([group]), 6),
    }


def decode_all(data: bytes) -> of.Message:
    """``of.decode``, and the flows of a FLOW_DESC reply (decoded when read)."""
    msg = of.decode(data)
    if isinstance(msg, of.FlowDescReply):
        assert msg.flows
    return msg


@pytest.mark.parametrize("kind", sorted(containers(nested_ct_wire(2))))
def test_deeply_nested_ct_is_a_decode_error_in_every_message(kind: str) -> None:
    data = containers(nested_ct_wire(DEEP))[kind]
    assert len(data) < 10_000
    with pytest.raises(of.OpenFlowDecodeError, match="nested more than 100"):
        decode_all(data)


def test_a_flow_desc_reply_is_framed_at_decode_and_its_flows_decoded_when_read() -> None:
    good = of.FlowMod(3, 7, actions=[of.Output(1)], cookie=0xAB)
    data = bytearray(of.encode(of.FlowDescReply([of.FlowDesc(good), of.FlowDesc(good)]), 5))
    reply = of.decode(bytes(data))
    assert reply.cookies == [0xAB, 0xAB] and [d.flow for d in reply.flows] == [good, good]
    truncated = bytes(data[:-4])
    truncated = truncated[:2] + len(truncated).to_bytes(2, "big") + truncated[4:]
    with pytest.raises(of.OpenFlowDecodeError, match="flow desc"):
        of.decode(truncated)  # an entry runs past the message: at decode


def test_deeply_nested_ct_is_a_decode_error_on_the_stream_path() -> None:
    deep = containers(nested_ct_wire(DEEP))["flow_mod"]
    stream = of.encode(of.EchoRequest(b"x"), 1) + deep + of.encode(of.BarrierReply(), 2)
    parser = of.Parser()
    rng = random.Random(17)
    decoded: list[str] = []
    pos = 0
    while pos < len(stream):
        step = rng.randint(1, 700)
        parser.feed(stream[pos : pos + step])
        pos += step
        for raw in parser:
            try:
                decoded.append(type(of.decode(raw)).__name__)
            except of.OpenFlowDecodeError as exc:
                decoded.append(f"error: {exc}")
    assert decoded[0] == "EchoRequest" and decoded[2] == "BarrierReply"
    assert "nested more than 100" in decoded[1]


def test_the_deepest_nesting_ovs_allows_decodes_and_prints() -> None:
    # The top-level list plus 99 ct() exec lists: LIMIT lists in all.
    deepest = nested_ct(LIMIT)
    flow = of.FlowMod(0, 1, actions=[deepest])
    decoded = of.decode(of.encode(flow, 1))
    assert decoded == flow
    assert of.to_text(decoded, 1).count("ct(commit") == LIMIT
    for data in containers(nested_ct_wire(LIMIT)).values():
        of.to_text(of.decode(data), 1)
    for data in containers(nested_ct_wire(LIMIT + 1)).values():
        with pytest.raises(of.OpenFlowDecodeError, match="nested more than 100"):
            decode_all(data)


def test_building_ct_deeper_than_the_bound_is_an_encode_error() -> None:
    # Before the bound, such a value was built and its to_text raised RecursionError.
    inner = nested_ct(LIMIT)
    with pytest.raises(of.OpenFlowEncodeError, match="nested more than 100"):
        of.CT(commit=True, actions=[inner])
    with pytest.raises(of.OpenFlowEncodeError, match="nested more than 100"):
        nested_ct(DEEP)


# -- unknown fields ---------------------------------------------------------------------------


def _global_tables() -> dict[str, int]:
    """The size of every module-level container of the codec."""
    sizes = {}
    for name, module in sorted(sys.modules.items()):
        if not name.startswith("ovsproxy.openflow.protocol") or not isinstance(
            module, types.ModuleType
        ):
            continue
        for attr, value in vars(module).items():
            if isinstance(value, (dict, list, set)):
                sizes[f"{name}.{attr}"] = len(value)
    return sizes


def _oxm(oxm_class: int, field: int, value: bytes) -> bytes:
    return struct.pack("!I", (oxm_class << 16) | (field << 9) | len(value)) + value


def _match(entries: bytes) -> bytes:
    length = 4 + len(entries)
    return struct.pack("!HH", 1, length) + entries + bytes(-length % 8)


def _unknown_fields(first_class: int, count: int) -> bytes:
    # Classes no known field uses, 128 field numbers each; 1-byte values.
    return b"".join(_oxm(first_class + i // 128, i % 128, bytes([i & 0xFF])) for i in range(count))


def _flow_mod_with_match(match: bytes, xid: int) -> bytes:
    body = struct.pack("!QQBBHHHIIIHH", 0, 0, 0, 0, 0, 0, 1, c.OFP_NO_BUFFER, 0, 0, 0, 0) + match
    return struct.pack("!BBHI", 6, c.MsgType.FLOW_MOD, 8 + len(body), xid) + body


def _set_field_flow(oxm_class: int, field: int, xid: int) -> bytes:
    set_field = struct.pack("!HH", c.OFPAT_SET_FIELD, 16) + _oxm(oxm_class, field, b"\x2a\x2b")
    set_field += bytes(16 - len(set_field))
    apply = struct.pack("!HH4x", c.OFPIT_APPLY_ACTIONS, 8 + len(set_field)) + set_field
    body = (
        struct.pack("!QQBBHHHIIIHH", 0, 0, 0, 0, 0, 0, 1, c.OFP_NO_BUFFER, 0, 0, 0, 0)
        + _match(b"")
        + apply
    )
    return struct.pack("!BBHI", 6, c.MsgType.FLOW_MOD, 8 + len(body), xid) + body


def _packet_out_with_match(match: bytes, xid: int) -> bytes:
    body = struct.pack("!IH2x", c.OFP_NO_BUFFER, 0) + match + b"\x00" * 14
    return struct.pack("!BBHI", 6, c.MsgType.PACKET_OUT, 8 + len(body), xid) + body


def _seen(decode: Callable[[], of.Message]) -> tuple[str, str, bytes]:
    msg = decode()
    return repr(msg), of.to_text(msg, 1), of.encode(msg, 1)


def test_unknown_fields_leave_global_tables_and_later_decodes_unchanged() -> None:
    later = {
        "match": _flow_mod_with_match(_match(_oxm(0x5000, 3, b"\x07\x08")), 1),
        "set_field": _set_field_flow(0x5001, 9, 2),
        "packet_out": _packet_out_with_match(
            _match(_oxm(0x8000, 0, b"\x00\x00\x00\x05") + _oxm(0x5002, 1, b"\x01")), 3
        ),
    }
    before = {name: _seen(lambda data=data: of.decode(data)) for name, data in later.items()}
    tables = _global_tables()
    assert tables["ovsproxy.openflow.protocol.fields.FIELDS"] > 50  # the probe sees them

    # One big message full of distinct unknown fields (more than the old table's 4096 cap),
    # and messages that print, re-encode and rebuild them.
    flood = _flow_mod_with_match(_match(_unknown_fields(0x4000, 6000)), 9)
    assert len(flood) < 0xFFFF
    decoded = of.decode(flood)
    assert len(decoded.match.entries) == 6000
    assert of.decode(of.encode(decoded, 9)) == decoded
    of.to_text(decoded, 9)
    for i in range(50):
        of.to_text(of.decode(_set_field_flow(0x6000 + i, i, 10)), 10)
        out = of.decode(_packet_out_with_match(_match(_unknown_fields(0x7000 + i, 20)), 11))
        assert out.match.get("oxm_%04x_1_1" % (0x7000 + i)) == 1
        of.to_text(out, 11)

    assert _global_tables() == tables
    # Fields never seen before still decode (the old table refused new ones once full)...
    fresh = of.decode(_flow_mod_with_match(_match(_oxm(0x5100, 4, b"\x01")), 12))
    assert "oxm_5100_4_1=0x1 " in of.to_text(fresh, 12)
    # ...and every message decodes exactly as it did before the flood.
    assert {name: _seen(lambda data=data: of.decode(data)) for name, data in later.items()} == (
        before
    )
    assert _global_tables() == tables


def test_values_with_unknown_fields_rebuild_from_their_names() -> None:
    decoded = of.decode(_set_field_flow(0x5001, 9, 2))
    action = decoded.actions[0]
    assert isinstance(action, of.SetField)
    assert action.field.name == "oxm_5001_9_2" and action.value == 0x2A2B
    assert action.replace(value=1) == of.SetField("oxm_5001_9_2", 1)
    assert of.to_text(decoded).endswith("actions=set_field:0x2a2b->oxm_5001_9_2")
    match = of.decode(_flow_mod_with_match(_match(_oxm(0x5000, 3, b"\x07\x08")), 1)).match
    assert match == of.Match(oxm_5000_3_2=0x0708)
    assert match.replace(reg0=1) == of.Match(reg0=1, oxm_5000_3_2=0x0708)
    # A name of that form for a field we do model is that field.
    assert of.get_field("oxm_8000_0_4") is of.get_field("in_port")
    with pytest.raises(of.OpenFlowEncodeError, match="unknown field"):
        of.get_field("oxm_ffff_1_4")  # experimenter class: not a plain OXM header


def test_a_flow_desc_reply_gives_each_flows_key_as_the_datapath_keys_it() -> None:
    # matches of two lengths (padding differs), two tables and priorities
    flows = [
        of.FlowMod(
            13,
            100,
            of.Match(
                eth_type=0x800, ip_proto=17, ipv4_dst=ipaddress.ip_address("10.96.0.1"), udp_dst=53
            ),
            actions=[of.GroupAction(4)],
            cookie=0xAB,
        ),
        of.FlowMod(0, 7, of.Match(in_port=3), actions=[of.Output(1)], cookie=0xCD),
    ]
    reply = of.decode(of.encode(of.FlowDescReply([of.FlowDesc(f) for f in flows]), 5))
    assert reply.keyed_cookies == [(f.cookie, flow_key(f)) for f in flows]


def test_a_flow_desc_match_longer_than_its_entry_is_a_decode_error_for_its_key() -> None:
    flows = [of.FlowMod(0, 7, of.Match(in_port=3), cookie=1), of.FlowMod(0, 8, cookie=2)]
    data = bytearray(of.encode(of.FlowDescReply([of.FlowDesc(f) for f in flows]), 5))
    first = 16  # OpenFlow header and multipart header
    entry_length = int.from_bytes(data[first : first + 2], "big")
    data[first + 24 + 2 : first + 24 + 4] = entry_length.to_bytes(2, "big")  # the match's length
    reply = of.decode(bytes(data))  # the entries' framing is still whole
    with pytest.raises(of.OpenFlowDecodeError, match="match runs past its entry"):
        reply.keyed_cookies  # noqa: B018
