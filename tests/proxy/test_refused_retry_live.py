"""A Service port the switch refused for a reason that passes (a full flow table: antrea#8206's
failure class) is tried again by the sync runner, with backoff, without waiting for an
unrelated event (real OVS, the agent's own sync wrapper and runner).

The refusal is Open vSwitch's own: the ServiceLB table is given a flow limit with
``overflow_policy=refuse`` (OFPFMFC_TABLE_FULL at commit); the operator then lifts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

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
from ovsproxy.openflow.connection import Channel
from ovsproxy.ovs.sandbox import Sandbox
from ovsproxy.proxy.runner import SyncRunner

pytestmark = [pytest.mark.ovs, pytest.mark.shared_sandbox]


@dataclass
class Agent:
    sandbox: Sandbox
    parts: Components
    runner: SyncRunner

    def add(self, name: str, cluster_ip: str) -> None:
        tracker = self.parts.tracker
        port = ServicePort(ServicePortName("ns", name, ""), (ipaddress.ip_address(cluster_ip),), 80)
        tracker.on_service_add(Service("ns", name, (port,)))
        endpoint = Endpoint(ipaddress.ip_address("10.244.0.9"), 8080)
        tracker.on_endpoint_slice_add(
            EndpointSlice("ns", f"{name}-1", name, (SlicePort("", Protocol.TCP, (endpoint,)),))
        )

    def on_switch(self, cluster_ip: str) -> bool:
        return f"nw_dst={cluster_ip}," in self.sandbox.ofctl("dump-flows")

    def refused(self) -> set[str]:
        assert self.parts.proxier is not None
        return {str(name) for name in self.parts.proxier.refused}


@pytest.fixture
async def agent(sandbox: Sandbox) -> AsyncIterator[Agent]:
    channel = Channel(sandbox.openflow)
    parts = Components(AgentConfig(node_name="n", node_ports=False))
    parts.take_core(
        build_core(
            parts.config, channel, NodeFacts(), semantics=Semantics.NONE, tracker=parts.tracker
        )
    )
    await channel.start()
    runner = SyncRunner(
        Syncer(parts, Metrics(), HealthState()),
        min_interval=0,
        full_resync_interval=3600,  # no periodic full sync within the test
        retry_initial=0.2,
        retry_max=1.0,
    )
    parts.tracker.set_notify(runner.request)
    task = asyncio.create_task(runner.run())
    try:
        yield Agent(sandbox, parts, runner)
    finally:
        runner.stop()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(task, 5)
        await channel.close()
        sandbox.vsctl("clear", "Bridge", sandbox.bridge, "flow_tables")


async def eventually(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        await asyncio.sleep(0.05)


async def test_a_service_refused_by_a_full_table_is_retried_once_it_has_room(
    agent: Agent,
) -> None:
    tracker, datapath = agent.parts.tracker, agent.parts.datapath
    assert datapath is not None
    agent.add("good", "10.96.0.11")
    tracker.on_synced(SYNC_SERVICES)
    tracker.on_synced(SYNC_ENDPOINT_SLICES)
    await eventually(lambda: agent.on_switch("10.96.0.11"), 10, "good installed")

    # The ServiceLB table is full: a new Service's flows there are refused at commit.
    lb = datapath.tables.service_lb
    held = sum(f" table={lb}," in line for line in agent.sandbox.ofctl("dump-flows").splitlines())
    agent.sandbox.vsctl(
        *("--", "--id=@ft", "create", "Flow_Table", f"flow_limit={held}"),
        *("overflow_policy=refuse", "--", "set", "Bridge", agent.sandbox.bridge),
        f"flow_tables:{lb}=@ft",
    )
    agent.add("late", "10.96.0.12")
    await eventually(lambda: agent.refused() == {"ns/late/TCP"}, 10, "late refused")
    assert not agent.on_switch("10.96.0.12")

    # The table has room again; nothing else changes: the runner tries late again itself.
    agent.sandbox.vsctl("clear", "Bridge", agent.sandbox.bridge, "flow_tables")
    await eventually(lambda: agent.on_switch("10.96.0.12"), 5, "late installed by a retry")
    await eventually(lambda: not agent.refused(), 5, "late no longer refused")
    assert agent.on_switch("10.96.0.11")
