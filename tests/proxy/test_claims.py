"""Which Service port owns which claim (``proxy.claims``): the older Service keeps a claim,
the decision depends on the set of ports only, and the incremental resolver agrees with it."""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Iterable

from hypothesis import given, settings
from hypothesis import strategies as st

from ovsproxy.model import Protocol, ServicePort, ServicePortName, ServiceState, ServiceType
from ovsproxy.proxy.claims import (
    Claim,
    ClaimResolver,
    claims_of,
    render_claim,
    resolve,
    seniority,
)

IPS = [ipaddress.ip_address(a) for a in ("10.96.0.1", "10.96.0.2", "fd00::1", "192.0.2.1")]


def service_port(
    name: str,
    port_name: str = "",
    *,
    namespace: str = "ns",
    created: float | None = None,
    cluster_ips: Iterable[str] = ("10.96.0.1",),
    port: int = 80,
    protocol: Protocol = Protocol.TCP,
    **kw: object,
) -> ServicePort:
    return ServicePort(
        ServicePortName(namespace, name, port_name, protocol),
        tuple(ipaddress.ip_address(a) for a in cluster_ips),
        port,
        protocol,
        created=created,
        **kw,  # type: ignore[arg-type]
    )


# -- examples, one per kind of claim --------------------------------------------------------


def test_the_older_service_keeps_a_node_port_per_protocol() -> None:
    old = service_port("a", created=100.0, node_port=30080, type=ServiceType.NODE_PORT)
    new = service_port(
        "b", cluster_ips=("10.96.0.2",), created=200.0, node_port=30080, type=ServiceType.NODE_PORT
    )
    udp = service_port(
        "c",
        cluster_ips=("10.96.0.3",),
        created=300.0,
        node_port=30080,
        protocol=Protocol.UDP,
        type=ServiceType.NODE_PORT,
    )
    refusals = resolve([new, udp, old])
    assert list(refusals) == [new.name]  # the UDP nodePort 30080 is another claim
    (conflict,) = refusals[new.name]
    assert (conflict.refused, conflict.owner, conflict.claim) == (
        new.name,
        old.name,
        "nodePort 30080/TCP",
    )
    assert str(conflict) == (
        "Service ns/b: port TCP: nodePort 30080/TCP is already claimed by the older Service "
        "ns/a (port TCP); this port is refused"
    )


def test_an_address_port_is_one_claim_whatever_lists_it() -> None:
    # a ClusterIP of one Service, an external IP of the other: the same flow match
    old = service_port("z", cluster_ips=("10.96.0.9",), created=1.0)
    new = service_port(
        "a", cluster_ips=("10.96.0.2",), external_ips=(ipaddress.ip_address("10.96.0.9"),)
    )
    other_port = service_port("b", cluster_ips=("10.96.0.9",), port=81, created=0.5)
    refusals = resolve([old, new, other_port])
    assert {n: [c.claim for c in cs] for n, cs in refusals.items()} == {
        new.name: ["10.96.0.9:80/TCP"]
    }


def test_health_check_node_ports_and_the_tie_break_by_name() -> None:
    # no timestamps: namespace/name decides; a Service with one is older than those without
    a = service_port("a", cluster_ips=("10.96.0.1",), health_check_node_port=32000)
    b = service_port("b", cluster_ips=("10.96.0.2",), health_check_node_port=32000)
    assert list(resolve([b, a])) == [b.name]
    dated = service_port("c", cluster_ips=("10.96.0.3",), health_check_node_port=32000, created=5)
    refusals = resolve([a, b, dated])
    assert sorted(refusals) == [a.name, b.name]
    assert {c.owner for cs in refusals.values() for c in cs} == {dated.name}


