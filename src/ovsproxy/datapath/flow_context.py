"""What every flow builder shares: the pipeline context (``Context``: tables, generation, the
node's addresses, the encoders the Service builders fill), the packet constants and the
match/instruction helpers of ``fixed_flows``, ``pod_flows`` and ``service_flows``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ovsproxy.datapath import pipeline as pl
from ovsproxy.model import IPAddress, IPFamily, Protocol
from ovsproxy.openflow import protocol as of
from ovsproxy.openflow.protocol import templates

ETH_IPV4 = 0x0800
ETH_IPV6 = 0x86DD
ETH_ARP = 0x0806
IPPROTO_ICMPV6 = 58
IPPROTO_TCP = 6
TCP_FIN, TCP_SYN, TCP_RST, TCP_ACK = 0x001, 0x002, 0x004, 0x010  # tcp_flags bits
ND_TYPES = (133, 134, 135, 136)  # router/neighbour solicitation and advertisement


def eth_type(family: IPFamily) -> int:
    return ETH_IPV4 if family == IPFamily.IPv4 else ETH_IPV6


def dst_field(family: IPFamily) -> str:
    return "ipv4_dst" if family == IPFamily.IPv4 else "ipv6_dst"


def src_field(family: IPFamily) -> str:
    return "ipv4_src" if family == IPFamily.IPv4 else "ipv6_src"


def goto(table: int) -> tuple[of.Instruction, ...]:
    return (of.GotoTable(table),)


def apply_actions(*actions: of.Action) -> tuple[of.Instruction, ...]:
    return (of.ApplyActions(tuple(actions)),)


# A bucket's actions as bytes: the endpoint address goes in.
BucketWire = Callable[[int], bytes]
DnatTemplates = dict[int, templates.EndpointDnatFlows]
FrontendTemplates = dict[int, templates.FrontendFlows]
# A mid-stream flow as bytes: the endpoint (``service_flows.endpoint_key``), the frontend
# and its port go in.
MidStreamWire = Callable[[int, IPAddress, int], bytes]


class Encoders:
    """A pipeline context's flow and bucket encoders (the codec's fast constructors), each
    built on first use: EndpointDNAT and ServiceLB templates by protocol (then IP version),
    bucket action encoders by (port, affinity, IP version). Bounded by the protocols and
    ports in use; a new ``Context`` starts with none."""

    __slots__ = ("buckets", "by_protocol", "mid_stream")

    def __init__(self) -> None:
        self.by_protocol: dict[Protocol, tuple[DnatTemplates, FrontendTemplates]] = {}
        self.buckets: dict[tuple[int, bool, int], BucketWire] = {}
        # mid-stream flow encoders by (IP version, re-create); None: not templatable
        self.mid_stream: dict[tuple[int, bool], MidStreamWire | None] = {}


@dataclass(frozen=True, slots=True)
class Context:
    """Everything the flow builders need besides the Service itself (and, in ``encoders``,
    what they build it with)."""

    tables: pl.Tables
    generation: int
    standalone: bool = True
    # Standalone: the mid-stream flows and their probe (``proxy.mid_stream.choose``: where
    # conntrack goes with ovs-vswitchd, the userspace datapath). Never without standalone.
    with_mid_stream: bool = True
    # Affinity timeouts above this are expired by the agent's sweeper, not by OVS (tests lower
    # it to exercise the sweep with short timeouts).
    max_ovs_timeout: int = pl.OVS_MAX_TIMEOUT
    # Standalone: the node's host-SNAT address per family (see pipeline.py), if configured.
    host_snat: tuple[IPAddress, ...] = ()
    # Standalone: the node's own IPs; packets from them are marked "from the node" (in-cluster).
    node_ips: tuple[IPAddress, ...] = ()
    encoders: Encoders = field(default_factory=Encoders, compare=False, repr=False)

    @property
    def mid_stream(self) -> bool:
        """Mid-stream flows and their probe are installed (standalone only)."""
        return self.standalone and self.with_mid_stream

    def host_snat_ip(self, family: IPFamily) -> IPAddress | None:
        return next((ip for ip in self.host_snat if IPFamily.of(ip) == family), None)

    def cookie(self, category: pl.Category) -> int:
        return pl.cookie(self.generation, category)
