"""Unit tests of the codec: canonical values, limits, framing, decoding, text."""

from __future__ import annotations

import copy
import ipaddress
import pickle
import struct

import pytest

from ovsproxy.datapath.groups import group_mod_chunks
from ovsproxy.openflow import protocol as of

IP = ipaddress.ip_address


def svc_bucket(bucket_id: int, ip: str = "10.0.0.2", port: int = 80) -> of.Bucket:
    return of.Bucket(
        bucket_id,
        [of.SetField("reg3", IP(ip)), of.SetField("reg4", port, 0xFFFF), of.Resubmit(42)],
        weight=100,
    )


# -- values -----------------------------------------------------------------------------------


def test_match_is_canonical_whatever_the_spelling() -> None:
    a = of.Match(eth_type=0x800, ip_proto=6, ipv4_dst=IP("10.96.0.1"), tcp_dst=80)
    b = of.Match(tcp_dst=80, ipv4_dst="10.96.0.1", ip_proto=6, eth_type=0x0800)
    c = of.Match(eth_type=0x800, ip_proto=6, ipv4_dst=(0x0A600001, 0xFFFFFFFF), tcp_dst=80)
    d = of.Match(
        eth_type=0x800, ip_proto=6, ipv4_dst=ipaddress.ip_network("10.96.0.1/32"), tcp_dst=80
    )
    assert a == b == c == d
    assert len({a, b, c, d}) == 1
    assert a.ipv4_dst == IP("10.96.0.1")
    assert a.tcp_dst == 80
    assert a.get("tcp_src") is None


def test_match_masks_values_and_drops_wildcards() -> None:
    m = of.Match(eth_type=0x800, ipv4_src=("10.1.2.3", "255.255.0.0"), reg5=(7, 0))
    assert m.ipv4_src == (IP("10.1.0.0"), IP("255.255.0.0"))
    assert "reg5" not in m
    assert m == of.Match(eth_type=0x800, ipv4_src=ipaddress.ip_network("10.1.0.0/16"))


def test_wide_registers_are_the_32_bit_registers_they_overlay() -> None:
    ip = IP("fd00::5")
    words = int(ip).to_bytes(16, "big")
    regs = {f"reg{12 + i}": int.from_bytes(words[4 * i : 4 * i + 4], "big") for i in range(4)}
    assert of.Match(xxreg3=ip) == of.Match(**regs)
    assert of.Match(xxreg3=ip).xxreg3 == int(ip)
    assert of.Match(xreg1=0x1_0000_0002) == of.Match(reg2=1, reg3=2)
    # A partial mask keeps only the words it covers.
    assert of.Match(xxreg0=(5, 0xFFFF)) == of.Match(reg3=(5, 0xFFFF))
    with pytest.raises(of.OpenFlowEncodeError, match="twice"):
        of.Match(xxreg3=ip, reg12=1)


def test_match_rejects_bad_input_with_clear_errors() -> None:
    with pytest.raises(of.OpenFlowEncodeError, match="unknown match field"):
        of.Match(nope=1)
    with pytest.raises(of.OpenFlowEncodeError, match="does not fit"):
        of.Match(reg0=1 << 32)
    with pytest.raises(of.OpenFlowEncodeError, match="cannot be masked"):
        of.Match(eth_type=(0x800, 0xFF00))
    with pytest.raises(of.OpenFlowEncodeError, match="tcp_dst needs"):
        of.Match(eth_type=0x800, tcp_dst=80)
    with pytest.raises(of.OpenFlowEncodeError, match="ipv4_dst needs eth_type=0x0800"):
        of.Match(ipv4_dst="10.0.0.1")
    with pytest.raises(of.OpenFlowEncodeError, match="ipv6_dst needs"):
        of.Match(eth_type=0x800, ipv6_dst="fd00::1")
    with pytest.raises(of.OpenFlowEncodeError):
        of.Match(eth_src="not a mac")


def test_values_are_frozen_hashable_and_typed() -> None:
    flow = of.FlowMod(1, 2, of.Match(reg0=1), actions=[of.Output(1)])
    with pytest.raises(AttributeError):
        flow.priority = 5  # type: ignore[misc]
    assert of.GroupAction(5) != of.GotoTable(5)  # same content, different kinds
    assert hash(flow) == hash(of.FlowMod(1, 2, of.Match(reg0=1), actions=[of.Output(1)]))
    assert pickle.loads(pickle.dumps(flow)) == flow
    assert copy.deepcopy(flow) is flow
    changed = flow.replace(priority=9)
    assert changed.priority == 9 and changed.wire != flow.wire
    assert of.SetField("reg4", 80, 0xFFFF).replace(value=81) == of.SetField("reg4", 81, 0xFFFF)


