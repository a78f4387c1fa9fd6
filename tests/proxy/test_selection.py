"""Endpoint selection and group ids on the proxier's one staging path.

``select_endpoints`` returns early for the common port (nothing external reaches it,
internalTrafficPolicy Cluster, every endpoint ready and without topology hints): whatever the
port, what it selects is what ``categorize_endpoints`` decides. Staging assigns each port the
groups its selection needs (``group_uses``, ``GroupIDs.assign``), whatever shape it had before.
"""

from __future__ import annotations

import dataclasses
import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ovsproxy.agent.core import NodeFacts, Semantics, build_core
from ovsproxy.config import AgentConfig
from ovsproxy.datapath import pipeline as pl
from ovsproxy.model import (
    Endpoint,
    IPFamily,
    Protocol,
    ServicePort,
    ServicePortName,
    ServiceState,
    ServiceType,
    TrafficPolicy,
)
from ovsproxy.proxy.categorize import categorize_endpoints, topology_mode
from ovsproxy.proxy.group_ids import EXTERNAL
from ovsproxy.proxy.proxier import DROP, FORWARD, REJECT, Proxier, select_endpoints
from tests.fakes.switch import FakeSwitch

NODE = "node-a"
ZONE = "z1"
ip = ipaddress.ip_address


def _port(name: str, *vips: str, **kwargs: object) -> ServicePort:
    protocol = kwargs.pop("protocol", Protocol.TCP)
    assert isinstance(protocol, Protocol)
    return ServicePort(
        ServicePortName("ns", name, "", protocol),
        tuple(ip(v) for v in vips),
        80,
        protocol,
        **kwargs,  # type: ignore[arg-type]
    )


def _eps(*addresses: str, **kwargs: object) -> tuple[Endpoint, ...]:
    return tuple(Endpoint(ip(a), 8080, **kwargs) for a in addresses)  # type: ignore[arg-type]


PLAIN: dict[str, ServiceState] = {
    "v4": ServiceState(_port("v4", "10.96.0.1"), _eps("10.0.0.1", "10.0.0.2")),
    "v6": ServiceState(_port("v6", "fd00::1"), _eps("fd01::1", "fd01::2")),
    "no endpoints": ServiceState(_port("none", "10.96.0.2")),
    "udp": ServiceState(_port("udp", "10.96.0.3", protocol=Protocol.UDP), _eps("10.0.0.3")),
    "affinity": ServiceState(_port("aff", "10.96.0.4", affinity_timeout=600), _eps("10.0.0.4")),
    "on this node": ServiceState(_port("local", "10.96.0.5"), _eps("10.0.0.5", node_name=NODE)),
    "eTP Local, not external": ServiceState(
        _port("etp", "10.96.0.6", external_traffic_policy=TrafficPolicy.LOCAL), _eps("10.0.0.6")
    ),
}

NOT_PLAIN: dict[str, ServiceState] = {
    "dual-stack": ServiceState(
        _port("dual", "10.96.1.1", "fd00::11"), (*_eps("10.0.1.1"), *_eps("fd01::11"))
    ),
    "not ready": ServiceState(
        _port("nr", "10.96.1.2"), (*_eps("10.0.1.2"), *_eps("10.0.1.3", ready=False))
    ),
    "terminating only": ServiceState(
        _port("term", "10.96.1.3"), _eps("10.0.1.4", ready=False, serving=True, terminating=True)
    ),
    "zone hints": ServiceState(
        _port("zone", "10.96.1.4"), _eps("10.0.1.5", hint_zones=frozenset({"z1"}))
    ),
    "node hints": ServiceState(
        _port("hint", "10.96.1.5"), _eps("10.0.1.6", hint_nodes=frozenset({NODE}))
    ),
    "iTP Local": ServiceState(
        _port("itp", "10.96.1.6", internal_traffic_policy=TrafficPolicy.LOCAL),
        _eps("10.0.1.7", node_name=NODE),
    ),
    "NodePort": ServiceState(
        _port("np", "10.96.1.7", type=ServiceType.NODE_PORT, node_port=30080), _eps("10.0.1.8")
    ),
    "external IP": ServiceState(
        _port("ext", "10.96.1.8", external_ips=(ip("192.0.2.1"),)), _eps("10.0.1.9")
    ),
    "LB IP": ServiceState(
        _port("lb", "10.96.1.9", load_balancer_ips=(ip("192.0.2.2"),)), _eps("10.0.1.10")
    ),
    "no ClusterIP": ServiceState(_port("headless"), _eps("10.0.1.11")),
}


