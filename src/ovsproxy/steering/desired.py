"""What the node's steering table must hold, computed from the Service ports (pure).

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
* ``masquerade``: (address, protocol, port) of every frontend whose steered connections are
  masqueraded: externalTrafficPolicy Cluster (kube-proxy masquerades these; Local keeps the
  client's address). A NodePort's address is the virtual NodePort IP, the destination its
  packets have after the steering table's DNAT.

Source ranges follow kube-proxy's nftables proxier: they restrict traffic to the Service's
load-balancer IPs only, per family (an LB IP of a family with no range listed is not
restricted). Its NodePorts and external IPs stay open to every source ("for better
or for worse, nodeports are not subject to loadBalancerSourceRanges"). When a range contains
the node's primary IP of that family, the load-balancer IPs themselves are allowed as sources
too (a node reaching a VIP that is also a local address sends from the VIP).
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ovsproxy.model import IPAddress, IPFamily, IPNetwork, Protocol, ServicePort, TrafficPolicy
from ovsproxy.model.node import VIRTUAL_NODEPORT_IP

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

    def node_port_ips(self, node_ips: Sequence[IPAddress]) -> tuple[IPAddress, ...]:
        """The node IPs that accept NodePort traffic, in the node IPs' order (the one place
        this is decided: the agent's NodePort frontends, its steering and ``verify``)."""
        selected = self.select(node_ips)
        return tuple(ip for ip in node_ips if ip in selected)


class SteeringSet(enum.StrEnum):
    """The table's sets; the value is the nftables set name (``-v4``/``-v6`` appended)."""

    NODEPORT_IPS = "nodeport-ips"
    NODEPORTS = "nodeports"
    EXTERNAL = "external"
    FIREWALL = "firewall"
    FIREWALL_ALLOW = "firewall-allow"
    MASQUERADE = "masquerade"


# Element shapes, per set:
#   NODEPORT_IPS    (address,)
#   NODEPORTS       (protocol, port)
#   EXTERNAL        (address, protocol, port)
#   FIREWALL        (address, protocol, port)
#   FIREWALL_ALLOW  (address, protocol, port, source network)
#   MASQUERADE      (address, protocol, port)
Element = tuple[IPAddress | IPNetwork | Protocol | int, ...]
SetKey = tuple[SteeringSet, IPFamily]


@dataclass(frozen=True, slots=True)
class SteeringState:
    """The desired (or installed) content of every set, by (set, family)."""

    sets: Mapping[SetKey, frozenset[Element]] = field(default_factory=dict)

    def elements(self, name: SteeringSet, family: IPFamily) -> frozenset[Element]:
        return self.sets.get((name, family), frozenset())

    @property
    def size(self) -> int:
        return sum(len(v) for v in self.sets.values())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SteeringState):
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
) -> SteeringState:
    """The table content for these Service ports on a node with these IPs (primary first)."""
    sets: dict[SetKey, set[Element]] = {}
    primary = primary_ips(node_ips)
    items = [*node_elements(node_ips, addresses)]
    for port in ports:
        items.extend(port_elements(port, primary))
    for key, element in items:
        sets.setdefault(key, set()).add(element)
    return SteeringState({k: frozenset(v) for k, v in sets.items()})


def primary_ips(node_ips: Sequence[IPAddress]) -> dict[IPFamily, IPAddress]:
    """The node's primary IP of each family: its first node IP of that family."""
    primary: dict[IPFamily, IPAddress] = {}
    for ip in node_ips:
        primary.setdefault(IPFamily.of(ip), ip)
    return primary


def node_elements(
    node_ips: Sequence[IPAddress], addresses: NodePortAddresses | None = None
) -> list[tuple[SetKey, Element]]:
    """The ``nodeport-ips`` elements."""
    return [
        ((SteeringSet.NODEPORT_IPS, IPFamily.of(ip)), (ip,))
        for ip in (addresses or NodePortAddresses()).select(node_ips)
    ]


def port_elements(
    port: ServicePort, primary: Mapping[IPFamily, IPAddress]
) -> list[tuple[SetKey, Element]]:
    """The elements one Service port contributes (it may share them with other ports)."""
    out: list[tuple[SetKey, Element]] = []
    masquerade = port.external_traffic_policy is not TrafficPolicy.LOCAL
    if port.node_port:
        for family in port.families:
            out.append(((SteeringSet.NODEPORTS, family), (port.protocol, port.node_port)))
            if masquerade:
                frontend = (VIRTUAL_NODEPORT_IP[family], port.protocol, port.node_port)
                out.append(((SteeringSet.MASQUERADE, family), frontend))
    for ip in (*port.external_ips, *port.load_balancer_ips):
        destination = (ip, port.protocol, port.port)
        out.append(((SteeringSet.EXTERNAL, IPFamily.of(ip)), destination))
        if masquerade:
            out.append(((SteeringSet.MASQUERADE, IPFamily.of(ip)), destination))
    if not port.load_balancer_source_ranges:
        return out
    for lb_ip in port.load_balancer_ips:
        family = IPFamily.of(lb_ip)
        ranges = [r for r in port.load_balancer_source_ranges if r.version == family]
        if not ranges:
            continue  # kube-proxy filters the ranges by family: none here, no restriction
        destination = (lb_ip, port.protocol, port.port)
        out.append(((SteeringSet.FIREWALL, family), destination))
        for source in ranges:
            out.append(((SteeringSet.FIREWALL_ALLOW, family), (*destination, source)))
        node_ip = primary.get(family)
        if node_ip is not None and any(node_ip in r for r in ranges):
            for own in port.load_balancer_ips:
                if own.version == family:
                    allow = (*destination, _host(own))
                    out.append(((SteeringSet.FIREWALL_ALLOW, family), allow))
    return out


