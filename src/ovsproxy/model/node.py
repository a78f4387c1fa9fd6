"""What the proxy knows about its own node: its Node object, the pods on the bridge, the
virtual addresses.

Values shared by the layers that read them (``sources`` decode the Node, ``healthcheck`` and
the agent act on it; ``ovs.ovsdb`` reads pod ports, ``proxy`` programs them) and by the two
users of the virtual Service address (the pipeline's hairpin SNAT and the route backends' next
hop), so neither has to import the other.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from ovsproxy.model import IPAddress, IPFamily, IPNetwork


@dataclass(frozen=True, slots=True)
class Node:
    """This node's Node object (core/v1), the fields the proxy reads (API source only).

    ``internal_ips`` and ``external_ips``: ``status.addresses`` of type InternalIP and
    ExternalIP, in the object's order; ``pod_cidrs``: ``spec.podCIDRs``;
    ``deletion_timestamp``: ``metadata.deletionTimestamp`` as the API wrote it (None: not
    being deleted); ``taints``: the keys of ``spec.taints``.
    """

    name: str
    internal_ips: tuple[IPAddress, ...] = ()
    external_ips: tuple[IPAddress, ...] = ()
    pod_cidrs: tuple[IPNetwork, ...] = ()
    deletion_timestamp: str | None = None
    taints: tuple[str, ...] = ()

    @property
    def deleting(self) -> bool:
        return self.deletion_timestamp is not None

    @property
    def host_ips(self) -> tuple[IPAddress, ...]:
        """The node's IPs: the InternalIPs, then the ExternalIPs, each once. The first of each
        family is the one kube-proxy takes as the node IP of that family (``GetNodeHostIPs``:
        InternalIP first, ExternalIP when there is none)."""
        return tuple(dict.fromkeys(self.internal_ips + self.external_ips))


@dataclass(frozen=True, slots=True)
class PodPort:
    """A pod attached to the bridge, as the CNI recorded it in the Interface's external_ids."""

    interface: str
    ofport: int
    name: str
    namespace: str
    ips: tuple[IPAddress, ...]
    mac: str


@dataclass(frozen=True, slots=True)
class NotAPod:
    """An Interface on the bridge that is not read as a pod, and why (for the log, the
    metrics and ``ovsproxy status``): it lacks what a CNI records, or it is malformed."""

    interface: str
    reason: str


@dataclass(frozen=True, slots=True)
class UnservedPath:
    """A packet path this node cannot serve, and why (the log, /status and
    ``ovsproxy_unserved_paths``): e.g. no host-SNAT address, a strict reverse-path filter."""

    path: str
    family: IPFamily
    reason: str

    def __str__(self) -> str:
        return f"{self.path} (IPv{int(self.family)}): {self.reason}"


# The node's virtual Service IP (Antrea's choice, kept so the pipeline and host look familiar):
# an address nobody owns, resolved by a permanent neighbour entry to a MAC nobody owns, reached
# through a host route on the gateway. It is the next hop of the Service routes (OVS matches the
# MAC to take the packet in) and the source hairpin traffic is SNATed to.
VIRTUAL_SERVICE_IP: dict[IPFamily, IPAddress] = {
    IPFamily.IPv4: ipaddress.IPv4Address("169.254.0.253"),
    IPFamily.IPv6: ipaddress.IPv6Address("fc01::aabb:ccdd:eeff"),
}
VIRTUAL_MAC = "aa:bb:cc:dd:ee:ff"

# Node-side steering (NodePort, external IPs, LB IPs): the nftables table (ovsproxy.steering)
# DNATs NodePort traffic to this virtual address, keeping the port, and OVS matches (this
# address, protocol, nodePort). Antrea's VirtualNodePortDNATIP values.
VIRTUAL_NODEPORT_IP: dict[IPFamily, IPAddress] = {
    IPFamily.IPv4: ipaddress.IPv4Address("169.254.0.252"),
    IPFamily.IPv6: ipaddress.IPv6Address("fc01::aabb:ccdd:eefe"),
}
# Packet mark bit the table ORs into every steered packet so that one policy rule per family
# (``fwmark MARK/MARK lookup NODE_STEERING_ROUTE_TABLE``, the routes layer's) routes all of them
# to gw0; other bits of the mark are left alone. Clear of kube-proxy's 0x4000 and 0x8000 and of
# Antrea's host marks.
NODE_STEERING_MARK = 0x0200_0000
NODE_STEERING_ROUTE_TABLE = 155  # the rule's routing table: default via VIRTUAL_SERVICE_IP, gw0
