"""Network programming latency: from a slice change's trigger time to the commit carrying it
(the proxier's part; tests/e2e/test_kube_proxy_metrics.py measures it through the agent)."""

from __future__ import annotations

import asyncio
import ipaddress
import time

import pytest

from ovsproxy.agent.core import NodeFacts, Semantics, build_core
from ovsproxy.config import AgentConfig
from ovsproxy.model import (
    Endpoint,
    EndpointSlice,
    IPFamily,
    Protocol,
    Service,
    ServicePort,
    ServicePortName,
    SlicePort,
)
from ovsproxy.model.handler import SYNC_ENDPOINT_SLICES, SYNC_SERVICES
from ovsproxy.openflow.errors import RequestTimeout
from ovsproxy.proxy.tracker import ChangeTracker
from tests.fakes.switch import FakeSwitch


def _slice(address: str, trigger: float) -> EndpointSlice:
    endpoint = Endpoint(ipaddress.ip_address(address), 8080)
    return EndpointSlice("ns", "web-1", "web", (SlicePort("", Protocol.TCP, (endpoint,)),), trigger)


async def test_a_failed_commit_keeps_the_trigger_times_for_the_commit_that_lands() -> None:
    switch = FakeSwitch()
    tracker = ChangeTracker()
    tracker.on_synced(SYNC_SERVICES)
    tracker.on_synced(SYNC_ENDPOINT_SLICES)
    proxier = build_core(
        AgentConfig(node_name="n"), switch, NodeFacts(), semantics=Semantics.NONE, tracker=tracker
    ).proxier
    port = ServicePort(ServicePortName("ns", "web", ""), (ipaddress.ip_address("10.96.0.1"),), 80)
    tracker.on_service_add(Service("ns", "web", (port,)))
    first = time.time()
    tracker.on_endpoint_slice_add(_slice("10.0.0.1", first))
    result = await proxier.sync()
    [(family, latency)] = result.programming_latencies
    assert family is IPFamily.IPv4 and 0 <= latency <= time.time() - first
    # The next change's commit fails: nothing is observed; the retry that lands observes it.
    second = time.time()
    tracker.on_endpoint_slice_update(_slice("10.0.0.2", second))
    switch.fail = RequestTimeout("no reply to bundle commit")
    with pytest.raises(Exception, match="no reply"):
        await proxier.sync()
    await asyncio.sleep(0.2)
    retried = await proxier.sync()
    [(_, latency)] = retried.programming_latencies
    assert 0.2 <= latency <= time.time() - second
    assert (await proxier.sync()).programming_latencies == ()  # observed once
