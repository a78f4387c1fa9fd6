"""kube-proxy's sync metrics as the sync wrapper sets them (``agent.sync.Syncer``), in the
cases the live test (tests/e2e/test_kube_proxy_metrics.py) cannot bring about: a sync before
the sources synced and a sync whose commit fails. docs/observability.md's table says what
each means."""

from __future__ import annotations

import ipaddress
import time

import pytest

from ovsproxy.agent.core import NodeFacts, Semantics, build_core
from ovsproxy.agent.sync import Syncer
from ovsproxy.agent.wiring import Components
from ovsproxy.config import AgentConfig
from ovsproxy.metrics import HealthState, Metrics
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
from ovsproxy.openflow.errors import RequestTimeout
from tests.fakes.switch import FakeSwitch

DURATION = "ovsproxy_sync_proxy_rules_duration_seconds_count"
LAST = "ovsproxy_sync_proxy_rules_last_timestamp_seconds"
PROGRAMMING = "ovsproxy_network_programming_duration_seconds_count"


def _slice(address: str, trigger: float) -> EndpointSlice:
    endpoint = Endpoint(ipaddress.ip_address(address), 8080)
    return EndpointSlice("ns", "web-1", "web", (SlicePort("", Protocol.TCP, (endpoint,)),), trigger)


async def test_failed_syncs_are_timed_but_only_a_successful_one_is_the_last() -> None:
    switch = FakeSwitch()
    parts = Components(AgentConfig(node_name="n"))
    parts.take_core(
        build_core(
            parts.config, switch, NodeFacts(), semantics=Semantics.NONE, tracker=parts.tracker
        )
    )
    metrics = Metrics()
    syncer = Syncer(parts, metrics, HealthState())

    def value(name: str, **labels: str) -> float:
        if name in (DURATION, LAST) and not labels:  # one sync: the same under each family
            v4, v6 = (value(name, ip_family=family) for family in ("IPv4", "IPv6"))
            assert v4 == v6, (name, v4, v6)
            return v4
        if name == PROGRAMMING and not labels:  # the slice's family (IPv4)
            return value(name, ip_family="IPv4")
        found = metrics.registry.get_sample_value(name, labels)
        return 0.0 if found is None else found

    tracker = parts.tracker
    port = ServicePort(ServicePortName("ns", "web", ""), (ipaddress.ip_address("10.96.0.1"),), 80)
    tracker.on_service_add(Service("ns", "web", (port,)))
    tracker.on_endpoint_slice_add(_slice("10.0.0.1", time.time()))
    await syncer(False)  # the sources have not synced: no sync, nothing timed (as kube-proxy)
    assert (value(DURATION), value(LAST), value(PROGRAMMING)) == (0, 0, 0)

    tracker.on_synced(SYNC_SERVICES)
    tracker.on_synced(SYNC_ENDPOINT_SLICES)
    before = time.time()
    await syncer(False)
    assert value(DURATION) == 1 and value(PROGRAMMING) == 1
    last = value(LAST)
    assert before <= last <= time.time()

    # A failed sync is timed; it is not the last successful one, and its change's
    # programming latency waits for the commit that lands.
    tracker.on_endpoint_slice_update(_slice("10.0.0.2", time.time()))
    switch.fail = RequestTimeout("no reply to bundle commit")
    with pytest.raises(Exception, match="no reply"):
        await syncer(False)
    assert value(DURATION) == 2 and value(LAST) == last and value(PROGRAMMING) == 1
    assert value("ovsproxy_syncs_total", result="error") == 1

    await syncer(False)
    assert value(DURATION) == 3 and value(LAST) > last and value(PROGRAMMING) == 2
