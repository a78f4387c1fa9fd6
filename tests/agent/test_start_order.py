"""Start-up order: the source lists while the rest of the agent is set up.

A cold start is mostly the list of Services and EndpointSlices; nothing the tracker records
needs the node ingress (steering table, policy routes, health checks), OVSDB or the switch, so
the list must not wait for them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from ovsproxy.agent.lifecycle import Agent
from ovsproxy.config import AgentConfig
from ovsproxy.lab import EXAMPLES


async def test_the_source_lists_while_the_node_ingress_is_still_starting(tmp_path: Path) -> None:
    config = AgentConfig(
        manifests=(str(EXAMPLES),),
        # an OVS that is not there: start-up never gets past the node ingress here anyway
        ovsdb=f"unix:{tmp_path}/db.sock",
        openflow=f"unix:{tmp_path}/br.mgmt",
        metrics_address="127.0.0.1:0",
        health_address="",
    )
    assert config.steers  # the default: node-side steering runs, before OVSDB
    agent = Agent(config)
    node_ingress_started = asyncio.Event()
    node_ingress_may_end = asyncio.Event()

    async def slow_node_ingress(source_started: asyncio.Task[None]) -> AgentConfig:
        # (a stand-in: the real node ingress needs a network namespace; its cost is what
        # matters here, and the e2e tests run the real one)
        node_ingress_started.set()
        await node_ingress_may_end.wait()
        return agent.config

    agent._start_node_ingress = slow_node_ingress  # type: ignore[method-assign]
    tracker = agent.parts.tracker
    listed = asyncio.Event()
    on_synced = tracker.on_synced

    def synced(kind: str) -> None:
        on_synced(kind)
        if tracker.synced:
            listed.set()

    tracker.on_synced = synced  # type: ignore[method-assign]
    stop = asyncio.Event()
    run = asyncio.create_task(agent.run(stop))
    try:
        await asyncio.wait_for(node_ingress_started.wait(), 10)
        await asyncio.wait_for(listed.wait(), 10)
        assert tracker.service_count() > 0
        assert not node_ingress_may_end.is_set()  # listed while the node ingress was starting
    finally:
        node_ingress_may_end.set()
        stop.set()
        await asyncio.wait_for(run, 30)
