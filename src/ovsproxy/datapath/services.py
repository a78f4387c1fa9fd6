"""What to install for a Service port and for the fixed pipeline: flows and groups as values.

Pure: (ServicePort, endpoints, group ids, tables, generation) in, (groups, flows) out. The
datapath diffs these against what is installed. Flow values are cached per endpoint and per
pipeline, so a full resync re-uses the same objects (and their encoded bytes) instead of
rebuilding 100,000 of them.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath.groups import BucketSpec, GroupSpec
from ovsproxy.model import Endpoint, IPAddress, IPFamily, Protocol, ServicePort
from ovsproxy.openflow import protocol as of

ETH_IPV4 = 0x0800
ETH_IPV6 = 0x86DD
ETH_ARP = 0x0806
IPPROTO_ICMPV6 = 58
ND_TYPES = (133, 134, 135, 136)  # router/neighbour solicitation and advertisement

_PORT_FIELD = {
    Protocol.TCP: "tcp_dst",
    Protocol.UDP: "udp_dst",
    Protocol.SCTP: "sctp_dst",
}


def eth_type(family: IPFamily) -> int:
    return ETH_IPV4 if family == IPFamily.IPv4 else ETH_IPV6


def _dst_field(family: IPFamily) -> str:
    return "ipv4_dst" if family == IPFamily.IPv4 else "ipv6_dst"


def _ip_value(ip: IPAddress) -> int:
    return int(ip)


@dataclass(frozen=True, slots=True)
class Context:
    """Everything the flow builders need besides the Service itself."""

    tables: pl.Tables
    generation: int
    standalone: bool = True

    def cookie(self, category: pl.Category) -> int:
        return pl.cookie(self.generation, category)


def _goto(table: int) -> tuple[of.Instruction, ...]:
    return (of.GotoTable(table),)


def _apply(*actions: of.Action) -> tuple[of.Instruction, ...]:
    return (of.ApplyActions(tuple(actions)),)


# -- the fixed pipeline -------------------------------------------------------------------
def pipeline_flows(ctx: Context) -> list[of.FlowMod]:
    """Table-miss and fixed flows of the tables we own."""
    t = ctx.tables
    ck = ctx.cookie(pl.Category.PIPELINE)
    flows: list[of.FlowMod] = []

    def add(
        table: int, priority: int, match: of.Match, instructions: Sequence[of.Instruction]
    ) -> None:
        flows.append(
            of.FlowMod(
                table_id=table,
                priority=priority,
                match=match,
                instructions=tuple(instructions),
                cookie=ck,
            )
        )

    if ctx.standalone and t.classifier is not None:
        add(
            t.classifier,
            pl.PRIORITY_NORMAL,
            of.Match(eth_type=ETH_ARP),
            _apply(of.Output(of.OFPP_NORMAL)),
        )
        for nd_type in ND_TYPES:
            add(
                t.classifier,
                pl.PRIORITY_NORMAL,
                of.Match(eth_type=ETH_IPV6, ip_proto=IPPROTO_ICMPV6, icmpv6_type=nd_type),
                _apply(of.Output(of.OFPP_NORMAL)),
            )
        add(t.classifier, pl.PRIORITY_MISS, of.Match(), _goto(t.conntrack_zone))
    for family in IPFamily:
        # Un-NAT replies and re-apply NAT to established Service connections.
        add(
            t.conntrack_zone,
            pl.PRIORITY_NORMAL,
            of.Match(eth_type=eth_type(family)),
            _apply(of.CT(zone=pl.ct_zone(family), table=t.conntrack_state, nat=of.NAT())),
        )
        add(
            t.conntrack_state,
            pl.PRIORITY_HIGH,
            of.Match(
                eth_type=eth_type(family), ct_state=(of.CT_TRK | of.CT_INV, of.CT_TRK | of.CT_INV)
            ),
            (),
        )  # invalid: drop
        # Established, related and reply packets skip Service selection.
        add(
            t.conntrack_state,
            pl.PRIORITY_NORMAL,
            of.Match(eth_type=eth_type(family), ct_state=(of.CT_TRK, of.CT_TRK | of.CT_NEW)),
            _goto(t.forwarding),
        )
    add(t.conntrack_zone, pl.PRIORITY_MISS, of.Match(), _goto(t.forwarding))
    # New connections: SessionAffinity and ServiceLB are entered by resubmit, so a learned
    # affinity flow (which can only load registers) returns here and ServiceLB runs next.
    add(
        t.conntrack_state,
        pl.PRIORITY_MISS,
        of.Match(),
        _apply(of.Resubmit(t.session_affinity), of.Resubmit(t.service_lb)),
    )
    add(
        t.session_affinity,
        pl.PRIORITY_MISS,
        of.Match(),
        _apply(of.SetField(pl.SELECTION_REG, pl.Selection.TO_SELECT.value_bits, pl.SELECTION_MASK)),
    )
    # An endpoint remembered by a learned affinity flow: straight to its DNAT flow.
    add(
        t.service_lb,
        pl.PRIORITY_LOW,
        of.Match(**{pl.SELECTION_REG: (pl.Selection.SELECTED.value_bits, pl.SELECTION_MASK)}),
        _apply(of.Resubmit(t.endpoint_dnat)),
    )
    add(t.service_lb, pl.PRIORITY_MISS, of.Match(), _apply(of.Resubmit(t.forwarding)))
    add(t.endpoint_dnat, pl.PRIORITY_MISS, of.Match(), _apply(of.Resubmit(t.forwarding)))
    if ctx.standalone:
        add(t.forwarding, pl.PRIORITY_MISS, of.Match(), _apply(of.Output(of.OFPP_NORMAL)))
    return flows


# -- forwarding to local pods (standalone) ------------------------------------------------
def pod_forwarding_flows(
    ctx: Context, ips: Iterable[IPAddress], mac: str, ofport: int
) -> list[of.FlowMod]:
    """Deliver to a pod on this bridge: the DNATed packet still carries the MAC the client
    sent it to (the gateway's, or the virtual next hop's), so set the pod's."""
    ck = ctx.cookie(pl.Category.FORWARDING)
    flows = []
    for ip in ips:
        family = IPFamily.of(ip)
        flows.append(
            of.FlowMod(
                table_id=ctx.tables.forwarding,
                priority=pl.PRIORITY_NORMAL,
                match=of.Match(**{"eth_type": eth_type(family), _dst_field(family): ip}),
                instructions=_apply(of.SetField("eth_dst", mac), of.Output(ofport)),
                cookie=ck,
            )
        )
    return flows