def test_set_field_normalizes_masks() -> None:
    assert of.SetField("reg3", 1, 0xFFFFFFFF) == of.SetField("reg3", 1)
    assert of.SetField("reg4", 0x12345, 0xFFFF).value == 0x2345
    with pytest.raises(of.OpenFlowEncodeError, match="cannot be masked"):
        of.SetField("eth_type", 0x800, 0xFF)
    with pytest.raises(of.OpenFlowEncodeError, match="unknown field"):
        of.SetField("reg99", 1)
    assert of.SetField("ip_dst", "10.0.0.1") == of.SetField("ipv4_dst", IP("10.0.0.1"))


def test_flow_mod_instructions_are_canonical() -> None:
    out = of.Output(1)
    a = of.FlowMod(1, 1, actions=[out], instructions=[of.GotoTable(5)])
    b = of.FlowMod(1, 1, instructions=[of.GotoTable(5), of.ApplyActions([out])])
    c = of.FlowMod(1, 1, instructions=[out, of.GotoTable(5)])
    assert a == b == c
    assert [type(i) for i in a.instructions] == [of.ApplyActions, of.GotoTable]
    assert a.actions == (out,)
    assert of.FlowMod(1, 1, instructions=[of.ApplyActions([])]) == of.FlowMod(1, 1)
    with pytest.raises(of.OpenFlowEncodeError, match="twice"):
        of.FlowMod(1, 1, instructions=[of.GotoTable(2), of.GotoTable(3)])
    with pytest.raises(of.OpenFlowEncodeError, match="Match"):
        of.FlowMod(1, 1, match={"reg0": 1})  # type: ignore[arg-type]


def test_flow_delete_uses_any_port_and_group() -> None:
    flow = of.FlowMod(10, 200, of.Match(reg0=1), actions=[of.Output(1)], cookie=0x77)
    delete = flow.as_delete()
    assert delete.command == of.FlowModCommand.DELETE_STRICT
    assert delete.out_port == of.OFPP_ANY and delete.out_group == of.OFPG_ANY
    assert delete.cookie_mask == 0xFFFFFFFFFFFFFFFF
    assert delete.instructions == ()
    # out_port/out_group sit at fixed offsets of the flow mod body.
    body = delete.wire
    assert struct.unpack_from("!II", body, 28) == (of.OFPP_ANY, of.OFPG_ANY)
    assert delete == of.FlowMod(
        10,
        200,
        of.Match(reg0=1),
        cookie=0x77,
        cookie_mask=0xFFFFFFFFFFFFFFFF,
        command=of.FlowModCommand.DELETE_STRICT,
    )
    # Without the cookie: any flow with this table, priority and match.
    loose = flow.as_delete(same_cookie=False)
    assert (loose.cookie, loose.cookie_mask, loose.priority) == (0, 0, 200)
    # The one constructor for deletes: every table by default, non-strict.
    generation = of.FlowMod.delete(cookie=0x5 << 32, cookie_mask=0xFF << 32)
    assert generation.table_id == of.OFPTT_ALL and generation.match == of.Match()
    assert generation.command == of.FlowModCommand.DELETE
    assert (
        of.to_text(generation)
        == "DEL table:255 priority=0 cookie:0x500000000/0xff00000000 actions=drop"
    )


def test_nat_is_padded_and_validated() -> None:
    nat = of.NAT(dst=True, ip_min="10.0.0.2", port_min=80)
    assert len(nat.wire) == 24 and struct.unpack_from("!H", nat.wire, 2)[0] == 24
    for kwargs in (
        {},
        {"src": True},
        {"dst": True, "ip_min": "fd00::1", "ip_max": "fd00::9", "port_min": 1, "port_max": 9},
    ):
        wire = of.NAT(**kwargs).wire
        assert len(wire) % 8 == 0 and struct.unpack_from("!H", wire, 2)[0] == len(wire)
    with pytest.raises(of.OpenFlowEncodeError):
        of.NAT(src=True, dst=True)
    with pytest.raises(of.OpenFlowEncodeError):
        of.NAT(dst=True, port_min=80)  # a port needs an address
    with pytest.raises(of.OpenFlowEncodeError):
        of.NAT(dst=True, ip_min="10.0.0.9", ip_max="10.0.0.1")


