"""This node's Node object: its conversion (pure) and its informer against the real API server
(the field selector, watch events for a taint, new addresses and a deletion, a 410 re-list)."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.tcpcut import Forwarder

from ovsproxy.lab.controlplane import ControlPlane
from ovsproxy.model import IPAddress
from ovsproxy.model.node import Node
from ovsproxy.model.problems import SourceError
from ovsproxy.sources.kubernetes import NODES, KubernetesSource
from ovsproxy.sources.nodes import convert_node

from .test_kubernetes import Seen, started, until, via


def node_object(name: str = "node-1", **extra: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {"name": name},
        "spec": {"podCIDRs": ["10.244.1.0/24", "fd00:10:244:1::/64"]},
        "status": {
            "addresses": [
                {"type": "Hostname", "address": name},
                {"type": "ExternalIP", "address": "203.0.113.7"},
                {"type": "InternalIP", "address": "192.0.2.11"},
                {"type": "InternalIP", "address": "2001:db8::11"},
            ]
        },
    }
    for key, value in extra.items():
        obj[key] = {**obj.get(key, {}), **value}
    return obj


# -- conversion -------------------------------------------------------------------------------


def test_a_node_becomes_its_model_value() -> None:
    node = convert_node(
        node_object(
            metadata={"deletionTimestamp": "2026-12-01T22:00:00Z"},
            spec={"taints": [{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]},
        )
    )
    assert node == Node(
        "node-1",
        internal_ips=(ipaddress.ip_address("192.0.2.11"), ipaddress.ip_address("2001:db8::11")),
        external_ips=(ipaddress.ip_address("203.0.113.7"),),
        pod_cidrs=(
            ipaddress.ip_network("10.244.1.0/24"),
            ipaddress.ip_network("fd00:10:244:1::/64"),
        ),
        deletion_timestamp="2026-12-01T22:00:00Z",
        taints=("ToBeDeletedByClusterAutoscaler",),
    )
    assert node.deleting
    # InternalIPs first: the ExternalIP comes last although the object lists it first.
    assert [str(ip) for ip in node.host_ips] == ["192.0.2.11", "2001:db8::11", "203.0.113.7"]
    assert not convert_node(node_object()).deleting


def test_a_bad_address_is_named_and_skipped_the_rest_counts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    obj = node_object(spec={"podCIDRs": ["10.244.1.0/24", "nonsense"]})
    obj["status"]["addresses"].insert(0, {"type": "InternalIP", "address": "192.0.2.300"})
    with caplog.at_level(logging.WARNING, "ovsproxy.sources.nodes"):
        node = convert_node(obj)
    assert [str(ip) for ip in node.internal_ips] == ["192.0.2.11", "2001:db8::11"]
    assert [str(net) for net in node.pod_cidrs] == ["10.244.1.0/24"]
    text = caplog.text
    assert "Node node-1: status.addresses[0].address: '192.0.2.300'" in text
    assert "Node node-1: spec.podCIDRs[1]: 'nonsense'" in text


def test_a_node_with_nothing_but_a_name() -> None:
    node = convert_node({"metadata": {"name": "bare"}})
    assert node == Node("bare") and node.host_ips == () and not node.deleting


addresses = st.lists(
    st.tuples(
        st.sampled_from(["InternalIP", "ExternalIP", "Hostname"]),
        st.one_of(st.ip_addresses(v=4).map(str), st.ip_addresses(v=6).map(str), st.just("host-a")),
    ),
    max_size=8,
)


def kube_proxy_node_ips(entries: list[tuple[str, str]]) -> list[IPAddress]:
    """kube-proxy's node IPs, as its GetNodeHostIPs documents them: every InternalIP, then
    every ExternalIP; the first of them, then the first of the other family."""
    ips: list[IPAddress] = []
    for wanted in ("InternalIP", "ExternalIP"):
        for kind, text in entries:
            if kind == wanted:
                try:
                    ips.append(ipaddress.ip_address(text))
                except ValueError:
                    pass
    if not ips:
        return []
    chosen = [ips[0]]
    chosen += [ip for ip in ips if ip.version != ips[0].version][:1]
    return chosen


@given(addresses)
def test_the_first_node_ip_of_each_family_is_kube_proxys(entries: list[tuple[str, str]]) -> None:
    obj = {
        "metadata": {"name": "n"},
        "status": {"addresses": [{"type": k, "address": a} for k, a in entries]},
    }
    host_ips = convert_node(obj).host_ips
    firsts: dict[int, IPAddress] = {}
    for ip in host_ips:
        firsts.setdefault(ip.version, ip)
    assert sorted(firsts.values(), key=str) == sorted(kube_proxy_node_ips(entries), key=str)
    assert len(set(host_ips)) == len(host_ips)


# -- the informer -----------------------------------------------------------------------------


class Recorder:
    """A NodeHandler that keeps what it got."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, Node | str]] = []
        self.synced = False
        self.errors: list[SourceError] = []

    def on_add(self, node: Node) -> None:
        self.seen.append(("add", node))

    def on_update(self, node: Node) -> None:
        self.seen.append(("update", node))

    def on_delete(self, name: str) -> None:
        self.seen.append(("delete", name))

    def on_synced(self) -> None:
        self.synced = True

    def on_error(self, problem: SourceError) -> None:
        self.errors.append(problem)


