"""`ovsproxy verify` against a real agent on a real OVS: clean when converged, every kind of
hand-made drift reported readably (exit 1), clean again once the agent repaired it."""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ovsproxy.ovs.sandbox import Pod, Sandbox
from tests.e2e.harness import AgentProcess, copy_examples

pytestmark = [pytest.mark.slow, pytest.mark.ovs, pytest.mark.shared_sandbox]


class Node:
    def __init__(self, sandbox: Sandbox, manifests: Path, agent: AgentProcess) -> None:
        self.sandbox, self.manifests, self.agent = sandbox, manifests, agent

    def verify(self, *extra: str) -> subprocess.CompletedProcess[str]:
        cmd = [
            sys.executable,
            "-m",
            "ovsproxy",
            "verify",
            "--ovsdb",
            self.sandbox.ovsdb,
            "--openflow",
            self.sandbox.openflow,
            "--netns",
            self.sandbox.netns,
            "--manifests",
            str(self.manifests),
            "--node-name",
            "node-1",
            *extra,
        ]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)

    @contextlib.contextmanager
    def agent_paused(self) -> Iterator[None]:
        """SIGSTOP the agent (OVS keeps forwarding): its periodic repair cannot race the
        drift a test makes and checks; SIGCONT afterwards."""
        assert self.agent.proc is not None
        self.agent.proc.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            self.agent.proc.send_signal(signal.SIGCONT)

    def wait_clean(self, timeout: float = 20) -> subprocess.CompletedProcess[str]:
        deadline = time.monotonic() + timeout
        while True:
            result = self.verify()
            if result.returncode == 0 or time.monotonic() > deadline:
                return result
            time.sleep(0.5)


@pytest.fixture
def node(example_pods: dict[str, Pod], sandbox: Sandbox, tmp_path: Path) -> Iterator[Node]:
    manifests = copy_examples(tmp_path / "manifests")
    # A drift check every 2 s (the periodic full resync), routes repaired every 1 s.
    agent = AgentProcess(
        sandbox,
        manifests,
        tmp_path / "agent.log",
        "--full-resync-interval",
        "2",
        "--route-sync-interval",
        "1",
    )
    agent.start()
    try:
        yield Node(sandbox, manifests, agent)
    finally:
        agent.stop()


def _ours(lines: str) -> list[str]:
    return [line for line in lines.splitlines() if "cookie=0x5e71" in line]


def test_verify_clean_then_every_kind_of_drift_then_repaired(node: Node) -> None:
    clean = node.verify()
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "converged: no difference" in clean.stdout
    assert re.search(r"compared \d+ Service ports, \d+ flows, \d+ groups, 2 routes", clean.stdout)

    # 1. One of our flows deleted by hand: the web ClusterIP's ServiceLB flow.
    flows = _ours(node.sandbox.ofctl("dump-flows", "table=13"))
    web = next(f for f in flows if "nw_dst=10.96.0.10," in f and "tp_dst=80 " in f)
    match = web.split(" actions=")[0].split("priority=")[1]
    with node.agent_paused():
        node.sandbox.ofctl("del-flows", "--strict", f"table=13,priority={match}")
        drift = node.verify()
    assert drift.returncode == 1, drift.stdout + drift.stderr
    missing = [line for line in drift.stdout.splitlines() if line.startswith("missing flow: ")]
    assert len(missing) == 1, drift.stdout
    assert "table=13" in missing[0] and "nw_dst=10.96.0.10" in missing[0]
    assert "actions=group:" in missing[0]
    assert "1 difference(s)" in drift.stdout
    repaired = node.wait_clean()
    assert repaired.returncode == 0, repaired.stdout + node.agent.log()[-2000:]

    # 2. A bucket of the web group changed by hand: same bucket count, another endpoint.
    status = node.agent.status()
    web_svc = next(s for s in status["services"] if s["name"] == "demo/web:http/TCP")
    gid = web_svc["group_ids"]["4"]
    group = next(
        line
        for line in node.sandbox.ofctl("dump-groups").splitlines()
        if f"group_id={gid}," in line
    )
    # The first bucket's endpoint 10.244.0.11 (its DNAT) becomes 10.244.0.99.
    changed = group.strip().replace("nat(dst=10.244.0.11:", "nat(dst=10.244.0.99:", 1)
    assert changed != group.strip(), group
    with node.agent_paused():
        node.sandbox.ofctl("mod-group", changed)
        drift = node.verify()
    assert drift.returncode == 1, drift.stdout + drift.stderr
    assert f"differs group: group_id={gid}," in drift.stdout, drift.stdout
    assert "bucket missing: weight:100,actions=" in drift.stdout
    assert "bucket unexpected: weight:100,actions=" in drift.stdout
    assert "nat(dst=10.244.0.99:8080)" in drift.stdout
    repaired = node.wait_clean()  # the agent's periodic drift check reads buckets too
    assert repaired.returncode == 0, repaired.stdout

    # 3. Our IPv4 Service route deleted by hand.
    routes = node.sandbox.exec("ip", "route", "show", "proto", "155").stdout
    service_route = next(line for line in routes.splitlines() if " via " in line)
    prefix = service_route.split()[0]
    with node.agent_paused():
        node.sandbox.exec("ip", "route", "del", prefix, "proto", "155")
        drift = node.verify()
    assert drift.returncode == 1, drift.stdout + drift.stderr
    assert f"missing route: {prefix} via 169.254.0.253 dev gw0 proto 155" in drift.stdout
    repaired = node.wait_clean()
    assert repaired.returncode == 0, repaired.stdout


