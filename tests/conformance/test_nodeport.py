"""Kubernetes' NodePort e2e tests (test/e2e/network/service.go and conntrack.go), ported to the
3-node lab: the API server allocates the nodePorts (30000-32767), the agents steer node-IP
traffic on them (nftables) and forward it through OVS.

Reachability "over the NodePort" means, as upstream's checkNodePortServiceReachability, the
ClusterIP on the Service port and every node's internal IP of the Service's family on the
nodePort; ours from every node's client pod and from the external client on the underlay
(upstream: one exec pod, the first two nodes).
"""

from __future__ import annotations

import concurrent.futures
import subprocess
import time

import pytest

from ovsproxy.lab.cluster import HTTP_PORT, Lab
from ovsproxy.model import IPFamily
from ovsproxy.ovs.traffic import TCP_TIMEOUT_S

from .kube import Cluster, Port, pod
from .probes import (
    POD_TO_OWN_NODE_GAP,
    Gaps,
    assert_not_programmed,
    assert_reaches,
    client_pod,
    endpoints_of,
    http,
    node_ip,
    port_name,
    udp,
    wait_absent,
    wait_node_port,
    wait_programmed,
)

pytestmark = [pytest.mark.slow, pytest.mark.ovs]

HTTP = Port("http", 80, HTTP_PORT)


def nodeport_clients(lab: Lab) -> list[tuple[str, str]]:
    """Every node's client pod and the external client."""
    found = [(f"{n.name} pod", client_pod(n)) for n in lab.nodes.values()]
    return [*found, ("external", lab.external_netns)]


def assert_nodeport_reaches(
    lab: Lab,
    gaps: Gaps,
    family: IPFamily,
    node_port: int,
    pods: set[str],
    *,
    nodes: tuple[str, ...] = ("node-1", "node-2", "node-3"),
    protocol: str = "TCP",
    count: int = 10,
) -> None:
    calls = [(node, label, netns) for node in nodes for label, netns in nodeport_clients(lab)]

    def probe(call: tuple[str, str, str]) -> dict:
        node, label, netns = call
        ip = node_ip(lab, node, family)
        n = 2 if label == f"{node} pod" and POD_TO_OWN_NODE_GAP else count  # the gap: fast
        if protocol == "UDP":
            return udp(lab, netns, ip, node_port, n)
        return http(lab, netns, ip, node_port, n, timeout=1 if n == 2 else TCP_TIMEOUT_S)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(probe, calls))
    wrong = []  # every client to every node first: the report shows the whole matrix
    for (node, label, _), out in zip(calls, results, strict=True):
        answered = set(out["counts"])
        if (
            out["failed"]
            or not answered <= pods
            or not answered
            or (protocol == "TCP" and count >= 10 * len(pods) and answered != pods)
        ):
            entry = (label, "->", node, out["counts"], out["failures"])
            if out["failed"]:
                entry += (out.get("evidence"),)
            (gaps.seen if label == f"{node} pod" else wrong).append(entry)
    assert not wrong, (f"{protocol} {family.name} nodePort {node_port}", wrong)


def assert_nodeport_unreachable(
    lab: Lab, family: IPFamily, node_port: int, *, nodes: tuple[str, ...] = ("node-1",)
) -> None:
    for node in nodes:
        ip = node_ip(lab, node, family)
        for label, netns in nodeport_clients(lab):
            out = http(lab, netns, ip, node_port, 2, timeout=1)
            assert out["failed"] == 2 and not out["counts"], (label, node, node_port, out)


def test_should_be_able_to_create_a_functioning_NodePort_service(
    lab: Lab, cp: Cluster, gaps: Gaps, family: IPFamily
) -> None:
    """Upstream: "[sig-network] Services should be able to create a functioning NodePort
    service [Conformance]".

    A TCP NodePort Service (80 -> 9376 here 8080) with two pods: an exec pod reaches it on
    ClusterIP:80 and on the nodes' internal IPs at the allocated nodePort.

    Beyond upstream: every node's IP (of the Service's family) from every node's client pod
    and from an external client; both pods answer; the nodePort is the API server's
    allocation, not a fixed one."""
    pods = [pod(lab, "web-1"), pod(lab, "web-2")]
    cp.create_service("nodeport-test", family, [HTTP], type="NodePort", pods=pods)
    node_port = cp.node_port("nodeport-test")
    assert 30000 <= node_port <= 32767
    name = port_name("nodeport-test", "http")
    wait_programmed(lab, name, endpoints_of(pods, family, HTTP_PORT))
    wait_node_port(lab, name, node_port)
    assert_reaches(lab, cp.cluster_ip("nodeport-test"), 80, {"web-1", "web-2"}, nodes=False)
    assert_nodeport_reaches(lab, gaps, family, node_port, {"web-1", "web-2"}, count=20)
    gaps.finish()


