"""Kubernetes' Service e2e tests (test/e2e/network/service.go, "[sig-network] Services"), ported
to the 3-node lab: ClusterIP Services, type changes that keep or drop a ClusterIP, the
service-proxy-name and headless labels, rejection, and terminating endpoints.

Each test's docstring quotes the upstream name, says what upstream checks, and what ours
checks beyond it. The Services, Pods and EndpointSlices are the real control plane's
(``Lab(kube=True)``: kube-apiserver allocates, kube-controller-manager makes the slices; see
kube.py). Upstream validates the Endpoints/EndpointSlice objects (the controller's job) and
polls reachability from one exec pod; ours waits until every agent programs the expected
endpoints and then asserts every answer, from every node's client pod and every node's own
namespace.
"""

from __future__ import annotations

import functools

import pytest

from ovsproxy.lab.cluster import HTTP_PORT, Lab
from ovsproxy.model import IPFamily

from .kube import HEADLESS_LABEL, PROXY_NAME_LABEL, Cluster, Port, pod
from .probes import (
    assert_not_programmed,
    assert_reaches,
    assert_refused,
    assert_udp_reaches,
    assert_unreachable,
    client_pod,
    clients,
    endpoints_of,
    http,
    in_parallel,
    port_name,
    udp,
    wait_absent,
    wait_programmed,
)

pytestmark = [pytest.mark.slow, pytest.mark.ovs]

HTTP = Port("http", 80, HTTP_PORT)


def test_should_serve_a_basic_endpoint_from_pods(lab: Lab, cp: Cluster, family: IPFamily) -> None:
    """Upstream: "[sig-network] Services should serve a basic endpoint from pods [Conformance]".

    A Service (port 80 -> 80) with no pod shows no endpoints; pod1 starts: its endpoint is
    there and the Service forwards to it; pod2 starts: both; pod1 is deleted: only pod2; pod2
    is deleted: none.

    Beyond upstream: at every step the exact set of pods answering (upstream: "reachable"), from
    every node's pod and node namespace; deleted pods go terminating before they disappear,
    and are still running, so a stale bucket would answer; with no endpoint, connections are
    refused (TCP RST), before the first pod and after the last."""
    cp.create_service("endpoint-test2", family, [Port("", 80, 80)])
    ip = cp.cluster_ip("endpoint-test2")
    name = port_name("endpoint-test2", "")
    pod1, pod2 = pod(lab, "echo-1"), pod(lab, "echo-2")

    wait_programmed(lab, name, set())
    assert_refused(lab, ip, 80)

    cp.add_pod("endpoint-test2", pod1)
    wait_programmed(lab, name, endpoints_of([pod1], family, 80))
    assert_reaches(lab, ip, 80, {"echo-1"})

    cp.add_pod("endpoint-test2", pod2)
    wait_programmed(lab, name, endpoints_of([pod1, pod2], family, 80))
    assert_reaches(lab, ip, 80, {"echo-1", "echo-2"})

    cp.delete_pod("echo-1")
    wait_programmed(lab, name, endpoints_of([pod2], family, 80))
    assert_reaches(lab, ip, 80, {"echo-2"})

    cp.delete_pod("echo-2")
    wait_programmed(lab, name, set())
    assert_refused(lab, ip, 80)


def test_should_serve_multiport_endpoints_from_pods(
    lab: Lab, cp: Cluster, family: IPFamily
) -> None:
    """Upstream: "[sig-network] Services should serve multiport endpoints from pods
    [Conformance]".

    A Service with two ports, portname1 80 -> named port svc1 and portname2 81 -> svc2, and no
    pod; pod1 (svc1 = 100) starts, then pod2 (svc2 = 101): the endpoints list pod1:100 and
    pod2:101 and the Service forwards; pod1 is deleted, then pod2: the endpoints follow.

    Beyond upstream: the named target ports resolve per pod, so the controller publishes two
    slices with different ports (as it does); port 80 reaches only pod1 and on its port 100,
    port 81 only pod2 on 101, each checked at every step; a port whose only pod is gone is
    refused while the other keeps working."""
    ports = [Port("portname1", 80, "svc1"), Port("portname2", 81, "svc2")]
    cp.create_service("multi-endpoint-test", family, ports)
    ip = cp.cluster_ip("multi-endpoint-test")
    first, second = (
        port_name("multi-endpoint-test", "portname1"),
        port_name("multi-endpoint-test", "portname2"),
    )
    pod1 = pod(lab, "echo-1", ("svc1", "TCP", 100))
    pod2 = pod(lab, "echo-2", ("svc2", "TCP", 101))

    cp.add_pod("multi-endpoint-test", pod1)
    wait_programmed(lab, first, endpoints_of([pod1], family, 100))
    wait_programmed(lab, second, set())
    assert_reaches(lab, ip, 80, {"echo-1"}, served_port=100)
    assert_refused(lab, ip, 81)

    cp.add_pod("multi-endpoint-test", pod2)
    wait_programmed(lab, second, endpoints_of([pod2], family, 101))
    assert_reaches(lab, ip, 80, {"echo-1"}, served_port=100)
    assert_reaches(lab, ip, 81, {"echo-2"}, served_port=101)

    cp.delete_pod("echo-1")
    wait_programmed(lab, first, set())
    assert_refused(lab, ip, 80)
    assert_reaches(lab, ip, 81, {"echo-2"}, served_port=101)

    cp.delete_pod("echo-2")
    wait_programmed(lab, second, set())
    assert_refused(lab, ip, 81)


