"""NodePort, external IP and load-balancer IP Services across a 3-node dual-stack lab (issue
14's acceptance): the external client reaches node IPs and LB IPs, the nodes capture that
traffic into OVS (nftables table + policy routes) and select endpoints as for ClusterIPs.

One lab for the module: web-N serves on node N; client-N is a client pod on node N; the
external client namespace sits on the underlay with the node IPs, and routes the test's LB and
external IPs via node-1.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest

from ovsproxy.lab.cluster import HTTP_PORT, UDP_PORT, Lab
from ovsproxy.lab.manifests import LabPort, LabService, addresses

from .conftest import start_lab
from .helpers import http, install, udp

pytestmark = [pytest.mark.slow, pytest.mark.ovs]

REQUESTS = 60
FAMILIES = [pytest.param(0, id="IPv4"), pytest.param(1, id="IPv6")]


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    yield from start_lab(3)


def nodeport_service(
    lab: Lab,
    name: str,
    octet: int,
    node_port: int,
    pods: tuple[str, ...] = ("web-1", "web-2", "web-3"),
    **kwargs: object,
) -> LabService:
    ports = (
        LabPort("http", 80, HTTP_PORT, node_port=node_port),
        LabPort("dns", 53, UDP_PORT, "UDP", node_port=node_port),
    )
    return LabService(
        name,
        addresses(f"10.96.2.{octet}", f"fd00:10:96::2:{octet:x}"),
        ports,
        lab.endpoints(*pods),
        type=str(kwargs.pop("type", "NodePort")),
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module")
def cluster_np(lab: Lab) -> LabService:
    """NodePort 30080 (TCP and UDP), externalTrafficPolicy Cluster, endpoints on every node."""
    svc = nodeport_service(lab, "np-cluster", 10, 30080)
    install(lab, svc)
    return svc


def node_ip(lab: Lab, node: str, family: int) -> str:
    return str(lab.nodes[node].node_ips[family])


@pytest.mark.parametrize("family", FAMILIES)
def test_nodeport_tcp_from_outside_on_every_node(
    lab: Lab, cluster_np: LabService, family: int
) -> None:
    pods = {ep.pod for ep in cluster_np.endpoints}
    for node in lab.nodes:
        out = http(lab.external_netns, node_ip(lab, node, family), REQUESTS, port=30080)
        assert out["failed"] == 0, (node, out["failures"], out)
        assert set(out["counts"]) == pods, (node, out["counts"])


@pytest.mark.parametrize("family", FAMILIES)
def test_nodeport_udp_from_outside_on_every_node(
    lab: Lab, cluster_np: LabService, family: int
) -> None:
    """Datagrams from distinct sockets: none lost. (Which endpoints answer is not asserted:
    select groups do not hash UDP ports yet, issue 13, as for ClusterIPs.)"""
    pods = {ep.pod for ep in cluster_np.endpoints}
    for node in lab.nodes:
        out = udp(lab.external_netns, node_ip(lab, node, family), REQUESTS, port=30080)
        assert out["failed"] == 0, (node, out["failures"], out)
        assert set(out["counts"]) <= pods, (node, out["counts"])


@pytest.mark.parametrize("family", FAMILIES)
def test_nodeport_from_the_node_itself_to_its_own_ip(
    lab: Lab, cluster_np: LabService, family: int
) -> None:
    pods = {ep.pod for ep in cluster_np.endpoints}
    for node in lab.nodes.values():
        ip = str(node.node_ips[family])
        out = http(node.netns, ip, REQUESTS, port=30080)
        assert out["failed"] == 0, (node.name, out["failures"], out)
        assert set(out["counts"]) == pods, (node.name, out["counts"])
        out = udp(node.netns, ip, REQUESTS, port=30080)
        assert out["failed"] == 0, (node.name, out["failures"], out)
        assert set(out["counts"]) <= pods, (node.name, out["counts"])
