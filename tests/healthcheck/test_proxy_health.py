"""/healthz and /livez with kube-proxy's semantics (pure, on a fake clock)."""

from __future__ import annotations

from ovsproxy.healthcheck import TO_BE_DELETED_TAINT, ProxyHealth
from ovsproxy.model import IPFamily
from ovsproxy.model.node import Node


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_healthy_while_starting_and_when_synced() -> None:
    clock = Clock()
    health = ProxyHealth(health_timeout=60, clock=clock)
    assert health.livez()[0] == 200 and health.healthz()[0] == 200
    assert health.livez()[1]["lastUpdated"] == health.livez()[1]["currentTime"]
    health.queued_update(IPFamily.IPv4)
    clock.now += 59
    assert health.is_healthy()  # queued, but not late yet
    health.updated(IPFamily.IPv4)
    clock.now += 600
    assert health.is_healthy()  # nothing pending: an idle proxy is healthy


def test_a_late_update_of_either_family_makes_it_unhealthy() -> None:
    clock = Clock()
    health = ProxyHealth(health_timeout=60, clock=clock)
    for family in IPFamily:
        health.updated(family)
    synced_at = clock.now
    health.queued_update(IPFamily.IPv6)
    clock.now += 30
    health.queued_update(IPFamily.IPv6)  # the oldest pending change counts, not the newest
    clock.now += 30
    status, body = health.livez()
    assert status == 503 and not health.is_healthy()
    assert body["lastUpdated"] != body["currentTime"]
    assert health.healthz()[0] == 503
    health.updated(IPFamily.IPv6)
    assert health.livez()[0] == 200
    assert clock.now - synced_at == 60


def test_healthz_fails_on_a_node_going_away_livez_does_not() -> None:
    health = ProxyHealth(clock=Clock())
    health.sync_node(Node("node-1", taints=("other", TO_BE_DELETED_TAINT)))
    status, body = health.healthz()
    assert status == 503 and body["nodeEligible"] is False
    assert health.livez()[0] == 200
    assert health.is_healthy()  # Service health checks ignore the node's eligibility
    health.sync_node(Node("node-1", deletion_timestamp="2026-12-01T22:00:00Z"))
    assert health.healthz()[0] == 503
    health.sync_node(Node("node-1", taints=("other",)))
    status, body = health.healthz()
    assert status == 200 and body["nodeEligible"] is True
    assert "nodeEligible" not in health.livez()[1]
    health.sync_node(None)  # deleted
    assert health.healthz()[0] == 503 and health.livez()[0] == 200
