"""The agent on the Kubernetes API (the test fake: real HTTP list/watch/bookmark/410), with a
real OVS, real pods and real traffic: the same pipeline as with manifests, plus the
ServiceCIDR API deciding the node's routes."""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.k8s_fake import FakeKubeApi

from ovsproxy.agent import Agent
from ovsproxy.config import load
from ovsproxy.lab import EXAMPLES
from ovsproxy.lab.evidence import RigNode, probe
from ovsproxy.ovs.sandbox import Pod, Sandbox

pytestmark = [pytest.mark.slow, pytest.mark.ovs, pytest.mark.shared_sandbox]

PLURAL = {"Service": "services", "EndpointSlice": "endpointslices"}


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
        self, sandbox: Sandbox, pods: dict[str, Pod], api: FakeKubeApi, agent: Agent
    ) -> None:
        self.sandbox, self.pods, self.api, self.agent = sandbox, pods, api, agent

    def services(self) -> dict[str, dict[str, Any]]:
        return {s["name"]: s for s in self.agent.pages.status_json()["services"]}


@pytest.fixture
async def world(
    example_pods: dict[str, Pod], sandbox: Sandbox, tmp_path: Path
) -> AsyncIterator[World]:
    pods = example_pods
    async with FakeKubeApi() as api:
        for obj in example_objects():
            api.apply(PLURAL[obj["kind"]], obj)
        api.apply(
            "servicecidrs",
            {
                "metadata": {"name": "kubernetes"},
                "spec": {"cidrs": ["10.96.0.0/16", "fd00:10:96::/112"]},
            },
        )
        config = load(
            kubeconfig=str(api.kubeconfig(tmp_path / "kubeconfig")),
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
            yield World(sandbox, pods, api, agent)
        finally:
            stop.set()
            with contextlib.suppress(Exception):
                await task


async def test_services_from_the_api_are_balanced_and_routed_by_the_servicecidr(
    world: World,
) -> None:
    status = world.agent.pages.status_json()
    # The ServiceCIDR API names the real ranges: they win over aggregation (10.96.0.0/27).
    assert sorted(status["routes"]) == ["10.96.0.0/16", "fd00:10:96::/112"]
    for netns in (world.pods["client"].netns, world.sandbox.netns):
        web = await http(world, netns, "http://10.96.0.10/")
        assert web["failed"] == 0 and set(web["counts"]) == {"web-1", "web-2"}, web
        api = await http(world, netns, "http://[fd00:10:96::20]/")
        assert api["failed"] == 0 and set(api["counts"]) == {"api-1", "api-2"}, api


async def test_watch_events_and_a_410_relist_reach_the_datapath(world: World) -> None:
    # An endpoint leaves (watch MODIFIED).
    web_slice = copy.deepcopy(world.api.objects("endpointslices")[("demo", "web-abc12")])
    web_slice["endpoints"] = web_slice["endpoints"][:1]
    world.api.apply("endpointslices", web_slice)
    await wait_for(
        lambda: len(world.services()["demo/web:http/TCP"]["endpoints"]) == 1,
        what="web to lose an endpoint",
    )
    only = await http(world, world.pods["client"].netns, "http://10.96.0.10/", 20)
    assert only["counts"] == {"web-1": 20}
    # The watch history is compacted and a Service is deleted while watches are broken: the
    # informer gets 410 Gone, re-lists, and the deletion it missed is applied.
    world.api.delete("services", "demo", "shop")
    world.api.compact()
    world.api.break_watches(mode="gone")
    await wait_for(lambda: "demo/shop:http/TCP" not in world.services(), what="shop to go")
    flows = world.sandbox.ofctl("dump-flows")
    assert "10.96.0.30" not in flows and "10.96.0.10" in flows
    assert world.agent.parts.tracker.stats.events["Service/delete"] >= 1
