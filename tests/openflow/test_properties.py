"""Property tests: round trips of random flows and groups, and a decoder that never crashes."""

from __future__ import annotations

import ipaddress
import struct

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ovsproxy.openflow import protocol as of

from .ofctl import OVS_OFCTL, ofp_print

SETTINGS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])

u8 = st.integers(0, 0xFF)
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFFFFFF)
u64 = st.integers(0, 0xFFFFFFFFFFFFFFFF)
ipv4 = st.integers(1, 0xFFFFFFFF).map(ipaddress.IPv4Address)
ipv6 = st.integers(1, (1 << 128) - 1).map(ipaddress.IPv6Address)
mac = st.integers(0, (1 << 48) - 1)
table = st.integers(0, 253)


def maybe_masked(values: st.SearchStrategy, bits: int) -> st.SearchStrategy:
    return st.one_of(values, st.tuples(values, st.integers(0, (1 << bits) - 1)))


@st.composite
def matches(draw: st.DrawFn) -> of.Match:
    fields: dict[str, object] = {}
    eth_type = draw(st.sampled_from([None, 0x0800, 0x86DD, 0x0806]))
    if eth_type is not None:
        fields["eth_type"] = eth_type
    if eth_type == 0x0800:
        if draw(st.booleans()):
            fields["ipv4_src"] = draw(maybe_masked(ipv4, 32))
        if draw(st.booleans()):
            fields["ipv4_dst"] = draw(maybe_masked(ipv4, 32))
    if eth_type == 0x86DD and draw(st.booleans()):
        fields["ipv6_dst"] = draw(maybe_masked(ipv6, 128))
    if eth_type in (0x0800, 0x86DD) and draw(st.booleans()):
        proto = draw(st.sampled_from([6, 17, 132, 47]))
        fields["ip_proto"] = proto
        name = {6: "tcp", 17: "udp", 132: "sctp"}.get(proto)
        if name and draw(st.booleans()):
            fields[f"{name}_dst"] = draw(maybe_masked(u16, 16))
        if name and draw(st.booleans()):
            fields[f"{name}_src"] = draw(u16)
    if eth_type == 0x0806:
        if draw(st.booleans()):
            fields["arp_op"] = draw(st.integers(1, 2))
        if draw(st.booleans()):
            fields["arp_tpa"] = draw(maybe_masked(ipv4, 32))
    for reg in draw(st.sets(st.integers(0, 15), max_size=4)):
        fields[f"reg{reg}"] = draw(maybe_masked(u32, 32))
    if draw(st.booleans()):
        fields["ct_state"] = draw(maybe_masked(u8, 8))
    if draw(st.booleans()):
        fields["ct_mark"] = draw(maybe_masked(u32, 32))
    if draw(st.booleans()):
        fields["in_port"] = draw(st.integers(1, 0xFEFF))
    if draw(st.booleans()):
        fields["eth_src"] = draw(maybe_masked(mac, 48))
    if draw(st.booleans()):
        fields["metadata"] = draw(maybe_masked(u64, 64))
    return of.Match(**fields)


