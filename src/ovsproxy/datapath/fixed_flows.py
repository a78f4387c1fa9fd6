"""The fixed pipeline: the flows installed once per pipeline context, whatever the Services
(table-miss flows, the classifier, conntrack, the reply path, the invalid-TCP checks, the
standalone forwarding to and from the node), as values.

Pure: a ``Context`` in, flows out; the proxier stages them under one owner.
"""

from __future__ import annotations

from collections.abc import Sequence

from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath.flow_context import (
    ETH_ARP,
    ETH_IPV6,
    IPPROTO_ICMPV6,
    IPPROTO_TCP,
    ND_TYPES,
    TCP_ACK,
    TCP_FIN,
    TCP_RST,
    TCP_SYN,
    Context,
    apply_actions,
    dst_field,
    eth_type,
    goto,
    src_field,
)
from ovsproxy.model import IPFamily
from ovsproxy.openflow import protocol as of


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
            apply_actions(of.Output(of.OFPP_NORMAL)),
        )
        for nd_type in ND_TYPES:
            add(
                t.classifier,
                pl.PRIORITY_NORMAL,
                of.Match(eth_type=ETH_IPV6, ip_proto=IPPROTO_ICMPV6, icmpv6_type=nd_type),
                apply_actions(of.Output(of.OFPP_NORMAL)),
            )
        for ip in ctx.node_ips:
            # The node itself (through the gateway): an in-cluster client (see ServiceLB's
            # short-circuit for externalTrafficPolicy Local).
            family = IPFamily.of(ip)
            add(
                t.classifier,
                pl.PRIORITY_LOW,
                of.Match(**{"eth_type": eth_type(family), src_field(family): ip}),
                (
                    of.ApplyActions((of.SetField(pl.FROM_NODE_REG, pl.FROM_NODE, pl.FROM_NODE),)),
                    of.GotoTable(t.conntrack_zone),
                ),
            )
        add(t.classifier, pl.PRIORITY_MISS, of.Match(), goto(t.conntrack_zone))
    for family in IPFamily:
        snat_ip = ctx.host_snat_ip(family) if ctx.standalone else None
        if snat_ip is not None:
            # A reply to a node-originated Service connection SNATed to the host-SNAT address:
            # undo that SNAT first (its destination is the node again), then the Service zone.
            add(
                t.conntrack_zone,
                pl.PRIORITY_HIGH,
                of.Match(**{"eth_type": eth_type(family), dst_field(family): snat_ip}),
                apply_actions(
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
                        dst_field(family): pl.VIRTUAL_SERVICE_IP[family],
                    }
                ),
                apply_actions(
                    of.CT(zone=pl.hairpin_ct_zone(family), table=t.conntrack_zone, nat=of.NAT())
                ),
            )
        # Un-NAT replies and re-apply NAT to established Service connections.
        add(
            t.conntrack_zone,
            pl.PRIORITY_NORMAL,
            of.Match(eth_type=eth_type(family)),
            apply_actions(of.CT(zone=pl.ct_zone(family), table=t.conntrack_state, nat=of.NAT())),
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
            apply_actions(
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
            apply_actions(of.Resubmit(t.forwarding)),
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
        add(
            t.conntrack_state,
            pl.PRIORITY_INVALID_SYN_ACK,
            invalid_syn_ack,
            apply_actions(*mark_stale),
        )
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
                apply_actions(*mark_stale, of.Resubmit(t.forwarding)),
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
            apply_actions(of.CT(commit=True, force=True, zone=pl.ct_zone(family))),
        )
        # Established, related and reply packets skip Service selection.
        add(
            t.conntrack_state,
            pl.PRIORITY_NORMAL,
            of.Match(eth_type=eth_type(family), ct_state=(of.CT_TRK, of.CT_TRK | of.CT_NEW)),
            apply_actions(of.Resubmit(t.forwarding)),
        )
        if ctx.mid_stream:
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
                apply_actions(
                    probe,
                    of.Resubmit(t.forwarding),
                    of.SetField(pl.PROBE_REG, 0, pl.PROBE),
                    of.Resubmit(t.session_affinity),
                    of.Resubmit(t.service_lb),
                ),
            )
    # The hand-off to forwarding is a resubmit, never a goto_table: in integrated mode the
    # CNI's next table may come before ours (goto_table only goes forward).
    add(t.conntrack_zone, pl.PRIORITY_MISS, of.Match(), apply_actions(of.Resubmit(t.forwarding)))
    # New connections: SessionAffinity and ServiceLB are entered by resubmit, so a learned
    # affinity flow (which can only load registers) returns here and ServiceLB runs next.
    add(
        t.conntrack_state,
        pl.PRIORITY_MISS,
        of.Match(),
        apply_actions(of.Resubmit(t.session_affinity), of.Resubmit(t.service_lb)),
    )
    add(
        t.session_affinity,
        pl.PRIORITY_MISS,
        of.Match(),
        apply_actions(
            of.SetField(pl.SELECTION_REG, pl.Selection.TO_SELECT.value_bits, pl.SELECTION_MASK)
        ),
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
                apply_actions(of.CT(commit=True, zone=pl.ct_zone(family), table=t.forwarding)),
            )
    # An endpoint remembered by a learned affinity flow is checked by the frontend's own flows
    # in ServiceLB (see service_objects): a stale choice falls through to the group.
    add(t.service_lb, pl.PRIORITY_MISS, of.Match(), apply_actions(of.Resubmit(t.forwarding)))
    add(t.endpoint_dnat, pl.PRIORITY_MISS, of.Match(), apply_actions(of.Resubmit(t.forwarding)))
    if ctx.standalone:
        flows.extend(_to_node_flows(ctx, ck))
    if ctx.mid_stream:
        # The mid-stream probe (PRIORITY_MID_STREAM) forwards nothing: a local pod's flow
        # marks TO_LOCAL_POD (pod_forwarding_flows), every other probe ends here.
        add(
            t.forwarding,
            pl.PRIORITY_PROBE_END,
            of.Match(**{pl.PROBE_REG: (pl.PROBE, pl.PROBE)}),
            (),
        )
    if ctx.standalone:
        add(t.forwarding, pl.PRIORITY_MISS, of.Match(), apply_actions(of.Output(of.OFPP_NORMAL)))
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
                instructions=apply_actions(*_BOUNCE_TO_SENDER),
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
                instructions=apply_actions(*_BOUNCE_TO_SENDER),
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
                instructions=apply_actions(
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
