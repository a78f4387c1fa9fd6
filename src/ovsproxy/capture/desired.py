"""What the node's capture table must hold, computed from the Service ports (pure).

The table is a fixed set of chains whose rules never change; everything that depends on
Services lives in named sets, keyed by address, protocol and port. So a Service change is a
few element adds and deletes, never a rule per Service, and ``diff`` of two states is exactly
the elements that differ.

Sets (one per IP family where an address is part of the key):

* ``nodeport-ips``: the node addresses that accept NodePort traffic (``nodePortAddresses``).
* ``nodeports``: (protocol, nodePort) of every NodePort, per family of the Service's
  ClusterIPs (a single-stack IPv4 Service has no IPv6 NodePort, as in kube-proxy).
* ``external``: (address, protocol, port) of every external IP and load-balancer ingress IP
  (``ipMode: Proxy`` ingresses are not in the model: the load balancer proxies those itself).
* ``firewall``: the load-balancer destinations that have ``loadBalancerSourceRanges``;
  ``firewall-allow``: (destination, source CIDR) pairs allowed to reach them.

Source ranges follow kube-proxy's nftables proxier: they restrict traffic to the Service's
load-balancer IPs only. Its NodePorts and external IPs stay open to every source ("for better
or for worse, nodeports are not subject to loadBalancerSourceRanges"). When a range contains
the node's primary IP of that family, the load-balancer IPs themselves are allowed as sources
too (a node reaching a VIP that is also a local address sends from the VIP).
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ovsproxy.model import IPAddress, IPFamily, IPNetwork, Protocol, ServicePort

PRIMARY = "primary"


@dataclass(frozen=True, slots=True)
class NodePortAddresses:
    """kube-proxy's ``nodePortAddresses``: CIDRs, or ``primary``; empty: every node IP.

    Per family: the CIDRs of that family select the node IPs they contain; a family with no
    CIDR listed accepts all its node IPs (kube-proxy adds ``0.0.0.0/0`` or ``::/0`` for it).
    ``primary``: the node's primary IP of each family (its first node IP of that family).
    Loopback addresses never accept NodePort traffic (unsupported by kube-proxy's nftables
    mode as well).
    """

    cidrs: tuple[IPNetwork, ...] = ()
    primary: bool = False

    @classmethod
    def parse(cls, values: Sequence[str]) -> NodePortAddresses:
        """From the configuration's strings; ``ValueError`` names the bad entry."""
        if list(values) == [PRIMARY]:
            return cls(primary=True)
        cidrs: list[IPNetwork] = []
        for index, text in enumerate(values):
            if text == PRIMARY:
                raise ValueError(f"nodePortAddresses[{index}]: 'primary' must be the only entry")
            try:
                network = ipaddress.ip_network(text.strip(), strict=False)
            except ValueError:
                raise ValueError(
                    f"nodePortAddresses[{index}]: {text!r} is not a CIDR or 'primary'"
                ) from None
            if "/" not in text:
                raise ValueError(f"nodePortAddresses[{index}]: {text!r} needs a prefix length")
            cidrs.append(network)
        return cls(cidrs=tuple(cidrs))

    def select(self, node_ips: Sequence[IPAddress]) -> frozenset[IPAddress]:
        """The node IPs (primary of each family first) that accept NodePort traffic."""
        usable = [ip for ip in node_ips if not ip.is_loopback]
        if self.primary:
            firsts: dict[int, IPAddress] = {}
            for ip in usable:
                firsts.setdefault(ip.version, ip)
            return frozenset(firsts.values())
        chosen: set[IPAddress] = set()
        for version in (4, 6):
            cidrs = [c for c in self.cidrs if c.version == version]
            of_family = [ip for ip in usable if ip.version == version]
            if not cidrs:
                chosen.update(of_family)
            else:
                chosen.update(ip for ip in of_family if any(ip in c for c in cidrs))
        return frozenset(chosen)


class CaptureSet(enum.StrEnum):
    """The table's sets; the value is the nftables set name (``-v4``/``-v6`` appended)."""

    NODEPORT_IPS = "nodeport-ips"
    NODEPORTS = "nodeports"
    EXTERNAL = "external"
    FIREWALL = "firewall"
    FIREWALL_ALLOW = "firewall-allow"


# Element shapes, per set:
#   NODEPORT_IPS    (address,)
#   NODEPORTS       (protocol, port)
#   EXTERNAL        (address, protocol, port)
#   FIREWALL        (address, protocol, port)
#   FIREWALL_ALLOW  (address, protocol, port, source network)
Element = tuple[IPAddress | IPNetwork | Protocol | int, ...]
SetKey = tuple[CaptureSet, IPFamily]