# (Lambdas everywhere: st.builds would invent values for optional typed arguments.)
set_fields = st.one_of(
    st.builds(lambda v: of.SetField("reg3", v), u32),
    st.builds(
        lambda f, v, m: of.SetField(f, v, mask=m),
        st.sampled_from(["reg4", "reg5", "pkt_mark"]),
        u32,
        u32,
    ),
    st.builds(lambda v: of.SetField("xxreg3", v), st.integers(0, (1 << 128) - 1)),
    st.builds(lambda v: of.SetField("eth_dst", v), mac),
    st.builds(lambda v: of.SetField("metadata", v), u64),
)
nats = st.one_of(
    st.just(of.NAT()),
    st.builds(
        lambda dst, ip, port: of.NAT(src=not dst, dst=dst, ip_min=ip, port_min=port),
        st.booleans(),
        ipv4,
        st.one_of(st.none(), st.integers(1, 0xFFFF)),
    ),
    st.builds(
        lambda lo, span, port: of.NAT(
            dst=True,
            ip_min=lo,
            ip_max=ipaddress.IPv6Address(min(int(lo) + span, (1 << 128) - 1)),
            port_min=port,
            port_max=port + 10,
            persistent=True,
            hash=True,
        ),
        ipv6,
        st.integers(0, 1000),
        st.integers(1, 0xFF00),
    ),
)
learn_specs = st.one_of(
    st.just(of.LearnMatchValue("eth_type", 0x800)),
    st.sampled_from(["reg0", "reg3", "ipv4_src"]).map(of.LearnMatchField),
    st.just(of.LearnLoadField("reg3", "reg3")),
    st.builds(
        lambda v, off: of.LearnLoadValue("reg4", v, n_bits=3, dst_offset=off),
        st.integers(0, 7),
        st.integers(0, 29),
    ),
    st.just(of.LearnOutput("reg1")),
)
simple_actions = st.one_of(
    st.integers(1, 0xFEFF).map(of.Output),
    st.integers(0, 0xFFFFFF00).map(of.GroupAction),
    set_fields,
    table.map(of.Resubmit),
    st.builds(lambda p, t: of.Resubmit(t, in_port=p), st.integers(1, 0xFEFF), table),
    st.builds(
        of.CopyField,
        st.just("reg0"),
        st.just("reg1"),
        st.integers(1, 16),
        st.integers(0, 16),
        st.integers(0, 16),
    ),
    st.just(of.CTClear()),
    st.builds(
        lambda reason, data, cid: of.Controller(reason=reason, userdata=data, controller_id=cid),
        st.sampled_from(list(of.PacketInReason)),
        st.binary(max_size=12),
        u16,
    ),
)
cts = st.builds(
    lambda commit, zone, tbl, nat, actions: of.CT(
        commit=commit or bool(actions),
        zone=zone,
        table=tbl,
        nat=nat,
        actions=actions if commit else (),
    ),
    st.booleans(),
    st.one_of(u16, st.just("reg5"), st.just("NXM_NX_REG6[16..31]")),
    st.one_of(st.none(), table),
    st.one_of(st.none(), nats),
    st.lists(st.builds(lambda v, m: of.SetField("ct_mark", v, m), u32, u32), max_size=1),
)
register_learn_specs = st.one_of(
    st.sampled_from(["reg0", "reg3", "NXM_NX_REG2[4..9]"]).map(of.LearnMatchField),
    st.just(of.LearnLoadField("reg3", "reg3")),
    st.builds(
        lambda v, off: of.LearnLoadValue("reg4", v, n_bits=3, dst_offset=off),
        st.integers(0, 7),
        st.integers(0, 29),
    ),
    st.builds(lambda v: of.LearnMatchValue("reg7", v), u32),
    st.just(of.LearnOutput("reg1")),
)
# Learned matches on packet fields need prerequisites in the flow too: registers only here.
register_learns = st.builds(
    lambda t, specs, idle, cookie, flags: of.Learn(
        t,
        specs,
        idle_timeout=idle,
        cookie=cookie,
        send_flow_rem=flags[0],
        delete_learned=flags[1],
    ),
    table,
    st.lists(register_learn_specs, max_size=5),
    u16,
    u64,
    st.tuples(st.booleans(), st.booleans()),
)
learns = st.builds(
    lambda t, specs, idle, hard, cookie, delete: of.Learn(
        t, specs, idle_timeout=idle, hard_timeout=hard, cookie=cookie, delete_learned=delete
    ),
    table,
    st.lists(learn_specs, max_size=5),
    u16,
    u16,
    u64,
    st.booleans(),
)
actions = st.lists(st.one_of(simple_actions, cts, learns), max_size=6)


@st.composite
def flows(draw: st.DrawFn) -> of.FlowMod:
    instructions: list[of.Instruction] = [of.ApplyActions(draw(actions))]
    if draw(st.booleans()):
        instructions.append(of.GotoTable(draw(table)))
    return of.FlowMod(
        draw(table),
        draw(u16),
        draw(matches()),
        instructions,
        cookie=draw(u64),
        cookie_mask=draw(st.sampled_from([0, 0xFFFFFFFFFFFFFFFF])),
        command=draw(st.sampled_from(list(of.FlowModCommand))),
        idle_timeout=draw(u16),
        hard_timeout=draw(u16),
        flags=draw(st.integers(0, 31)),
        importance=draw(u16),
    )