# -- Services -----------------------------------------------------------------------------
@functools.cache
def endpoint_bucket_actions(
    ip: IPAddress, port: int, affinity: bool, tables: pl.Tables
) -> tuple[of.Action, ...]:
    """A bucket: endpoint address into reg3/xxreg3, port and selection state into reg4 (one
    masked set_field), then on to EndpointDNAT (or back to ServiceLB to learn affinity)."""
    family = IPFamily.of(ip)
    state = pl.Selection.TO_LEARN if affinity else pl.Selection.SELECTED
    return (
        of.SetField(pl.endpoint_ip_reg(family), _ip_value(ip)),
        of.SetField(
            pl.ENDPOINT_PORT_REG, port | state.value_bits, pl.ENDPOINT_PORT_MASK | pl.SELECTION_MASK
        ),
        of.Resubmit(tables.service_lb if affinity else tables.endpoint_dnat),
    )


def endpoint_dnat_flow(ctx: Context, ip: IPAddress, port: int, protocol: Protocol) -> of.FlowMod:
    return _endpoint_dnat_flow(ctx, ip, port, protocol)


@functools.lru_cache(maxsize=1 << 18)
def _endpoint_dnat_flow(ctx: Context, ip: IPAddress, port: int, protocol: Protocol) -> of.FlowMod:
    family = IPFamily.of(ip)
    match = of.Match(
        **{
            "eth_type": eth_type(family),
            "ip_proto": protocol.ip_proto,
            pl.endpoint_ip_reg(family): _ip_value(ip),
            pl.ENDPOINT_PORT_REG: (port, pl.ENDPOINT_PORT_MASK),
        }
    )
    ct = of.CT(
        commit=True,
        zone=pl.ct_zone(family),
        table=ctx.tables.forwarding,
        nat=of.NAT(dst=True, ip_min=ip, port_min=port),
        actions=(of.SetField("ct_mark", pl.CT_MARK_SERVICE, pl.CT_MARK_SERVICE_MASK),),
    )
    return of.FlowMod(
        table_id=ctx.tables.endpoint_dnat,
        priority=pl.PRIORITY_NORMAL,
        match=match,
        instructions=_apply(ct),
        cookie=ctx.cookie(pl.Category.ENDPOINT),
    )


def service_frontend_ips(port: ServicePort, family: IPFamily) -> tuple[IPAddress, ...]:
    """ClusterIPs, externalIPs and load-balancer ingress IPs of one family."""
    seen: dict[IPAddress, None] = {}
    for ip in (*port.cluster_ips, *port.external_ips, *port.load_balancer_ips):
        if ip.version == family:
            seen.setdefault(ip, None)
    return tuple(seen)


