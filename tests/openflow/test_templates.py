"""The codec's fast constructors build exactly what the generic constructors build: the same
type, wire, field values (recursively) and text, for random shapes and values -- and errors
where the generic constructors raise. ``ovs-ofctl ofp-print`` reads a few as we print them."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath import service_flows as svc
from ovsproxy.datapath.flow_context import Context
from ovsproxy.datapath.switch_sync import flow_key
from ovsproxy.model import Protocol
from ovsproxy.openflow import protocol as of
from ovsproxy.openflow.protocol import templates as tpl

from .ofctl import OVS_OFCTL, ofp_print

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

u16 = st.integers(0, 0xFFFF)
u64 = st.integers(0, 0xFFFFFFFFFFFFFFFF)
table = st.integers(0, 254)
protocols = st.sampled_from([6, 17, 132])
ports = st.one_of(st.integers(1, 0xFFFF), st.sampled_from([1, 80, 8080, 0xFFFF]))
zones = st.one_of(u16, st.sampled_from([pl.CT_ZONE_V4, pl.CT_ZONE_V6]))
ct_tables = st.one_of(st.none(), st.integers(0, 254))
MARK = of.SetField("ct_mark", pl.CT_MARK_SERVICE, pl.CT_MARK_SERVICE_MASK)
ct_actions = st.sampled_from([(), (MARK,), (MARK, of.SetField("ct_label", 5))])


def addresses(version: int) -> st.SearchStrategy[int]:
    bits = 32 if version == 4 else 128
    edge = [1, (1 << bits) - 1, 0x0A000001 if version == 4 else 0xFD00 << 112 | 1]
    return st.one_of(st.integers(1, (1 << bits) - 1), st.sampled_from(edge))


@st.composite
def dnat_shapes(draw: st.DrawFn) -> dict[str, object]:
    """An EndpointDNAT flow shape: family, registers, zone, tables, cookie."""
    version = draw(st.sampled_from([4, 6]))
    if version == 4:
        ip_field = draw(st.sampled_from([f"reg{i}" for i in range(16)]))
        taken = {int(ip_field[3:])}
    else:
        ip_field = draw(st.sampled_from([f"xxreg{i}" for i in range(4)]))
        first = 4 * int(ip_field[5:])
        taken = set(range(first, first + 4))
    port_reg = draw(st.sampled_from([i for i in range(16) if i not in taken]))
    return {
        "table_id": draw(table),
        "priority": draw(u16),
        "cookie": draw(u64),
        "version": version,
        "ip_proto": draw(protocols),
        "ip_field": ip_field,
        "port_field": f"reg{port_reg}",
        "zone": draw(zones),
        "ct_table": draw(ct_tables),
        "ct_actions": draw(ct_actions),
    }


def same(fast: object, generic: object) -> None:
    assert tpl.identical(fast, generic), (fast, generic)
    assert fast == generic and hash(fast) == hash(generic)
    if isinstance(fast, of.FlowMod) and isinstance(generic, of.FlowMod):
        assert fast.to_text() == generic.to_text()
        assert of.format_flow(fast) == of.format_flow(generic)
        assert repr(fast) == repr(generic)
        assert of.decode(of.encode(fast, 7)) == fast


@SETTINGS
@given(shape=dnat_shapes(), data=st.data())
def test_endpoint_dnat_flows_are_the_generic_flows(shape: dict, data: st.DataObject) -> None:
    flows = tpl.EndpointDnatFlows(
        shape.pop("table_id"), shape.pop("priority"), shape.pop("cookie"), **shape
    )
    assert flows.fast
    for _ in range(3):
        ip = data.draw(addresses(shape["version"]))
        port = data.draw(ports)
        same(flows.flow(ip, port), flows.generic(ip, port))
        assert flows.wire(ip, port) == flows.generic(ip, port).wire
        generic = flows.generic(ip, port)  # keyed: (table, priority, match) as the datapath keys
        assert flows.keyed(ip, port) == (flow_key(generic), generic.wire)


@pytest.mark.parametrize("version", [4, 6])
@pytest.mark.parametrize(("ip", "port"), [(0, 80), (1, 0), (1, 0x10000), (-1, 80)])
def test_endpoint_dnat_outside_the_fast_path_is_generic_even_in_its_errors(
    version: int, ip: int, port: int
) -> None:
    flows = tpl.EndpointDnatFlows(
        14, 200, 1, version=version, ip_proto=6, ip_field="reg3" if version == 4 else "xxreg3",
        port_field="reg4", zone=5, ct_table=20, ct_actions=(MARK,),
    )  # fmt: skip
    try:
        expected = flows.generic(ip, port)
    except Exception as exc:  # the generic constructors refuse it: so does the template
        with pytest.raises(type(exc)):
            flows.flow(ip, port)
        with pytest.raises(type(exc)):
            flows.wire(ip, port)
        with pytest.raises(type(exc)):
            flows.keyed(ip, port)
    else:
        same(flows.flow(ip, port), expected)
        assert flows.wire(ip, port) == expected.wire
        assert flows.keyed(ip, port) == (flow_key(expected), expected.wire)


def test_a_shape_the_template_cannot_cut_is_built_generically() -> None:
    # A port matched under another mask is not two bytes the template can find.
    flows = tpl.EndpointDnatFlows(
        14, 200, 1, version=4, ip_proto=6, ip_field="reg3", port_field="reg4",
        port_mask=0xFFFF0000, zone=5, ct_table=20,
    )  # fmt: skip
    assert not flows.fast
    same(flows.flow(0x0A000001, 80), flows.generic(0x0A000001, 80))
    assert flows.wire(0x0A000001, 80) == flows.generic(0x0A000001, 80).wire


action_lists = st.one_of(
    st.just(()),
    st.integers(0, 0xFFFFFF00).map(lambda g: (of.GroupAction(g),)),
    st.lists(
        st.sampled_from(
            [
                of.GroupAction(7),
                of.Output(3),
                of.Resubmit(20),
                of.Controller(max_len=256, userdata=b"ovsp-rej"),
                of.SetField("reg4", 0x20000, 0x70000),
            ]
        ),
        min_size=1,
        max_size=4,
    ).map(tuple),
)


@SETTINGS
@given(
    version=st.sampled_from([4, 6]),
    ip_proto=protocols,
    table_id=table,
    priority=u16,
    cookie=u64,
    data=st.data(),
)
def test_frontend_flows_are_the_generic_flows(
    version: int, ip_proto: int, table_id: int, priority: int, cookie: int, data: st.DataObject
) -> None:
    port_field = {6: "tcp_dst", 17: "udp_dst", 132: "sctp_dst"}[ip_proto]
    flows = tpl.FrontendFlows(
        table_id,
        priority,
        cookie,
        version=version,
        ip_proto=ip_proto,
        ip_field="ipv4_dst" if version == 4 else "ipv6_dst",
        port_field=port_field,
    )
    assert flows.fast
    for _ in range(3):
        ip = data.draw(st.one_of(st.just(0), addresses(version)))
        port = data.draw(u16)
        actions = data.draw(action_lists)
        same(flows.flow(ip, port, actions), flows.generic(ip, port, actions))
    gid = data.draw(st.integers(0, 0xFFFFFF00))
    same(flows.group_flow(ip, port, gid), flows.generic(ip, port, (of.GroupAction(gid),)))


def test_frontend_flows_refuse_what_the_generic_constructors_refuse() -> None:
    flows = tpl.FrontendFlows(
        13, 190, 1, version=4, ip_proto=6, ip_field="ipv4_dst", port_field="tcp_dst"
    )
    for ip, port, actions in (
        (1 << 32, 80, ()),
        (1, 1 << 16, ()),
        (1, 80, ("not an action",)),
        (1, 80, [of.GroupAction(1)]),  # a list: the generic constructors take it
    ):
        try:
            expected = flows.generic(ip, port, actions)  # type: ignore[arg-type]
        except Exception as exc:
            with pytest.raises(type(exc)):
                flows.flow(ip, port, actions)  # type: ignore[arg-type]
        else:
            same(flows.flow(ip, port, actions), expected)  # type: ignore[arg-type]


SET_FIELDS = [
    "reg0",
    "reg3",
    "reg4",
    "xreg1",
    "xxreg3",
    "ct_mark",
    "eth_dst",
    "ipv4_dst",
    "tcp_dst",
]


@SETTINGS
@given(name=st.sampled_from(SET_FIELDS), data=st.data())
def test_set_field_exact_is_set_field(name: str, data: st.DataObject) -> None:
    make = tpl.set_field_exact(name)
    bits = of.get_field(name).n_bytes * 8
    value = data.draw(st.integers(0, (1 << bits) - 1))
    same(make(value), of.SetField(name, value))
    same(make(value).to_text(), of.SetField(name, value).to_text())


def test_set_field_exact_takes_other_spellings_as_set_field_does() -> None:
    make = tpl.set_field_exact("reg3")
    ip = ipaddress.IPv4Address("10.0.0.1")
    same(make(ip), of.SetField("reg3", ip))  # type: ignore[arg-type]
    with pytest.raises(of.OpenFlowEncodeError):
        make(1 << 32)


bucket_actions = st.lists(
    st.sampled_from(
        [
            of.SetField("reg3", 0x0A000001),
            of.SetField("reg4", 8080 | 0x20000, 0x7FFFF),
            of.Resubmit(14),
            of.Output(2),
            of.GroupAction(3),
        ]
    ),
    max_size=5,
).map(tuple)


@SETTINGS
@given(
    bucket_id=st.one_of(st.integers(0, 0xFFFFFF00), st.sampled_from([0, 0xFFFFFF00])),
    actions=bucket_actions,
    weight=st.one_of(st.none(), u16, st.sampled_from([100])),
)
def test_bucket_is_the_generic_bucket(
    bucket_id: int, actions: tuple[of.Action, ...], weight: int | None
) -> None:
    fast = tpl.bucket(bucket_id, actions, weight)
    same(fast, of.Bucket(bucket_id, actions, weight))
    assert fast.to_text() == of.Bucket(bucket_id, actions, weight).to_text()


@pytest.mark.parametrize(
    ("bucket_id", "actions", "weight"),
    [(-1, (), 100), (0xFFFFFF01, (), 100), (0, (), 0x10000), (0, ("x",), 100), (0, [], 100)],
)
def test_bucket_refuses_what_bucket_refuses(bucket_id: int, actions: object, weight: int) -> None:
    try:
        expected = of.Bucket(bucket_id, actions, weight)  # type: ignore[arg-type]
    except Exception as exc:
        with pytest.raises(type(exc)):
            tpl.bucket(bucket_id, actions, weight)  # type: ignore[arg-type]
    else:
        same(tpl.bucket(bucket_id, actions, weight), expected)  # type: ignore[arg-type]


# -- the services' own shapes -------------------------------------------------------------


@pytest.mark.parametrize("protocol", list(Protocol))
@pytest.mark.parametrize("version", [4, 6])
def test_the_services_shapes_are_templated(protocol: Protocol, version: int) -> None:
    ctx = Context(pl.Tables.for_config(pl.PipelineConfig()), 3)
    assert svc._dnat_template(ctx, version, protocol).fast
    assert svc._frontend_template(ctx, version, protocol).fast


@pytest.mark.skipif(OVS_OFCTL is None, reason="ovs-ofctl is not installed")
@pytest.mark.parametrize(
    ("version", "ip", "port", "protocol"),
    [
        (4, "10.244.1.7", 8080, 6),
        (4, "192.168.200.1", 53, 17),
        (6, "fd00:10:244::7", 443, 6),
        (6, "2001:db8::1:0:0:1", 9000, 132),
    ],
)
def test_ovs_ofctl_prints_templated_values_as_we_do(
    version: int, ip: str, port: int, protocol: int
) -> None:
    address = int(ipaddress.ip_address(ip))
    dnat = tpl.EndpointDnatFlows(
        14, 200, 0x5E71000103000000, version=version, ip_proto=protocol,
        ip_field="reg3" if version == 4 else "xxreg3", port_field="reg4", zone=0xFFF0,
        ct_table=20, ct_actions=(MARK,),
    )  # fmt: skip
    frontend = tpl.FrontendFlows(
        13, 190, 0x5E71000102000000, version=version, ip_proto=protocol,
        ip_field="ipv4_dst" if version == 4 else "ipv6_dst",
        port_field={6: "tcp_dst", 17: "udp_dst", 132: "sctp_dst"}[protocol],
    )  # fmt: skip
    reg = "reg3" if version == 4 else "xxreg3"
    set_ip = tpl.set_field_exact(reg)
    actions = (set_ip(address), of.SetField("reg4", port | 0x20000, 0x7FFFF), of.Resubmit(14))
    group = of.GroupMod(
        of.GroupModCommand.ADD,
        9,
        buckets=[tpl.bucket(0, actions), tpl.bucket(1, actions, 50)],
        selection_method="hash",
    )
    for msg in (dnat.flow(address, port), frontend.group_flow(address, 80, 9), group):
        assert ofp_print(of.encode(msg, 1)) == of.to_text(msg, 1)
    text = of.to_text(dnat.flow(address, port))
    nat_ip = ip if version == 4 else f"[{ipaddress.ip_address(ip)}]"
    assert f"nat(dst={nat_ip}:{port})" in text


@SETTINGS
@given(
    specs=st.lists(
        st.tuples(st.none(), bucket_actions, st.one_of(st.none(), u16, st.just(100))), max_size=6
    ),
    first_id=st.one_of(st.integers(0, 0xFFFFFF00), st.just(0xFFFFFF00 - 2)),
)
def test_numbered_buckets_are_the_generic_buckets(
    specs: list[tuple[None, tuple[of.Action, ...], int | None]], first_id: int
) -> None:
    try:
        expected = [of.Bucket(first_id + i, a, w) for i, (_, a, w) in enumerate(specs)]
    except Exception as exc:
        with pytest.raises(type(exc)):
            tpl.numbered_buckets(specs, first_id)
    else:
        got = tpl.numbered_buckets(specs, first_id)
        assert len(got) == len(expected)
        for fast, generic in zip(got, expected, strict=True):
            same(fast, generic)


GROUP_COMMANDS = list(of.GroupModCommand)


@SETTINGS
@given(
    command=st.sampled_from(GROUP_COMMANDS),
    group_id=st.one_of(st.integers(0, 0xFFFFFFFF), st.sampled_from([1, 0xFFFFFF00])),
    group_type=st.sampled_from(list(of.GroupType)),
    n_buckets=st.integers(0, 4),
    command_bucket_id=st.one_of(st.none(), st.integers(0, 0xFFFFFFFF)),
    selection_method=st.sampled_from([None, "", "hash", "dp_hash"]),
    fields=st.sampled_from(
        [(), ("ipv4_src",), ("ip_dst", "udp_src"), svc.CONNECTION_HASH_FIELDS, ("no_such",)]
    ),
    actions=bucket_actions,
)
def test_group_mod_is_the_generic_group_mod(
    command: int,
    group_id: int,
    group_type: int,
    n_buckets: int,
    command_bucket_id: int | None,
    selection_method: str | None,
    fields: tuple[str, ...],
    actions: tuple[of.Action, ...],
) -> None:
    buckets = [tpl.bucket(i, actions) for i in range(n_buckets)]
    kwargs = {
        "command_bucket_id": command_bucket_id,
        "selection_method": selection_method,
        "fields": fields,
    }
    try:
        expected = of.GroupMod(command, group_id, group_type, buckets, **kwargs)  # type: ignore[arg-type]
    except Exception as exc:
        with pytest.raises(type(exc)):
            tpl.group_mod(command, group_id, group_type, buckets, **kwargs)  # type: ignore[arg-type]
    else:
        fast = tpl.group_mod(command, group_id, group_type, buckets, **kwargs)  # type: ignore[arg-type]
        same(fast, expected)
        assert fast.to_text() == expected.to_text()


def test_group_mod_takes_what_it_does_not_speed_up_to_the_generic_constructor() -> None:
    bucket = tpl.bucket(0, (of.Output(1),))
    for buckets in ([bucket, "not a bucket"], [bucket] * 3000):  # junk; over 65,535 bytes
        with pytest.raises(of.OpenFlowCodecError):
            of.GroupMod(of.GroupModCommand.ADD, 1, of.GroupType.SELECT, buckets)  # type: ignore[arg-type]
        with pytest.raises(of.OpenFlowCodecError):
            tpl.group_mod(of.GroupModCommand.ADD, 1, of.GroupType.SELECT, buckets)  # type: ignore[arg-type]


@SETTINGS
@given(
    bucket_id=st.one_of(st.integers(0, 0xFFFFFF00), st.sampled_from([0, 0xFFFFFF00, 0xFFFFFF01])),
    actions=bucket_actions,
    weight=st.one_of(u16, st.sampled_from([100, -1, 0x10000])),
)
def test_bucket_wire_is_the_generic_buckets_encoding(
    bucket_id: int, actions: tuple[of.Action, ...], weight: int
) -> None:
    encoded = b"".join(a.wire for a in actions)
    try:
        expected = of.Bucket(bucket_id, actions, weight)
    except of.OpenFlowCodecError:
        with pytest.raises(of.OpenFlowCodecError):
            tpl.bucket_wire(bucket_id, encoded, weight)
    else:
        assert tpl.bucket_wire(bucket_id, encoded, weight) == expected.wire


@SETTINGS
@given(
    command=st.sampled_from(GROUP_COMMANDS),
    group_id=st.one_of(st.integers(0, 0xFFFFFFFF), st.sampled_from([1, 0xFFFFFF00])),
    group_type=st.sampled_from(list(of.GroupType)),
    n_buckets=st.integers(0, 4),
    command_bucket_id=st.one_of(st.none(), st.integers(0, 0xFFFFFFFF)),
    selection_method=st.sampled_from([None, "", "hash", "dp_hash"]),
    fields=st.sampled_from(
        [(), ("ipv4_src",), ("ip_dst", "udp_src"), svc.CONNECTION_HASH_FIELDS, ("no_such",)]
    ),
    actions=bucket_actions,
)
def test_encoded_group_mod_is_the_generic_group_mods_encoding(
    command: int,
    group_id: int,
    group_type: int,
    n_buckets: int,
    command_bucket_id: int | None,
    selection_method: str | None,
    fields: tuple[str, ...],
    actions: tuple[of.Action, ...],
) -> None:
    buckets = [of.Bucket(i, actions) for i in range(n_buckets)]
    kwargs = {
        "command_bucket_id": command_bucket_id,
        "selection_method": selection_method,
        "fields": fields,
    }
    wires = [b.wire for b in buckets]
    try:
        expected = of.GroupMod(command, group_id, group_type, buckets, **kwargs)  # type: ignore[arg-type]
    except of.OpenFlowCodecError:
        with pytest.raises(of.OpenFlowCodecError):
            tpl.encoded_group_mod(command, group_id, group_type, wires, **kwargs)  # type: ignore[arg-type]
    else:
        got = tpl.encoded_group_mod(command, group_id, group_type, wires, **kwargs)  # type: ignore[arg-type]
        assert type(got) is of.EncodedGroupMod
        assert got[0] == expected.wire and got.decoded() == expected


@SETTINGS
@given(
    field=st.sampled_from(["reg3", "xxreg3", "reg4", "eth_type", "ip_proto"]),
    value=st.integers(0, (1 << 130)),
    after=st.sampled_from([b"", of.Resubmit(14).wire]),
)
def test_set_field_exact_wire_is_the_generic_set_fields_encoding(
    field: str, value: int, after: bytes
) -> None:
    make = tpl.set_field_exact_wire(field, after)
    try:
        expected = of.SetField(field, value).wire + after
    except of.OpenFlowCodecError:
        with pytest.raises(of.OpenFlowCodecError):
            make(value)
    else:
        assert make(value) == expected
