"""Which Service port owns which claim, decided as an API server's allocators would have.

A Service port claims its nodePort (per protocol), its Service's healthCheckNodePort, and
every address:port/protocol it answers on (its ClusterIPs, external IPs and load-balancer
ingress IPs). Two Services can claim the same one only where no allocator stood between them
(manifests, a second cluster's objects): the datapath would then hold two flows with one
match, and the newest would win on every node. Instead the older Service keeps the claim
(``metadata.creationTimestamp``, then namespace/name; a Service without a timestamp counts
as newer than any with one) and the newer Service's conflicting port is refused whole: none
of its frontends reach the datapath, while its other ports, and every other Service, are
served. A refused port holds no claim, so it refuses nothing of anyone's.

``resolve`` is the decision, pure: its answer depends on the set of ports only, never on the
order they came in. ``ClaimResolver`` keeps it across syncs: an update re-decides only the
ports that share a claim, directly or through others, with a changed port (a port without a
conflict is decided alone), so a sync's cost follows its change; ``ovsproxy check`` calls
``resolve`` on the manifests' Services.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from ovsproxy.model import IPAddress, Protocol, ServicePort, ServicePortName
from ovsproxy.model.problems import PortConflict

NODE_PORT = "nodePort"
HEALTH_CHECK_NODE_PORT = "healthCheckNodePort"
ADDRESS = "address"


class Claim(NamedTuple):
    """One thing a Service port takes for itself (a tuple: a full sync builds one per
    frontend of every port)."""

    kind: str  # NODE_PORT, HEALTH_CHECK_NODE_PORT or ADDRESS
    port: int
    protocol: Protocol | None = None  # None: a healthCheckNodePort (HTTP, whatever the port's)
    ip: IPAddress | None = None  # ADDRESS only

    def __str__(self) -> str:
        if self.kind == ADDRESS:
            host = f"[{self.ip}]" if self.ip is not None and self.ip.version == 6 else self.ip
            return f"{host}:{self.port}/{self.protocol}"
        if self.kind == NODE_PORT:
            return f"nodePort {self.port}/{self.protocol}"
        return f"healthCheckNodePort {self.port}"


def claims_of(port: ServicePort) -> tuple[Claim, ...]:
    """Everything ``port`` claims, each once."""
    protocol = port.protocol
    claims = [
        Claim(ADDRESS, port.port, protocol, ip)
        for ip in dict.fromkeys((*port.cluster_ips, *port.external_ips, *port.load_balancer_ips))
    ]
    if port.node_port:
        claims.append(Claim(NODE_PORT, port.node_port, protocol))
    if port.health_check_node_port:
        claims.append(Claim(HEALTH_CHECK_NODE_PORT, port.health_check_node_port))
    return tuple(claims)


Seniority = tuple[bool, float, str, str]


def seniority(port: ServicePort) -> Seniority:
    """The older Service first: by creationTimestamp (none: after every one given), then by
    namespace/name."""
    name = port.name
    created = port.created
    return (created is None, created or 0.0, name.namespace, name.name)


Refusals = dict[ServicePortName, tuple[PortConflict, ...]]


def resolve(ports: Iterable[ServicePort]) -> Refusals:
    """The refused ports among ``ports`` (one ServicePort per name), each with every claim it
    loses and the older port holding it. Ports are taken oldest Service first: a port gets
    its claims unless another Service's port got one of them before it; ports of one Service
    never conflict with each other (its own validation is the source's)."""
    holders: dict[Claim, ServicePortName] = {}
    refusals: Refusals = {}
    for port in sorted(ports, key=lambda p: (seniority(p), p.name)):
        name = port.name
        claims = claims_of(port)
        conflicts = tuple(
            PortConflict(name, holder, str(claim))
            for claim in claims
            if (holder := holders.get(claim)) is not None
            and (holder.namespace, holder.name) != (name.namespace, name.name)
        )
        if conflicts:
            refusals[name] = conflicts
            continue
        for claim in claims:
            holders.setdefault(claim, name)
    return refusals


class ClaimResolver:
    """``resolve`` over the ports the proxier holds, kept as they change."""

    def __init__(self) -> None:
        self._ports: dict[ServicePortName, ServicePort] = {}
        self._claims: dict[ServicePortName, tuple[Claim, ...]] = {}
        self._claimants: dict[Claim, set[ServicePortName]] = {}
        self.refusals: Refusals = {}

    def refused(self, name: ServicePortName) -> bool:
        return name in self.refusals

    def update(self, ports: Mapping[ServicePortName, ServicePort | None]) -> set[ServicePortName]:
        """Take the new ports (None: gone); the names whose refusal came, went or changed
        (among them, ports not in ``ports`` that an older one now takes a claim from or
        gives one back to)."""
        seeds: set[ServicePortName] = set()
        for name, port in ports.items():
            old = self._ports.get(name)
            if old is port or (old is not None and port is not None and old == port):
                continue  # (an endpoint change: the claims are the same)
            for claim in self._claims.pop(name, ()):
                claimants = self._claimants[claim]
                claimants.discard(name)
                if claimants:
                    seeds.update(claimants)  # they may get back what this port held
                else:
                    del self._claimants[claim]
            seeds.add(name)
            if port is None:
                self._ports.pop(name, None)
                continue
            self._ports[name] = port
            claims = self._claims[name] = claims_of(port)
            for claim in claims:
                self._claimants.setdefault(claim, set()).add(name)
        return self._redecide(self._sharing(seeds))

    def reset(self, ports: Iterable[ServicePort]) -> set[ServicePortName]:
        """Hold exactly ``ports`` (a full sync); the names whose refusal changed."""
        wanted = {port.name: port for port in ports}
        gone: dict[ServicePortName, ServicePort | None] = dict.fromkeys(
            self._ports.keys() - wanted.keys()
        )
        return self.update({**gone, **wanted})

    def _sharing(self, seeds: set[ServicePortName]) -> set[ServicePortName]:
        """``seeds`` and every port that shares a claim with one of them, transitively."""
        found = set(seeds)
        stack = list(seeds)
        while stack:
            for claim in self._claims.get(stack.pop(), ()):
                claimants = self._claimants[claim]
                if len(claimants) > 1:
                    for other in claimants - found:
                        found.add(other)
                        stack.append(other)
        return found

    def _redecide(self, names: set[ServicePortName]) -> set[ServicePortName]:
        decided = resolve(self._ports[n] for n in names if n in self._ports)
        changed = set()
        for name in names:
            now = decided.get(name)
            if now != self.refusals.get(name):
                changed.add(name)
                if now is None:
                    del self.refusals[name]
                else:
                    self.refusals[name] = now
        return changed
