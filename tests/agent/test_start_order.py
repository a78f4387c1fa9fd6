"""Start-up order: the source lists while the rest of the agent is set up.

A cold start is mostly the list of Services and EndpointSlices; nothing the tracker records
needs the node side (steering table, policy routes, health checks), OVSDB or the switch, so
the list must not wait for them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from ovsproxy.agent.lifecycle import Agent
from ovsproxy.config import AgentConfig
from ovsproxy.lab import EXAMPLES


async def test_the_source_lists_while_the_node_side_is_still_starting(tmp_path: Path) -> None:
    config = AgentConfig(
        manifests=(str(EXAMPLES),),
        # an OVS that is not there: start-up never gets past the node side here anyway
        ovsdb=f"unix:{tmp_path}/db.sock",
        openflow=f"unix:{tmp_path}/br.mgmt",
        metrics_address="127.0.0.1:0",
    )
    assert config.steers  # the default: node-side steering runs, before OVSDB
    agent = Agent(config)
    node_side_started = asyncio.Event()
    node_side_may_end = asyncio.Event()

    async def slow_node_side(source_started: asyncio.Task[None]) -> AgentConfig:
        # (a stand-in: the real node side needs a network namespace; its cost is what
        # matters here, and the e2e tests run the real one)
        node_side_started.set()
        await node_side_may_end.wait()
        return agent.config

    agent._start_node_side = slow_node_side  # type: ignore[method-assign]
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
        await asyncio.wait_for(node_side_started.wait(), 10)
        await asyncio.wait_for(listed.wait(), 10)
        assert tracker.service_count() > 0
        assert not node_side_may_end.is_set()  # listed while the node side was starting
    finally:
        node_side_may_end.set()
        stop.set()
        await asyncio.wait_for(run, 30)
