"""``service_objects`` builds with the codec's templates and int-keyed caches: its groups and
flows must be exactly what the generic constructors build (the straightforward builder below,
as service_flows.py was written before the templates), in the same order, for random Services --
families, protocols, ports, affinity, external IPs, duplicate endpoints, no endpoints."""

from __future__ import annotations

import ipaddress
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath import service_flows as svc
from ovsproxy.datapath.flow_context import Context, eth_type
from ovsproxy.datapath.groups import GroupSpec, bucket_spec
from ovsproxy.model import Endpoint, IPAddress, IPFamily, Protocol, ServicePort, ServicePortName
from ovsproxy.openflow import protocol as of
from ovsproxy.openflow.protocol.templates import identical

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MARK = of.SetField("ct_mark", pl.CT_MARK_SERVICE, pl.CT_MARK_SERVICE_MASK)
REJECT = (of.Controller(max_len=pl.REJECT_MAX_LEN, userdata=pl.REJECT_USERDATA),)


def _ref_bucket_actions(ip: IPAddress, port: int, affinity: bool, t: pl.Tables) -> tuple:
    family = IPFamily.of(ip)
    if not affinity:  # the bucket translates
        return (
            of.CT(
                commit=True,
                zone=pl.ct_zone(family),
                table=t.forwarding,
                nat=of.NAT(dst=True, ip_min=ip, port_min=port),
                actions=(MARK,),
            ),
        )
    reg = pl.ENDPOINT_IP_REG if ip.version == 4 else pl.ENDPOINT_IP6_REG
    return (
        of.SetField(reg, int(ip)),
        of.SetField(
            pl.ENDPOINT_PORT_REG,
            port | pl.Selection.TO_LEARN.value_bits,
            pl.ENDPOINT_PORT_MASK | pl.SELECTION_MASK,
        ),
        of.Resubmit(t.service_lb),
    )


def _ref_dnat_flow(ctx: Context, ip: IPAddress, port: int, protocol: Protocol) -> of.FlowMod:
    family = IPFamily.of(ip)
    match = of.Match(
        **{
            "eth_type": eth_type(family),
            "ip_proto": protocol.ip_proto,
            pl.endpoint_ip_reg(family): int(ip),
            pl.ENDPOINT_PORT_REG: (port, pl.ENDPOINT_PORT_MASK),
        }
    )
    ct = of.CT(
        commit=True,
        zone=pl.ct_zone(family),
        table=ctx.tables.forwarding,
        nat=of.NAT(dst=True, ip_min=ip, port_min=port),
        actions=(MARK,),
    )
    return of.FlowMod(
        ctx.tables.endpoint_dnat,
        pl.PRIORITY_NORMAL,
        match,
        (of.ApplyActions((ct,)),),
        cookie=ctx.cookie(pl.Category.ENDPOINT),
    )


def _reference(ctx: Context, port: ServicePort, sets: list[svc.FrontendSet]) -> svc.ServiceObjects:
    t = ctx.tables
    groups: list[GroupSpec] = []
    flows: list[of.FlowMod] = []
    cookie = ctx.cookie(pl.Category.SERVICE)
    affinity = port.session_affinity
    dnat: dict[tuple[IPAddress, int], None] = {}
    for fset in sets:
        if not fset.frontends:
            continue
        buckets = tuple(
            bucket_spec(
                # the endpoint's key: one int
                int(ep.ip) << 17 | ep.port << 1 | (ep.ip.version == 6),
                _ref_bucket_actions(ep.ip, ep.port, affinity, t),
            )
            for ep in fset.endpoints
        )
        groups.append(GroupSpec(fset.group_id, buckets, svc.GROUP_SELECTION_METHOD))
        for ip in fset.frontends:
            family = IPFamily.of(ip)
            actions = (of.GroupAction(fset.group_id),) if fset.endpoints else fset.empty_actions
            flows.append(
                of.FlowMod(
                    table_id=t.service_lb,
                    priority=pl.PRIORITY_LOW,
                    match=svc.frontend_match(port, ip),
                    instructions=(of.ApplyActions(tuple(actions)),) if actions else (),
                    cookie=cookie,
                )
            )
            if not (affinity and fset.endpoints):
                continue
            selection = pl.SELECTION_REG
            flows.append(
                of.FlowMod(
                    table_id=t.service_lb,
                    priority=pl.PRIORITY_NORMAL,
                    match=svc.frontend_match(
                        port,
                        ip,
                        **{selection: (pl.Selection.TO_LEARN.value_bits, pl.SELECTION_MASK)},
                    ),
                    instructions=(
                        of.ApplyActions(
                            (
                                svc._learn_affinity(ctx, port, family),
                                of.SetField(
                                    selection, pl.Selection.SELECTED.value_bits, pl.SELECTION_MASK
                                ),
                                of.Resubmit(t.endpoint_dnat),
                            )
                        ),
                    ),
                    cookie=cookie,
                )
            )
            for ep in fset.endpoints:
                flows.append(
                    of.FlowMod(
                        table_id=t.service_lb,
                        priority=pl.PRIORITY_NORMAL,
                        match=svc.frontend_match(
                            port,
                            ip,
                            **{
                                pl.endpoint_ip_reg(family): int(ep.ip),
                                pl.ENDPOINT_PORT_REG: (
                                    ep.port | pl.Selection.SELECTED.value_bits,
                                    pl.ENDPOINT_PORT_MASK | pl.SELECTION_MASK,
                                ),
                            },
                        ),
                        instructions=(of.ApplyActions((of.Resubmit(t.endpoint_dnat),)),),
                        cookie=cookie,
                    )
                )
        for ep in fset.endpoints if affinity else ():  # EndpointDNAT: affinity only
            dnat.setdefault((ep.ip, ep.port), None)
    for ip, ep_port in dnat:
        flows.append(_ref_dnat_flow(ctx, ip, ep_port, port.protocol))
    return svc.ServiceObjects(tuple(groups), tuple(flows))


