"""``agent.core.build_core``: the one way the agent, ``verify``, the test harnesses and the
benches build the core. What each level of Service semantics wires, the NodePort frontends
from the configuration, and the followers called after each commit, in order."""

from __future__ import annotations

import ipaddress

import pytest

from ovsproxy.agent.core import NodeFacts, Semantics, build_core, commit_followers
from ovsproxy.config import AgentConfig
from ovsproxy.datapath.reject import Rejector
from ovsproxy.model import IPAddress, Service, ServicePort, ServicePortName
from ovsproxy.model.handler import SYNC_ENDPOINT_SLICES, SYNC_SERVICES
from ovsproxy.openflow.connection import Channel
from ovsproxy.proxy.followers import Committed
from ovsproxy.servicecidr import ServiceCIDRDiscoverer
from tests.fakes.switch import FakeSwitch


def ip(text: str) -> IPAddress:
    return ipaddress.ip_address(text)


async def test_live_semantics_are_wired_to_the_channel_and_the_proxier() -> None:
    channel = Channel("tcp:127.0.0.1:1")  # never started
    core = build_core(AgentConfig(node_name="n", zone="z"), channel, NodeFacts(generation=7))
    semantics = core.semantics
    assert semantics is not None
    try:
        proxier = core.proxier
        assert (proxier.node_name, proxier.zone, core.datapath.generation) == ("n", "z", 7)
        assert proxier.tracker is core.tracker and proxier.datapath is core.datapath
        assert proxier._reject_action == semantics.rejector.reject_action != ()
        assert proxier.conntrack is semantics.conntrack
        assert proxier._send == channel.send
        assert channel.on_packet_in == semantics.handle
        assert semantics.rejector.forwards == proxier.forwards
        # one sweep interval: the sweeper's and what the proxier's status says of it
        assert proxier.sweep_interval == semantics.sweeper.interval == 60.0
        assert channel.on_connected is not None  # the meter, then the datapath's replay
    finally:
        await semantics.close()


async def test_flows_only_and_none_send_nothing_after_a_commit() -> None:
    config = AgentConfig(node_name="n")
    flows = build_core(config, FakeSwitch(), NodeFacts(), semantics=Semantics.FLOWS)
    assert flows.semantics is None
    assert flows.proxier._reject_action == Rejector(None).reject_action != ()
    assert flows.proxier.conntrack is None and flows.proxier._send is None
    none = build_core(config, FakeSwitch(), NodeFacts(), semantics=Semantics.NONE)
    assert none.proxier._reject_action == () and none.semantics is None
    with pytest.raises(TypeError, match="over a Channel"):
        build_core(config, FakeSwitch(), NodeFacts())


V4, LOOPBACK, V6, V4_2, OTHER = "192.168.50.1", "127.0.0.1", "fd00::1", "192.168.50.2", "10.0.0.1"


@pytest.mark.parametrize(
    ("overrides", "node_ports", "node_port_ips"),
    [
        ({}, True, (V4, V6, V4_2, OTHER)),  # every node IP but loopback
        ({"node_port_addresses": ("192.168.0.0/16",)}, True, (V4, V6, V4_2)),  # IPv6: every one
        ({"node_port_addresses": ("primary",)}, True, (V4, V6)),
        ({"node_ports": False}, False, ()),
        ({"manage_routes": False}, False, ()),  # no steering without the routes
    ],
)
def test_node_port_frontends_follow_the_configuration(overrides, node_ports, node_port_ips):
    node_ip = (V4, LOOPBACK, V6, V4_2, OTHER)
    config = AgentConfig(node_name="n", node_ip=node_ip, **overrides)
    core = build_core(config, FakeSwitch(), NodeFacts(), semantics=Semantics.NONE)
    assert core.proxier.node_ports is node_ports
    assert core.proxier.node_port_ips == tuple(ip(a) for a in node_port_ips)


async def test_followers_see_each_commit_in_order_and_cluster_ips_only_when_they_change() -> None:
    seen: list[tuple[str, object]] = []

    class HealthChecks:
        async def after_commit(self, committed: Committed) -> None:
            seen.append(("health checks", sorted(map(str, committed.touched))))

    class NodeIngress:
        health_checks = HealthChecks()

        async def after_commit(self, committed: Committed) -> None:
            seen.append(("node ingress", sorted(map(str, committed.touched))))

    discoverer = ServiceCIDRDiscoverer(configured=(), use_api=False)
    followers = commit_followers(NodeIngress(), discoverer)
    added: list[frozenset[IPAddress]] = []
    discoverer.add_cluster_ips = lambda ips: (  # type: ignore[method-assign]
        added.append(frozenset(ips)),
        seen.append(("cluster IPs", sorted(map(str, ips)))),
    )
    core = build_core(
        AgentConfig(node_name="n"),
        FakeSwitch(),
        NodeFacts(),
        semantics=Semantics.NONE,
        followers=followers,
    )
    tracker = core.tracker
    tracker.on_synced(SYNC_SERVICES)
    tracker.on_synced(SYNC_ENDPOINT_SLICES)
    name = ServicePortName("ns", "web", "")
    tracker.on_service_add(Service("ns", "web", (ServicePort(name, (ip("10.96.0.1"),), 80),)))
    await core.proxier.sync()
    assert seen == [
        ("node ingress", ["ns/web/TCP"]),
        ("health checks", ["ns/web/TCP"]),
        ("cluster IPs", ["10.96.0.1"]),
    ]
    tracker.on_service_update(Service("ns", "web", (ServicePort(name, (ip("10.96.0.1"),), 81),)))
    await core.proxier.sync()
    # the same ClusterIP: not handed on again
    assert seen[3:] == [("node ingress", ["ns/web/TCP"]), ("health checks", ["ns/web/TCP"])]
    assert added == [frozenset({ip("10.96.0.1")})]