def test_should_serve_endpoints_on_same_port_and_different_protocols(
    lab: Lab, cp: Cluster, family: IPFamily
) -> None:
    """Upstream: "[sig-network] Services should serve endpoints on same port and different
    protocols [Conformance]".

    One Service with tcp-port 80/TCP and udp-port 80/UDP, one pod listening on 80 for both:
    both are forwarded. Updated to the TCP port only: TCP works, UDP stops; to the UDP port
    only: UDP works, TCP stops.

    Beyond upstream: from every node's pod and namespace; after each update the removed
    protocol's port is gone from every agent (not merely failing somewhere). (The double this
    test ran against before published the slice before the Service; the real controller
    writes it after the Service, as here.)"""
    tcp, udp_port = Port("tcp-port", 80, 80, "TCP"), Port("udp-port", 80, 80, "UDP")
    pod1 = pod(lab, "echo-1")
    cp.create_service("multiprotocol-test", family, [tcp, udp_port], pods=[pod1])
    ip = cp.cluster_ip("multiprotocol-test")
    tcp_name = port_name("multiprotocol-test", "tcp-port", "TCP")
    udp_name = port_name("multiprotocol-test", "udp-port", "UDP")
    wanted = endpoints_of([pod1], family, 80)
    wait_programmed(lab, tcp_name, wanted)
    wait_programmed(lab, udp_name, wanted)
    assert_reaches(lab, ip, 80, {"echo-1"}, count=10)
    assert_udp_reaches(lab, ip, 80, {"echo-1"}, count=10)

    def only(port: Port):
        def mutate(svc: dict) -> None:
            svc["spec"]["ports"] = [port.as_dict()]

        return mutate

    cp.update_service("multiprotocol-test", only(tcp))
    wait_programmed(lab, tcp_name, wanted)
    lab.wait_status(lambda _n, st: all(s["name"] != udp_name for s in st["services"]))
    assert_reaches(lab, ip, 80, {"echo-1"}, count=10)
    assert_unreachable(lab, ip, 80, protocol="UDP")

    cp.update_service("multiprotocol-test", only(udp_port))
    wait_programmed(lab, udp_name, wanted)
    lab.wait_status(lambda _n, st: all(s["name"] != tcp_name for s in st["services"]))
    assert_udp_reaches(lab, ip, 80, {"echo-1"}, count=10)
    assert_unreachable(lab, ip, 80, protocol="TCP")


def test_should_be_able_to_change_the_type_from_ExternalName_to_ClusterIP(
    lab: Lab, cp: Cluster, family: IPFamily
) -> None:
    """Upstream: "[sig-network] Services should be able to change the type from ExternalName to
    ClusterIP [Conformance]".

    An ExternalName Service (no ClusterIP) is updated to type ClusterIP with port 80/TCP; the
    API server assigns a ClusterIP; with two pods it is reachable on its ClusterIP (and its
    name: DNS, not the proxy's job, not ported).

    Beyond upstream: while ExternalName, no agent programs anything for it; after the change
    every agent programs both pods and both answer from every node."""
    cp.create_service(
        "externalname-service", family, type="ExternalName", externalName="foo.example.com"
    )
    wait_absent(lab, "externalname-service")
    assert "clusterIP" not in cp.service("externalname-service")["spec"]

    def to_cluster_ip(svc: dict) -> None:
        svc["spec"]["type"] = "ClusterIP"
        svc["spec"].pop("externalName")
        svc["spec"]["ports"] = [HTTP.as_dict()]
        # The family asked for (a dual-stack server gives its first family, IPv4, otherwise).
        svc["spec"]["ipFamilies"] = [family.name]

    cp.update_service("externalname-service", to_cluster_ip)
    pods = [pod(lab, "web-1"), pod(lab, "web-2")]
    cp.set_pods("externalname-service", pods)
    ip = cp.cluster_ip("externalname-service")
    wait_programmed(
        lab, port_name("externalname-service", "http"), endpoints_of(pods, family, HTTP_PORT)
    )
    assert_reaches(lab, ip, 80, {"web-1", "web-2"})