def _learn_affinity(ctx: Context, port: ServicePort, family: IPFamily) -> of.Learn:
    """Remember client -> endpoint in SessionAffinity for `affinity_timeout` seconds."""
    src = "ipv4_src" if family == IPFamily.IPv4 else "ipv6_src"
    dst = _dst_field(family)
    reg = pl.endpoint_ip_reg(family)
    timeout = min(port.affinity_timeout, 0xFFFF)
    return of.Learn(
        table=ctx.tables.session_affinity,
        priority=pl.PRIORITY_NORMAL,
        hard_timeout=timeout,
        cookie=pl.learned_cookie(),
        delete_learned=True,
        specs=(
            of.LearnMatchValue("eth_type", eth_type(family)),
            of.LearnMatchValue("ip_proto", port.protocol.ip_proto),
            of.LearnMatchField(src, src),
            of.LearnMatchField(dst, dst),
            of.LearnMatchField(_PORT_FIELD[port.protocol], _PORT_FIELD[port.protocol]),
            of.LearnLoadField(reg, reg),
            of.LearnLoadField(pl.ENDPOINT_PORT_REG, pl.ENDPOINT_PORT_REG, n_bits=16),
            of.LearnLoadValue(
                pl.SELECTION_REG,
                int(pl.Selection.SELECTED),
                dst_offset=pl.SELECTION_SHIFT,
                n_bits=3,
            ),
        ),
    )


@dataclass(frozen=True, slots=True)
class ServiceObjects:
    groups: tuple[GroupSpec, ...]
    flows: tuple[of.FlowMod, ...]


def service_objects(
    ctx: Context,
    port: ServicePort,
    endpoints: Sequence[Endpoint],
    group_ids: dict[IPFamily, int],
    reject_action: tuple[of.Action, ...] = (),
) -> ServiceObjects:
    """Groups and flows for one Service port. `endpoints` are the ones to use (after
    categorisation); `group_ids` has an id for every family the Service has frontends in."""
    t = ctx.tables
    groups: list[GroupSpec] = []
    flows: list[of.FlowMod] = []
    svc_cookie = ctx.cookie(pl.Category.SERVICE)
    for family, group_id in sorted(group_ids.items()):
        frontends = service_frontend_ips(port, family)
        if not frontends:
            continue
        family_eps = [ep for ep in endpoints if ep.ip.version == family]
        buckets = tuple(
            BucketSpec(
                key=(ep.ip, ep.port),
                actions=endpoint_bucket_actions(ep.ip, ep.port, port.session_affinity, t),
            )
            for ep in family_eps
        )
        groups.append(GroupSpec(group_id=group_id, buckets=buckets))
        base = {
            "eth_type": eth_type(family),
            "ip_proto": port.protocol.ip_proto,
            _PORT_FIELD[port.protocol]: port.port,
        }
        for ip in frontends:
            match = of.Match(
                **base,
                **{_dst_field(family): ip},
                **{pl.SELECTION_REG: (pl.Selection.TO_SELECT.value_bits, pl.SELECTION_MASK)},
            )
            if family_eps:
                actions: tuple[of.Action, ...] = (of.GroupAction(group_id),)
            else:
                actions = reject_action  # empty: drop
            flows.append(
                of.FlowMod(
                    table_id=t.service_lb,
                    priority=pl.PRIORITY_NORMAL,
                    match=match,
                    instructions=_apply(*actions) if actions else (),
                    cookie=svc_cookie,
                )
            )
            if port.session_affinity and family_eps:
                learn_match = of.Match(
                    **base,
                    **{_dst_field(family): ip},
                    **{pl.SELECTION_REG: (pl.Selection.TO_LEARN.value_bits, pl.SELECTION_MASK)},
                )
                flows.append(
                    of.FlowMod(
                        table_id=t.service_lb,
                        priority=pl.PRIORITY_NORMAL,
                        match=learn_match,
                        instructions=_apply(
                            _learn_affinity(ctx, port, family),
                            of.SetField(
                                pl.SELECTION_REG,
                                pl.Selection.SELECTED.value_bits,
                                pl.SELECTION_MASK,
                            ),
                            of.Resubmit(t.endpoint_dnat),
                        ),
                        cookie=svc_cookie,
                    )
                )
        for ep in family_eps:
            flows.append(endpoint_dnat_flow(ctx, ep.ip, ep.port, port.protocol))
    return ServiceObjects(tuple(groups), tuple(flows))


def is_ipv6(ip: IPAddress) -> bool:
    return isinstance(ip, ipaddress.IPv6Address)
