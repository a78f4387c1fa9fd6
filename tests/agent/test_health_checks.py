"""``agent.nodeport.HealthChecks``, the follower that keeps the healthCheckNodePort servers:
asked to change them only when a port with a healthCheckNodePort was touched (or on a full
sync), with every such port's state. The servers themselves are tested live in
tests/healthcheck/ and tests/lab/test_nodeport.py."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

from ovsproxy.agent.nodeport import HealthChecks
from ovsproxy.healthcheck import ProxyHealth
from ovsproxy.healthcheck.service_health import ServiceHealth, ServiceKey, UpdateResult
from ovsproxy.model import (
    Endpoint,
    IPAddress,
    ServicePort,
    ServicePortName,
    ServiceState,
    ServiceType,
    TrafficPolicy,
)
from ovsproxy.proxy.followers import Committed

NODE = "node-a"


class Servers:
    def __init__(self) -> None:
        self.updates: list[dict[ServiceKey, ServiceHealth]] = []

    async def update(self, desired: Mapping[ServiceKey, ServiceHealth]) -> UpdateResult:
        self.updates.append(dict(desired))
        return UpdateResult()


def state(name: str, health_check_node_port: int = 0) -> ServiceState:
    port = ServicePort(
        ServicePortName("ns", name, ""),
        (ipaddress.ip_address("10.96.0.1"),),
        80,
        type=ServiceType.LOAD_BALANCER if health_check_node_port else ServiceType.CLUSTER_IP,
        external_traffic_policy=TrafficPolicy.LOCAL,
        health_check_node_port=health_check_node_port,
    )
    return ServiceState(port, (Endpoint(ipaddress.ip_address("10.0.0.1"), 80, node_name=NODE),))


def commit(touched: dict[ServicePortName, ServiceState | None], full: bool = False) -> Committed:
    def no_cluster_ips() -> frozenset[IPAddress]:
        raise AssertionError("not asked of the health checks")

    return Committed(touched, full, 0, no_cluster_ips)


async def test_servers_change_only_with_the_ports_that_have_a_health_check() -> None:
    checks = HealthChecks(NODE, ProxyHealth(), None)
    servers = checks.servers = Servers()  # type: ignore[assignment]
    lb, plain = state("lb", 31000), state("plain")
    await checks.after_commit(commit({lb.port.name: lb, plain.port.name: plain}))
    assert [list(u) for u in servers.updates] == [[("ns", "lb")]]
    assert servers.updates[0][("ns", "lb")].port == 31000
    await checks.after_commit(commit({plain.port.name: None}))  # not one of them: nothing
    assert len(servers.updates) == 1
    await checks.after_commit(commit({}, full=True))  # a full sync: asked again, as it is
    assert [list(u) for u in servers.updates[1:]] == [[("ns", "lb")]]
    await checks.after_commit(commit({lb.port.name: state("lb")}))  # its check removed
    assert servers.updates[2:] == [{}]
