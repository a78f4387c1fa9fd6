"""kube-proxy's metric names, measured by the agent as users run it (`ovsproxy run`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ovsproxy.metrics import KUBE_PROXY_SYNC_BUCKETS
from ovsproxy.ovs.sandbox import Pod, Sandbox
from ovsproxy.sources.convert import TRIGGER_TIME_ANNOTATION
from tests.e2e.harness import AgentProcess, copy_examples

pytestmark = [pytest.mark.slow, pytest.mark.ovs, pytest.mark.shared_sandbox]

PROGRAMMING = "ovsproxy_network_programming_duration_seconds"
WEB_2 = """  - addresses: [10.244.0.12]
    conditions: {ready: true, serving: true, terminating: false}
    nodeName: node-1
    targetRef: {kind: Pod, namespace: demo, name: web-2}
"""


@pytest.fixture
def agent(example_pods: dict[str, Pod], sandbox: Sandbox, tmp_path: Path) -> Iterator[AgentProcess]:
    agent = AgentProcess(sandbox, copy_examples(tmp_path / "manifests"), tmp_path / "agent.log")
    agent.start()
    try:
        yield agent
    finally:
        agent.stop()


def _rfc3339(unix: float) -> str:
    return (
        datetime.fromtimestamp(unix, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
    )


def test_trigger_time_annotation_is_observed_as_network_programming_latency(
    agent: AgentProcess,
) -> None:
    healthy = time.time()
    web = agent.manifests / "web.yaml"
    endpoint_changes = agent.metric("ovsproxy_sync_proxy_rules_endpoint_changes_total")
    service_changes = agent.metric("ovsproxy_sync_proxy_rules_service_changes_total")
    assert endpoint_changes >= 3 and service_changes >= 3  # the initial lists count
    assert agent.metric(f"{PROGRAMMING}_count") == 0  # the examples carry no trigger time
    # The change was triggered 2 s ago (after the agent started: earlier ones are not ours).
    lag = 2.0
    time.sleep(max(0.0, healthy + lag + 0.1 - time.time()))
    trigger = time.time() - lag
    text = web.read_text()
    assert WEB_2 in text
    annotation = f"  annotations:\n    {TRIGGER_TIME_ANNOTATION}: '{_rfc3339(trigger)}'\n"
    name = "  name: web-abc12\n"
    text = text.replace(WEB_2, "").replace(name, name + annotation)
    written = time.time()
    web.write_text(text)
    agent.wait_for(lambda: agent.metric(f"{PROGRAMMING}_count") == 1, what="one observation")
    seen = time.time()
    # Observed at the commit, which came between the write and now.
    observed = agent.metric(f"{PROGRAMMING}_sum")
    assert written - trigger <= observed + 1e-3, (observed, written - trigger)
    assert observed <= seen - trigger + 1e-3, (observed, seen - trigger)
    # In kube-proxy's buckets: the 2 s bucket holds nothing, the +Inf one the observation.
    assert agent.metric(f"{PROGRAMMING}_bucket", le="2.0") == 0
    assert agent.metric(f"{PROGRAMMING}_bucket", le="+Inf", ip_family="IPv4") == 1
    # One slice update seen, no Service change.
    assert agent.metric("ovsproxy_sync_proxy_rules_endpoint_changes_total") == endpoint_changes + 1
    assert agent.metric("ovsproxy_sync_proxy_rules_service_changes_total") == service_changes


def test_sync_duration_and_last_timestamp_under_kube_proxy_names(agent: AgentProcess) -> None:
    _, text = agent.get("/metrics")
    # kube-proxy's buckets, so its dashboards' bucket queries work unchanged.
    for bound in (KUBE_PROXY_SYNC_BUCKETS[0], KUBE_PROXY_SYNC_BUCKETS[-1]):
        for family in ("IPv4", "IPv6"):  # one sync programs both: observed under each
            bucket = f'{{ip_family="{family}",le="{bound}"}}'
            assert f"ovsproxy_sync_proxy_rules_duration_seconds_bucket{bucket}" in text
    # (A family's programming latency shows once observed, as kube-proxy's vectors do: the
    # first test observes one; tests/agent/test_kube_proxy_metric_set.py checks the buckets.)
    assert f"{PROGRAMMING}_bucket{{" not in text
    syncs = agent.metric("ovsproxy_sync_proxy_rules_duration_seconds_count", ip_family="IPv4")
    last = agent.metric("ovsproxy_sync_proxy_rules_last_timestamp_seconds", ip_family="IPv6")
    assert syncs >= 1 and 0 < time.time() - last < 120
    web = agent.manifests / "web.yaml"
    web.write_text(web.read_text().replace(WEB_2, ""))
    agent.wait_for(
        lambda: (
            agent.metric("ovsproxy_sync_proxy_rules_last_timestamp_seconds", ip_family="IPv6")
            > last
        ),
        what="a newer successful sync",
    )
    assert (
        agent.metric("ovsproxy_sync_proxy_rules_duration_seconds_count", ip_family="IPv4") > syncs
    )
