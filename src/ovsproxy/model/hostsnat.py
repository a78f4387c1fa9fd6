"""The node's host-SNAT address: which address of its pod CIDR it is, decided without I/O.

In standalone mode a connection the node itself sent (or steered in from outside) to a Service
and DNATed to an endpoint on another node is SNATed to the host-SNAT address, one per IP
family, so the endpoint's reply is routed back to this node (the other nodes route its pod
CIDR to it) and into OVS (a permanent neighbour entry on the gateway resolves the address to
the virtual MAC). See datapath/pipeline.py for the packet path.

The reservation: **the address just below the last one of the node's pod CIDR** (in
10.244.1.0/24: 10.244.1.254; in fd00:10:244:1::/64: fd00:10:244:1:ffff:ffff:ffff:fffe). In an
IPv4 CIDR that is the highest unicast host address; an IPAM handing out addresses from the
bottom (host-local's default) reaches it last, and excluding it from the IPAM's range keeps it
free for good. ``--host-snat-ip`` overrides the choice.

The pod CIDRs come from the gateway's connected prefixes (the gateway carries the pod
subnets' gateway addresses) and, where the Node object is read, from its ``spec.podCIDRs``;
``choose_host_snat`` takes them in the order to try.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ovsproxy.model import IPAddress, IPFamily, IPNetwork

# Positions from the end of the pod CIDR: 1 is its last address (IPv4's broadcast), 2 ours.
RESERVED_FROM_END = 2
# The smallest pod CIDR that leaves room for a gateway, the reservation and one pod.
MIN_HOSTS = 4


def host_snat_address(pod_cidr: IPNetwork) -> IPAddress:
    """The reserved host-SNAT address of ``pod_cidr``; ValueError (with why) when the CIDR is
    too small to spare it."""
    if pod_cidr.num_addresses < MIN_HOSTS:
        raise ValueError(
            f"pod CIDR {pod_cidr} has {pod_cidr.num_addresses} address(es): too small to reserve "
            f"a host-SNAT address (at least /{pod_cidr.max_prefixlen - 2} is needed)"
        )
    return pod_cidr[-RESERVED_FROM_END]


@dataclass(frozen=True, slots=True)
class HostSNATChoice:
    """The host-SNAT address of one family, or why there is none (``address`` None)."""

    family: IPFamily
    address: IPAddress | None
    origin: str  # where the address came from, or what was tried
    reason: str = ""  # why there is no address (empty when there is one)


def choose_host_snat(
    family: IPFamily,
    *,
    override: IPAddress | None,
    pod_cidrs: Sequence[IPNetwork],
    gateway_ips: Iterable[IPAddress],
    pod_ips: Iterable[IPAddress],
) -> HostSNATChoice:
    """The host-SNAT address of ``family``: ``override`` (``--host-snat-ip``) when given, else
    the reservation of the first pod CIDR of that family. Refused, with the reason, when the
    address is the gateway's own or a local pod's (a permanent neighbour entry to the virtual
    MAC would cut that pod off)."""
    if override is not None:
        address: IPAddress = override
        origin = "--host-snat-ip"
    else:
        cidrs = [c for c in pod_cidrs if IPFamily.of(c) == family]
        if not cidrs:
            return HostSNATChoice(
                family, None, "pod CIDR", f"no IPv{int(family)} pod CIDR known for this node"
            )
        try:
            address = host_snat_address(cidrs[0])
        except ValueError as exc:
            return HostSNATChoice(family, None, f"pod CIDR {cidrs[0]}", str(exc))
        origin = f"pod CIDR {cidrs[0]}"
    if address in set(gateway_ips):
        return HostSNATChoice(family, None, origin, f"{address} is the gateway's own address")
    if address in set(pod_ips):
        return HostSNATChoice(
            family,
            None,
            origin,
            f"{address} is used by a local pod (exclude it from the pod IPAM's range, or give "
            "--host-snat-ip)",
        )
    return HostSNATChoice(family, address, origin)


def connected_prefixes(
    interfaces: Iterable[ipaddress.IPv4Interface | ipaddress.IPv6Interface],
) -> list[IPNetwork]:
    """The pod CIDRs a gateway's addresses make connected (global ones, in order, no
    duplicates): ``10.244.1.1/24`` -> ``10.244.1.0/24``."""
    out: list[IPNetwork] = []
    for interface in interfaces:
        network = interface.network
        if network.is_link_local or network.is_loopback or network in out:
            continue
        out.append(network)
    return out