def test_should_be_able_to_update_service_type_to_NodePort_listening_on_same_port_number_but_different_protocols(  # noqa: E501
    lab: Lab, cp: Cluster, gaps: Gaps, family: IPFamily
) -> None:
    """Upstream: "[sig-network] Services should be able to update service type to NodePort
    listening on same port number but different protocols".

    A TCP ClusterIP Service is changed to type NodePort (tcp-port 80/TCP): reachable on its
    nodePort; then to tcp-port 80/TCP plus udp-port 80/UDP: two nodePorts are allocated and
    TCP and UDP are both served.

    Beyond upstream: the TCP nodePort is kept across the second update (the update names no
    nodePort, as upstream's; kube-apiserver carries a port's nodePort over by the port's
    name); UDP on its nodePort answers from every client; every agent lists both ports with
    their nodePorts."""
    pods = [pod(lab, "echo-1"), pod(lab, "echo-2")]
    tcp, udp_port = Port("tcp-port", 80, 80, "TCP"), Port("udp-port", 80, 80, "UDP")
    cp.create_service("nodeport-update-service", family, [tcp], pods=pods)
    tcp_name = port_name("nodeport-update-service", "tcp-port")
    wait_programmed(lab, tcp_name, endpoints_of(pods, family, 80))

    def to_node_port(*ports: Port):
        def mutate(svc: dict) -> None:  # as upstream: the ports without their nodePorts
            svc["spec"]["type"] = "NodePort"
            svc["spec"]["ports"] = [p.as_dict() for p in ports]

        return mutate

    cp.update_service("nodeport-update-service", to_node_port(tcp))
    tcp_node_port = cp.node_port("nodeport-update-service")
    wait_node_port(lab, tcp_name, tcp_node_port)
    assert_nodeport_reaches(lab, gaps, family, tcp_node_port, {"echo-1", "echo-2"}, count=20)

    after = cp.update_service("nodeport-update-service", to_node_port(tcp, udp_port))
    node_ports = {p["protocol"]: p["nodePort"] for p in after["spec"]["ports"]}
    assert len(after["spec"]["ports"]) == 2 and all(node_ports.values())
    assert node_ports["TCP"] == tcp_node_port
    udp_name = port_name("nodeport-update-service", "udp-port", "UDP")
    wait_node_port(lab, udp_name, node_ports["UDP"])
    assert_nodeport_reaches(lab, gaps, family, tcp_node_port, {"echo-1", "echo-2"}, count=20)
    assert_nodeport_reaches(
        lab, gaps, family, node_ports["UDP"], {"echo-1", "echo-2"}, protocol="UDP", count=10
    )
    gaps.finish()


