"""What to install for a Service port and for the fixed pipeline: flows and groups as values.

Pure: (ServicePort, endpoints, group ids, tables, generation) in, (groups, flows) out. The
datapath diffs these against what is installed (and keeps the flows as their encodings).
Groups keep each bucket's actions as their encoding, and the EndpointDNAT flows are staged
as their encodings: what the datapath keeps is bytes, built afresh (no cache of values).
The shapes built per endpoint and per frontend (EndpointDNAT and ServiceLB flows, a bucket's
actions) come from the codec's templates (``openflow.protocol.templates``): exactly what the
generic constructors encode, several times cheaper (bench ``encode``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field

from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath.desired import EncodedFlow
from ovsproxy.datapath.groups import BucketSpec, GroupSpec, SelectionMethod
from ovsproxy.model import Endpoint, IPAddress, IPFamily, Protocol, ServicePort
from ovsproxy.openflow import protocol as of
from ovsproxy.openflow.protocol import templates
from ovsproxy.openflow.protocol.actions import decode_actions

ETH_IPV4 = 0x0800
ETH_IPV6 = 0x86DD
ETH_ARP = 0x0806
IPPROTO_ICMPV6 = 58
IPPROTO_TCP = 6
TCP_FIN, TCP_SYN, TCP_RST, TCP_ACK = 0x001, 0x002, 0x004, 0x010  # tcp_flags bits
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


def _src_field(family: IPFamily) -> str:
    return "ipv4_src" if family == IPFamily.IPv4 else "ipv6_src"


def _ip_value(ip: IPAddress) -> int:
    return int(ip)


# A bucket's actions as bytes: the endpoint address goes in.
_BucketWire = Callable[[int], bytes]
_DnatTemplates = dict[int, templates.EndpointDnatFlows]
_FrontendTemplates = dict[int, templates.FrontendFlows]


class Encoders:
    """A pipeline context's flow and bucket encoders (the codec's fast constructors), each
    built on first use: EndpointDNAT and ServiceLB templates by protocol (then IP version),
    bucket action encoders by (port, affinity, IP version). Bounded by the protocols and
    ports in use; a new ``Context`` starts with none."""

    __slots__ = ("buckets", "by_protocol", "mid_stream")

    def __init__(self) -> None:
        self.by_protocol: dict[Protocol, tuple[_DnatTemplates, _FrontendTemplates]] = {}
        self.buckets: dict[tuple[int, bool, int], _BucketWire] = {}
        # mid-stream flow encoders by (IP version, re-create); None: not templatable
        self.mid_stream: dict[tuple[int, bool], _MidStreamWire | None] = {}


@dataclass(frozen=True, slots=True)
class Context:
    """Everything the flow builders need besides the Service itself (and, in ``encoders``,
    what they build it with)."""

    tables: pl.Tables
    generation: int
    standalone: bool = True
    # Affinity timeouts above this are expired by the agent's sweeper, not by OVS (tests lower
    # it to exercise the sweep with short timeouts).
    max_ovs_timeout: int = pl.OVS_MAX_TIMEOUT
    # Standalone: the node's host-SNAT address per family (see pipeline.py), if configured.
    host_snat: tuple[IPAddress, ...] = ()
    # Standalone: the node's own IPs; packets from them are marked "from the node" (in-cluster).
    node_ips: tuple[IPAddress, ...] = ()
    encoders: Encoders = field(default_factory=Encoders, compare=False, repr=False)

    def host_snat_ip(self, family: IPFamily) -> IPAddress | None:
        return next((ip for ip in self.host_snat if IPFamily.of(ip) == family), None)

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
        for ip in ctx.node_ips:
            # The node itself (through the gateway): an in-cluster client (see ServiceLB's
            # short-circuit for externalTrafficPolicy Local).
            family = IPFamily.of(ip)
            add(
                t.classifier,
                pl.PRIORITY_LOW,
                of.Match(**{"eth_type": eth_type(family), _src_field(family): ip}),
                (
                    of.ApplyActions((of.SetField(pl.FROM_NODE_REG, pl.FROM_NODE, pl.FROM_NODE),)),
                    of.GotoTable(t.conntrack_zone),
                ),
            )
        add(t.classifier, pl.PRIORITY_MISS, of.Match(), _goto(t.conntrack_zone))
    for family in IPFamily:
        snat_ip = ctx.host_snat_ip(family) if ctx.standalone else None
        if snat_ip is not None:
            # A reply to a node-originated Service connection SNATed to the host-SNAT address:
            # undo that SNAT first (its destination is the node again), then the Service zone.
            add(
                t.conntrack_zone,
                pl.PRIORITY_HIGH,
                of.Match(**{"eth_type": eth_type(family), _dst_field(family): snat_ip}),
                _apply(
                    of.CT(zone=pl.host_snat_ct_zone(family), table=t.conntrack_zone, nat=of.NAT())
                ),
            )
        if ctx.standalone:
            # A hairpin reply (to the virtual Service IP): undo its SNAT first, then it meets
            # the Service zone like any reply.
            add(
                t.conntrack_zone,
                pl.PRIORITY_HIGH,
                of.Match(
                    **{
                        "eth_type": eth_type(family),
                        _dst_field(family): pl.VIRTUAL_SERVICE_IP[family],
                    }
                ),
                _apply(
                    of.CT(zone=pl.hairpin_ct_zone(family), table=t.conntrack_zone, nat=of.NAT())
                ),
            )
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
            of.Match(eth_type=eth_type(family), ct_state=pl.CT_STATE_INVALID),
            (),
        )  # invalid: drop
        # ...except an RST: the agent flushes its entry, the endpoint gets it (stale_reset)
        add(
            t.conntrack_state,
            pl.PRIORITY_INVALID_RST,
            of.Match(
                eth_type=eth_type(family),
                ip_proto=IPPROTO_TCP,
                ct_state=pl.CT_STATE_INVALID,
                # RST without ACK: how a TCP answers a segment no connection of its owns
                # (RFC 9293 3.10.7.3), the stray ACK here; an abort of a live connection
                # carries ACK and stays dropped when invalid.
                tcp_flags=(TCP_RST, TCP_RST | TCP_ACK),
            ),
            _apply(
                of.MeteredController(
                    pl.INVALID_RST_MAX_LEN,
                    userdata=pl.INVALID_RST_USERDATA,
                    meter_id=pl.REJECT_METER_ID,
                ),
                of.Resubmit(t.forwarding),
            ),
        )
        # ...and a SYN-ACK, when no agent flushed that entry in time (or at all: an agent
        # restart). The endpoint answers the client's SYN retransmission, which met the entry
        # the stray ACK spoiled; its SYN-ACK is invalid there. A forced commit in the reply
        # direction deletes the entry (a SYN-ACK can create none); Open vSwitch refuses a
        # commit in a flow matching +inv, so the packet is marked STALE and resubmitted. The
        # SYN-ACK is then dropped (a Service connection's NAT went with the entry): the
        # client's next SYN retransmission starts a fresh entry (stale_reset).
        # A SYN conntrack calls invalid meets the entry of an earlier connection with the
        # same tuple that conntrack did not see end (one the stray ACK spoiled, on this node
        # or, a connection from another node, on the endpoint's): it goes on, NATed like that
        # entry, so the endpoint's answer can replace the entry (the SYN-ACK below).
        add(
            t.conntrack_state,
            pl.PRIORITY_INVALID_SYN,
            of.Match(
                eth_type=eth_type(family),
                ip_proto=IPPROTO_TCP,
                ct_state=pl.CT_STATE_INVALID,
                tcp_flags=(TCP_SYN, TCP_SYN | TCP_ACK | TCP_RST | TCP_FIN),
            ),
            _apply(of.Resubmit(t.forwarding)),
        )
        stale = pl.Selection.STALE.value_bits
        mark_stale = (
            of.SetField(pl.SELECTION_REG, stale, pl.SELECTION_MASK),
            of.Resubmit(t.conntrack_state),
        )
        syn_ack = {
            "eth_type": eth_type(family),
            "ip_proto": IPPROTO_TCP,
            "ct_state": pl.CT_STATE_INVALID,
            "tcp_flags": (TCP_SYN | TCP_ACK, TCP_SYN | TCP_ACK | TCP_RST),
        }
        invalid_syn_ack = of.Match(**syn_ack)
        add(t.conntrack_state, pl.PRIORITY_INVALID_SYN_ACK, invalid_syn_ack, _apply(*mark_stale))
        if ctx.standalone:
            # A local pod's SYN-ACK outside a Service connection (no NAT to undo: the endpoint
            # of a connection from another node) goes on as it is.
            add(
                t.conntrack_state,
                pl.PRIORITY_INVALID_POD_SYN_ACK,
                of.Match(
                    **syn_ack,
                    ct_mark=(0, pl.CT_MARK_SERVICE_MASK),
                    **{pl.FROM_POD_REG: (pl.FROM_POD, pl.FROM_POD)},
                ),
                _apply(*mark_stale, of.Resubmit(t.forwarding)),
            )
        add(
            t.conntrack_state,
            pl.PRIORITY_STALE_ENTRY,
            of.Match(
                eth_type=eth_type(family),
                ip_proto=IPPROTO_TCP,
                tcp_flags=(TCP_SYN | TCP_ACK, TCP_SYN | TCP_ACK | TCP_RST),
                **{pl.SELECTION_REG: (stale, pl.SELECTION_MASK)},
            ),
            _apply(of.CT(commit=True, force=True, zone=pl.ct_zone(family))),
        )
        # Established, related and reply packets skip Service selection.
        add(
            t.conntrack_state,
            pl.PRIORITY_NORMAL,
            of.Match(eth_type=eth_type(family), ct_state=(of.CT_TRK, of.CT_TRK | of.CT_NEW)),
            _apply(of.Resubmit(t.forwarding)),
        )
        if ctx.standalone:
            # A new TCP segment without SYN or RST: a connection conntrack picks up mid-stream
            # (its entry went with a vswitchd restart). Probe L3Forwarding for whether it goes
            # to a local pod, then select as usual: ServiceLB re-creates the translation of
            # one an endpoint sent (PRIORITY_MID_STREAM, mid_stream_flow).
            probe = of.SetField(pl.PROBE_REG, pl.PROBE, pl.PROBE)
            add(
                t.conntrack_state,
                pl.PRIORITY_MID_STREAM,
                of.Match(
                    eth_type=eth_type(family),
                    ip_proto=IPPROTO_TCP,
                    ct_state=(of.CT_TRK | of.CT_NEW, of.CT_TRK | of.CT_NEW),
                    tcp_flags=(0, TCP_SYN | TCP_RST),
                ),
                _apply(
                    probe,
                    of.Resubmit(t.forwarding),
                    of.SetField(pl.PROBE_REG, 0, pl.PROBE),
                    of.Resubmit(t.session_affinity),
                    of.Resubmit(t.service_lb),
                ),
            )
    # The hand-off to forwarding is a resubmit, never a goto_table: in integrated mode the
    # CNI's next table may come before ours (goto_table only goes forward).
    add(t.conntrack_zone, pl.PRIORITY_MISS, of.Match(), _apply(of.Resubmit(t.forwarding)))
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
    if ctx.standalone:
        # A new connection that is not to a Service is committed: its replies are then
        # established, not invalid (a SYN-ACK conntrack never saw the SYN of is +inv), and,
        # after a vswitchd restart, a mid-stream segment of it is told from one of a Service
        # connection whose entry was lost (only those are new: PRIORITY_MID_STREAM). Pod to
        # pod on this bridge too: a direct connection to an endpoint's port would otherwise
        # be new in every packet. (A Service connection whose translated tuple an entry of
        # such a direct connection holds gets another source port from conntrack's NAT.)
        for family in IPFamily:
            add(
                t.service_lb,
                pl.PRIORITY_COMMIT,
                of.Match(eth_type=eth_type(family)),
                _apply(of.CT(commit=True, zone=pl.ct_zone(family), table=t.forwarding)),
            )
    # An endpoint remembered by a learned affinity flow is checked by the frontend's own flows
    # in ServiceLB (see service_objects): a stale choice falls through to the group.
    add(t.service_lb, pl.PRIORITY_MISS, of.Match(), _apply(of.Resubmit(t.forwarding)))
    add(t.endpoint_dnat, pl.PRIORITY_MISS, of.Match(), _apply(of.Resubmit(t.forwarding)))
    if ctx.standalone:
        flows.extend(_to_node_flows(ctx, ck))
        # The mid-stream probe (PRIORITY_MID_STREAM) forwards nothing: a local pod's flow
        # marks TO_LOCAL_POD (pod_forwarding_flows), every other probe ends here.
        add(
            t.forwarding,
            pl.PRIORITY_PROBE_END,
            of.Match(**{pl.PROBE_REG: (pl.PROBE, pl.PROBE)}),
            (),
        )
        add(t.forwarding, pl.PRIORITY_MISS, of.Match(), _apply(of.Output(of.OFPP_NORMAL)))
    return flows


# Back out of the port it came in on (the gateway), addressed to the sender: the node kernel
# sent it to the virtual MAC, so its own MAC is the packet's source.
_BOUNCE_TO_SENDER = (
    of.CopyField("eth_src", "eth_dst"),
    of.SetField("eth_src", pl.VIRTUAL_MAC),
    of.Output(of.OFPP_IN_PORT),
)


def _to_node_flows(ctx: Context, ck: int) -> list[of.FlowMod]:
    """L3Forwarding for Service traffic the node itself sent (to the virtual MAC: the next hop
    of its Service routes and the host-SNAT address's neighbour) that is not for a local pod.

    * its request, DNATed to an endpoint on another node: SNATed to the host-SNAT address
      (other nodes route that address back to this node, and this node's kernel to the
      gateway, so the reply re-enters OVS to be un-NATed), then back out the gateway to the
      node's routing table;
    * the reply to that (or any Service connection's reply addressed to the node): back out
      the gateway, to the node's own MAC.
    """
    t = ctx.tables
    flows = []
    for family in IPFamily:
        et = eth_type(family)
        service = (pl.CT_MARK_SERVICE, pl.CT_MARK_SERVICE_MASK)
        flows.append(
            of.FlowMod(
                table_id=t.forwarding,
                priority=pl.PRIORITY_TO_NODE,
                match=of.Match(
                    eth_type=et,
                    eth_dst=pl.VIRTUAL_MAC,
                    ct_state=(of.CT_TRK | of.CT_RPL, of.CT_TRK | of.CT_RPL),
                    ct_mark=service,
                ),
                instructions=_apply(*_BOUNCE_TO_SENDER),
                cookie=ck,
            )
        )
        snat_ip = ctx.host_snat_ip(family)
        if snat_ip is None:
            continue
        src = "ipv4_src" if family == IPFamily.IPv4 else "ipv6_src"
        flows.append(
            of.FlowMod(
                table_id=t.forwarding,
                priority=pl.PRIORITY_HOST_SNAT_OUT,
                match=of.Match(**{"eth_type": et, "eth_dst": pl.VIRTUAL_MAC, src: snat_ip}),
                instructions=_apply(*_BOUNCE_TO_SENDER),
                cookie=ck,
            )
        )
        flows.append(
            of.FlowMod(
                table_id=t.forwarding,
                priority=pl.PRIORITY_HOST_SNAT,
                match=of.Match(
                    eth_type=et,
                    eth_dst=pl.VIRTUAL_MAC,
                    ct_state=(of.CT_TRK, of.CT_TRK | of.CT_RPL),
                    ct_mark=service,
                ),
                instructions=_apply(
                    of.CT(
                        commit=True,
                        zone=pl.host_snat_ct_zone(family),
                        table=t.forwarding,
                        nat=of.NAT(src=True, ip_min=snat_ip),
                    )
                ),
                cookie=ck,
            )
        )
    return flows


# -- forwarding to local pods (standalone) ------------------------------------------------
def pod_forwarding_flows(
    ctx: Context, ips: Iterable[IPAddress], mac: str, ofport: int
) -> list[of.FlowMod]:
    """Deliver to a pod on this bridge: the DNATed packet still carries the MAC the client
    sent it to (the gateway's, or the virtual next hop's), so set the pod's.

    Hairpin: a pod whose Service connection was DNATed to itself (source = destination) is
    SNATed to the virtual Service IP, so its reply comes back through OVS to be un-NATed, and
    is sent back out the port it came in on."""
    ck = ctx.cookie(pl.Category.FORWARDING)
    t = ctx.tables
    flows = []
    if t.classifier is not None:
        flows.append(
            of.FlowMod(
                table_id=t.classifier,
                priority=pl.PRIORITY_LOW,
                match=of.Match(in_port=ofport),
                instructions=(
                    of.ApplyActions((of.SetField(pl.FROM_POD_REG, pl.FROM_POD, pl.FROM_POD),)),
                    of.GotoTable(t.conntrack_zone),
                ),
                cookie=ck,
            )
        )
    for ip in ips:
        family = IPFamily.of(ip)
        src = "ipv4_src" if family == IPFamily.IPv4 else "ipv6_src"
        to_pod = {"eth_type": eth_type(family), _dst_field(family): ip}
        if t.classifier is not None:
            # The pod's address arriving from anywhere but its port (the gateway: a node
            # kernel routing one of our packets back in) is dropped: its conntrack entry would
            # take the reply of the pod's real connection.
            flows.append(
                of.FlowMod(
                    table_id=t.classifier,
                    priority=pl.PRIORITY_SPOOFED,
                    match=of.Match(eth_type=eth_type(family), **{src: ip}),
                    instructions=(),
                    cookie=ck,
                )
            )
        flows.append(
            of.FlowMod(
                table_id=t.forwarding,
                priority=pl.PRIORITY_LOCAL_POD_PROBE,
                match=of.Match(**to_pod, **{pl.PROBE_REG: (pl.PROBE, pl.PROBE)}),
                instructions=_apply(
                    of.SetField(pl.TO_LOCAL_POD_REG, pl.TO_LOCAL_POD, pl.TO_LOCAL_POD)
                ),
                cookie=ck,
            )
        )
        flows.append(
            of.FlowMod(
                table_id=t.forwarding,
                priority=pl.PRIORITY_HAIRPIN_SNAT,
                match=of.Match(in_port=ofport, **to_pod, **{src: ip}),
                instructions=_apply(
                    of.CT(
                        commit=True,
                        zone=pl.hairpin_ct_zone(family),
                        table=t.forwarding,
                        nat=of.NAT(src=True, ip_min=pl.VIRTUAL_SERVICE_IP[family]),
                    )
                ),
                cookie=ck,
            )
        )
        flows.append(
            of.FlowMod(
                table_id=t.forwarding,
                priority=pl.PRIORITY_HAIRPIN_OUT,
                match=of.Match(in_port=ofport, **to_pod),
                instructions=_apply(of.SetField("eth_dst", mac), of.Output(of.OFPP_IN_PORT)),
                cookie=ck,
            )
        )
        flows.append(
            of.FlowMod(
                table_id=t.forwarding,
                priority=pl.PRIORITY_NORMAL,
                match=of.Match(**to_pod),
                instructions=_apply(of.SetField("eth_dst", mac), of.Output(ofport)),
                cookie=ck,
            )
        )
    return flows


# -- Services -----------------------------------------------------------------------------
# A bucket is kept as the encoding of its actions (``BucketSpec.wire``: the endpoint's address
# into a register, then the actions every bucket of that port and affinity shares), built in
# one struct call per endpoint: no value per endpoint, and no cache of them (a cache of every
# endpoint's bucket values was the largest single cost of a 10,000-Service cluster; bench
# ``memory``). Equal encodings compare in C (memcmp), so a re-built Service stages for free.
_new_tuple = tuple.__new__


# A Service's buckets in its groups (``BucketSpec.key``) and its EndpointDNAT flows are keyed
# by one int: address << 17 | port << 1 | (1 for IPv6). An int hashes in C (an (ipaddress,
# port) key hashes in Python, per endpoint) and costs one object (a tuple of three costs two
# more). The address is read as the codec reads it (``ip._ip``: the int ``int(ip)`` returns,
# without the call).
EndpointKey = int
_IPV4 = ipaddress.IPv4Address


def endpoint_key(ip: IPAddress, port: int) -> EndpointKey:
    address: int = ip._ip  # type: ignore[union-attr]  # hot path, see above
    return address << 17 | port << 1 | (type(ip) is not _IPV4)


def _bucket_tail(port: int, affinity: bool, tables: pl.Tables) -> tuple[of.Action, ...]:
    state = pl.Selection.TO_LEARN if affinity else pl.Selection.SELECTED
    return (
        of.SetField(
            pl.ENDPOINT_PORT_REG, port | state.value_bits, pl.ENDPOINT_PORT_MASK | pl.SELECTION_MASK
        ),
        of.Resubmit(tables.service_lb if affinity else tables.endpoint_dnat),
    )


def _new_bucket_wire(
    makers: dict[tuple[int, bool, int], _BucketWire],
    port: int,
    affinity: bool,
    version: int,
    tables: pl.Tables,
) -> _BucketWire:
    tail = b"".join([a.wire for a in _bucket_tail(port, affinity, tables)])
    reg = pl.ENDPOINT_IP_REG if version == 4 else pl.ENDPOINT_IP6_REG
    make = makers[port, affinity, version] = templates.set_field_exact_wire(reg, tail)
    return make


def endpoint_bucket_wire(ip: IPAddress, port: int, affinity: bool, ctx: Context) -> bytes:
    """A bucket's actions, encoded: endpoint address into reg3/xxreg3, port and selection
    state into reg4 (one masked set_field), then on to EndpointDNAT (or back to ServiceLB to
    learn affinity)."""
    version = 4 if type(ip) is _IPV4 else 6
    makers = ctx.encoders.buckets
    make = makers.get((port, affinity, version))
    if make is None:
        make = _new_bucket_wire(makers, port, affinity, version, ctx.tables)
    return make(ip._ip)  # type: ignore[union-attr]


def endpoint_bucket_actions(
    ip: IPAddress, port: int, affinity: bool, ctx: Context
) -> tuple[of.Action, ...]:
    """``endpoint_bucket_wire`` as values."""
    wire = endpoint_bucket_wire(ip, port, affinity, ctx)
    return decode_actions(wire, 0, len(wire))


_CT_MARK_SERVICE = of.SetField("ct_mark", pl.CT_MARK_SERVICE, pl.CT_MARK_SERVICE_MASK)


def _dnat_template(ctx: Context, version: int, protocol: Protocol) -> templates.EndpointDnatFlows:
    """The EndpointDNAT flows of one family and protocol (the codec's fast constructor)."""
    family = IPFamily(version)
    return templates.EndpointDnatFlows(
        ctx.tables.endpoint_dnat,
        pl.PRIORITY_NORMAL,
        ctx.cookie(pl.Category.ENDPOINT),
        version=version,
        ip_proto=protocol.ip_proto,
        ip_field=pl.endpoint_ip_reg(family),
        port_field=pl.ENDPOINT_PORT_REG,
        port_mask=pl.ENDPOINT_PORT_MASK,
        zone=pl.ct_zone(family),
        ct_table=ctx.tables.forwarding,
        ct_actions=(_CT_MARK_SERVICE,),
    )


def _frontend_template(ctx: Context, version: int, protocol: Protocol) -> templates.FrontendFlows:
    """ServiceLB's group (or reject/drop) flows of one family and protocol."""
    family = IPFamily(version)
    return templates.FrontendFlows(
        ctx.tables.service_lb,
        pl.PRIORITY_LOW,
        ctx.cookie(pl.Category.SERVICE),
        version=version,
        ip_proto=protocol.ip_proto,
        ip_field=_dst_field(family),
        port_field=_PORT_FIELD[protocol],
    )


def _templates(ctx: Context, protocol: Protocol) -> tuple[_DnatTemplates, _FrontendTemplates]:
    """The context's EndpointDNAT and ServiceLB templates of a protocol, by IP version."""
    by_protocol = ctx.encoders.by_protocol
    found = by_protocol.get(protocol)
    if found is None:
        found = by_protocol[protocol] = (
            {v: _dnat_template(ctx, v, protocol) for v in (4, 6)},
            {v: _frontend_template(ctx, v, protocol) for v in (4, 6)},
        )
    return found


# EndpointDNAT flows are not cached: the datapath keeps what it was given as its encoding
# only, and a cache of the values would keep every flow's value tree (several times its
# bytes) alive as well.
def endpoint_dnat_flow(ctx: Context, ip: IPAddress, port: int, protocol: Protocol) -> of.FlowMod:
    """EndpointDNAT: ct(commit, zone=Z, nat(dst=IP:PORT), exec(ct_mark)) then Forwarding."""
    return _templates(ctx, protocol)[0][ip.version].flow(int(ip), port)


def mid_stream_flow(
    ctx: Context, ip: IPAddress, port: int, frontends: Iterable[tuple[IPAddress, int]]
) -> of.FlowMod:
    """ServiceLB (standalone): a TCP segment without SYN, new to conntrack, from the endpoint
    ``ip:port`` to a local pod (the probe's TO_LOCAL_POD) is a Service connection whose entry
    the switch lost, seen from the server's side. With exactly one frontend (address, port)
    mapping to this endpoint, ``ct(commit, nat(src=frontend))`` re-creates the translation the
    client's socket expects (the entry's reply direction is its next packet to the frontend,
    un-NATed to the endpoint); with more than one it is dropped: the client's next packet
    picks the connection up through the group (the same endpoint: the same bucket ids)."""
    family = IPFamily.of(ip)
    unique = sorted(set(frontends), key=lambda f: (f[0].version, int(f[0]), f[1]))
    match = of.Match(
        **{
            "eth_type": eth_type(family),
            "ip_proto": IPPROTO_TCP,
            _src_field(family): ip,
            "tcp_src": port,
            pl.TO_LOCAL_POD_REG: (pl.TO_LOCAL_POD, pl.TO_LOCAL_POD),
        }
    )
    instructions: tuple[of.Instruction, ...] = ()
    if len(unique) == 1:
        frontend, frontend_port = unique[0]
        instructions = _apply(
            of.CT(
                commit=True,
                zone=pl.ct_zone(family),
                table=ctx.tables.forwarding,
                nat=of.NAT(src=True, ip_min=frontend, port_min=frontend_port),
                actions=(_CT_MARK_SERVICE,),
            )
        )
    return of.FlowMod(
        table_id=ctx.tables.service_lb,
        priority=pl.PRIORITY_MID_STREAM,
        match=match,
        instructions=instructions,
        cookie=ctx.cookie(pl.Category.ENDPOINT),
    )


# mid_stream_flow's encoding for many endpoints (one flow per TCP endpoint in a full sync):
# the flow of sample values, encoded once by the generic constructors, with the endpoint's
# and the frontend's address and port written at their places (the places of sample values
# that occur once in it; checked against a second generic encoding, else generic for good).
_SAMPLES = {
    4: (
        (
            ipaddress.ip_address("10.241.226.211"),
            0xB7C5,
            ipaddress.ip_address("10.193.178.163"),
            0x9D8E,
        ),
        (ipaddress.ip_address("10.17.34.51"), 0x1357, ipaddress.ip_address("10.68.85.102"), 0x2468),
    ),
    6: (
        (
            ipaddress.ip_address("fd5b:a7c3:91e2:d4f6:08b1:3c5e:7a9d:2f64"),
            0xB7C5,
            ipaddress.ip_address("fd3e:c1a9:57d2:e8b4:6f03:9a1c:d5e7:4b28"),
            0x9D8E,
        ),
        (ipaddress.ip_address("fd00::1"), 0x1357, ipaddress.ip_address("fd00::2"), 0x2468),
    ),
}
_MidStreamWire = Callable[[IPAddress, int, IPAddress, int], bytes]


def _mid_stream_wire(ctx: Context, version: int, recreate: bool) -> _MidStreamWire | None:
    """A fast ``mid_stream_flow(...).wire`` for one family and kind (None: not templatable)."""

    def generic(ip: IPAddress, port: int, frontend: IPAddress, frontend_port: int) -> bytes:
        fronts = [(frontend, frontend_port)] * (1 if recreate else 2)
        if not recreate:  # two frontends: the drop
            fronts[1] = (frontend, frontend_port + 1 if frontend_port < 0xFFFF else 1)
        return mid_stream_flow(ctx, ip, port, fronts).wire

    sample, check = _SAMPLES[version]
    proto = generic(*sample)
    values = [(sample[0].packed, 0), (sample[1].to_bytes(2, "big"), 1)]
    if recreate:
        values += [(sample[2].packed, 2), (sample[3].to_bytes(2, "big"), 3)]
    places: list[tuple[int, int, int]] = []
    for raw, which in values:
        at = proto.find(raw)
        if at < 0 or proto.find(raw, at + 1) >= 0:
            return None
        places.append((at, at + len(raw), which))

    def fast(ip: IPAddress, port: int, frontend: IPAddress, frontend_port: int) -> bytes:
        wire = bytearray(proto)
        args = (
            ip.packed,
            port.to_bytes(2, "big"),
            frontend.packed,
            frontend_port.to_bytes(2, "big"),
        )
        for start, end, which in places:
            wire[start:end] = args[which]
        return bytes(wire)

    if fast(*check) != generic(*check):
        return None
    return fast


def mid_stream_wire(
    ctx: Context, ip: IPAddress, port: int, frontends: Collection[tuple[IPAddress, int]]
) -> bytes:
    """``mid_stream_flow(ctx, ip, port, frontends).wire``, several times cheaper."""
    recreate = len(frontends) == 1
    made = ctx.encoders.mid_stream
    key = (ip.version, recreate)
    if key not in made:
        made[key] = _mid_stream_wire(ctx, ip.version, recreate)
    fast = made[key]
    if fast is None:
        return mid_stream_flow(ctx, ip, port, frontends).wire
    frontend, frontend_port = next(iter(frontends)) if recreate else (ip, 1)
    return fast(ip, port, frontend, frontend_port)


def service_frontend_ips(port: ServicePort, family: IPFamily) -> tuple[IPAddress, ...]:
    """ClusterIPs, externalIPs and load-balancer ingress IPs of one family."""
    seen: dict[IPAddress, None] = {}
    for ip in (*port.cluster_ips, *port.external_ips, *port.load_balancer_ips):
        if ip.version == family:
            seen.setdefault(ip, None)
    return tuple(seen)


def affinity_timeouts(timeout: int, max_ovs: int = pl.OVS_MAX_TIMEOUT) -> tuple[int, bool]:
    """How a ClientIP affinity timeout is realised: (learned flows' idle_timeout, swept).

    kube-proxy's timer restarts with every new connection of the client (iptables ``recent``
    --set on each new connection), so the learned flow gets an *idle* timeout: it is hit by the
    first packet of each new connection only (established packets skip selection). Up to OVS's
    16-bit limit OVS expires it; above it (Kubernetes allows 86,400 s) the flow has no OVS
    timeout and the agent's sweeper deletes it once its idle age reaches the timeout (the cookie
    carries the timeout and the swept flag).
    """
    if timeout <= 0:
        return 0, False
    if timeout <= max_ovs:
        return timeout, False
    return 0, True


def _learn_affinity(ctx: Context, port: ServicePort, family: IPFamily) -> of.Learn:
    """Remember client -> endpoint in SessionAffinity, refreshed by each new connection."""
    src = "ipv4_src" if family == IPFamily.IPv4 else "ipv6_src"
    dst = _dst_field(family)
    reg = pl.endpoint_ip_reg(family)
    idle, swept = affinity_timeouts(port.affinity_timeout, ctx.max_ovs_timeout)
    return of.Learn(
        table=ctx.tables.session_affinity,
        priority=pl.PRIORITY_NORMAL,
        idle_timeout=idle,
        cookie=pl.learned_cookie(port.affinity_timeout, swept),
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


def frontend_match(
    port: ServicePort, ip: IPAddress, l4_port: int | None = None, **extra: object
) -> of.Match:
    """ServiceLB's match for one frontend (ClusterIP, external or load-balancer IP: the
    Service's port; the virtual NodePort IP: ``l4_port``, the nodePort)."""
    family = IPFamily.of(ip)
    return of.Match(
        **{
            "eth_type": eth_type(family),
            "ip_proto": port.protocol.ip_proto,
            _dst_field(family): ip,
            _PORT_FIELD[port.protocol]: port.port if l4_port is None else l4_port,
            **extra,
        }
    )


def learned_flows_delete(
    ctx: Context, port: ServicePort, ip: IPAddress, l4_port: int | None = None
) -> of.FlowMod:
    """Delete every learned affinity flow of one frontend (non-strict: any client)."""
    return of.FlowMod.delete(
        ctx.tables.session_affinity,
        frontend_match(port, ip, l4_port),
        cookie=pl.learned_cookie(),
        cookie_mask=pl.LEARNED_CATEGORY_MASK,
    )


# Every select group uses Open vSwitch's "hash" method over the connection's 5-tuple:
# highest random weight per bucket id, so inserting or removing a bucket moves only the
# connections that bucket wins or had, and each new connection is translated afresh (also
# against just-learned affinity flows). OVS's default method, dp_hash, sends every new
# connection to a bucket added by INSERT_BUCKET until the next MODIFY (OVS 3.1); "hash"
# without fields is OVS's symmetric L4 hash, which leaves UDP ports out (one UDP client,
# one endpoint, however many sockets). OVS skips a listed field whose prerequisites the
# packet does not meet (ofproto-dpif-xlate.c, pick_hash_fields_select_group), so one list
# serves TCP, UDP and SCTP over IPv4 and IPv6; it is in OVS's field order, as dump-groups
# prints it.
CONNECTION_HASH_FIELDS = (
    "ipv4_src",
    "ipv4_dst",
    "ipv6_src",
    "ipv6_dst",
    "ip_proto",
    "tcp_src",
    "tcp_dst",
    "udp_src",
    "udp_dst",
    "sctp_src",
    "sctp_dst",
)
GROUP_SELECTION_METHOD = SelectionMethod("hash", CONNECTION_HASH_FIELDS)


@dataclass(frozen=True, slots=True)
class FrontendSet:
    """Frontends of one family that share one endpoint set and one select group: the
    ClusterIPs (internal traffic policy), or external and load-balancer IPs and the NodePort
    (external traffic policy)."""

    frontends: tuple[IPAddress, ...]  # matched with the Service's port
    group_id: int
    endpoints: tuple[Endpoint, ...]
    # What the frontends do while `endpoints` is empty: reject (the agent's controller action)
    # or, when empty, drop.
    empty_actions: tuple[of.Action, ...] = ()
    # The virtual NodePort IP of this family, matched with the Service's nodePort (at most one).
    node_port_frontends: tuple[IPAddress, ...] = ()
    # externalTrafficPolicy Local: in-cluster clients (from a local pod or the node) of these
    # frontends go to this group instead, with its endpoints (kube-proxy's short-circuit);
    # 0: no short-circuit.
    in_cluster_group: int = 0
    in_cluster_endpoints: tuple[Endpoint, ...] = ()
    in_cluster_empty_actions: tuple[of.Action, ...] = ()
    # Only the group (for another set's short-circuit), no frontends of its own.
    group_only: bool = False

    def frontend_ports(self, port: ServicePort) -> list[tuple[IPAddress, int]]:
        """(address, L4 port) of every frontend."""
        out = [(ip, port.port) for ip in self.frontends]
        out += [(ip, port.node_port) for ip in self.node_port_frontends]
        return out


@dataclass(frozen=True, slots=True)
class ServiceObjects:
    groups: tuple[GroupSpec, ...]
    # what ``Datapath.stage`` takes: the EndpointDNAT flows as their encodings only
    staged: tuple[of.FlowMod | EncodedFlow, ...]

    @property
    def flows(self) -> tuple[of.FlowMod, ...]:
        """The flows as values (decoded where staged encoded)."""
        return tuple(
            of.decode_flow_mod(f.wire) if type(f) is EncodedFlow else f  # type: ignore[misc]
            for f in self.staged
        )


def frontend_objects(
    ctx: Context, port: ServicePort, sets: Sequence[FrontendSet]
) -> ServiceObjects:
    """Groups and flows of one Service port. Per frontend F, in ServiceLB:

    * priority LOW: F -> group (any selection state: a new connection, or a learned choice
      that is no longer valid); with no endpoints, the reject action or drop;
    * with session affinity, priority NORMAL: F + "selected, learn it" (from a bucket) ->
      learn, then EndpointDNAT; and per endpoint E, F + "selected" + E (a learned choice that
      is still one of F's endpoints) -> EndpointDNAT. A learned choice whose endpoint left
      matches none of these and falls to the group, which picks and learns a live endpoint:
      the client moves at once, other clients keep their affinity.
    """
    t = ctx.tables
    groups: list[GroupSpec] = []
    flows: list[of.FlowMod] = []
    svc_cookie = ctx.cookie(pl.Category.SERVICE)
    affinity = port.session_affinity
    dnat_templates, frontend_templates = _templates(ctx, port.protocol)
    makers = ctx.encoders.buckets
    ipv4 = _IPV4
    # The EndpointDNAT flows of the port's endpoints, each once.
    dnat: dict[EndpointKey, EncodedFlow] = {}
    for fset in sets:
        if not (fset.frontends or fset.node_port_frontends or fset.group_only):
            continue
        buckets: list[BucketSpec] = []
        append = buckets.append
        for ep in fset.endpoints:
            ip = ep.ip
            ep_port = ep.port
            address = ip._ip  # type: ignore[union-attr]  # hot: see endpoint_key
            if type(ip) is ipv4:
                version = 4
                key = address << 17 | ep_port << 1
            else:
                version = 6
                key = address << 17 | ep_port << 1 | 1
            make = makers.get((ep_port, affinity, version))
            if make is None:
                make = _new_bucket_wire(makers, ep_port, affinity, version, t)
            # BucketSpec(key, wire, weight), in C
            append(_new_tuple(BucketSpec, (key, make(address), 100)))
            if key not in dnat:
                dnat[key] = _new_tuple(EncodedFlow, dnat_templates[version].keyed(address, ep_port))
        # GroupSpec(group_id, buckets, selection_method): see GROUP_SELECTION_METHOD.
        groups.append(
            _new_tuple(GroupSpec, (fset.group_id, tuple(buckets), GROUP_SELECTION_METHOD))
        )
        # To the group; with no endpoints, the reject action or (empty) drop.
        actions = (of.GroupAction(fset.group_id),) if fset.endpoints else tuple(fset.empty_actions)
        short_circuit: tuple[of.Action, ...] = ()
        if fset.in_cluster_group:
            short_circuit = (
                (of.GroupAction(fset.in_cluster_group),)
                if fset.in_cluster_endpoints
                else tuple(fset.in_cluster_empty_actions)
            )
        for ip, l4_port in fset.frontend_ports(port):
            address = ip._ip  # type: ignore[union-attr]  # hot path: see endpoint_key
            flows.append(frontend_templates[ip.version].flow(address, l4_port, actions))
            if fset.in_cluster_group:
                flows.extend(_short_circuit_flows(ctx, port, ip, l4_port, short_circuit))
            if not (affinity and (fset.endpoints or fset.in_cluster_endpoints)):
                continue
            family = IPFamily.of(ip)
            selection = pl.SELECTION_REG
            flows.append(
                of.FlowMod(
                    table_id=t.service_lb,
                    priority=pl.PRIORITY_NORMAL,
                    match=frontend_match(
                        port,
                        ip,
                        l4_port,
                        **{selection: (pl.Selection.TO_LEARN.value_bits, pl.SELECTION_MASK)},
                    ),
                    instructions=_apply(
                        _learn_affinity(ctx, port, family),
                        of.SetField(selection, pl.Selection.SELECTED.value_bits, pl.SELECTION_MASK),
                        of.Resubmit(t.endpoint_dnat),
                    ),
                    cookie=svc_cookie,
                )
            )
            for ep in fset.endpoints:
                flows.append(_accept_learned(ctx, port, ip, l4_port, ep))
            # A learned choice of an in-cluster client among the cluster endpoints that are
            # not this set's (externalTrafficPolicy Local: those are the local ones).
            own = {(e.ip, e.port) for e in fset.endpoints}
            for ep in fset.in_cluster_endpoints:
                if (ep.ip, ep.port) in own:
                    continue
                for bit in (pl.FROM_POD, pl.FROM_NODE):
                    flows.append(
                        _accept_learned(ctx, port, ip, l4_port, ep, **{pl.FROM_POD_REG: (bit, bit)})
                    )
    return ServiceObjects(tuple(groups), (*flows, *dnat.values()))


def _accept_learned(
    ctx: Context,
    port: ServicePort,
    ip: IPAddress,
    l4_port: int,
    ep: Endpoint,
    **extra: object,
) -> of.FlowMod:
    """ServiceLB: a learned choice of ``ep`` for this frontend is still valid: EndpointDNAT."""
    family = IPFamily.of(ip)
    return of.FlowMod(
        table_id=ctx.tables.service_lb,
        priority=pl.PRIORITY_NORMAL,
        match=frontend_match(
            port,
            ip,
            l4_port,
            **{
                pl.endpoint_ip_reg(family): _ip_value(ep.ip),
                pl.ENDPOINT_PORT_REG: (
                    ep.port | pl.Selection.SELECTED.value_bits,
                    pl.ENDPOINT_PORT_MASK | pl.SELECTION_MASK,
                ),
                **extra,
            },
        ),
        instructions=_apply(of.Resubmit(ctx.tables.endpoint_dnat)),
        cookie=ctx.cookie(pl.Category.SERVICE),
    )


def _short_circuit_flows(
    ctx: Context,
    port: ServicePort,
    ip: IPAddress,
    l4_port: int,
    actions: tuple[of.Action, ...],
) -> list[of.FlowMod]:
    """ServiceLB: an in-cluster client (a local pod, or the node) of an external frontend
    with externalTrafficPolicy Local -> the cluster endpoints' group (one flow per reg0 bit)."""
    return [
        of.FlowMod(
            table_id=ctx.tables.service_lb,
            priority=pl.PRIORITY_SHORT_CIRCUIT,
            match=frontend_match(port, ip, l4_port, **{pl.FROM_POD_REG: (bit, bit)}),
            instructions=_apply(*actions) if actions else (),
            cookie=ctx.cookie(pl.Category.SERVICE),
        )
        for bit in (pl.FROM_POD, pl.FROM_NODE)
    ]


def service_objects(
    ctx: Context,
    port: ServicePort,
    endpoints: Sequence[Endpoint],
    group_ids: dict[IPFamily, int],
    reject_action: tuple[of.Action, ...] = (),
) -> ServiceObjects:
    """Groups and flows for one Service port whose frontends all use `endpoints` (after
    categorisation); `group_ids` has an id for every family the Service has frontends in.
    Without endpoints of a family, its frontends get `reject_action` (empty: drop)."""
    sets = [
        FrontendSet(
            frontends=service_frontend_ips(port, family),
            group_id=group_id,
            endpoints=tuple(ep for ep in endpoints if ep.ip.version == family),
            empty_actions=reject_action,
        )
        for family, group_id in sorted(group_ids.items())
    ]
    return frontend_objects(ctx, port, sets)
