"""Services across a 3-node dual-stack lab: each node its own OVS and agent process, endpoints on
every node, clients in pods and in the node namespaces (issue 13's acceptance).

One lab for the module: node-1 and node-3 in zone-1, node-2 in zone-2; web-N serves on node N,
node-1 also runs web-1b; client-N is a client pod on node N. Every test writes its own Service
(its own ClusterIPs) into the lab's manifests directory and waits until every agent has it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ovsproxy.lab.cluster import HTTP_PORT, UDP_PORT, Lab
from ovsproxy.lab.manifests import LabPort, LabService, addresses, remove_service
from ovsproxy.ovs.traffic import run_in_netns

from .conftest import start_lab
from .helpers import client_pod, clients, http, install, udp

pytestmark = [pytest.mark.slow, pytest.mark.ovs]

REQUESTS = 60
FAMILIES = [pytest.param(0, id="IPv4"), pytest.param(1, id="IPv6")]
TCP = (LabPort("http", 80, HTTP_PORT),)
UDP = (LabPort("dns", 53, UDP_PORT, "UDP"),)


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    for lab in start_lab(3, zones=2):
        lab.add_pod("node-1", "web-1b")
        yield lab


def service(
    lab: Lab, name: str, octet: int, pods: tuple[str, ...], ports=TCP + UDP, **kwargs: object
) -> LabService:
    return LabService(
        name,
        addresses(f"10.96.1.{octet}", f"fd00:10:96::1:{octet:x}"),
        ports,
        lab.endpoints(*pods, **kwargs.pop("conditions", {})) if pods else (),  # type: ignore[arg-type]
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module")
def everywhere(lab: Lab) -> LabService:
    """A ClusterIP with endpoints on all three nodes (TCP 80 and UDP 53)."""
    svc = service(lab, "everywhere", 10, ("web-1", "web-1b", "web-2", "web-3"))
    install(lab, svc)
    return svc


def test_pod_to_pod_across_nodes(lab: Lab) -> None:
    """host-gw routing without any Service: the far node commits the connection, so the
    pod's SYN-ACK is not dropped as conntrack-invalid there."""
    web2 = lab.pod("web-2")
    for ip in web2.ips:
        out = http(lab, client_pod(lab.nodes["node-1"]), str(ip), 10, port=HTTP_PORT)
        assert out["failed"] == 0 and out["counts"] == {"web-2": 10}, out


@pytest.mark.parametrize("family", FAMILIES)
def test_clusterip_tcp_reaches_every_endpoint_from_every_node(
    lab: Lab, everywhere: LabService, family: int
) -> None:
    ip = str(everywhere.cluster_ips[family])
    pods = {ep.pod for ep in everywhere.endpoints}
    for label, netns in clients(lab):
        out = http(lab, netns, ip, REQUESTS)
        assert out["failed"] == 0, (label, out["failures"], out)
        assert set(out["counts"]) == pods, (label, out["counts"])


@pytest.mark.parametrize("family", FAMILIES)
def test_clusterip_udp_answers_from_every_node(
    lab: Lab, everywhere: LabService, family: int
) -> None:
    """Datagrams from distinct sockets, local and remote endpoints: none lost."""
    ip = str(everywhere.cluster_ips[family])
    pods = {ep.pod for ep in everywhere.endpoints}
    for label, netns in clients(lab):
        out = udp(lab, netns, ip, REQUESTS)
        assert out["failed"] == 0, (label, out["failures"], out)
        assert set(out["counts"]) <= pods, (label, out["counts"])


@pytest.mark.parametrize("family", FAMILIES)
def test_clusterip_udp_spreads_over_every_endpoint(
    lab: Lab, everywhere: LabService, family: int
) -> None:
    """Each datagram from its own socket (a new 5-tuple): every endpoint gets a share."""
    ip = str(everywhere.cluster_ips[family])
    pods = {ep.pod for ep in everywhere.endpoints}
    for label, netns in clients(lab):
        out = udp(lab, netns, ip, REQUESTS)
        assert out["failed"] == 0, (label, out["failures"], out)
        assert set(out["counts"]) == pods, (label, out["counts"])


def test_hairpin_with_endpoints_on_other_nodes(lab: Lab, everywhere: LabService) -> None:
    """web-1 reaching its own Service: some answers from itself (hairpin), the rest from the
    other endpoints, local and remote; none fails."""
    web1 = lab.pod("web-1")
    for ip in everywhere.cluster_ips:
        out = http(lab, web1.netns, str(ip), REQUESTS)
        assert out["failed"] == 0, out
        assert set(out["counts"]) == {ep.pod for ep in everywhere.endpoints}, out["counts"]


def test_internal_traffic_policy_local(lab: Lab) -> None:
    svc = service(
        lab, "itp-local", 20, ("web-1", "web-1b", "web-2"), internal_traffic_policy="Local"
    )
    install(lab, svc, lambda node: [ep for ep in svc.endpoints if ep.node == node])
    try:
        for ip in map(str, svc.cluster_ips):
            out = http(lab, client_pod(lab.nodes["node-1"]), ip, 30)
            assert out["failed"] == 0 and set(out["counts"]) == {"web-1", "web-1b"}, out
            out = http(lab, client_pod(lab.nodes["node-2"]), ip, 10)
            assert out["failed"] == 0 and set(out["counts"]) == {"web-2"}, out
            # node-3 has none of the endpoints: dropped, as kube-proxy does (no reject).
            for netns in (client_pod(lab.nodes["node-3"]), lab.nodes["node-3"].netns):
                out = http(lab, netns, ip, 3, timeout=0.5)
                assert out["counts"] == {} and out["failures"] == {"timeout": 3}, out
    finally:
        remove_service(lab.manifests, svc)