def test_should_be_able_to_change_the_type_from_ClusterIP_to_ExternalName(
    lab: Lab, cp: Cluster, family: IPFamily
) -> None:
    """Upstream: "[sig-network] Services should be able to change the type from ClusterIP to
    ExternalName [Conformance]".

    A ClusterIP Service is updated to type ExternalName (a CNAME to another Service): the API
    server clears its ClusterIP, and its name resolves (DNS, not ported).

    Beyond upstream: the proxy's side of it. Before, two pods serve it from every node; after,
    the EndpointSlice controller deletes its slices, no agent has the Service, no flow of any
    agent still matches the old ClusterIP, and it answers nobody."""
    pods = [pod(lab, "web-1"), pod(lab, "web-2")]
    cp.create_service("clusterip-service", family, [HTTP], pods=pods)
    ip = cp.cluster_ip("clusterip-service")
    wait_programmed(
        lab, port_name("clusterip-service", "http"), endpoints_of(pods, family, HTTP_PORT)
    )
    assert_reaches(lab, ip, 80, {"web-1", "web-2"})

    def to_external_name(svc: dict) -> None:
        svc["spec"]["type"] = "ExternalName"
        svc["spec"]["externalName"] = "externalsvc.conformance.svc.cluster.local"

    after = cp.update_service("clusterip-service", to_external_name)
    assert "clusterIP" not in after["spec"]
    wait_absent(lab, "clusterip-service")
    assert_not_programmed(lab, ip)
    assert_unreachable(lab, ip, 80)


def _proxy_label_test(lab: Lab, cp: Cluster, family: IPFamily, labels: dict) -> None:
    """service-proxy-name and headless, as upstream: one Service created with the label (never
    served), one toggled (served, labelled: not served, unlabelled: served again)."""
    pods = [pod(lab, f"web-{i}") for i in (1, 2, 3)]
    names = {p.name for p in pods}
    cp.create_service("service-disabled", family, [HTTP], labels=labels, pods=pods)
    cp.create_service("service-toggled", family, [HTTP], pods=pods)
    disabled, toggled = cp.cluster_ip("service-disabled"), cp.cluster_ip("service-toggled")
    toggled_port = port_name("service-toggled", "http")
    wanted = endpoints_of(pods, family, HTTP_PORT)

    wait_programmed(lab, toggled_port, wanted)
    assert_reaches(lab, toggled, 80, names)
    wait_absent(lab, "service-disabled")
    assert_not_programmed(lab, disabled)
    assert_unreachable(lab, disabled, 80)

    def set_labels(value: dict):
        def mutate(svc: dict) -> None:
            svc["metadata"]["labels"] = dict(value)

        return mutate

    cp.update_service("service-toggled", set_labels(labels))
    wait_absent(lab, "service-toggled")
    assert_not_programmed(lab, toggled)
    assert_unreachable(lab, toggled, 80)

    cp.update_service("service-toggled", set_labels({}))
    wait_programmed(lab, toggled_port, wanted)
    assert_reaches(lab, toggled, 80, names)

    wait_absent(lab, "service-disabled")
    assert_unreachable(lab, disabled, 80)


def test_should_implement_service_kubernetes_io_service_proxy_name(
    lab: Lab, cp: Cluster, family: IPFamily
) -> None:
    """Upstream: "[sig-network] Services should implement service.kubernetes.io/service-proxy-name".

    A Service labelled service-proxy-name=foo-bar (another proxy's) is never served; an
    unlabelled one with three pods is; labelling it takes it down, unlabelling brings it back.

    Beyond upstream: "down" means no agent has the Service and no flow matches its ClusterIP
    (upstream: the ClusterIP does not answer); "up" means all three pods answer, from every
    node. The controller copies the label to the slices, so the slices leave our informers'
    selection with the Service and come back with it."""
    _proxy_label_test(lab, cp, family, {PROXY_NAME_LABEL: "foo-bar"})


def test_should_implement_service_kubernetes_io_headless(
    lab: Lab, cp: Cluster, family: IPFamily
) -> None:
    """Upstream: "[sig-network] Services should implement service.kubernetes.io/headless".

    As the service-proxy-name test, with the label service.kubernetes.io/headless="" on a
    Service that has a ClusterIP: the labelled one is never served, the toggled one follows
    its label.

    Beyond upstream: as in the service-proxy-name test (every agent, every node, flows)."""
    _proxy_label_test(lab, cp, family, {HEADLESS_LABEL: ""})