def node_path(name: str, sub: str = "") -> str:
    return f"/api/v1/nodes/{name}{sub}"


def create_node(api: ControlPlane, obj: dict[str, Any]) -> None:
    """A Node as a kubelet registers it (the server keeps the status it is created with)."""
    api.request("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", **obj})


def patch_node(api: ControlPlane, name: str, patch: dict[str, Any], sub: str = "") -> None:
    api.request("PATCH", node_path(name, sub), patch, content_type="application/merge-patch+json")


@pytest.fixture
def nodes(cp: ControlPlane) -> Iterator[list[str]]:
    """Unique Node names (Nodes are cluster-wide); each deleted after the test."""
    names = [f"n-{secrets.token_hex(3)}" for _ in range(2)]
    yield names
    for name in names:
        cp.request("DELETE", node_path(name), ok=(200, 404))


async def node_source(
    kubeconfig: Path, name: str, seen: list[Seen] | None = None
) -> tuple[KubernetesSource, Recorder, Any]:
    _, source = await started(kubeconfig, seen=seen)
    recorder = Recorder()
    informer = source.node(recorder, name)
    await asyncio.wait_for(informer.wait_synced(), 10)
    await until(lambda: informer.stats.watches >= 1)
    return source, recorder, informer


async def test_only_this_nodes_object_is_listed_and_watched(cp, agent_kubeconfig, nodes) -> None:
    mine, other = nodes
    create_node(cp, node_object(mine))
    create_node(cp, node_object(other))
    seen: list[Seen] = []
    source, recorder, informer = await node_source(agent_kubeconfig, mine, seen)
    try:
        assert recorder.synced and [(k, v.name) for k, v in recorder.seen] == [("add", mine)]
        for request in (r for r in seen if "nodes" in r.path):
            assert request.path == "/api/v1/nodes"
            assert request.params["fieldSelector"] == f"metadata.name={mine}"
        # Another Node's changes are not ours; ours arrive as updates, then its deletion.
        patch_node(cp, other, {"spec": {"taints": [{"key": "x", "effect": "NoSchedule"}]}})
        taint = {"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}
        patch_node(cp, mine, {"spec": {"taints": [taint]}})
        await until(lambda: len(recorder.seen) == 2)
        kind, node = recorder.seen[1]
        assert kind == "update" and isinstance(node, Node)
        assert node.taints == ("ToBeDeletedByClusterAutoscaler",)
        # The kubelet changes its addresses (through the status subresource).
        addresses = [{"type": "InternalIP", "address": "192.0.2.12"}]
        patch_node(cp, mine, {"status": {"addresses": addresses}}, "/status")
        await until(lambda: len(recorder.seen) == 3)
        kind, node = recorder.seen[2]
        assert kind == "update" and isinstance(node, Node)
        assert [str(ip) for ip in node.host_ips] == ["192.0.2.12"]
        cp.request("DELETE", node_path(mine))
        await until(lambda: recorder.seen[-1] == ("delete", mine))
        assert informer.store == {}
        assert len(recorder.seen) == 4 and not recorder.errors
    finally:
        await source.stop()


async def test_a_deletion_missed_during_a_410_is_found_by_the_relist(
    cp, agent_kubeconfig, nodes, tmp_path
) -> None:
    """The connection drops; the Node is deleted and etcd compacted in the gap; the re-list
    finds the deletion. The real server answers the watch from the old resourceVersion with
    410 Expired, or, when the delete is the first revision after it (so at the compacted
    revision, its previous version compacted away), with a 500 "etcd event received with
    PrevKv=nil" every time: the informer must re-list on that too, not retry the watch."""
    [name, _] = nodes
    create_node(cp, node_object(name))
    async with Forwarder("127.0.0.1", cp.port) as path:
        kubeconfig = via(agent_kubeconfig, path.port, tmp_path / "via.kubeconfig")
        source, recorder, informer = await node_source(kubeconfig, name)
        try:
            path.cut()
            cp.request("DELETE", node_path(name))
            cp.compact()
            path.resume()
            await until(lambda: recorder.seen[-1] == ("delete", name), timeout=30)
            assert informer.stats.lists >= 2
            assert informer.stats.expired + informer.stats.failures >= 1
            # The Node comes back (a re-registered node): an add again.
            create_node(cp, node_object(name))
            await until(lambda: recorder.seen[-1][0] == "add")
        finally:
            await source.stop()


async def test_a_node_that_does_not_exist_is_still_a_complete_list(
    cp, agent_kubeconfig, nodes
) -> None:
    [name, _] = nodes
    source, recorder, _informer = await node_source(agent_kubeconfig, name)
    try:
        assert recorder.synced and recorder.seen == []
        create_node(cp, node_object(name))
        await until(lambda: recorder.seen[-1:] != [] and recorder.seen[-1][0] == "add")
    finally:
        await source.stop()


async def test_the_server_refuses_a_field_it_cannot_select_by(cp, agent_kubeconfig) -> None:
    _, source = await started(agent_kubeconfig)
    try:
        response = await source.client.get(
            NODES.path(), params={"fieldSelector": "spec.providerID=x"}
        )
        assert response.status_code == 400
        assert "field label not supported" in response.json()["message"]
    finally:
        await source.stop()
