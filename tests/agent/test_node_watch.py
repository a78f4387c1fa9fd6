"""The agent's NodeWatcher: the Node's events into the proxy health and the node IPs (the e2e
test tests/e2e/test_node_object.py runs the same through a real agent, OVS and the fake API)."""

from __future__ import annotations

import asyncio
import ipaddress
import logging

import pytest

from ovsproxy.agent.lifecycle import Agent
from ovsproxy.agent.node import NodeWatcher
from ovsproxy.config import AgentConfig
from ovsproxy.healthcheck import TO_BE_DELETED_TAINT, ProxyHealth
from ovsproxy.model import IPAddress
from ovsproxy.model.node import Node

A, B = ipaddress.ip_address("192.0.2.1"), ipaddress.ip_address("2001:db8::1")


def test_events_set_eligibility_and_address_changes_reach_the_follower() -> None:
    health = ProxyHealth()
    watcher = NodeWatcher("node-1", health)
    seen: list[tuple[IPAddress, ...]] = []
    watcher.on_add(Node("node-1", internal_ips=(A,)))
    watcher.follow(seen.append)
    assert seen == [(A,)]  # what it has, at once
    watcher.on_update(Node("node-1", internal_ips=(A,), taints=(TO_BE_DELETED_TAINT,)))
    assert not health.node_eligible and seen == [(A,)]  # same addresses: no call
    watcher.on_update(Node("node-1", internal_ips=(A,), external_ips=(B,)))
    assert health.node_eligible and seen == [(A,), (A, B)]
    watcher.on_update(Node("node-1"))  # no addresses: the node IPs stay
    assert seen == [(A,), (A, B)]
    watcher.on_delete("node-1")
    assert not health.node_eligible
    status = watcher.status()
    assert status["deleted"] and not status["found"] and not status["eligible"]
    watcher.on_add(Node("node-1", internal_ips=(A,), deletion_timestamp="2026-12-01T00:00:00Z"))
    assert not health.node_eligible and not watcher.status()["deleted"]
    assert seen[-1] == (A,)


async def test_start_up_waits_for_the_node_list_then_falls_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    agent = Agent(AgentConfig(kubeconfig="/nonexistent", node_name="node-1"))
    agent.node_wait = 0.05
    agent.parts.node = NodeWatcher("node-1", agent.proxy_health)
    started: asyncio.Task[None] = asyncio.create_task(asyncio.sleep(0))
    with caplog.at_level(logging.WARNING, "ovsproxy.agent"):
        assert await agent._node_object_ips(started) == ()
    assert "Node node-1 not listed within 0.05s" in caplog.text
    # Listed (found): its addresses.
    agent.parts.node.on_add(Node("node-1", internal_ips=(A,)))
    agent.parts.node.on_synced()
    assert await agent._node_object_ips(started) == (A,)
    # Configured node IPs win: the Node is not waited for.
    configured = Agent(AgentConfig(kubeconfig="/nonexistent", node_ip=("192.0.2.9",)))
    configured.parts.node = NodeWatcher("node-1", configured.proxy_health)
    assert await configured._node_object_ips(started) == ()