buckets = st.builds(
    lambda bid, acts, weight: of.Bucket(bid, acts, weight=weight),
    st.integers(0, of.OFPG_BUCKET_MAX),
    st.lists(simple_actions, max_size=4),
    st.one_of(st.none(), u16),
)


@st.composite
def groups(draw: st.DrawFn) -> of.GroupMod:
    command = draw(st.sampled_from(list(of.GroupModCommand)))
    bucket_list = (
        []
        if command in (of.GroupModCommand.DELETE, of.GroupModCommand.REMOVE_BUCKET)
        else draw(st.lists(buckets, max_size=6))
    )
    method = None
    fields: list[str] = []
    if command in (of.GroupModCommand.ADD, of.GroupModCommand.MODIFY):
        method = draw(st.sampled_from([None, "dp_hash", "hash"]))
        if method == "hash":
            fields = draw(
                st.lists(
                    st.sampled_from(["ipv4_dst", "tcp_dst", "ip_proto"]), max_size=3, unique=True
                )
            )
    bucket_id = None
    if command in (of.GroupModCommand.INSERT_BUCKET, of.GroupModCommand.REMOVE_BUCKET):
        bucket_id = draw(
            st.one_of(
                st.sampled_from([of.OFPG_BUCKET_FIRST, of.OFPG_BUCKET_LAST]),
                st.integers(0, of.OFPG_BUCKET_MAX),
            )
        )
    return of.GroupMod(
        command,
        draw(u32),
        draw(st.sampled_from(list(of.GroupType))),
        bucket_list,
        command_bucket_id=bucket_id,
        selection_method=method,
        selection_method_param=draw(u64) if method else 0,
        fields=fields,
    )


# -- round trips -----------------------------------------------------------------------------


@SETTINGS
@given(flows(), u32)
def test_flow_round_trip(flow: of.FlowMod, xid: int) -> None:
    data = of.encode(flow, xid)
    decoded = of.decode(data)
    assert decoded == flow
    assert of.encode(decoded, xid) == data
    assert struct.unpack_from("!I", data, 4)[0] == xid
    assert decoded.to_text() == flow.to_text()


@SETTINGS
@given(groups(), u32)
def test_group_round_trip(group: of.GroupMod, xid: int) -> None:
    data = of.encode(group, xid)
    decoded = of.decode(data)
    assert decoded == group
    assert of.encode(decoded, xid) == data
    assert decoded.to_text() == group.to_text()


@SETTINGS
@given(flows(), groups(), u32)
def test_encoded_messages_frame_and_decode_as_the_values(
    flow: of.FlowMod, group: of.GroupMod, xid: int
) -> None:
    """What the datapath keeps and sends instead of the values: the same bytes on the wire,
    in a bundle too, and the same value and text back."""
    for value, encoded in (
        (flow, of.EncodedFlowMod.of(flow)),
        (group, of.EncodedGroupMod.of(group)),
    ):
        assert of.encode(encoded, xid) == of.encode(value, xid)
        assert of.encode_bundle_add(7, encoded, xid) == of.encode_bundle_add(7, value, xid)
        back = encoded.decoded()
        assert type(back) is type(value) and back == value
        assert encoded.to_text() == value.to_text()
        assert type(encoded)(value.wire) == encoded
    assert of.decode_flow_mod(flow.wire) == flow
    assert of.EncodedGroupMod.of(group).command == group.command
    assert of.EncodedGroupMod.of(group).group_id == group.group_id


@SETTINGS
@given(matches())
def test_match_round_trips_through_its_own_keywords(match: of.Match) -> None:
    assert of.Match(**match.as_kwargs()) == match
    assert len(match.wire) % 8 == 0