def test_verify_reports_unexpected_flow_and_group_and_needs_ovs(node: Node) -> None:
    node.sandbox.ofctl(
        "add-flow",
        "cookie=0x5e71000102000000,table=13,priority=190,tcp,nw_dst=10.96.9.9,tp_dst=81,"
        "actions=drop",
    )
    node.sandbox.ofctl(
        "add-group",
        "group_id=777,type=select,bucket=bucket_id:0,actions=drop",
    )
    drift = node.verify()
    assert drift.returncode == 1, drift.stdout + drift.stderr
    assert "unexpected flow: cookie=0x5e71000102000000, table=13, priority=190," in drift.stdout
    assert "nw_dst=10.96.9.9" in drift.stdout
    assert "unexpected group: group_id=777,type=select" in drift.stdout
    assert "ovsdb: Bridge br0 external_ids:ovsproxy-group-ids" in drift.stdout
    # Without an OVS to check: a clear error, exit 2.
    bare = subprocess.run(
        [sys.executable, "-m", "ovsproxy", "verify", "--manifests", str(node.manifests)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bare.returncode != 0 and "--ovsdb and --openflow" in bare.stderr


def _big_service(endpoints: int) -> str:
    """A Service whose group is too large for OVS to describe (GROUP_DESC over 64 KB), its
    endpoints in slices of 1,000 (the API's limit)."""
    docs = [
        "apiVersion: v1\nkind: Service\nmetadata: {name: big, namespace: demo}\n"
        "spec:\n  clusterIP: 10.96.0.50\n  ports: [{name: http, port: 80, targetPort: 8080}]\n"
    ]
    for start in range(0, endpoints, 1000):
        addresses = "\n".join(
            f"  - addresses: [10.245.{n // 250}.{n % 250 + 1}]\n    conditions: {{ready: true}}"
            for n in range(start, min(start + 1000, endpoints))
        )
        docs.append(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n"
            f"metadata: {{name: big-{start}, namespace: demo, "
            "labels: {kubernetes.io/service-name: big}}\n"
            "addressType: IPv4\nports: [{name: http, port: 8080, protocol: TCP}]\n"
            f"endpoints:\n{addresses}\n"
        )
    return "---\n".join(docs)


def test_verify_a_group_too_large_to_dump_by_count_and_bucket_probe(node: Node) -> None:
    (node.manifests / "big.yaml").write_text(_big_service(1200))
    node.agent.wait_for(
        lambda: any(s["name"] == "demo/big:http/TCP" for s in node.agent.status()["services"]),
        timeout=30,
        what="the big Service",
    )
    big = next(s for s in node.agent.status()["services"] if s["name"] == "demo/big:http/TCP")
    gid = big["group_ids"]["4"]
    clean = node.wait_clean()
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert (
        f"note: group {gid}: 1200 buckets (too large to dump), bucket ids 0..1199" in clean.stdout
    )
    with node.agent_paused():
        node.sandbox.ofctl("remove-buckets", f"group_id={gid},command_bucket_id=7")
        drift = node.verify()
    assert drift.returncode == 1, drift.stdout + drift.stderr
    assert (
        f"differs group: group_id={gid},type=select (1199 buckets, too large to dump)\n"
        "    1199 buckets, wanted 1200"
    ) in drift.stdout
    assert "bucket ids not 0..1198" in drift.stdout
    repaired = node.wait_clean()  # bucket counts are in the agent's drift check
    assert repaired.returncode == 0, repaired.stdout


NODEPORT_SERVICE = """\
apiVersion: v1
kind: Service
metadata: {name: np, namespace: demo}
spec:
  type: NodePort
  clusterIP: 10.96.0.40
  externalIPs: [192.0.2.30]
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30080, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: np-1, namespace: demo, labels: {kubernetes.io/service-name: np}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
  - addresses: [10.244.0.11]
    conditions: {ready: true}
"""


def test_verify_checks_the_steering_table(node: Node) -> None:
    (node.manifests / "np.yaml").write_text(NODEPORT_SERVICE)
    node.agent.wait_for(
        lambda: "30080" in node.sandbox.exec("nft", "list", "table", "inet", "ovsproxy").stdout,
        timeout=30,
        what="the NodePort in the steering table",
    )
    clean = node.wait_clean()
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert re.search(r", [1-9]\d* capture elements\)$", clean.stdout.strip()), clean.stdout

    # One of our set elements and a rule of one of our chains deleted by hand.
    element = "element inet ovsproxy nodeports-v4 { tcp . 30080 }"
    with node.agent_paused():
        node.sandbox.exec(*f"nft delete {element}".split())
        node.sandbox.exec("nft", "flush", "chain", "inet", "ovsproxy", "nat-output")
        drift = node.verify()
    assert drift.returncode == 1, drift.stdout + drift.stderr
    assert f"missing nftables element: {element}\n" in drift.stdout, drift.stdout
    assert (
        "differs nftables chain: chain inet ovsproxy nat-output "
        "{ type nat hook output priority -100; policy accept; }\n    0 rule(s), wanted "
    ) in drift.stdout, drift.stdout
    assert "2 difference(s)" in drift.stdout, drift.stdout
    # The agent's periodic check sees the drift and rebuilds the table.
    repaired = node.wait_clean()
    assert repaired.returncode == 0, repaired.stdout + node.agent.log()[-2000:]