def test_ct_checks_its_arguments() -> None:
    with pytest.raises(of.OpenFlowEncodeError, match="require commit"):
        of.CT(actions=[of.SetField("ct_mark", 1)])
    with pytest.raises(of.OpenFlowEncodeError, match="16 bits"):
        of.CT(zone="NXM_NX_REG5[0..7]")
    assert of.CT(zone="reg5").zone == of.Subfield("reg5", 0, 16)
    assert of.CT(zone="NXM_NX_REG5[16..31]").to_text() == "ct(zone=NXM_NX_REG5[16..31])"


def test_subfields_parse_and_print_like_ovs() -> None:
    assert of.Subfield.parse("NXM_NX_REG4[16..18]") == of.Subfield("reg4", 16, 3)
    assert of.Subfield.parse("reg4[]") == of.Subfield("reg4")
    assert of.Subfield.parse("reg4[3]").to_text() == "NXM_NX_REG4[3]"
    assert of.Subfield("ipv4_src").to_text() == "NXM_OF_IP_SRC[]"
    with pytest.raises(of.OpenFlowEncodeError):
        of.Subfield("reg4", 30, 4)


# -- groups and limits -----------------------------------------------------------------------


def test_group_command_bucket_id_defaults_and_checks() -> None:
    assert of.GroupMod(of.GroupModCommand.ADD, 1).command_bucket_id == of.OFPG_BUCKET_ALL
    insert = of.GroupMod(of.GroupModCommand.INSERT_BUCKET, 1, buckets=[svc_bucket(3)])
    assert insert.command_bucket_id == of.OFPG_BUCKET_LAST
    with pytest.raises(of.OpenFlowEncodeError, match="only allowed on ADD/MODIFY"):
        of.GroupMod(
            of.GroupModCommand.INSERT_BUCKET, 1, buckets=[svc_bucket(3)], selection_method="dp_hash"
        )
    with pytest.raises(of.OpenFlowEncodeError, match="carry no buckets"):
        of.GroupMod(of.GroupModCommand.REMOVE_BUCKET, 1, buckets=[svc_bucket(3)])
    with pytest.raises(of.OpenFlowEncodeError, match="out of range"):
        of.Bucket(of.OFPG_BUCKET_LAST, [])


def test_a_message_over_65535_bytes_is_refused_with_a_clear_error() -> None:
    data = bytes(70_000)
    with pytest.raises(of.MessageTooLarge, match="split it"):
        of.encode(of.PacketOut([of.Output(1)], data), 1)
    buckets = [svc_bucket(i, f"10.0.{i // 256}.{i % 256}") for i in range(1200)]
    with pytest.raises(of.MessageTooLarge, match="65535"):
        of.GroupMod(of.GroupModCommand.ADD, 5, buckets=buckets)
    # Fits a message (65,535 bytes) but not a bundle (65,519 left after BUNDLE_ADD's 16).
    big = [
        svc_bucket(i).replace(actions=(*svc_bucket(i).actions, of.Output(1))) for i in (1021, 1022)
    ]
    group = of.GroupMod(
        of.GroupModCommand.ADD, 5, buckets=[svc_bucket(i) for i in range(1021)] + big
    )
    assert of.MAX_BUNDLED_MESSAGE_LEN < group.length <= of.OFP_MAX_MESSAGE_LEN
    assert len(of.encode(group, 1)) == group.length
    with pytest.raises(of.MessageTooLarge):
        of.encode_bundle_add(1, group, 1)
    chunks = group_mod_chunks(group.command, group.group_id, group.buckets)
    assert len(chunks) == 2
    assert all(of.encode_bundle_add(1, c, 1) for c in chunks)


def test_size_helpers_match_the_encoding() -> None:
    b = svc_bucket(1)
    group = of.GroupMod(
        of.GroupModCommand.ADD, 1, buckets=[b, b.replace(bucket_id=2)], selection_method="dp_hash"
    )
    assert len(b.wire) == 64
    assert of.group_mod_length(group) == len(of.encode(group, 1))
    assert of.group_mod_overhead("dp_hash") + 2 * 64 == of.group_mod_length(group)
    assert of.group_mod_overhead() == 24


# -- bundles ----------------------------------------------------------------------------------


def test_bundle_add_wraps_the_message_with_the_outer_xid() -> None:
    group = of.GroupMod(of.GroupModCommand.ADD, 5, buckets=[svc_bucket(0)])
    inner = of.encode(group, 99)
    wrapped = of.encode_bundle_add(7, group, 1234)
    assert wrapped == of.BundleAdd(7, group).encode(1234)
    header = of.Header._make(struct.unpack_from("!BBHI", wrapped))
    assert header.msg_type == of.MsgType.BUNDLE_ADD_MESSAGE and header.xid == 1234
    assert struct.unpack_from("!I", wrapped, 20)[0] == 1234  # inner xid rewritten to the outer one
    assert wrapped[24:] == inner[8:]
    decoded = of.decode(wrapped)
    assert decoded == of.BundleAdd(7, group) and decoded.message == group


