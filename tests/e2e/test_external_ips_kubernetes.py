"""``refuse_external_ips`` with the Kubernetes API as the source (issue 35): the rule sits
between either source and the tracker, so a Service the real kube-apiserver admits with
externalIPs is served without them, with a problem naming it and the field. The manifests
source's counterpart, and a node address as an external IP: test_external_ip_rules.py.

(The API server's own address as an external IP is not shown live: the test control plane
serves on 127.0.0.1, which the converter already refuses as a loopback address; the rule is
tested in tests/proxy/test_external_ips.py.)"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from support.controlplane import apply_object

from ovsproxy.agent import Agent
from ovsproxy.config import load
from ovsproxy.lab.controlplane import ControlPlane
from ovsproxy.lab.evidence import RigNode, probe
from ovsproxy.ovs.sandbox import Pod, Sandbox

pytestmark = [pytest.mark.slow, pytest.mark.ovs, pytest.mark.shared_sandbox]

EXTERNAL_IP = "192.0.2.60"
SERVICE: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {"name": "ext", "namespace": "demo"},
    "spec": {
        "clusterIP": "10.96.0.60",
        "externalIPs": [EXTERNAL_IP],
        "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}],
    },
}
SLICE: dict[str, Any] = {
    "apiVersion": "discovery.k8s.io/v1",
    "kind": "EndpointSlice",
    "metadata": {
        "name": "ext-1",
        "namespace": "demo",
        "labels": {"kubernetes.io/service-name": "ext"},
    },
    "addressType": "IPv4",
    "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    "endpoints": [{"addresses": ["10.244.0.11"], "conditions": {"ready": True}}],
}


@pytest.fixture
async def agent(
    example_pods: dict[str, Pod],
    sandbox: Sandbox,
    tmp_path: Path,
    kube_api: ControlPlane,
    demo_namespace: str,
) -> AsyncIterator[Agent]:
    kubeconfig = kube_api.ovsproxy_kubeconfig(tmp_path / "agent.kubeconfig")
    config = load(
        kubeconfig=str(kubeconfig),
        ovsdb=sandbox.ovsdb,
        openflow=sandbox.openflow,
        netns=sandbox.netns,
        min_sync_interval=0.0,
        metrics_address="127.0.0.1:0",
        node_name="node-1",
        log_level="warning",
        refuse_external_ips=True,
    )
    agent = Agent(config)
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        await asyncio.wait_for(agent.ready.wait(), 30)
        yield agent
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await task


async def test_a_service_from_the_api_is_served_without_its_external_ips(
    agent: Agent, kube_api: ControlPlane, sandbox: Sandbox, example_pods: dict[str, Pod]
) -> None:
    apply_object(kube_api, SERVICE)
    apply_object(kube_api, SLICE)

    def served() -> dict[str, Any] | None:
        services = {s["name"]: s for s in agent.pages.status_json()["services"]}
        return services.get("demo/ext:http/TCP")

    deadline = asyncio.get_running_loop().time() + 20
    while not (port := served()) or not port["endpoints"]:
        assert asyncio.get_running_loop().time() < deadline, "demo/ext not served"
        await asyncio.sleep(0.1)
    assert port["external_ips"] == []
    assert (
        "Service demo/ext: spec.externalIPs: external IPs are refused on this node "
        f"(refuse_external_ips) (got '{EXTERNAL_IP}')"
    ) in agent.pages.status_json()["problems"]
    steered = sandbox.exec("nft", "list", "set", "inet", "ovsproxy", "external-v4").stdout
    assert EXTERNAL_IP not in steered
    assert f"nw_dst={EXTERNAL_IP}" not in sandbox.ofctl("dump-flows")
    rig = (RigNode("node-1", sandbox),)
    args = ("http", "http://10.96.0.60/", "--count", "5")
    web = await asyncio.to_thread(probe, rig, example_pods["client"].netns, *args)
    assert web["failed"] == 0, web
