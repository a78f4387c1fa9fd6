"""Which Service port owns which claim, decided as an API server's allocators would have.

A Service port claims its nodePort (per protocol), its Service's healthCheckNodePort, and
every address:port/protocol it answers on (its ClusterIPs, external IPs and load-balancer
ingress IPs). Two Services can claim the same one only where no allocator stood between them
(manifests, a second cluster's objects): the datapath would then hold two flows with one
match, and the newest would win on every node. Instead the older Service keeps the claim
(``metadata.creationTimestamp``; a Service without a timestamp counts as newer than any with
one; between two without, the one the agent saw first -- ``ClaimResolver`` -- then
namespace/name) and the newer Service's conflicting port is refused whole: none
of its frontends reach the datapath, while its other ports, and every other Service, are
served. A refused port holds no claim, so it refuses nothing of anyone's.

``resolve`` is the decision, pure: its answer depends on the set of ports (and, for Services
without a timestamp, when each was first seen) only, never on the order they came in.
Manifests made by kubectl carry ``creationTimestamp: null``: without the first-seen rule a
newly added file would take a nodePort from the Service serving it whenever its name sorts
first, on every node. ``ClaimResolver`` keeps it across syncs: an update re-decides only the
ports that share a claim, directly or through others, with a changed port (a port without a
conflict is decided alone), so a sync's cost follows its change; ``ovsproxy check`` calls
``resolve`` on the manifests' Services.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from ipaddress import IPv4Address, IPv6Address
from itertools import chain

from ovsproxy.model import Protocol, ServicePort, ServicePortName, ServiceState
from ovsproxy.model.problems import PortConflict

NODE_PORT = "nodePort"
HEALTH_CHECK_NODE_PORT = "healthCheckNodePort"
ADDRESS = "address"

# One thing a Service port takes for itself: (kind, port, protocol, address as an int, IP
# version). A plain tuple of ints and strings: a full sync builds and hashes one per frontend
# of every port, and an ``ipaddress`` value hashes in Python. A healthCheckNodePort has no
# protocol (HTTP, whatever the port's) and no address; a nodePort no address.
Claim = tuple[str, int, Protocol | None, int, int]
_IPV4 = IPv4Address


def render_claim(claim: Claim) -> str:
    """``10.96.0.10:80/TCP``, ``[fd00::10]:80/TCP``, ``nodePort 30080/TCP``,
    ``healthCheckNodePort 32000``."""
    kind, port, protocol, address, version = claim
    if kind == ADDRESS:
        if version == 4:
            return f"{IPv4Address(address)}:{port}/{protocol}"
        return f"[{IPv6Address(address)}]:{port}/{protocol}"
    if kind == NODE_PORT:
        return f"nodePort {port}/{protocol}"
    return f"healthCheckNodePort {port}"


def claims_of(port: ServicePort) -> tuple[Claim, ...]:
    """Everything ``port`` claims, each once."""
    protocol = port.protocol
    number = port.port
    ips = port.cluster_ips
    if port.external_ips or port.load_balancer_ips:
        ips = (*ips, *port.external_ips, *port.load_balancer_ips)
    claims: list[Claim] = [
        (ADDRESS, number, protocol, ip._ip, 4 if type(ip) is _IPV4 else 6)  # type: ignore[union-attr]
        for ip in ips
    ]
    if port.node_port:
        claims.append((NODE_PORT, port.node_port, protocol, 0, 0))
    if port.health_check_node_port:
        claims.append((HEALTH_CHECK_NODE_PORT, port.health_check_node_port, None, 0, 0))
    return tuple(dict.fromkeys(claims)) if len(claims) > 1 else tuple(claims)


Seniority = tuple[bool, float, int, str, str]
ServiceKey = tuple[str, str]


def seniority(port: ServicePort, seen: Mapping[ServiceKey, int] | None = None) -> Seniority:
    """The older Service first: by creationTimestamp (none: after every one given), then, for
    equal timestamps (none), by when it was first seen (``seen``: a Service's first-seen
    order, lower first; absent: 0), then by namespace/name."""
    name = port.name
    created = port.created
    order = seen.get(name.service, 0) if seen else 0
    return (created is None, created or 0.0, order, name.namespace, name.name)


Refusals = dict[ServicePortName, tuple[PortConflict, ...]]


def resolve(ports: Iterable[ServicePort], seen: Mapping[ServiceKey, int] | None = None) -> Refusals:
    """The refused ports among ``ports`` (one ServicePort per name), each with every claim it
    loses and the older port holding it. Ports are taken oldest Service first (``seniority``
    with ``seen``): a port gets its claims unless another Service's port got one of them
    before it; ports of one Service never conflict with each other (its own validation is
    the source's)."""
    return _decide(((port, claims_of(port)) for port in ports), seen)


def _decide(
    ports: Iterable[tuple[ServicePort, tuple[Claim, ...]]],
    seen: Mapping[ServiceKey, int] | None = None,
) -> Refusals:
    holders: dict[Claim, ServicePortName] = {}
    refusals: Refusals = {}
    for port, claims in sorted(ports, key=lambda item: (seniority(item[0], seen), item[0].name)):
        name = port.name
        conflicts = tuple(
            PortConflict(name, holder, render_claim(claim))
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
    """``resolve`` over the ports the proxier holds, kept as they change. A claim's
    claimants are the one port that claims it, or a set when several do (rare: a conflict,
    or a healthCheckNodePort, which every port of its Service claims), so a port whose
    claims are all its own is decided without ``resolve`` and without a set per claim."""

    def __init__(self) -> None:
        self._ports: dict[ServicePortName, tuple[ServicePort, tuple[Claim, ...]]] = {}
        self._claimants: dict[Claim, ServicePortName | set[ServicePortName]] = {}
        self.refusals: Refusals = {}
        # When each Service held here was first seen (the number of the update that brought
        # it), and how many of its ports are held: between two Services without a
        # creationTimestamp the one served first keeps a claim, so a newly added manifest never
        # takes a port from a Service already serving it. Services first seen in one update tie
        # (then namespace/name): none of them was served before the other.
        self.seen: dict[ServiceKey, int] = {}
        self._held: dict[ServiceKey, int] = {}
        self._updates = 0

    def refused(self, name: ServicePortName) -> bool:
        return bool(self.refusals) and name in self.refusals

    def update(
        self, ports: Iterable[tuple[ServicePortName, ServicePort | None]]
    ) -> set[ServicePortName]:
        """Take the new ports (None: gone); the names whose refusal came, went or changed
        (among them, ports not in ``ports`` that an older one now takes a claim from or
        gives one back to)."""
        changed: list[tuple[ServicePortName, tuple[Claim, ...]]] = []
        freed: list[Claim] = []  # claims a changed port held (their other claimants may gain)
        entries, claimants = self._ports, self._claimants
        self._updates += 1
        emptied: list[ServiceKey] = []
        for name, port in ports:
            entry = entries.get(name)
            old = entry[0] if entry is not None else None
            if old is port or (old is not None and port is not None and old == port):
                continue  # (an endpoint change: the claims are the same)
            if entry is not None:
                for claim in entry[1]:
                    if self._release(claim, name):
                        freed.append(claim)
            service = name.service
            if port is None:
                if entry is not None:
                    del entries[name]
                    self._held[service] -= 1
                    emptied.append(service)
                changed.append((name, ()))
                continue
            if entry is None:
                self._held[service] = self._held.get(service, 0) + 1
                self.seen.setdefault(service, self._updates)
            claims = claims_of(port)
            entries[name] = (port, claims)
            changed.append((name, claims))
            for claim in claims:
                held = claimants.setdefault(claim, name)
                if held is not name:
                    if type(held) is set:
                        held.add(name)
                    else:
                        claimants[claim] = {held, name}  # type: ignore[arg-type]
        for service in emptied:  # after the whole update: a port renamed is not a new Service
            if self._held.get(service) == 0:
                del self._held[service]
                del self.seen[service]  # gone: if it comes back, it is new
        return self._redecide(changed, freed)

    def reset(self, states: Mapping[ServicePortName, ServiceState]) -> set[ServicePortName]:
        """Hold exactly the ports of ``states`` (a full sync); the names whose refusal
        changed."""
        gone = [(name, None) for name in self._ports if name not in states]
        return self.update(chain(gone, ((name, state.port) for name, state in states.items())))

    def _release(self, claim: Claim, name: ServicePortName) -> bool:
        """``name`` no longer claims ``claim``; True when others still do."""
        held = self._claimants[claim]
        if type(held) is not set:
            del self._claimants[claim]
            return False
        held.discard(name)
        if len(held) == 1:
            self._claimants[claim] = next(iter(held))
        return True

    def _redecide(
        self, changed: list[tuple[ServicePortName, tuple[Claim, ...]]], freed: list[Claim]
    ) -> set[ServicePortName]:
        """Decide again the changed ports and the ports sharing a claim with them, or with a
        freed claim, transitively; the names whose refusal differs from before."""
        claimants = self._claimants
        refusals = self.refusals
        flipped: set[ServicePortName] = set()
        contested: dict[ServicePortName, None] = {}  # reached through a claim held by several
        stack: list[ServicePortName] = []
        for claim in freed:
            held = claimants.get(claim)
            if held is not None:
                stack.extend(held if type(held) is set else (held,))  # type: ignore[arg-type]
        for name, claims in changed:
            if any(type(claimants[c]) is set for c in claims):
                stack.append(name)
            elif refusals and name in refusals:  # gone, or now alone with all its claims
                del refusals[name]
                flipped.add(name)
        while stack:
            name = stack.pop()
            if name in contested:
                continue
            contested[name] = None
            for claim in self._ports[name][1]:
                held = claimants[claim]
                if type(held) is set:
                    stack.extend(other for other in held if other not in contested)
        if not contested:
            return flipped
        decided = _decide((self._ports[name] for name in contested), self.seen)
        for name in contested:
            now = decided.get(name)
            if now != refusals.get(name):
                flipped.add(name)
                if now is None:
                    del refusals[name]
                else:
                    refusals[name] = now
        return flipped