# -- framing and decoding ------------------------------------------------------------------------


def test_parser_frames_a_stream_fed_in_any_pieces() -> None:
    messages = [of.EchoRequest(b"x" * n) for n in range(20)] + [of.BarrierRequest()]
    stream = b"".join(of.encode(m, i + 1) for i, m in enumerate(messages))
    for piece in (1, 3, 7, 64, len(stream)):
        parser = of.Parser()
        out = []
        for start in range(0, len(stream), piece):
            parser.feed(stream[start : start + piece])
            out.extend(parser)
        assert [of.decode(raw) for raw in out] == messages
        assert parser.buffered == 0


def test_parser_rejects_garbage_lengths() -> None:
    parser = of.Parser()
    parser.feed(b"\x06\x00\x00\x04\x00\x00\x00\x01")
    with pytest.raises(of.OpenFlowDecodeError):
        list(parser)


@pytest.mark.parametrize(
    ("error", "name"),
    [
        (of.Error(6, 0), "OFPET_GROUP_MOD_FAILED/OFPGMFC_GROUP_EXISTS"),
        (of.Error(6, 8), "OFPET_GROUP_MOD_FAILED/OFPGMFC_UNKNOWN_GROUP"),
        (of.Error(5, 1), "OFPET_FLOW_MOD_FAILED/OFPFMFC_TABLE_FULL"),
        (of.Error(2, 4), "OFPET_BAD_ACTION/OFPBAC_BAD_OUT_PORT"),
        (of.Error(4, 9), "OFPET_BAD_MATCH/OFPBMC_BAD_PREREQ"),
        (of.Error(17, 13), "OFPET_BUNDLE_FAILED/OFPBFC_MSG_FAILED"),
        (
            of.Error(0xFFFF, 42, b"", of.constants.NX_VENDOR_ID),
            "OFPET_EXPERIMENTER/NXBAC_CT_DATAPATH_SUPPORT",
        ),
        (of.Error(6, 999), "OFPET_GROUP_MOD_FAILED/OFPET_GROUP_MOD_FAILED_CODE_999"),
    ],
)
def test_errors_decode_to_names(error: of.Error, name: str) -> None:
    decoded = of.decode(of.encode(error, 3))
    assert decoded == error
    assert decoded.name == name


def test_error_identifies_the_failed_message() -> None:
    failed = of.encode(of.GroupMod(of.GroupModCommand.ADD, 5, buckets=[svc_bucket(0)]), 0x55)
    error = of.decode(of.encode(of.Error(6, 0, failed[:64]), 0x55))
    assert error.failed_header == of.Header(6, of.MsgType.GROUP_MOD, len(failed), 0x55)
    assert "OFPT_GROUP_MOD, xid=0x55" in error.to_text()


def test_packet_in_decodes_from_both_formats() -> None:
    frame = bytes.fromhex("ffffffffffff0000000000010800") + bytes(46)
    meta = of.Match(in_port=3, reg5=0x1234, ct_state=0x21)
    pin = of.PacketIn(of.PacketInReason.ACTION, 7, 0xABC, meta, frame, userdata=b"\xde\xad")
    assert of.decode(of.encode(pin, 9)) == pin
    assert pin.in_port == 3
    # OFPT_PACKET_IN (OpenFlow 1.5 layout): header, buffer, total_len, reason, table,
    # cookie, match, 2 pad bytes, data.
    body = struct.pack("!IHBBQ", of.OFP_NO_BUFFER, len(frame), 1, 7, 0xABC) + meta.wire
    raw = struct.pack("!BBHI", 6, of.MsgType.PACKET_IN, 8 + len(body) + 2 + len(frame), 4)
    decoded = of.decode(raw + body + b"\0\0" + frame)
    assert decoded == of.PacketIn(of.PacketInReason.ACTION, 7, 0xABC, meta, frame)
    assert decoded.match.get("reg5") == 0x1234 and decoded.data == frame


def test_multipart_replies_decode_to_flows_and_groups() -> None:
    flow = of.FlowMod(
        10,
        200,
        of.Match(eth_type=0x800, reg3="10.0.0.1"),
        actions=[of.GroupAction(3)],
        cookie=5,
        idle_timeout=7,
    )
    desc = of.FlowDesc(
        flow, duration_sec=3, duration_nsec=9, idle_age=1, packet_count=10, byte_count=600
    )
    reply = of.decode(of.encode(of.FlowDescReply([desc, desc], more=True), 3))
    assert reply.more and list(reply.flows) == [desc, desc]
    group = of.GroupMod(
        of.GroupModCommand.ADD,
        5,
        buckets=[svc_bucket(0), svc_bucket(1)],
        selection_method="dp_hash",
    )
    reply = of.decode(of.encode(of.GroupDescReply([group]), 4))
    assert list(reply.groups) == [group] and not reply.more