def test_prefer_same_zone(lab: Lab) -> None:
    """zone-1: node-1 and node-3; zone-2: node-2."""
    svc = service(
        lab, "zonal", 30, ("web-1", "web-2", "web-3"), traffic_distribution="PreferSameZone"
    )
    zone_of = {node.name: node.zone for node in lab.nodes.values()}
    install(lab, svc, lambda node: [ep for ep in svc.endpoints if ep.zone == zone_of[node]])
    # Endpoints in zone-1 only: zone-2's node has none in its zone and uses them all.
    only_z1 = service(
        lab, "zone-1-only", 31, ("web-1", "web-3"), traffic_distribution="PreferSameZone"
    )
    install(lab, only_z1)
    try:
        for ip in map(str, svc.cluster_ips):
            for node, expected in (
                ("node-1", {"web-1", "web-3"}),
                ("node-2", {"web-2"}),
                ("node-3", {"web-1", "web-3"}),
            ):
                out = http(lab, client_pod(lab.nodes[node]), ip, 30)
                assert out["failed"] == 0 and set(out["counts"]) == expected, (node, out)
        for ip in map(str, only_z1.cluster_ips):
            out = http(lab, client_pod(lab.nodes["node-2"]), ip, 30)
            assert out["failed"] == 0 and set(out["counts"]) == {"web-1", "web-3"}, out
    finally:
        remove_service(lab.manifests, svc)
        remove_service(lab.manifests, only_z1)


def test_session_affinity_with_remote_endpoints(lab: Lab) -> None:
    svc = service(lab, "sticky", 40, ("web-2", "web-3"), session_affinity_timeout=600)
    install(lab, svc)
    try:
        for ip in map(str, svc.cluster_ips):
            for label, netns in clients(lab):
                out = http(lab, netns, ip, 15)
                assert out["failed"] == 0 and len(out["counts"]) == 1, (label, out)
    finally:
        remove_service(lab.manifests, svc)


def test_reject_without_endpoints(lab: Lab) -> None:
    """No endpoint anywhere: TCP gets a RST, UDP an ICMP port unreachable, on every node."""
    svc = service(lab, "nobody", 50, ())
    install(lab, svc)
    try:
        for ip in map(str, svc.cluster_ips):
            for label, netns in clients(lab):
                out = http(lab, netns, ip, 3)
                assert out["failures"] == {"refused": 3}, (label, out)
                out = udp(lab, netns, ip, 3)
                assert out["failures"] == {"refused": 3}, (label, out)
    finally:
        remove_service(lab.manifests, svc)


def test_terminating_fallback_to_remote_endpoints(lab: Lab) -> None:
    """Every endpoint terminating but still serving, all on other nodes than node-1: node-1's
    clients use them (kube-proxy's fallback) rather than failing."""
    conditions = {"ready": False, "serving": True, "terminating": True}
    svc = service(lab, "draining", 60, ("web-2", "web-3"), conditions=conditions)
    install(lab, svc)
    try:
        for ip in map(str, svc.cluster_ips):
            for netns in (client_pod(lab.nodes["node-1"]), lab.nodes["node-1"].netns):
                out = http(lab, netns, ip, 30)
                assert out["failed"] == 0 and set(out["counts"]) == {"web-2", "web-3"}, out
    finally:
        remove_service(lab.manifests, svc)


def test_udp_flush_with_remote_endpoints(lab: Lab) -> None:
    """A UDP flow (one 5-tuple) from node-1 to its remote endpoint; once that endpoint leaves
    the slices, the same flow reaches the one left: the conntrack entry on the client's node
    (where the DNAT is) was flushed."""
    svc = service(lab, "udp-flush", 70, ("web-2", "web-3"), ports=UDP)
    install(lab, svc)
    netns = client_pod(lab.nodes["node-1"])
    try:
        for index, ip in enumerate(map(str, svc.cluster_ips)):
            flow = ("--source-port", str(40000 + index), "--interval", "0.05")
            first = run_in_netns(netns, "udp", ip, "53", "--count", "5", *flow)
            assert first["failed"] == 0 and len(first["counts"]) == 1, first
            (chosen,) = first["counts"]
            again = run_in_netns(netns, "udp", ip, "53", "--count", "5", *flow)
            assert again["counts"] == {chosen: 5}, again  # one conntrack entry: it stays
            (left,) = {"web-2", "web-3"} - {chosen}
            install(lab, service(lab, "udp-flush", 70, (left,), ports=UDP))
            out = run_in_netns(netns, "udp", ip, "53", "--count", "10", *flow)
            assert out["failed"] == 0 and out["counts"] == {left: 10}, out
            install(lab, svc)
    finally:
        remove_service(lab.manifests, svc)
