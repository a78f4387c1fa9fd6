"""The benchmarks' fake API server (bench.kubeapi, their second baseline beside kube-apiserver)
pages lists as the API server does; the test fake omits remainingItemCount for a selected list
as the API server does. (The informer reading the benchmarks' cluster whole: from the real
kube-apiserver, test_kubeload.py.)"""

from __future__ import annotations

import asyncio
import json
from urllib.request import urlopen

import pytest
from support import cluster
from support.k8s_fake import FakeKubeApi

from bench import kubeapi
from ovsproxy.sources.convert import PROXY_LABEL_SELECTOR


def _get(url: str) -> dict:
    with urlopen(url, timeout=10) as response:
        return json.loads(response.read())


async def _pages(api: FakeKubeApi, plural: str, query: str) -> list[dict]:
    base = f"{api.url}/apis/discovery.k8s.io/v1/{plural}?limit=500{query}"
    pages = [await asyncio.to_thread(_get, base)]
    while token := pages[-1]["metadata"].get("continue"):
        pages.append(await asyncio.to_thread(_get, f"{base}&continue={token}"))
    return pages


@pytest.mark.parametrize("selected", [True, False])
async def test_serving_api_pages_one_snapshot_like_the_api_server(selected: bool) -> None:
    api = kubeapi.ServingKubeApi()
    await api.start()
    try:
        _, slices = cluster.cluster_objects(1_200, 2)
        api.load("endpointslices", slices)
        version = str(api.resource_version)
        query = f"&labelSelector={PROXY_LABEL_SELECTOR}" if selected else ""
        pages = await _pages(api, "endpointslices", query)
        assert [len(p["items"]) for p in pages] == [500, 500, 200]
        assert {p["metadata"]["resourceVersion"] for p in pages} == {version}
        remaining = [p["metadata"].get("remainingItemCount") for p in pages[:-1]]
        assert remaining == ([None, None] if selected else [700, 200])
        names = [i["metadata"]["name"] for p in pages for i in p["items"]]
        assert len(set(names)) == 1_200
        assert all("kind" not in i for p in pages for i in p["items"])  # as in a real list
    finally:
        await api.stop()


async def test_the_fake_counts_remaining_items_only_without_a_selector() -> None:
    async with FakeKubeApi() as api:
        for obj in cluster.cluster_objects(7, 1)[1]:
            api.apply("endpointslices", obj)
        url = f"{api.url}/apis/discovery.k8s.io/v1/endpointslices?limit=5"
        plain = await asyncio.to_thread(_get, url)
        selected = await asyncio.to_thread(_get, f"{url}&labelSelector={PROXY_LABEL_SELECTOR}")
        assert plain["metadata"]["remainingItemCount"] == 2
        assert "remainingItemCount" not in selected["metadata"]
        assert selected["metadata"]["continue"]