def assert_categorised(state: ServiceState, *, node_ports: bool, short_circuit: bool) -> None:
    """What ``select_endpoints`` decides for ClusterIP traffic is categorisation's answer."""
    port = state.port
    for family in sorted(port.families):
        sel = select_endpoints(
            state, family, NODE, ZONE, node_ports=node_ports, short_circuit=short_circuit
        )
        candidates = state.endpoints_of(family)
        cats = categorize_endpoints(candidates, port, NODE, ZONE)
        internal = cats.local if port.internal_policy_local else cats.cluster
        internal = cats.all_reachable if internal is None else internal
        assert sel.frontends == port.cluster_ips_of(family)
        assert sel.endpoints == internal
        action = REJECT if not cats.has_any else DROP if not internal else FORWARD
        assert sel.action == action and bool(sel.reason) == (action != FORWARD)
        assert sel.terminating == (bool(internal) and not any(ep.ready for ep in internal))
        mode = topology_mode(candidates, NODE, ZONE) if port.uses_cluster_endpoints else None
        assert sel.topology == (mode.value if mode else "")
        used = set(internal)
        assert [name for name, _why in sel.excluded] == [
            str(ep) for ep in candidates if ep not in used
        ]
        # external traffic: external and load-balancer IPs, the NodePort (when served)
        external = port.external_ips + port.load_balancer_ips
        assert sel.external_frontends == tuple(
            dict.fromkeys(a for a in external if a.version == family and a not in sel.frontends)
        )
        has_node_port = node_ports and port.node_port and sel.frontends
        assert sel.node_port_frontends == (
            (pl.VIRTUAL_NODEPORT_IP[family],) if has_node_port else ()
        )
        if sel.has_external:
            chosen = cats.local if port.external_policy_local else cats.cluster
            assert sel.external_endpoints == (cats.all_reachable if chosen is None else chosen)
            short = short_circuit and port.external_policy_local
            assert sel.in_cluster_endpoints == (cats.cluster if short else None)
        else:
            assert (sel.external_endpoints, sel.in_cluster_endpoints) == ((), None)


@pytest.mark.parametrize("case", [*PLAIN, *NOT_PLAIN])
def test_selection_is_categorisations(case: str) -> None:
    state = {**PLAIN, **NOT_PLAIN}[case]
    for node_ports, short_circuit in ((False, False), (True, True)):
        assert_categorised(state, node_ports=node_ports, short_circuit=short_circuit)


@pytest.mark.parametrize("case", list(PLAIN))
def test_the_common_port_uses_every_endpoint_in_one_group(case: str) -> None:
    proxier, _switch = _proxier()
    state = PLAIN[case]
    proxier._stage_service(state)
    installed = proxier.services[state.port.name]
    (family,) = state.port.families
    sel = installed.families[family]
    assert (sel.endpoints, sel.excluded, sel.has_external) == (state.endpoints, (), False)
    assert sel.action == (FORWARD if state.endpoints else REJECT)
    assert installed.group_ids == {family: proxier.groups.first}
    assert installed.external_group_ids == {} and installed.endpoints == state.endpoints


def _endpoints(family: IPFamily) -> st.SearchStrategy[tuple[Endpoint, ...]]:
    address = (
        (lambda i: ip(f"10.0.0.{i}")) if family == IPFamily.IPv4 else (lambda i: ip(f"fd01::{i}"))
    )
    endpoint = st.builds(
        Endpoint,
        ip=st.integers(1, 9).map(address),
        port=st.just(8080),
        ready=st.booleans() | st.just(True),
        serving=st.booleans(),
        terminating=st.booleans(),
        node_name=st.sampled_from([NODE, "node-b", None]),
        hint_zones=st.just(frozenset()) | st.frozensets(st.sampled_from([ZONE, "z2"])),
        hint_nodes=st.just(frozenset()) | st.frozensets(st.sampled_from([NODE, "node-b"])),
    )
    return st.lists(endpoint, max_size=5, unique_by=lambda e: e.ip).map(tuple)