def test_should_release_NodePorts_on_delete(
    lab: Lab, cp: Cluster, gaps: Gaps, family: IPFamily
) -> None:
    """Upstream: "[sig-network] Services should release NodePorts on delete".

    A NodePort Service is created and deleted: on the node the port is no longer in use (no
    listening socket, `ss`), and a new Service can be created with the same nodePort.

    Beyond upstream: no listening socket on any node (the proxy holds none), the nodePort no
    longer answers from any client on any node after the delete, and the new Service with the
    same nodePort (the API server's allocator accepting it is upstream's check that it was
    released) is reachable there again, with its own pods."""
    pods = [pod(lab, "web-1")]
    cp.create_service("nodeport-reuse", family, [HTTP], type="NodePort", pods=pods)
    node_port = cp.node_port("nodeport-reuse")
    name = port_name("nodeport-reuse", "http")
    wait_node_port(lab, name, node_port)
    assert_nodeport_reaches(lab, gaps, family, node_port, {"web-1"}, count=3)

    cp.delete_service("nodeport-reuse")
    cp.delete_pod("web-1")  # (a pod outlives its Service: the new one would select it too)
    wait_absent(lab, "nodeport-reuse")
    for node in lab.nodes.values():
        listening = subprocess.run(
            ["ip", "netns", "exec", node.netns, "ss", "-Hltnu", f"sport = :{node_port}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert listening.strip() == "", (node.name, listening)
    assert_nodeport_unreachable(lab, family, node_port, nodes=("node-1", "node-2", "node-3"))

    again = [pod(lab, "web-2")]
    cp.create_service(
        "nodeport-reuse",
        family,
        [Port("http", 80, HTTP_PORT, node_port=node_port)],
        type="NodePort",
        pods=again,
    )
    assert cp.node_port("nodeport-reuse") == node_port
    wait_node_port(lab, name, node_port)
    wait_programmed(lab, name, endpoints_of(again, family, HTTP_PORT))
    assert_nodeport_reaches(lab, gaps, family, node_port, {"web-2"}, count=3)
    gaps.finish()


def test_should_be_able_to_preserve_UDP_traffic_when_server_pod_cycles_for_a_NodePort_service(
    lab: Lab, cp: Cluster, family: IPFamily
) -> None:
    """Upstream: "[sig-network] Conntrack should be able to preserve UDP traffic when server pod
    cycles for a NodePort service".

    A UDP NodePort Service; a client pod on one node sends a datagram every few seconds from a
    fixed source port to the other node's IP:nodePort, before any backend exists; backend 1
    starts on the server node: the client's datagrams reach it within a minute (the stale
    conntrack entry of the no-endpoint time must not keep them away); backend 2 starts and
    backend 1 is deleted: they reach backend 2.

    Beyond upstream: the datagrams (one flow to conntrack: same source port throughout) are
    answered by the new backend right after the agents report it (3 s budget, not a minute),
    and never again by the deleted one."""
    port = Port("udp", 80, 80, "UDP")
    cp.create_service("udp-cycle", family, [port], type="NodePort")
    node_port = cp.node_port("udp-cycle")
    name = port_name("udp-cycle", "udp", "UDP")
    wait_node_port(lab, name, node_port)
    client, target = client_pod(lab.nodes["node-1"]), node_ip(lab, "node-2", family)
    source_port = 12345

    def send(count: int = 1) -> dict:
        return udp(
            lab,
            client,
            target,
            node_port,
            count,
            timeout=0.5,
            new_socket=False,
            source_port=source_port,
        )

    for _ in range(3):  # no backend yet: conntrack holds an entry for this flow
        assert send()["counts"] == {}

    def answered_by(backend: str, within: float = 3) -> None:
        deadline = time.monotonic() + within
        while True:
            out = send()
            if out["counts"] == {backend: 1}:
                return
            assert time.monotonic() < deadline, (backend, out)

    backend1 = pod(lab, "echo-2")
    cp.add_pod("udp-cycle", backend1)
    wait_programmed(lab, name, endpoints_of([backend1], family, 80))
    answered_by("echo-2")

    backend2 = pod(lab, "echo-2b")
    cp.add_pod("udp-cycle", backend2)
    cp.delete_pod("echo-2")
    wait_programmed(lab, name, endpoints_of([backend2], family, 80))
    answered_by("echo-2b")
    out = send(10)
    assert out["counts"] == {"echo-2b": 10}, out


def _terminating_nodeport(lab: Lab, cp: Cluster, family: IPFamily, **spec: object) -> int:
    web = pod(lab, "web-1")
    cp.create_service("svc-proxy-terminating", family, [HTTP], type="NodePort", pods=[web], **spec)
    name = port_name("svc-proxy-terminating", "http")
    node_port = cp.node_port("svc-proxy-terminating")
    wait_node_port(lab, name, node_port)
    cp.terminate_pod("web-1", drains=True)
    ready = endpoints_of([web], family, HTTP_PORT)
    wait_programmed(lab, name, ready)  # the cluster set falls back to the terminating one
    return node_port


def test_should_fallback_to_terminating_endpoints_when_there_are_no_ready_endpoints_with_externallTrafficPolicy_Cluster(  # noqa: E501
    lab: Lab, cp: Cluster, gaps: Gaps, family: IPFamily
) -> None:
    """Upstream: "[sig-network] Services should fallback to terminating endpoints when there
    are no ready endpoints with externallTrafficPolicy=Cluster" (sic).

    NodePort, externalTrafficPolicy Cluster, one endpoint on node0, terminating: pods on node0
    and node1 both reach node0's IP:nodePort.

    Beyond upstream: every node's IP, from every node's pod and the external client."""
    node_port = _terminating_nodeport(lab, cp, family)
    for _ in range(2):
        assert_nodeport_reaches(lab, gaps, family, node_port, {"web-1"}, count=3)
    gaps.finish()


def test_should_fallback_to_local_terminating_endpoints_when_there_are_no_ready_endpoints_with_externalTrafficPolicy_Local(  # noqa: E501
    lab: Lab, cp: Cluster, gaps: Gaps, family: IPFamily
) -> None:
    """Upstream: "[sig-network] Services should fallback to local terminating endpoints when
    there are no ready endpoints with externalTrafficPolicy=Local".

    NodePort, externalTrafficPolicy Local, one endpoint on node0, terminating: pod0 (node0)
    -> node1's IP:nodePort fails (external traffic, no local endpoint there); pod1 (node1) and
    pod0 -> node0's IP:nodePort succeed.

    Beyond upstream: the external client gets the same answers (node0 serves, node1 and
    node2 do not)."""
    node_port = _terminating_nodeport(lab, cp, family, local=True, externalTrafficPolicy="Local")
    node0, node1 = node_ip(lab, "node-1", family), node_ip(lab, "node-2", family)
    pod0, pod1 = client_pod(lab.nodes["node-1"]), client_pod(lab.nodes["node-2"])
    for _ in range(2):
        out = http(lab, pod0, node1, node_port, 2, timeout=1)
        assert out["failed"] == 2, out
        for client in (pod0, pod1, lab.external_netns):
            out = http(lab, client, node0, node_port, 3)
            if client == pod0 and out["failures"] == {"timeout": 3}:
                gaps.seen.append(("node-1 pod", "->", "node-1", out["failures"]))
                continue
            assert out["failed"] == 0 and out["counts"] == {"web-1": 3}, (client, out)
        for far in ("node-2", "node-3"):
            out = http(lab, lab.external_netns, node_ip(lab, far, family), node_port, 2, timeout=1)
            assert out["failed"] == 2, (far, out)
    gaps.finish()


def test_should_be_able_to_change_the_type_from_ExternalName_to_NodePort(
    lab: Lab, cp: Cluster, gaps: Gaps, family: IPFamily
) -> None:
    """Upstream: "[sig-network] Services should be able to change the type from ExternalName to
    NodePort [Conformance]".

    An ExternalName Service is updated to type NodePort (port 80/TCP): a ClusterIP and a
    nodePort are assigned; with two pods it is reachable on the ClusterIP and on the nodes'
    IPs at the nodePort.

    Beyond upstream: nothing is programmed while it is ExternalName; afterwards every node and
    every client, both pods."""
    cp.create_service(
        "externalname-service", family, type="ExternalName", externalName="foo.example.com"
    )
    wait_absent(lab, "externalname-service")

    def to_node_port(svc: dict) -> None:
        svc["spec"]["type"] = "NodePort"
        svc["spec"].pop("externalName")
        svc["spec"]["ports"] = [HTTP.as_dict()]
        svc["spec"]["ipFamilies"] = [family.name]  # else the server's first family (IPv4)

    cp.update_service("externalname-service", to_node_port)
    pods = [pod(lab, "web-1"), pod(lab, "web-2")]
    cp.set_pods("externalname-service", pods)
    name = port_name("externalname-service", "http")
    node_port = cp.node_port("externalname-service")
    wait_programmed(lab, name, endpoints_of(pods, family, HTTP_PORT))
    wait_node_port(lab, name, node_port)
    assert_reaches(lab, cp.cluster_ip("externalname-service"), 80, {"web-1", "web-2"}, nodes=False)
    assert_nodeport_reaches(lab, gaps, family, node_port, {"web-1", "web-2"}, count=20)
    gaps.finish()


def test_should_be_able_to_change_the_type_from_NodePort_to_ExternalName(
    lab: Lab, cp: Cluster, gaps: Gaps, family: IPFamily
) -> None:
    """Upstream: "[sig-network] Services should be able to change the type from NodePort to
    ExternalName [Conformance]".

    A NodePort Service is updated to type ExternalName: its ClusterIP is cleared and its
    nodePort released (and its name resolves: DNS, not ported).

    Beyond upstream: the proxy's side: before, it answers on the ClusterIP and every node's
    nodePort; after, no agent has it, no flow matches its ClusterIP, and neither the ClusterIP
    nor the nodePort answers on any node; the API server gives that nodePort to a new Service
    (released)."""
    pods = [pod(lab, "web-1"), pod(lab, "web-2")]
    cp.create_service("nodeport-service", family, [HTTP], type="NodePort", pods=pods)
    name = port_name("nodeport-service", "http")
    ip, node_port = cp.cluster_ip("nodeport-service"), cp.node_port("nodeport-service")
    wait_node_port(lab, name, node_port)
    assert_nodeport_reaches(lab, gaps, family, node_port, {"web-1", "web-2"}, count=20)

    def to_external_name(svc: dict) -> None:
        svc["spec"]["type"] = "ExternalName"
        svc["spec"]["externalName"] = "externalsvc.conformance.svc.cluster.local"

    after = cp.update_service("nodeport-service", to_external_name)
    assert "clusterIP" not in after["spec"]
    assert not any("nodePort" in p for p in after["spec"]["ports"])
    wait_absent(lab, "nodeport-service")
    assert_not_programmed(lab, ip)
    assert_nodeport_unreachable(lab, family, node_port, nodes=("node-1", "node-2", "node-3"))
    # Released: the API server's allocator gives the same nodePort to a new Service.
    again = cp.create_service(
        "nodeport-again",
        family,
        [Port("http", 80, HTTP_PORT, node_port=node_port)],
        type="NodePort",
    )
    assert again["spec"]["ports"][0]["nodePort"] == node_port
    gaps.finish()