@SETTINGS
@given(st.lists(st.one_of(flows(), groups()), min_size=1, max_size=4), u32, u32)
def test_bundle_of_anything_round_trips(
    messages: list[of.Message], bundle_id: int, xid: int
) -> None:
    for msg in messages:
        wrapped = of.encode_bundle_add(bundle_id, msg, xid)
        assert of.decode(wrapped) == of.BundleAdd(bundle_id, msg)
        assert wrapped == of.BundleAdd(bundle_id, msg).encode(xid)


@pytest.mark.skipif(OVS_OFCTL is None, reason="ovs-ofctl is not installed")
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.one_of(
            set_fields,
            table.map(of.Resubmit),
            register_learns,
            st.integers(0, 0xFFFFFF00).map(of.GroupAction),
            st.builds(
                lambda n, a, b: of.CopyField("reg0", "reg1", n, a, b),
                st.integers(1, 16),
                st.integers(0, 16),
                st.integers(0, 16),
            ),
            st.builds(
                lambda reason, data, cid: of.Controller(
                    reason=reason, userdata=data, controller_id=cid
                ),
                st.sampled_from(list(of.PacketInReason)),
                st.binary(max_size=12),
                u16,
            ),
        ),
        max_size=5,
    ),
    matches(),
)
def test_ovs_ofctl_prints_random_flows_as_we_do(
    flow_actions: list[of.Action], match: of.Match
) -> None:
    # Only actions that are consistent with any match: ofp-print checks consistency.
    flow = of.FlowMod(5, 100, match, actions=flow_actions, cookie=7)
    assert ofp_print(of.encode(flow, 1)) == of.to_text(flow, 1)


# -- a decoder that never crashes ------------------------------------------------------------

FUZZ = settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def decodes_or_rejects(data: bytes) -> None:
    try:
        of.decode(data)
    except of.OpenFlowDecodeError:
        pass


@FUZZ
@given(st.binary(max_size=200))
def test_random_bytes_raise_only_decode_errors(data: bytes) -> None:
    decodes_or_rejects(data)


@FUZZ
@given(u8, st.binary(max_size=300))
def test_random_bodies_of_every_type_raise_only_decode_errors(msg_type: int, body: bytes) -> None:
    data = struct.pack("!BBHI", of.OFP_VERSION, msg_type % 40, 8 + len(body), 1) + body
    decodes_or_rejects(data)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    msg = draw(st.one_of(flows(), groups()))
    data = bytearray(of.encode(msg, 1))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "truncate", "insert", "length"]))
        if kind == "flip" and len(data) > 8:
            pos = draw(st.integers(8, len(data) - 1))
            data[pos] = draw(u8)
        elif kind == "truncate" and len(data) > 8:
            del data[draw(st.integers(8, len(data) - 1)) :]
        elif kind == "insert":
            pos = draw(st.integers(8, len(data)))
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif len(data) >= 8:
            # Fix the header length so the decoder goes past the framing check.
            struct.pack_into("!H", data, 2, len(data) & 0xFFFF)
    if draw(st.booleans()) and len(data) >= 8:
        struct.pack_into("!H", data, 2, len(data) & 0xFFFF)
    return bytes(data)


@FUZZ
@given(mutated())
def test_mutated_messages_raise_only_decode_errors(data: bytes) -> None:
    decodes_or_rejects(data)


@SETTINGS
@given(st.lists(st.binary(max_size=64), max_size=20))
def test_parser_raises_only_decode_errors(chunks: list[bytes]) -> None:
    parser = of.Parser()
    try:
        for chunk in chunks:
            parser.feed(chunk)
            for raw in parser:
                assert len(raw) >= 8
                decodes_or_rejects(raw)
    except of.OpenFlowDecodeError:
        pass


@SETTINGS
@given(st.lists(flows(), min_size=1, max_size=5), st.integers(1, 50))
def test_parser_reassembles_valid_streams(messages: list[of.FlowMod], piece: int) -> None:
    stream = b"".join(of.encode(m, i) for i, m in enumerate(messages))
    assume(len(stream) > 0)
    parser = of.Parser()
    out = []
    for start in range(0, len(stream), piece):
        parser.feed(stream[start : start + piece])
        out.extend(of.decode(raw) for raw in parser)
    assert out == messages