@st.composite
def states(draw: st.DrawFn) -> ServiceState:
    families = draw(st.sampled_from([(IPFamily.IPv4,), (IPFamily.IPv6,), tuple(IPFamily)]))
    vips = tuple(ip("10.96.0.1") if f == IPFamily.IPv4 else ip("fd00::1") for f in families)
    node_port = draw(st.sampled_from([0, 0, 30080]))
    port = ServicePort(
        ServicePortName("ns", "svc", "", Protocol.TCP),
        vips,
        80,
        internal_traffic_policy=draw(st.sampled_from(TrafficPolicy)),
        external_traffic_policy=draw(st.sampled_from(TrafficPolicy)),
        type=ServiceType.NODE_PORT if node_port else ServiceType.CLUSTER_IP,
        node_port=node_port,
        external_ips=draw(st.sampled_from([(), (ip("192.0.2.1"),)])),
        load_balancer_ips=draw(st.sampled_from([(), (ip("192.0.2.2"),)])),
    )
    endpoints = tuple(ep for f in families for ep in draw(_endpoints(f)))
    return ServiceState(port, endpoints)


@given(states(), st.booleans(), st.booleans())
def test_any_port_selects_what_categorisation_decides(state, node_ports, short_circuit) -> None:
    assert_categorised(state, node_ports=node_ports, short_circuit=short_circuit)


def _proxier() -> tuple[Proxier, FakeSwitch]:
    switch = FakeSwitch()
    config = AgentConfig(node_name=NODE, zone=ZONE)
    core = build_core(config, switch, NodeFacts(), semantics=Semantics.NONE)
    return core.proxier, switch


def _groups_staged(proxier: Proxier) -> dict[object, set[int]]:
    dp = proxier.datapath
    return {o: set(dp.desired.owners[o].groups) for o in dp.owners() if dp.desired.owners[o].groups}


# Ports changing shape between the common case and the others: ids freed by one port are
# the next one's.
_EXT = NOT_PLAIN["external IP"]
_EXT_PLAIN = ServiceState(dataclasses.replace(_EXT.port, external_ips=()), _EXT.endpoints)
_V4_AS_V6 = ServiceState(
    dataclasses.replace(PLAIN["v4"].port, cluster_ips=(ip("fd00::40"),)), _eps("fd01::40")
)
STEPS: list[list[ServiceState]] = [
    [*PLAIN.values(), *NOT_PLAIN.values()],
    [_EXT_PLAIN, _V4_AS_V6, NOT_PLAIN["dual-stack"]],
    [_EXT, PLAIN["v4"], ServiceState(PLAIN["udp"].port)],
]


async def test_every_port_stages_the_groups_it_was_assigned() -> None:
    proxier, _switch = _proxier()
    for step in STEPS:
        for state in step:
            proxier._stage_service(state)
        await proxier.datapath.commit()
        assigned = proxier.groups.assigned()
        staged = _groups_staged(proxier)
        assert staged == {n: set(ids.values()) for n, ids in assigned.items() if ids}
        held = [gid for ids in assigned.values() for gid in ids.values()]
        assert len(held) == len(set(held))
        for name, installed in proxier.services.items():
            expected = set(installed.group_ids.values()) | set(
                installed.external_group_ids.values()
            )
            assert expected <= staged.get(name, set())


async def test_a_port_keeps_its_clusterip_group_as_external_frontends_come_and_go() -> None:
    proxier, _switch = _proxier()
    name = _EXT.port.name
    proxier._stage_service(_EXT_PLAIN)
    (gid,) = proxier.services[name].group_ids.values()
    proxier._stage_service(
        dataclasses.replace(_EXT, endpoints=(*_EXT.endpoints, *_eps("10.0.1.99")))
    )
    installed = proxier.services[name]
    # the external IP shares the ClusterIPs' endpoints: one group for both
    assert installed.group_ids == {IPFamily.IPv4: gid} and installed.external_group_ids == {}
    local = dataclasses.replace(_EXT.port, external_traffic_policy=TrafficPolicy.LOCAL)
    proxier._stage_service(ServiceState(local, _eps("10.0.1.9", node_name=NODE)))
    installed = proxier.services[name]
    assert installed.group_ids == {IPFamily.IPv4: gid}
    (external,) = installed.external_group_ids.values()
    assert (
        proxier.groups.ids_of(name, EXTERNAL) == {IPFamily.IPv4: external} != {IPFamily.IPv4: gid}
    )
    proxier._stage_service(_EXT_PLAIN)
    assert proxier.groups.assigned()[name] == {(IPFamily.IPv4, ""): gid}
    proxier._stage_service(PLAIN["v6"])  # a port new to the proxier: the id given back
    assert proxier.services[PLAIN["v6"].port.name].group_ids == {IPFamily.IPv6: external}