def test_a_refused_port_holds_nothing_and_the_other_ports_of_its_service_stay() -> None:
    old = service_port("a", created=1.0, node_port=30080, type=ServiceType.NODE_PORT)
    middle_http = service_port(
        "b", "http", cluster_ips=("10.96.0.2",), created=2.0, node_port=30080
    )
    middle_dns = service_port(
        "b", "dns", cluster_ips=("10.96.0.2",), created=2.0, port=53, node_port=30081
    )
    # wants b:http's address: b:http is refused, so it holds nothing and the newest gets it
    newest = service_port("c", cluster_ips=("10.96.0.2",), created=3.0)
    assert list(resolve([newest, middle_dns, middle_http, old])) == [middle_http.name]


def test_ports_of_one_service_never_conflict() -> None:
    both = [
        service_port("a", "x", health_check_node_port=32000, port=80),
        service_port("a", "y", health_check_node_port=32000, port=81),
    ]
    assert resolve(both) == {}


def test_the_resolver_gives_the_claim_back_when_the_older_service_goes() -> None:
    old = service_port("a", created=1.0, node_port=30080)
    new = service_port("b", cluster_ips=("10.96.0.2",), created=2.0, node_port=30080)
    resolver = ClaimResolver()
    assert resolver.update([(new.name, new)]) == set()
    assert resolver.update([(old.name, old)]) == {new.name}  # the older arrives: b refused
    assert resolver.refused(new.name)
    assert resolver.update([(old.name, old)]) == set()  # the same port again: nothing
    assert resolver.update([(old.name, None)]) == {new.name}
    assert resolver.refusals == {}


# -- properties ------------------------------------------------------------------------------


@st.composite
def services(draw: st.DrawFn) -> list[ServicePort]:
    """Small Services (one to two ports) over few values, so that they collide often."""
    namespace = draw(st.sampled_from(["a", "b"]))
    name = draw(st.sampled_from(["s1", "s2", "s3"]))
    created = draw(st.sampled_from([None, 1.0, 2.0]))
    cluster_ips = draw(st.lists(st.sampled_from(IPS[:3]), min_size=1, max_size=2, unique=True))
    external = tuple(draw(st.lists(st.sampled_from(IPS), max_size=1)))
    health = draw(st.sampled_from([0, 32000, 32001]))
    ports = []
    for port_name in draw(st.lists(st.sampled_from(["x", "y"]), min_size=1, unique=True)):
        protocol = draw(st.sampled_from([Protocol.TCP, Protocol.UDP]))
        ports.append(
            ServicePort(
                ServicePortName(namespace, name, port_name, protocol),
                tuple(cluster_ips),
                draw(st.sampled_from([80, 81])),
                protocol,
                node_port=draw(st.sampled_from([0, 30080, 30081])),
                external_ips=external,
                health_check_node_port=health,
                created=created,
            )
        )
    return ports


def cluster(groups: list[list[ServicePort]]) -> dict[ServicePortName, ServicePort]:
    """One Service per namespace/name (the last drawn wins), as a source holds them."""
    by_service: dict[tuple[str, str], list[ServicePort]] = {}
    for ports in groups:
        by_service[ports[0].name.service] = ports
    return {p.name: p for ports in by_service.values() for p in ports}


