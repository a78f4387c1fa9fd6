"""The agent on the real Kubernetes API (kube-apiserver of the pinned release: list, watch, 410
after an etcd compaction), with a real OVS, real pods and real traffic: the same pipeline as
with manifests, plus the ServiceCIDR API (the ``kubernetes`` one the server made from its
--service-cluster-ip-range) deciding the node's routes."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.controlplane import apply_object
from support.tcpcut import Forwarder

from ovsproxy.agent import Agent
from ovsproxy.config import load
from ovsproxy.lab import EXAMPLES
from ovsproxy.lab.controlplane import ControlPlane
from ovsproxy.lab.evidence import RigNode, probe
from ovsproxy.ovs.sandbox import Pod, Sandbox

pytestmark = [pytest.mark.slow, pytest.mark.ovs, pytest.mark.shared_sandbox]


def example_objects() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


async def http(world: World, netns: str, url: str, count: int = 40) -> dict[str, Any]:
    """Lost requests with their evidence (``ovsproxy.lab.evidence``; the agent runs in this
    process: no /status to ask)."""
    rig = (RigNode("node-1", world.sandbox),)
    return await asyncio.to_thread(probe, rig, netns, "http", url, "--count", str(count))


async def wait_for(predicate: Any, timeout: float = 15, what: str = "condition") -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        if predicate():
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"timed out waiting for {what}")


class World:
    def __init__(
        self,
        sandbox: Sandbox,
        pods: dict[str, Pod],
        api: ControlPlane,
        agent: Agent,
        path: Forwarder,
    ) -> None:
        self.sandbox, self.pods, self.api, self.agent = sandbox, pods, api, agent
        self.path = path  # the agent's connection to the server

    def services(self) -> dict[str, dict[str, Any]]:
        return {s["name"]: s for s in self.agent.pages.status_json()["services"]}


@pytest.fixture
async def world(
    example_pods: dict[str, Pod],
    sandbox: Sandbox,
    tmp_path: Path,
    kube_api: ControlPlane,
    demo_namespace: str,
) -> AsyncIterator[World]:
    pods = example_pods
    for obj in example_objects():
        apply_object(kube_api, obj)
    kubeconfig = kube_api.ovsproxy_kubeconfig(tmp_path / "agent.kubeconfig")
    async with Forwarder("127.0.0.1", kube_api.port) as path:
        config_json = json.loads(kubeconfig.read_text())
        config_json["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{path.port}"
        kubeconfig.write_text(json.dumps(config_json))
        config = load(
            kubeconfig=str(kubeconfig),
            ovsdb=sandbox.ovsdb,
            openflow=sandbox.openflow,
            netns=sandbox.netns,
            min_sync_interval=0.0,
            metrics_address="127.0.0.1:0",
            health_address="",
            node_name="node-1",
            log_level="warning",
        )
        agent = Agent(config)
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        try:
            await asyncio.wait_for(agent.ready.wait(), 30)
            yield World(sandbox, pods, kube_api, agent, path)
        finally:
            stop.set()
            with contextlib.suppress(Exception):
                await task


async def test_services_from_the_api_are_balanced_and_routed_by_the_servicecidr(
    world: World,
) -> None:
    status = world.agent.pages.status_json()
    # The ServiceCIDR API names the real ranges: they win over aggregation (10.96.0.0/27).
    assert sorted(status["routes"]) == sorted(world.api.service_cidrs)
    for netns in (world.pods["client"].netns, world.sandbox.netns):
        web = await http(world, netns, "http://10.96.0.10/")
        assert web["failed"] == 0 and set(web["counts"]) == {"web-1", "web-2"}, web
        api = await http(world, netns, "http://[fd00:10:96::20]/")
        assert api["failed"] == 0 and set(api["counts"]) == {"api-1", "api-2"}, api


async def test_watch_events_and_a_410_relist_reach_the_datapath(world: World) -> None:
    # An endpoint leaves (watch MODIFIED).
    [web_slice] = [o for o in example_objects() if o["metadata"]["name"] == "web-abc12"]
    web_slice["endpoints"] = web_slice["endpoints"][:1]
    apply_object(world.api, web_slice)
    await wait_for(
        lambda: len(world.services()["demo/web:http/TCP"]["endpoints"]) == 1,
        what="web to lose an endpoint",
    )
    only = await http(world, world.pods["client"].netns, "http://10.96.0.10/", 20)
    assert only["counts"] == {"web-1": 20}
    # The agent's connection drops; a Service is deleted and etcd's history compacted in the
    # gap: the informer's watch gets the server's 410, it re-lists, and the deletion it
    # missed is applied.
    world.path.cut()
    world.api.request("DELETE", "/api/v1/namespaces/demo/services/shop")
    world.api.compact()
    world.path.resume()
    await wait_for(lambda: "demo/shop:http/TCP" not in world.services(), 30, "shop to go")
    flows = world.sandbox.ofctl("dump-flows")
    assert "10.96.0.30" not in flows and "10.96.0.10" in flows
    assert world.agent.parts.tracker.stats.events["Service/delete"] >= 1
