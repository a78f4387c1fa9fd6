"""The agent's /healthz and /livez: kube-proxy's semantics (ProxyHealth) over the sync state.

Helper e found an idle agent reporting 503 once its last sync was 120 s old (the hourly full
resync being its only sync). kube-proxy stays healthy while nothing is pending; so does ours.
"""

from __future__ import annotations

import time

from ovsproxy.agent.lifecycle import Agent
from ovsproxy.config import AgentConfig
from ovsproxy.healthcheck import TO_BE_DELETED_TAINT, ProxyHealth
from ovsproxy.model import IPFamily
from ovsproxy.model.node import Node


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def agent_with_clock() -> tuple[Agent, Clock]:
    agent = Agent(AgentConfig(manifests=("/nonexistent",)))
    clock = Clock()
    agent.proxy_health = ProxyHealth(clock=clock)
    agent.health.connected = lambda: True
    return agent, clock


def test_an_idle_agent_stays_healthy_long_after_its_last_sync() -> None:
    agent, clock = agent_with_clock()
    assert agent.health.check(node=True)[0] is False  # no sync yet
    agent.health.sync_result(True)
    for family in IPFamily:
        agent.proxy_health.updated(family)
    # An hour without any change or sync (the last sync is that old as well).
    agent.health.last_sync_ok = time.monotonic() - 3600
    clock.now += 3600
    assert agent.health.check(node=True)[0] is True
    assert agent.health.check()[0] is True


def test_a_change_left_unsynced_past_the_timeout_is_unhealthy_until_synced() -> None:
    agent, clock = agent_with_clock()
    agent.health.sync_result(True)
    agent.proxy_health.updated(IPFamily.IPv4)  # the first sync
    agent.proxy_health.queued_update(IPFamily.IPv4)
    clock.now += 59
    assert agent.health.check()[0] is True
    clock.now += 2
    healthy, body = agent.health.check()
    assert healthy is False and body["healthy"] is False
    agent.proxy_health.updated(IPFamily.IPv4)
    assert agent.health.check()[0] is True


def test_healthz_not_livez_fails_on_a_node_going_away() -> None:
    agent, _clock = agent_with_clock()
    agent.health.sync_result(True)
    agent.proxy_health.sync_node(Node("node-1", taints=(TO_BE_DELETED_TAINT,)))
    assert agent.health.check()[0] is True  # /livez
    healthy, body = agent.health.check(node=True)  # /healthz
    assert healthy is False and body["nodeEligible"] is False


def test_an_openflow_disconnect_is_unhealthy() -> None:
    agent, _clock = agent_with_clock()
    agent.health.sync_result(True)
    agent.health.connected = lambda: False
    assert agent.health.check()[0] is False