def test_unknown_fields_and_actions_survive_a_round_trip() -> None:
    # tun_id (OXM 38) and NX note (subtype 8) are not modelled but must not break dumps.
    flow = of.FlowMod(0, 1, of.Match(reg0=1), actions=[of.Output(1)])
    data = bytearray(of.encode(flow, 1))
    note = struct.pack("!HHIH6x", 0xFFFF, 16, of.constants.NX_VENDOR_ID, 8)
    data += note
    struct.pack_into("!H", data, 2, len(data))
    apply_at = 48 + len(flow.match.wire)
    struct.pack_into("!H", data, apply_at + 2, struct.unpack_from("!H", data, apply_at + 2)[0] + 16)
    decoded = of.decode(bytes(data))
    assert decoded.actions[-1] == of.RawAction(note)
    assert of.encode(decoded, 1) == bytes(data)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x06",
        b"\x06\x0e\x00\x08\x00\x00\x00\x01",  # flow mod without a body
        b"\x06\x63\x00\x08\x00\x00\x00\x01",  # unknown type
        b"\x04\x0e\x00\x08\x00\x00\x00\x01",  # not OpenFlow 1.5
        b"\x06\x14\x00\x09\x00\x00\x00\x01",  # length does not match
    ],
)
def test_malformed_input_raises_only_decode_errors(data: bytes) -> None:
    with pytest.raises(of.OpenFlowDecodeError):
        of.decode(data)


# -- text -----------------------------------------------------------------------------------------


def test_text_forms_match_ovs_ofctl_syntax() -> None:
    flow = of.FlowMod(
        10,
        200,
        of.Match(eth_type=0x800, ip_proto=6, ipv4_dst="10.96.0.1", tcp_dst=80),
        actions=[of.GroupAction(5)],
    )
    assert of.format_flow(flow) == (
        "table=10, priority=200,tcp,nw_dst=10.96.0.1,tp_dst=80 actions=group:5"
    )
    group = of.GroupMod(
        of.GroupModCommand.ADD, 5, buckets=[svc_bucket(0)], selection_method="dp_hash"
    )
    assert of.format_group(group) == (
        "group_id=5,type=select,selection_method=dp_hash,bucket=bucket_id:0,weight:100,"
        "actions=set_field:0xa000002->reg3,set_field:0x50/0xffff->reg4,resubmit(,42)"
    )
    assert of.format_flow(of.FlowMod(0, 0x8000, cookie=1)) == "cookie=0x1, actions=drop"


@pytest.mark.parametrize(
    ("fast", "general"),
    [
        ({"reg3": (5, 0xFFFFFFFF)}, {"reg3": "5"}),
        ({"reg3": (5, 0), "reg0": 1}, {"reg0": "0x1"}),
        ({"reg4": (0x12345, 0xFFFF), "reg5": 7}, {"reg5": "7", "reg4": ("0x2345", "0xffff")}),
        ({"reg2": 1, "reg3": 2, "reg7": 3}, {"xreg1": "0x100000002", "reg7": "3"}),
        (
            {"eth_type": 0x800, "ip_proto": 6, "ipv4_dst": IP("10.0.0.1"), "tcp_dst": 80},
            {"tcp_dst": "80", "ip_proto": "6", "ipv4_dst": "10.0.0.1", "eth_type": "0x800"},
        ),
    ],
)
def test_fast_and_general_match_paths_agree(fast: dict, general: dict) -> None:
    built = of.Match(**fast)
    assert built == of.Match(**general)
    assert built == of.Match.from_entries(built.entries)
    assert built.to_text() == of.Match(**general).to_text()


def test_fast_path_still_reports_errors() -> None:
    with pytest.raises(of.OpenFlowEncodeError, match="cannot be masked"):
        of.Match(eth_type=(0x800, 0xFF00))
    with pytest.raises(of.OpenFlowEncodeError, match="tcp_dst needs"):
        of.Match(eth_type=0x800, ip_proto=17, tcp_dst=80)
    with pytest.raises(of.OpenFlowEncodeError, match="does not fit"):
        of.Match(reg1=-1)
    with pytest.raises(of.OpenFlowEncodeError, match="twice"):
        of.Match(nw_dst="10.0.0.1", ipv4_dst="10.0.0.1", eth_type=0x800)