def _host(ip: IPAddress) -> IPNetwork:
    return ipaddress.ip_network(ip)


@dataclass(frozen=True, slots=True)
class SteeringDiff:
    """Element adds and deletes that turn one state into another, by (set, family)."""

    adds: Mapping[SetKey, frozenset[Element]] = field(default_factory=dict)
    deletes: Mapping[SetKey, frozenset[Element]] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return sum(len(v) for v in self.adds.values()) + sum(len(v) for v in self.deletes.values())

    def __bool__(self) -> bool:
        return self.size > 0


def diff(old: SteeringState, new: SteeringState) -> SteeringDiff:
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
    return SteeringDiff(adds, deletes)


def apply(state: SteeringState, change: SteeringDiff) -> SteeringState:
    """``state`` with ``change`` applied (what the kernel holds after the transaction)."""
    sets = {k: set(v) for k, v in state.sets.items()}
    for key, removed in change.deletes.items():
        sets.setdefault(key, set()).difference_update(removed)
    for key, added in change.adds.items():
        sets.setdefault(key, set()).update(added)
    return SteeringState({k: frozenset(v) for k, v in sets.items() if v})


class SteeringTracker:
    """The desired state kept up to date incrementally, with the pending change since the last
    ``take_changes``: work per Service update is proportional to that Service's elements.

    Elements are reference-counted: two Service ports may need the same one (an external IP
    and port listed twice, a NodePort seen by two families), and it goes only with the last.
    """

    def __init__(
        self, node_ips: Sequence[IPAddress] = (), addresses: NodePortAddresses | None = None
    ) -> None:
        self._counts: dict[tuple[SetKey, Element], int] = {}
        self._ports: dict[object, ServicePort] = {}  # ServicePortName -> port
        self._adds: set[tuple[SetKey, Element]] = set()
        self._deletes: set[tuple[SetKey, Element]] = set()
        self._node_ips: tuple[IPAddress, ...] = ()
        self._addresses = addresses or NodePortAddresses()
        self._primary: dict[IPFamily, IPAddress] = {}
        self.set_node_ips(node_ips, addresses)

    def _take(self, item: tuple[SetKey, Element]) -> None:
        count = self._counts.get(item, 0)
        self._counts[item] = count + 1
        if count == 0:
            if item in self._deletes:
                self._deletes.discard(item)
            else:
                self._adds.add(item)

    def _release(self, item: tuple[SetKey, Element]) -> None:
        count = self._counts[item] - 1
        if count:
            self._counts[item] = count
            return
        del self._counts[item]
        if item in self._adds:
            self._adds.discard(item)
        else:
            self._deletes.add(item)

    def update(self, port: ServicePort | None, *, name: object = None) -> None:
        """Set (``port``) or remove (``None``, with ``name``) one Service port."""
        key = port.name if port is not None else name
        old = self._ports.pop(key, None)
        if old is not None:
            for item in port_elements(old, self._primary):
                self._release(item)
        if port is not None:
            self._ports[key] = port
            for item in port_elements(port, self._primary):
                self._take(item)

    def set_node_ips(
        self, node_ips: Sequence[IPAddress], addresses: NodePortAddresses | None = None
    ) -> None:
        """New node IPs or nodePortAddresses; a new primary IP re-derives every port."""
        for item in node_elements(self._node_ips, self._addresses):
            self._release(item)  # taken by the previous call, with the previous addresses
        if addresses is not None:
            self._addresses = addresses
        old_primary = self._primary
        self._node_ips = tuple(node_ips)
        self._primary = primary_ips(node_ips)
        if self._primary != old_primary:
            for port in self._ports.values():
                for item in port_elements(port, old_primary):
                    self._release(item)
                for item in port_elements(port, self._primary):
                    self._take(item)
        for item in node_elements(self._node_ips, self._addresses):
            self._take(item)

    def state(self) -> SteeringState:
        """The whole desired state (for a full rebuild or a verify): O(elements)."""
        sets: dict[SetKey, set[Element]] = {}
        for key, element in self._counts:
            sets.setdefault(key, set()).add(element)
        return SteeringState({k: frozenset(v) for k, v in sets.items()})

    def take_changes(self) -> SteeringDiff:
        """The adds and deletes since the last call (and forget them)."""
        adds: dict[SetKey, set[Element]] = {}
        deletes: dict[SetKey, set[Element]] = {}
        for key, element in self._adds:
            adds.setdefault(key, set()).add(element)
        for key, element in self._deletes:
            deletes.setdefault(key, set()).add(element)
        self._adds.clear()
        self._deletes.clear()
        return SteeringDiff(
            {k: frozenset(v) for k, v in adds.items()},
            {k: frozenset(v) for k, v in deletes.items()},
        )
