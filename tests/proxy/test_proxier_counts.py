"""The proxier's running counts (the agent's gauges read them after every sync)."""

from __future__ import annotations

import ipaddress

from ovsproxy.agent.core import NodeFacts, Semantics, build_core
from ovsproxy.config import AgentConfig
from ovsproxy.model import (
    Endpoint,
    EndpointSlice,
    Protocol,
    Service,
    ServicePort,
    ServicePortName,
    SlicePort,
)
from ovsproxy.model.handler import SYNC_ENDPOINT_SLICES, SYNC_SERVICES
from ovsproxy.proxy.proxier import Proxier
from ovsproxy.proxy.tracker import ChangeTracker
from tests.fakes.switch import FakeSwitch


def _slice(name: str, service: str, *addresses: str) -> EndpointSlice:
    endpoints = tuple(Endpoint(ipaddress.ip_address(a), 8080) for a in addresses)
    return EndpointSlice("ns", name, service, (SlicePort("", Protocol.TCP, endpoints),))


def _service(name: str, vip: str) -> Service:
    port = ServicePort(ServicePortName("ns", name, ""), (ipaddress.ip_address(vip),), 80)
    return Service("ns", name, (port,))


def _walked(proxier: Proxier) -> int:
    return sum(len(s.endpoints) for s in proxier.services.values())


async def test_endpoint_count_follows_adds_changes_and_removals() -> None:
    tracker = ChangeTracker()
    tracker.on_synced(SYNC_SERVICES)
    tracker.on_synced(SYNC_ENDPOINT_SLICES)
    proxier = build_core(
        AgentConfig(node_name="n"),
        FakeSwitch(),
        NodeFacts(),
        semantics=Semantics.NONE,
        tracker=tracker,
    ).proxier
    tracker.on_service_add(_service("web", "10.96.0.1"))
    tracker.on_service_add(_service("api", "10.96.0.2"))
    tracker.on_endpoint_slice_add(_slice("web-1", "web", "10.0.0.1", "10.0.0.2"))
    tracker.on_endpoint_slice_add(_slice("api-1", "api", "10.0.1.1"))
    await proxier.sync()
    counts = [proxier.endpoint_count()]
    tracker.on_endpoint_slice_update(_slice("web-1", "web", "10.0.0.1", "10.0.0.2", "10.0.0.3"))
    await proxier.sync()
    counts.append(proxier.endpoint_count())
    tracker.on_endpoint_slice_update(_slice("api-1", "api"))  # the port stays, with none
    await proxier.sync()
    counts.append(proxier.endpoint_count())
    tracker.on_service_delete("ns", "web")
    await proxier.sync()
    counts.append(proxier.endpoint_count())
    assert counts == [3, 4, 3, 0]
    await proxier.sync(full=True)  # a full sync restages every port: no double count
    assert proxier.endpoint_count() == _walked(proxier) == 0
    tracker.on_endpoint_slice_update(_slice("api-1", "api", "10.0.1.1", "10.0.1.2"))
    await proxier.sync(full=True)
    assert proxier.endpoint_count() == _walked(proxier) == 2
