"""The Node object watched, end to end: a real `ovsproxy run` process on the real Kubernetes API
(kube-apiserver, with the shipped RBAC's token), a real OVS and the node's real nftables table.

* /healthz answers 503 (and /livez 200) while the Node is tainted
  ``ToBeDeletedByClusterAutoscaler``, being deleted, or deleted: from the event on, before any
  sync is needed.
* The node IPs are the Node's addresses (an address on no device of the node: scanning the
  devices would never find it), and a changed address set moves the NodePort frontends (the
  OpenFlow flows and the steering table's ``nodeport-ips`` set) to the new IPs.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from support.controlplane import apply_object

from ovsproxy.lab.controlplane import ControlPlane
from ovsproxy.ovs.sandbox import Pod, Sandbox
from tests.e2e.harness import AgentProcess
from tests.e2e.test_kubernetes_source import example_objects

pytestmark = [pytest.mark.slow, pytest.mark.ovs, pytest.mark.shared_sandbox]

TAINT = "ToBeDeletedByClusterAutoscaler"
NODE_PORT = 30080
# TEST-NET addresses that no device of the sandbox carries
FIRST_IP, SECOND_IP = "192.0.2.77", "192.0.2.78"

HOLD = "tests.ovsproxy/hold"  # a finalizer: the Node stays, being deleted, until it goes
NODE_PORT_SERVICE = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {"name": "web-np", "namespace": "demo"},
    "spec": {
        "type": "NodePort",
        "clusterIP": "10.96.0.40",
        "clusterIPs": ["10.96.0.40"],
        "ipFamilies": ["IPv4"],
        "selector": {"app": "web"},
        "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": NODE_PORT}],
    },
}


def node(address: str = FIRST_IP, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "node-1"},
        "spec": {"podCIDRs": ["10.244.0.0/24"], **spec},
        "status": {
            "addresses": [
                {"type": "Hostname", "address": "node-1"},
                {"type": "InternalIP", "address": address},
            ]
        },
    }


class World:
    def __init__(
        self, sandbox: Sandbox, api: ControlPlane, agent: AgentProcess, kubeconfig: Path
    ) -> None:
        self.sandbox, self.api, self.agent, self.kubeconfig = sandbox, api, agent, kubeconfig

    def verify(self) -> subprocess.CompletedProcess[str]:
        """``ovsproxy verify`` as an operator runs it: the same flags as the agent."""
        cmd = [sys.executable, "-m", "ovsproxy", "verify", "--kubeconfig", str(self.kubeconfig)]
        cmd += ["--ovsdb", self.sandbox.ovsdb, "--openflow", self.sandbox.openflow]
        cmd += ["--netns", self.sandbox.netns, "--node-name", "node-1"]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)

    def set_node(self, obj: dict[str, Any]) -> None:
        """As the kubelet: the Node (created if gone), then its status (addresses)."""
        apply_object(self.api, obj)
        self.api.request(
            "PATCH",
            "/api/v1/nodes/node-1/status",
            {"status": obj["status"]},
            content_type="application/merge-patch+json",
        )

    def healthz(self) -> int:
        return self.agent.get("/healthz")[0]

    def livez(self) -> int:
        return self.agent.get("/livez")[0]

    def syncs(self) -> float:
        return self.agent.metric("ovsproxy_syncs_total")

    def node_port_flows(self) -> list[str]:
        return [
            line
            for line in self.sandbox.ofctl("dump-flows").splitlines()
            if f"tp_dst={NODE_PORT}" in line and "nw_dst=192.0.2." in line
        ]

    def nodeport_ips(self) -> set[str]:
        out = self.sandbox.exec("nft", "-j", "list", "set", "inet", "ovsproxy", "nodeport-ips-v4")
        for item in json.loads(out.stdout)["nftables"]:
            if "set" in item:
                return {str(e) for e in item["set"].get("elem", [])}
        return set()


async def until(predicate: Callable[[], bool], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await asyncio.to_thread(predicate):
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"timed out waiting for {what}")


@pytest.fixture
async def world(
    example_pods: dict[str, Pod],
    sandbox: Sandbox,
    tmp_path: Path,
    kube_api: ControlPlane,
    demo_namespace: str,
) -> AsyncIterator[World]:
    for obj in [*example_objects(), NODE_PORT_SERVICE]:
        apply_object(kube_api, obj)
    kube_api.request("POST", "/api/v1/nodes", node())  # the server keeps a created status
    kubeconfig = kube_api.ovsproxy_kubeconfig(tmp_path / "agent.kubeconfig")
    agent = AgentProcess(sandbox, None, tmp_path / "agent.log", "--kubeconfig", str(kubeconfig))
    try:
        await asyncio.to_thread(agent.start)
        yield World(sandbox, kube_api, agent, kubeconfig)
    finally:
        await asyncio.to_thread(agent.stop)
        kube_api.request(
            "PATCH",
            "/api/v1/nodes/node-1",
            {"metadata": {"finalizers": None}},
            content_type="application/merge-patch+json",
            ok=(200, 404),
        )
        kube_api.request("DELETE", "/api/v1/nodes/node-1", ok=(200, 404))


async def test_healthz_turns_503_as_the_node_goes_away_livez_stays_200(world: World) -> None:
    assert world.healthz() == 200
    status = world.agent.status()
    assert status["node"]["found"] and status["node"]["eligible"]
    assert status["node"]["pod_cidrs"] == ["10.244.0.0/24"]
    # Settled first (no sync in the last second: start-up's follow-ups are done), so that any
    # sync below would be one a Node event caused.
    last = -1.0
    while (now := await asyncio.to_thread(world.syncs)) != last:
        last = now
        await asyncio.sleep(1)
    api = world.api
    merge = "application/merge-patch+json"

    def taint(key: str) -> None:
        apply_object(api, node(taints=[{"key": key, "effect": "NoSchedule"}]))

    def being_deleted() -> None:  # a finalizer holds it: deletionTimestamp set, still there
        api.request(
            "PATCH",
            "/api/v1/nodes/node-1",
            {"metadata": {"finalizers": [HOLD]}},
            content_type=merge,
        )
        api.request("DELETE", "/api/v1/nodes/node-1")

    def gone() -> None:  # the finalizer released: the Node is deleted
        api.request(
            "PATCH", "/api/v1/nodes/node-1", {"metadata": {"finalizers": None}}, content_type=merge
        )

    steps: list[tuple[str, Callable[[], None], int]] = [
        ("tainted ToBeDeletedByClusterAutoscaler", lambda: taint(TAINT), 503),
        ("another taint", lambda: taint("other"), 200),
        ("being deleted", being_deleted, 503),
        ("deleted", gone, 503),
        ("registered again", lambda: world.set_node(node()), 200),
    ]
    for what, step, code in steps:
        syncs = await asyncio.to_thread(world.syncs)
        assert syncs >= 1
        step()
        await until(lambda code=code: world.healthz() == code, f"/healthz {code} after {what}")
        # From the Node event itself: no Service changed, so no sync ran for it.
        assert await asyncio.to_thread(world.syncs) == syncs
        assert world.livez() == 200
    assert "/healthz answers 503" in world.agent.log()


async def test_node_ips_are_the_nodes_addresses_and_follow_them(world: World) -> None:
    status = world.agent.status()["node_ports"]
    assert status["node_ips"] == [FIRST_IP] and status["node_ips_from"] == "Node"
    assert status["node_port_ips"] == [FIRST_IP]
    flows = world.node_port_flows()
    assert flows and all(f"nw_dst={FIRST_IP}," in line for line in flows), flows
    assert world.nodeport_ips() == {FIRST_IP}
    # From the start: the devices were never scanned (no window on other IPs).
    log = world.agent.log()
    assert f"node IPs (from the Node object): {FIRST_IP}" in log
    assert "from the node's devices" not in log
    # The Node's address changes: the NodePort frontends and the steering table follow.
    world.set_node(node(SECOND_IP))
    await until(
        lambda: world.agent.status()["node_ports"]["node_ips"] == [SECOND_IP], "the new node IP"
    )
    await until(
        lambda: (
            (flows := world.node_port_flows())
            and all(f"nw_dst={SECOND_IP}," in line for line in flows)
        ),
        "NodePort flows on the new node IP",
    )
    await until(lambda: world.nodeport_ips() == {SECOND_IP}, "the steering table's new node IP")
    # `ovsproxy verify` takes the node IPs where the agent does: the Node's addresses.
    result = await asyncio.to_thread(world.verify)
    assert result.returncode == 0, result.stdout + result.stderr
    # A Node update that leaves the addresses alone changes nothing of it.
    world.set_node(node(SECOND_IP, taints=[{"key": "other", "effect": "NoSchedule"}]))
    await asyncio.sleep(0.5)
    assert world.agent.status()["node_ports"]["node_ips"] == [SECOND_IP]
