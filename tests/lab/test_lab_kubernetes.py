"""Every node's agent reads the same (fake) Kubernetes API: a change is seen by all of them."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from pathlib import Path

import pytest
from support.k8s_fake import FakeKubeApi

from ovsproxy.lab.cluster import Lab
from ovsproxy.lab.manifests import LabPort, LabService, addresses, endpoint_texts

from .helpers import client_pod, clients, http

pytestmark = [pytest.mark.slow, pytest.mark.ovs]

PLURALS = {"Service": "services", "EndpointSlice": "endpointslices"}


def _apply(api: FakeKubeApi, service: LabService) -> None:
    for doc in service.documents():
        api.apply(PLURALS[doc["kind"]], doc)


async def test_agents_of_every_node_follow_one_api(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    async with FakeKubeApi() as api:
        kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
        lab = Lab(2, source_args=("--kubeconfig", str(kubeconfig)))
        await asyncio.to_thread(lab.up)
        try:
            service = LabService(
                "api-web",
                addresses("10.96.3.10", "fd00:10:96::3:10"),
                (LabPort("http", 80, 8080),),
                lab.endpoints(),
            )
            _apply(api, service)
            name = "lab/api-web:http/TCP"
            await asyncio.to_thread(
                lab.wait_endpoints, name, endpoint_texts(service.endpoints, 8080)
            )
            for ip in map(str, service.cluster_ips):
                for label, netns in clients(lab):
                    out = await asyncio.to_thread(http, lab, netns, ip, 20)
                    assert out["failed"] == 0, (label, out)
                    assert set(out["counts"]) == {"web-1", "web-2"}, (label, out)
            # One change in the API, seen by both nodes.
            only_2 = dataclasses.replace(service, endpoints=lab.endpoints("web-2"))
            _apply(api, only_2)
            await asyncio.to_thread(
                lab.wait_endpoints, name, endpoint_texts(only_2.endpoints, 8080), 10
            )
            out = await asyncio.to_thread(
                http, lab, client_pod(lab.nodes["node-1"]), "10.96.3.10", 20
            )
            assert out["failed"] == 0 and out["counts"] == {"web-2": 20}, out
        finally:
            await asyncio.to_thread(lab.down)