@dataclass(frozen=True, slots=True)
class CaptureState:
    """The desired (or installed) content of every set, by (set, family)."""

    sets: Mapping[SetKey, frozenset[Element]] = field(default_factory=dict)

    def elements(self, name: CaptureSet, family: IPFamily) -> frozenset[Element]:
        return self.sets.get((name, family), frozenset())

    @property
    def size(self) -> int:
        return sum(len(v) for v in self.sets.values())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CaptureState):
            return NotImplemented
        return _nonempty(self.sets) == _nonempty(other.sets)

    def __hash__(self) -> int:
        return hash(frozenset(_nonempty(self.sets).items()))


def _nonempty(sets: Mapping[SetKey, frozenset[Element]]) -> dict[SetKey, frozenset[Element]]:
    return {k: v for k, v in sets.items() if v}


def desired_state(
    ports: Iterable[ServicePort],
    node_ips: Sequence[IPAddress],
    addresses: NodePortAddresses | None = None,
) -> CaptureState:
    """The table content for these Service ports on a node with these IPs (primary first)."""
    sets: dict[SetKey, set[Element]] = {}

    def add(name: CaptureSet, family: IPFamily, element: Element) -> None:
        sets.setdefault((name, family), set()).add(element)

    for ip in (addresses or NodePortAddresses()).select(node_ips):
        add(CaptureSet.NODEPORT_IPS, IPFamily.of(ip), (ip,))
    primary: dict[IPFamily, IPAddress] = {}
    for ip in node_ips:
        primary.setdefault(IPFamily.of(ip), ip)

    for port in ports:
        if port.node_port:
            for family in port.families:
                add(CaptureSet.NODEPORTS, family, (port.protocol, port.node_port))
        for ip in (*port.external_ips, *port.load_balancer_ips):
            add(CaptureSet.EXTERNAL, IPFamily.of(ip), (ip, port.protocol, port.port))
        if not port.load_balancer_source_ranges:
            continue
        for lb_ip in port.load_balancer_ips:
            family = IPFamily.of(lb_ip)
            ranges = [r for r in port.load_balancer_source_ranges if r.version == family]
            destination = (lb_ip, port.protocol, port.port)
            add(CaptureSet.FIREWALL, family, destination)
            for source in ranges:
                add(CaptureSet.FIREWALL_ALLOW, family, (*destination, source))
            node_ip = primary.get(family)
            if node_ip is not None and any(node_ip in r for r in ranges):
                for own in port.load_balancer_ips:
                    if own.version == family:
                        add(CaptureSet.FIREWALL_ALLOW, family, (*destination, _host(own)))
    return CaptureState({k: frozenset(v) for k, v in sets.items()})


def _host(ip: IPAddress) -> IPNetwork:
    return ipaddress.ip_network(ip)


@dataclass(frozen=True, slots=True)
class CaptureDiff:
    """Element adds and deletes that turn one state into another, by (set, family)."""

    adds: Mapping[SetKey, frozenset[Element]] = field(default_factory=dict)
    deletes: Mapping[SetKey, frozenset[Element]] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return sum(len(v) for v in self.adds.values()) + sum(len(v) for v in self.deletes.values())

    def __bool__(self) -> bool:
        return self.size > 0


def diff(old: CaptureState, new: CaptureState) -> CaptureDiff:
    """The minimal change from ``old`` to ``new``: exactly the elements that differ."""
    adds: dict[SetKey, frozenset[Element]] = {}
    deletes: dict[SetKey, frozenset[Element]] = {}
    for key in old.sets.keys() | new.sets.keys():
        before = old.sets.get(key, frozenset())
        after = new.sets.get(key, frozenset())
        if added := after - before:
            adds[key] = added
        if removed := before - after:
            deletes[key] = removed
    return CaptureDiff(adds, deletes)


def apply(state: CaptureState, change: CaptureDiff) -> CaptureState:
    """``state`` with ``change`` applied (what the kernel holds after the transaction)."""
    sets = {k: set(v) for k, v in state.sets.items()}
    for key, removed in change.deletes.items():
        sets.setdefault(key, set()).difference_update(removed)
    for key, added in change.adds.items():
        sets.setdefault(key, set()).update(added)
    return CaptureState({k: frozenset(v) for k, v in sets.items() if v})
