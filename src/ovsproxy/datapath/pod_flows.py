"""Forwarding to a pod on this bridge (standalone): its port's classifier flow, the delivery
flows of its addresses and the hairpin, as values.

Pure: a ``Context`` and the pod (addresses, MAC, OpenFlow port) in, flows out; the proxier
stages them under the pod's owner.
"""

from __future__ import annotations

from collections.abc import Iterable

from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath.flow_context import (
    Context,
    apply_actions,
    dst_field,
    eth_type,
)
from ovsproxy.model import IPAddress, IPFamily
from ovsproxy.openflow import protocol as of


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
        to_pod = {"eth_type": eth_type(family), dst_field(family): ip}
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
        if ctx.mid_stream:
            flows.append(
                of.FlowMod(
                    table_id=t.forwarding,
                    priority=pl.PRIORITY_LOCAL_POD_PROBE,
                    match=of.Match(**to_pod, **{pl.PROBE_REG: (pl.PROBE, pl.PROBE)}),
                    instructions=apply_actions(
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
                instructions=apply_actions(
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
                instructions=apply_actions(of.SetField("eth_dst", mac), of.Output(of.OFPP_IN_PORT)),
                cookie=ck,
            )
        )
        flows.append(
            of.FlowMod(
                table_id=t.forwarding,
                priority=pl.PRIORITY_NORMAL,
                match=of.Match(**to_pod),
                instructions=apply_actions(of.SetField("eth_dst", mac), of.Output(ofport)),
                cookie=ck,
            )
        )
    return flows