def test_should_be_rejected_when_no_endpoints_exist(
    lab: Lab, cp: Cluster, family: IPFamily
) -> None:
    """Upstream: "[sig-network] Services should be rejected when no endpoints exist".

    A Service with no endpoints; a pod on the first node connecting to it gets REFUSED (not a
    timeout).

    Beyond upstream: from every node's pod and namespace, TCP gets a RST quickly (well within
    the client timeout), and the Service's UDP port answers ICMP port unreachable (refused on
    a connected socket)."""
    ports = [Port("http", 80, 80), Port("dns", 53, 53, "UDP")]
    cp.create_service("no-pods", family, ports)
    ip = cp.cluster_ip("no-pods")
    wait_programmed(lab, port_name("no-pods", "http"), set())
    wait_programmed(lab, port_name("no-pods", "dns", "UDP"), set())
    assert_refused(lab, ip, 80)
    for node in lab.nodes.values():
        out = http(lab, client_pod(node), ip, 80, 5, timeout=3)
        assert out["failures"] == {"refused": 5} and out["max_latency_s"] < 1, out
    for label, netns in clients(lab):
        out = udp(lab, netns, ip, 53, 3, timeout=2)
        assert out["failures"] == {"refused": 3}, (label, out)


def _terminating_service(
    lab: Lab, cp: Cluster, family: IPFamily, name: str, local: bool = False, **spec: object
) -> str:
    """Upstream's set-up: one webserver pod on node0 (node-1), then deleted with a long grace
    period: its endpoint is terminating but still serving (the pod answers while it drains).
    ``local``: only node-1's agent uses it (a traffic policy Local)."""
    web = pod(lab, "web-1")
    cp.create_service(name, family, [HTTP], pods=[web], **spec)
    ready = endpoints_of([web], family, HTTP_PORT)
    wait_programmed(
        lab, port_name(name, "http"), lambda node: ready if node == "node-1" or not local else set()
    )
    cp.terminate_pod("web-1", drains=True)
    return cp.cluster_ip(name)


def test_should_fallback_to_terminating_endpoints_when_there_are_no_ready_endpoints_with_internalTrafficPolicy_Cluster(  # noqa: E501
    lab: Lab, cp: Cluster, family: IPFamily
) -> None:
    """Upstream: "[sig-network] Services should fallback to terminating endpoints when there
    are no ready endpoints with internalTrafficPolicy=Cluster".

    One endpoint, on node0, terminating (deleted, long grace period): pods on node0 and node1
    both still reach it through the ClusterIP (5 times, 5 s apart).

    Beyond upstream: every agent programs the terminating endpoint (/status), pods and node
    namespaces of all three nodes reach it; once it is gone, they are refused."""
    ip = _terminating_service(lab, cp, family, "svc-proxy-terminating")
    web = pod(lab, "web-1")
    wait_programmed(
        lab, port_name("svc-proxy-terminating", "http"), endpoints_of([web], family, HTTP_PORT)
    )
    for _ in range(3):
        assert_reaches(lab, ip, 80, {"web-1"}, count=5)
    cp.remove_pod("web-1")
    wait_programmed(lab, port_name("svc-proxy-terminating", "http"), set())
    assert_refused(lab, ip, 80)


def test_should_fallback_to_local_terminating_endpoints_when_there_are_no_ready_endpoints_with_internalTrafficPolicy_Local(  # noqa: E501
    lab: Lab, cp: Cluster, family: IPFamily
) -> None:
    """Upstream: "[sig-network] Services should fallback to local terminating endpoints when
    there are no ready endpoints with internalTrafficPolicy=Local".

    internalTrafficPolicy Local, one endpoint on node0, terminating: the pod on node0 reaches
    it; the pod on node1 gets an error (no local endpoint).

    Beyond upstream: node-1's agent programs the terminating endpoint and the others none
    (/status); node-2 and node-3 both fail, their node namespaces too."""
    ip = _terminating_service(
        lab, cp, family, "svc-proxy-terminating", local=True, internalTrafficPolicy="Local"
    )
    web = pod(lab, "web-1")
    local = endpoints_of([web], family, HTTP_PORT)
    wait_programmed(
        lab,
        port_name("svc-proxy-terminating", "http"),
        lambda node: local if node == "node-1" else set(),
    )
    others = [(label, netns) for label, netns in clients(lab) if not label.startswith("node-1 ")]
    no_local = functools.partial(http, lab, ip=ip, port=80, count=2, timeout=1)
    for _ in range(3):
        out = http(lab, client_pod(lab.nodes["node-1"]), ip, 80, 5)
        assert out["failed"] == 0 and out["counts"] == {"web-1": 5}, out
        for label, out in in_parallel(others, no_local).items():
            assert out["failed"] == 2, (label, out)
