"""The benchmarks' cluster in the real kube-apiserver (bench.kubeload): loaded as the admin,
read whole by the agent's informers with the shipped RBAC's token, changed by the churn
generator's patches; kube-apiserver's and etcd's usage read from /proc.

One control plane for the module (kube-apiserver takes seconds to start here)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import cluster

from bench import kubeload
from bench.scenarios.churn import Churn
from ovsproxy.proxy.tracker import ChangeTracker
from ovsproxy.sources.kubernetes import KubernetesSource

SERVICES = 520  # two list pages of 500
ENDPOINTS = 3


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kubeload.RealCluster]:
    with kubeload.RealCluster(tmp_path_factory.mktemp("kubeload")) as real:
        asyncio.run(real.load(SERVICES, ENDPOINTS))
        yield real


async def _read(real: kubeload.RealCluster) -> tuple[KubernetesSource, ChangeTracker]:
    tracker = ChangeTracker()
    assert real.kubeconfig is not None
    source = KubernetesSource(tracker, kubeconfig=real.kubeconfig)
    await source.start()
    await asyncio.wait_for(source.wait_synced(), 60)
    return source, tracker


async def test_the_agent_reads_the_loaded_cluster_whole(real: kubeload.RealCluster) -> None:
    source, tracker = await _read(real)
    try:
        states = tracker.snapshot()
        ours = {k: s for k, s in states.items() if k.namespace == cluster.NAMESPACE}
        assert len(ours) == SERVICES
        assert all(len(s.endpoints) == ENDPOINTS for s in ours.values())
        # the ClusterIPs asked for (bench.dp.cluster's), allocated in the bench ServiceCIDR
        svc = real.control_plane.request("GET", "/api/v1/namespaces/bench/services/svc-7")
        assert svc["spec"]["clusterIP"] == cluster.service_object(7)["spec"]["clusterIP"]
        assert source.endpoint_slices.stats.pages == 2
        # plus default/kubernetes, the control plane's own (no endpoints)
        assert {k.namespace for k in states} == {cluster.NAMESPACE, "default"}
    finally:
        await source.stop()


async def test_churn_patches_reach_the_informer(real: kubeload.RealCluster) -> None:
    source, tracker = await _read(real)
    churn = Churn(real, SERVICES, ENDPOINTS)
    await churn.open()
    try:
        before = real.server_usage()
        sent = await churn.stream(rate=200.0, seconds=0.5)
        assert sent == 100
        changed = {i for i, eps in enumerate(churn.state) if len(eps) != ENDPOINTS}
        assert changed

        def seen() -> bool:
            states = tracker.snapshot()
            counts = {k.name: len(s.endpoints) for k, s in states.items()}
            return all(
                counts[f"svc-{i}"] == len(churn.state[i]) for i in range(SERVICES) if i in changed
            )

        changed_event = asyncio.Event()
        tracker.set_notify(changed_event.set)
        async with asyncio.timeout(30):
            while not seen():
                changed_event.clear()
                await changed_event.wait()
        after = real.server_usage()
        assert after["kube-apiserver"].cpu_s > before["kube-apiserver"].cpu_s
        assert after["etcd"].rss_kb > 0
    finally:
        churn.close()
        await source.stop()


def test_loaded_slices_are_not_the_controllers(tmp_path: Path) -> None:
    """What the loader writes is an external writer's slice, owned by its Service."""
    real = kubeload.RealCluster(tmp_path)
    real.uids[3] = "uid-3"
    obj = real.slice(3, cluster.endpoints_of(3, 2))
    labels = obj["metadata"]["labels"]
    assert labels["kubernetes.io/service-name"] == "svc-3"
    assert labels["endpointslice.kubernetes.io/managed-by"] == kubeload.FIELD_MANAGER
    assert obj["metadata"]["ownerReferences"][0]["uid"] == "uid-3"
    assert "uid" not in obj["metadata"] and "resourceVersion" not in obj["metadata"]
