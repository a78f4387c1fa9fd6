"""`ovsproxy trace` on the single-node sandbox, as users run it: a real agent process, the
command line in another process, and a real request with the traced 5-tuple (the client's
source port bound) that must reach the endpoint the trace named."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ovsproxy.ovs.sandbox import Pod, Sandbox
from ovsproxy.ovs.traffic import run_in_netns
from tests.e2e.harness import AgentProcess, copy_examples

pytestmark = [pytest.mark.slow, pytest.mark.ovs, pytest.mark.shared_sandbox]

# Two Services beside the examples: one without endpoints, one with internalTrafficPolicy
# Local whose only endpoint runs on another node (the agent is node-1).
EXTRA = """
apiVersion: v1
kind: Service
metadata: {name: empty, namespace: demo}
spec:
  clusterIP: 10.96.0.40
  clusterIPs: [10.96.0.40]
  ports: [{name: http, port: 80, targetPort: 8080, protocol: TCP}]
---
apiVersion: v1
kind: Service
metadata: {name: local, namespace: demo}
spec:
  clusterIP: 10.96.0.50
  clusterIPs: [10.96.0.50]
  internalTrafficPolicy: Local
  ports: [{name: http, port: 80, targetPort: 8080, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: local-1
  namespace: demo
  labels: {kubernetes.io/service-name: local}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
  - addresses: [10.244.0.12]
    conditions: {ready: true, serving: true, terminating: false}
    nodeName: node-2
---
apiVersion: v1
kind: Service
metadata: {name: sticky, namespace: demo}
spec:
  clusterIP: 10.96.0.60
  clusterIPs: [10.96.0.60]
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}
  ports: [{name: http, port: 80, targetPort: 8080, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: sticky-1
  namespace: demo
  labels: {kubernetes.io/service-name: sticky}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
  - addresses: [10.244.0.11]
    conditions: {ready: true, serving: true, terminating: false}
    nodeName: node-1
  - addresses: [10.244.0.12]
    conditions: {ready: true, serving: true, terminating: false}
    nodeName: node-1
"""
SOURCE_PORTS = range(41000, 41008)


class World:
    def __init__(self, sandbox: Sandbox, pods: dict[str, Pod], agent: AgentProcess) -> None:
        self.sandbox, self.pods, self.agent = sandbox, pods, agent

    def trace(self, src: str, dst: str, *extra: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "ovsproxy", "trace", src, dst, "--address"]
        cmd += [f"127.0.0.1:{self.agent.port}", *extra]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60)

    def trace_json(self, src: str, dst: str, *extra: str) -> dict[str, Any]:
        done = self.trace(src, dst, "--json", *extra)
        assert done.returncode == 0, done.stderr
        result: dict[str, Any] = json.loads(done.stdout)
        return result

    def request(self, src: str, url: str, source_port: int) -> dict[str, Any]:
        netns = self.sandbox.netns if src == "node" else self.pods[src].netns
        args = ["http", url, "--count", "1", "--timeout", "2", "--source-port", str(source_port)]
        return run_in_netns(netns, *args)

    def pod_of(self, endpoint: str) -> str:
        ip = endpoint.rpartition(":")[0].strip("[]")
        return next(name for name, pod in self.pods.items() if ip in {str(a) for a in pod.ips})


@pytest.fixture
def world(example_pods: dict[str, Pod], sandbox: Sandbox, tmp_path: Path) -> Iterator[World]:
    pods = example_pods
    manifests = copy_examples(tmp_path / "manifests")
    (manifests / "trace-extra.yaml").write_text(EXTRA)
    agent = AgentProcess(sandbox, manifests, tmp_path / "agent.log")
    agent.start()
    try:
        agent.wait_for(
            lambda: (
                {"demo/empty:http/TCP", "demo/local:http/TCP"}
                <= {s["name"] for s in agent.status()["services"]}
            ),
            what="the extra Services",
        )
        yield World(sandbox, pods, agent)
    finally:
        agent.stop()


@pytest.mark.parametrize("src", ["client", "node"])
def test_trace_names_the_endpoint_a_real_request_reaches(world: World, src: str) -> None:
    seen = set()
    for port in SOURCE_PORTS:
        result = world.trace_json(src, "demo/web", "--source-port", str(port))
        assert result["verdict"] == "forwarded", result
        assert result["frontend"] == "tcp,nw_dst=10.96.0.10,tp_dst=80"
        assert result["group_id"] is not None and result["buckets"] == 2
        traced = world.pod_of(result["endpoint"])
        assert result["endpoint_pod"] == f"demo/{traced}"
        assert result["leaves"]["kind"] == "pod" and result["leaves"]["pod"] == f"demo/{traced}"
        assert result["nat"][0]["kind"] == "DNAT" and result["nat"][0]["from"] == "10.96.0.10:80"
        answer = world.request(src, "http://10.96.0.10/", port)
        assert answer["failed"] == 0, answer
        assert answer["counts"] == {traced: 1}, (port, result["endpoint"], answer)
        seen.add(traced)
    # Both endpoints occur among the ports: the trace follows the 5-tuple, not one bucket.
    assert seen == {"web-1", "web-2"}


def test_text_output_names_frontend_group_endpoint_and_exit(world: World) -> None:
    port = SOURCE_PORTS[0]
    done = world.trace("demo/client", "10.96.0.10:80", "--source-port", str(port))
    assert done.returncode == 0, done.stderr
    text = done.stdout
    for table in ("Classifier", "ConntrackZone", "ServiceLB", "L3Forwarding"):
        assert table in text, text
    # no affinity: the group's bucket translates, there is no EndpointDNAT step
    assert "EndpointDNAT" not in text, text
    assert "frontend   tcp,nw_dst=10.96.0.10,tp_dst=80" in text
    answer = world.request("client", "http://10.96.0.10/", port)
    (pod,) = answer["counts"]
    ip = next(str(a) for a in world.pods[pod].ips if a.version == 4)
    assert f"endpoint   {ip}:8080 (pod demo/{pod})" in text, text
    assert f"Service frontend -> select group, DNAT to the endpoint {ip}:8080" in text, text
    assert f"FORWARDED  out to pod demo/{pod}" in text, text
    assert "DNAT       10.96.0.10:80 -> " in text


def test_service_without_endpoints_says_rejected(world: World) -> None:
    done = world.trace("client", "demo/empty")
    assert done.returncode == 0, done.stderr
    assert "REJECTED   no usable endpoints" in done.stdout, done.stdout
    assert "TCP RST" in done.stdout
    # and so it is: the agent answers the SYN with a RST
    answer = world.request("client", "http://10.96.0.40/", SOURCE_PORTS[0])
    assert answer["failures"] == {"refused": 1}, answer


def test_local_policy_from_the_wrong_node_says_dropped_and_why(world: World) -> None:
    result = world.trace_json("client", "demo/local")
    assert result["verdict"] == "dropped"
    assert result["reason"].startswith(
        "internalTrafficPolicy Local: no usable endpoint on this node"
    ), result["reason"]
    assert result["service"]["excluded"] == {
        "10.244.0.12:8080": "on another node (internalTrafficPolicy Local)"
    }
    text = world.trace("client", "demo/local").stdout
    assert "DROPPED    internalTrafficPolicy Local" in text, text
    assert "not used: 10.244.0.12:8080: on another node" in text
    answer = world.request("client", "http://10.96.0.50/", SOURCE_PORTS[0])
    assert answer["failures"] == {"timeout": 1}, answer


def test_bad_arguments_are_named(world: World) -> None:
    done = world.trace("nobody", "demo/web")
    assert done.returncode != 0
    assert "SRC 'nobody'" in done.stderr and "demo/client" in done.stderr
    done = world.trace("client", "demo/shop")
    assert done.returncode != 0 and "several ports" in done.stderr


def test_trace_follows_learned_session_affinity(world: World) -> None:
    """The trace reads the switch's state: once a real connection has taught the switch the
    client's endpoint (ClientIP affinity), a 5-tuple the group would send elsewhere is
    traced, and goes, to the learned endpoint."""
    before = {
        port: world.pod_of(
            world.trace_json("client", "demo/sticky", "--source-port", str(port))["endpoint"]
        )
        for port in SOURCE_PORTS
    }
    first = SOURCE_PORTS[0]
    chosen = before[first]
    other = next(port for port, pod in before.items() if pod != chosen)
    answer = world.request("client", "http://10.96.0.60/", first)
    assert answer["counts"] == {chosen: 1}, answer
    after = world.trace_json("client", "demo/sticky", "--source-port", str(other))
    assert world.pod_of(after["endpoint"]) == chosen, after
    notes = [step["note"] for step in after["steps"]]
    assert "learned affinity: the endpoint this client used last" in notes, notes
    answer = world.request("client", "http://10.96.0.60/", other)
    assert answer["counts"] == {chosen: 1}, answer