@settings(max_examples=300, deadline=None)
@given(st.lists(services(), max_size=8), st.randoms(use_true_random=False))
def test_the_decision_depends_on_the_set_only_and_the_older_always_wins(groups, rng) -> None:
    ports = list(cluster(groups).values())
    refusals = resolve(ports)
    shuffled = list(ports)
    rng.shuffle(shuffled)
    assert resolve(shuffled) == refusals
    by_name = {p.name: p for p in ports}
    held: dict[Claim, ServicePortName] = {}
    for port in ports:
        if port.name in refusals:
            for conflict in refusals[port.name]:
                owner = by_name[conflict.owner]
                assert conflict.owner not in refusals  # a refused port holds nothing
                assert owner.name.service != port.name.service
                assert seniority(owner) < seniority(port)  # the older wins
                assert conflict.claim in {render_claim(c) for c in claims_of(owner)}
            continue
        for claim in claims_of(port):
            # no two served Services share a claim: no refused claim reaches the datapath
            other = held.setdefault(claim, port.name)
            assert other.service == port.name.service, (claim, other, port.name)
    for port in ports:  # and every refusal has a reason: nothing is refused for nothing
        if port.name in refusals:
            assert refusals[port.name]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.lists(services() | st.sampled_from(["delete"]), max_size=4), max_size=6),
    st.booleans(),
)
def test_the_resolver_after_any_sequence_of_changes_is_the_decision(batches, full) -> None:
    resolver = ClaimResolver()
    current: dict[ServicePortName, ServicePort] = {}
    for batch in batches:
        before = dict(resolver.refusals)
        changes: dict[ServicePortName, ServicePort | None] = {}
        for item in batch:
            if item == "delete":
                if current:
                    victim = sorted(current)[0].service
                    for name in [n for n in current if n.service == victim]:
                        del current[name]
                        changes[name] = None
                continue
            service = item[0].name.service
            for name in [n for n in current if n.service == service]:
                del current[name]
                changes[name] = None
            for port in item:
                current[port.name] = port
                changes[port.name] = port
        if full:
            flipped = resolver.reset({n: ServiceState(p) for n, p in current.items()})
        else:
            flipped = resolver.update(changes.items())
        assert resolver.refusals == resolve(current.values(), resolver.seen)
        assert set(resolver.seen) == {n.service for n in current}
        assert flipped == {
            n
            for n in before.keys() | resolver.refusals.keys()
            if before.get(n) != resolver.refusals.get(n)
        }


def untimed(ports: list[ServicePort]) -> list[ServicePort]:
    """As kubectl writes manifests: ``creationTimestamp: null``."""
    return [dataclasses.replace(p, created=None) for p in ports]


@settings(max_examples=300, deadline=None)
@given(st.lists(services().map(untimed), min_size=1, max_size=6), services().map(untimed))
def test_a_service_added_later_never_takes_a_claim_from_a_served_one(served, newcomer) -> None:
    """Finding (issue 35): without creationTimestamps the claim went by name, so a newly added
    file (bad-collide.yaml) took nodePort 30080 from the Service serving it, on every node.
    Now between two Services without a timestamp the one seen first keeps it: whatever the
    newcomer's name, every port served before stays served."""
    resolver = ClaimResolver()
    current = cluster(served)
    newcomer_service = newcomer[0].name.service
    # a Service already held would be an update, not a newcomer
    current = {n: p for n, p in current.items() if n.service != newcomer_service}
    resolver.update(current.items())
    serving = {n for n in current if n not in resolver.refusals}
    resolver.update((p.name, p) for p in newcomer)
    assert serving.isdisjoint(resolver.refusals), resolver.refusals
    # and the newcomer is refused exactly where it collides with what serves
    owners = {c for n in serving for c in claims_of(current[n])}
    for port in newcomer:
        assert (port.name in resolver.refusals) == any(c in owners for c in claims_of(port))
    # Services seen in one update tie, and the name decides, as `ovsproxy check` does
    together = ClaimResolver()
    together.update([*current.items(), *((p.name, p) for p in newcomer)])
    assert together.refusals == resolve([*current.values(), *newcomer])


def test_bad_collide_added_later_does_not_take_the_served_node_port() -> None:
    def port(namespace: str, name: str) -> ServicePort:
        return ServicePort(
            ServicePortName(namespace, name), (IPS[0] if name == "web" else IPS[1],), 80,
            Protocol.TCP, node_port=30080,
        )  # fmt: skip

    served, bad = port("demo", "web"), port("demo", "bad-collide")  # "bad-collide" < "web"
    resolver = ClaimResolver()
    resolver.update([(served.name, served)])
    assert resolver.update([(bad.name, bad)]) == {bad.name}
    assert set(resolver.refusals) == {bad.name}
    assert resolver.refusals[bad.name][0].owner == served.name
    # the served one goes: the newcomer gets the port; it comes back: it is the newcomer now
    resolver.update([(served.name, None)])
    assert resolver.refusals == {}
    resolver.update([(served.name, served)])
    assert set(resolver.refusals) == {served.name}