# Small pools, so that addresses repeat: endpoints shared between Services and sets, and
# duplicate endpoints within one.
V4 = [ipaddress.IPv4Address(0x0AF40000 + i) for i in (1, 2, 3, 0xFFFF)]
V6 = [ipaddress.IPv6Address((0xFD00 << 112) + i) for i in (1, 2, 0xFFFFFFFF)]
addresses = st.sampled_from([*V4, *V6])
ports = st.sampled_from([1, 80, 8080, 0xFFFF])
endpoints = st.builds(Endpoint, addresses, ports)
frontends = st.lists(
    st.sampled_from(
        [
            ipaddress.IPv4Address("10.96.0.10"),
            ipaddress.IPv4Address("192.0.2.7"),
            ipaddress.IPv6Address("fd00:96::a"),
            ipaddress.IPv6Address("2001:db8::7"),
        ]
    ),
    max_size=3,
    unique=True,
)


@st.composite
def service_ports(draw: st.DrawFn) -> ServicePort:
    protocol = draw(st.sampled_from(list(Protocol)))
    return ServicePort(
        ServicePortName("ns", "svc", "p", protocol),
        tuple(draw(frontends)),
        draw(ports),
        protocol,
        affinity_timeout=draw(st.sampled_from([0, 0, 10800, 100000])),
        external_ips=tuple(draw(frontends)),
    )


@st.composite
def contexts(draw: st.DrawFn) -> Context:
    config = draw(
        st.sampled_from(
            [
                pl.PipelineConfig(),
                pl.PipelineConfig(mode=pl.Mode.INTEGRATED, first_table=30, next_table=7),
            ]
        )
    )
    return Context(pl.Tables.for_config(config), draw(st.integers(1, 0xFFFF)))


def _same(got: svc.ServiceObjects, want: svc.ServiceObjects) -> None:
    assert got.groups == want.groups
    assert identical(tuple(got.groups), tuple(want.groups))
    assert len(got.flows) == len(want.flows)
    for a, b in zip(got.flows, want.flows, strict=True):
        assert identical(a, b), (of.format_flow(a), of.format_flow(b))


@SETTINGS
@given(
    ctx=contexts(),
    port=service_ports(),
    eps=st.lists(endpoints, max_size=6),
    reject=st.sampled_from([(), REJECT]),
    cached=st.booleans(),
)
def test_service_objects_are_what_the_generic_constructors_build(
    ctx: Context,
    port: ServicePort,
    eps: list[Endpoint],
    reject: tuple[of.Action, ...],
    cached: bool,
) -> None:
    group_ids = {f: 7 + f for f in IPFamily if svc.service_frontend_ips(port, f)}
    if cached:  # the values again, now from the caches
        svc.service_objects(ctx, port, eps, group_ids, reject)
    got = svc.service_objects(ctx, port, eps, group_ids, reject)
    sets = [
        svc.FrontendSet(
            svc.service_frontend_ips(port, family),
            gid,
            tuple(ep for ep in eps if ep.ip.version == family),
            reject,
        )
        for family, gid in sorted(group_ids.items())
    ]
    _same(got, _reference(ctx, port, sets))


@SETTINGS
@given(ctx=contexts(), port=service_ports(), eps=st.lists(endpoints, max_size=6), data=st.data())
def test_frontend_sets_with_their_own_endpoints_are_built_as_before(
    ctx: Context, port: ServicePort, eps: list[Endpoint], data: st.DataObject
) -> None:
    # The proxier's sets: internal and external frontends with different endpoint sets (one
    # endpoint may be in both), each set of one family.
    sets = []
    for family in IPFamily:
        fronts = svc.service_frontend_ips(port, family)
        mine = tuple(ep for ep in eps if ep.ip.version == family)
        cut = data.draw(st.integers(0, len(fronts)))
        sets.append(svc.FrontendSet(fronts[:cut], 10 + family, mine, REJECT))
        keep = data.draw(st.lists(st.sampled_from(mine), max_size=3)) if mine else []
        sets.append(svc.FrontendSet(fronts[cut:], 20 + family, tuple(keep)))
    _same(svc.frontend_objects(ctx, port, sets), _reference(ctx, port, sets))


def test_the_endpoint_helpers_give_the_generic_values() -> None:
    ctx = Context(pl.Tables.for_config(pl.PipelineConfig()), 2)
    for ip in (V4[0], V6[2]):
        for affinity in (False, True):
            want = _ref_bucket_actions(ip, 8080, affinity, ctx.tables)
            got: Any = svc.endpoint_bucket_actions(ip, 8080, affinity, ctx)
            assert identical(got, want)
            wire = svc.endpoint_bucket_wire(ip, 8080, affinity, ctx)
            assert wire == b"".join(a.wire for a in want)
        for protocol in Protocol:
            got = svc.endpoint_dnat_flow(ctx, ip, 443, protocol)
            assert identical(got, _ref_dnat_flow(ctx, ip, 443, protocol))
