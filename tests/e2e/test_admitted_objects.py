"""What the real kube-apiserver admits, our source accepts.

A varied set of valid Services and EndpointSlices is created through the real API (so each
passed the server's own validation and defaulting): dual-stack and single-stack IPv6,
ExternalName, headless, named and numeric target ports, SCTP and UDP, appProtocol, NodePort
and LoadBalancer with ``externalTrafficPolicy: Local`` (a healthCheckNodePort allocated),
``loadBalancerSourceRanges``, load-balancer ingress with ``ipMode``, ``sessionAffinityConfig``
at both ends of its range, ``trafficDistribution``, ``internalTrafficPolicy``, externalIPs,
names of the longest lengths the server allows, many ports; slices with terminating
endpoints, conditions left out, zone and node hints, hostname/nodeName/zone, an all-ports
port, IPv6 and FQDN address types, 1000 endpoints, 100 ports, no endpoint at all. Then the
agent's source (``KubernetesSource``: the informer, ``kubejson``, ``convert``) lists them
as the agent does: every one must be delivered as a model value, none refused
(ExternalName and headless Services, FQDN slices are ignored by design, as kube-proxy does).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.controlplane import delete_namespace

from ovsproxy.lab.controlplane import ControlPlane
from ovsproxy.model import EndpointSlice, Service
from ovsproxy.model.problems import SourceProblem
from ovsproxy.sources.kubernetes import KubernetesSource

pytestmark = [pytest.mark.slow]

NS = "admitted"
Doc = dict[str, Any]
LONG_SERVICE = "s" * 63  # a DNS-1035 label: at most 63
LONG_SLICE = "e" * 253  # a DNS-1123 subdomain: at most 253


def service(name: str, spec: Doc, **meta: Any) -> Doc:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, **meta}, "spec": spec}


def tcp(name: str, port: int, **extra: Any) -> Doc:
    return {"name": name, "port": port, "protocol": "TCP", **extra}


SERVICES: list[Doc] = [
    service(
        "dual",
        {
            "ipFamilyPolicy": "RequireDualStack",
            "ipFamilies": ["IPv4", "IPv6"],
            "ports": [tcp("http", 80, targetPort="web"), tcp("https", 443, targetPort=8443)],
        },
    ),
    service(
        "v6",
        {"ipFamilyPolicy": "SingleStack", "ipFamilies": ["IPv6"], "ports": [tcp("a", 80)]},
    ),
    service("prefer-dual", {"ipFamilyPolicy": "PreferDualStack", "ports": [tcp("a", 80)]}),
    service("extname", {"type": "ExternalName", "externalName": "example.com"}),
    service("headless", {"clusterIP": "None", "ports": [tcp("a", 80)]}),
    service(
        "protocols",
        {
            "ports": [
                {"name": "sctp", "port": 9000, "protocol": "SCTP"},
                {"name": "udp", "port": 53, "protocol": "UDP"},
                tcp("h2c", 81, appProtocol="kubernetes.io/h2c"),
                tcp("ws", 82, appProtocol="kubernetes.io/ws"),
                tcp("custom", 83, appProtocol="example.com/custom"),
            ]
        },
    ),
    service(
        "nodeport-local",
        {
            "type": "NodePort",
            "externalTrafficPolicy": "Local",
            "ports": [tcp("http", 80), {"name": "dns", "port": 53, "protocol": "UDP"}],
        },
    ),
    service(
        "lb",
        {
            "type": "LoadBalancer",
            "externalTrafficPolicy": "Local",
            "loadBalancerSourceRanges": ["10.0.0.0/8", "192.168.1.0/24", "2001:db8::/64"],
            "loadBalancerClass": "example.com/lb",
            "allocateLoadBalancerNodePorts": False,
            "ports": [tcp("http", 80)],
        },
    ),
    service(
        "lb-nodeports",
        {
            "type": "LoadBalancer",
            "externalTrafficPolicy": "Cluster",
            "ports": [tcp("http", 80)],
            "externalIPs": ["198.51.100.7"],
        },
    ),
    service(
        "affinity-max",
        {
            "sessionAffinity": "ClientIP",
            "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 86400}},
            "ports": [tcp("a", 80)],
        },
    ),
    service(
        "affinity-min",
        {
            "sessionAffinity": "ClientIP",
            "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 1}},
            "ports": [tcp("a", 80)],
        },
    ),
    service(
        "distribution",
        {
            "trafficDistribution": "PreferClose",
            "internalTrafficPolicy": "Local",
            "publishNotReadyAddresses": True,
            "ports": [tcp("a", 80)],
        },
    ),
    service(LONG_SERVICE, {"ports": [tcp("p" * 15, 80)]}),  # a port name: at most 15
    service("many-ports", {"ports": [tcp(f"p{i}", 1000 + i) for i in range(100)]}),
    service("unnamed-port", {"ports": [{"port": 80, "targetPort": 8080}]}),
    service(
        "labelled",
        {"ports": [tcp("a", 80)]},
        labels={"app": "x", "example.com/tier": "front"},
        annotations={"example.com/note": "n" * 1000},
    ),
]

# LoadBalancer ingress as a cloud controller would write it (status subresource).
LB_STATUS = {
    "lb": {
        "loadBalancer": {
            "ingress": [
                {"ip": "203.0.113.10", "ipMode": "VIP"},
                {"ip": "203.0.113.11", "ipMode": "Proxy"},
                {"hostname": "lb.example.com"},
                {"ip": "2001:db8::10", "ports": [{"port": 80, "protocol": "TCP"}]},
            ]
        }
    }
}


def endpoint_slice(name: str, service_name: str, body: Doc) -> Doc:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": service_name}},
        **body,
    }


def v4(i: int) -> str:
    return f"10.244.{i // 250}.{i % 250 + 1}"


SLICES: list[Doc] = [
    endpoint_slice(
        "dual-v4",
        "dual",
        {
            "addressType": "IPv4",
            "ports": [tcp("http", 8080, appProtocol="http"), tcp("https", 8443)],
            "endpoints": [
                {
                    "addresses": ["10.244.0.1"],
                    "conditions": {"ready": True, "serving": True, "terminating": False},
                    "hostname": "pod-1",
                    "nodeName": "node-1",
                    "zone": "zone-a",
                    "targetRef": {"kind": "Pod", "namespace": NS, "name": "pod-1"},
                    "hints": {"forZones": [{"name": "zone-a"}], "forNodes": [{"name": "node-1"}]},
                },
                {  # terminating, still serving
                    "addresses": ["10.244.0.2"],
                    "conditions": {"ready": False, "serving": True, "terminating": True},
                },
                {  # terminating, no longer serving
                    "addresses": ["10.244.0.3"],
                    "conditions": {"ready": False, "serving": False, "terminating": True},
                },
                {"addresses": ["10.244.0.4"]},  # conditions left out: unknown, i.e. ready
                {"addresses": ["10.244.0.5"], "conditions": {}},
            ],
        },
    ),
    endpoint_slice(
        "dual-v6",
        "dual",
        {
            "addressType": "IPv6",
            "ports": [tcp("http", 8080), tcp("https", 8443)],
            "endpoints": [{"addresses": ["fd00:10:244::1"], "conditions": {"ready": True}}],
        },
    ),
    endpoint_slice(
        "protocols-1",
        "protocols",
        {
            "addressType": "IPv4",
            "ports": [
                {"name": "sctp", "port": 9000, "protocol": "SCTP"},
                {"name": "udp", "port": 53, "protocol": "UDP"},
                tcp("h2c", 81, appProtocol="kubernetes.io/h2c"),
            ],
            "endpoints": [{"addresses": ["10.244.1.1"]}],
        },
    ),
    endpoint_slice(  # a port without a number: "all ports"
        "all-ports",
        "unnamed-port",
        {"addressType": "IPv4", "ports": [{}], "endpoints": [{"addresses": ["10.244.1.2"]}]},
    ),
    endpoint_slice(
        "unnamed-port-1",
        "unnamed-port",
        {
            "addressType": "IPv4",
            "ports": [{"port": 8080}],  # name "" and protocol TCP by default
            "endpoints": [{"addresses": ["10.244.1.3"]}],
        },
    ),
    endpoint_slice("fqdn", "extname", {"addressType": "FQDN", "ports": [tcp("a", 80)],
                                       "endpoints": [{"addresses": ["example.com"]}]}),
    endpoint_slice(LONG_SLICE, LONG_SERVICE, {
        "addressType": "IPv4",
        "ports": [tcp("p" * 15, 80)],
        "endpoints": [{"addresses": ["10.244.1.4"]}],
    }),
    endpoint_slice("thousand", "distribution", {
        "addressType": "IPv4",
        "ports": [tcp("a", 8080)],
        "endpoints": [
            {"addresses": [v4(i)], "zone": f"zone-{i % 3}",
             "hints": {"forZones": [{"name": f"zone-{i % 3}"}]}}
            for i in range(1000)
        ],
    }),
    endpoint_slice("many-ports-1", "many-ports", {
        "addressType": "IPv4",
        "ports": [tcp(f"p{i}", 2000 + i) for i in range(100)],
        "endpoints": [{"addresses": ["10.244.9.1"]}],
    }),
    endpoint_slice("empty", "affinity-max", {"addressType": "IPv4", "ports": [tcp("a", 80)],
                                             "endpoints": []}),
    endpoint_slice("no-ports", "affinity-min", {"addressType": "IPv4",
                                                "endpoints": [{"addresses": ["10.244.9.2"]}]}),
]  # fmt: skip

IGNORED_SERVICES = {"extname", "headless"}  # by design, as kube-proxy
IGNORED_SLICES = {"fqdn"}


class Recorder:
    """A SourceHandler that keeps what the source delivered and what it refused."""

    def __init__(self) -> None:
        self.services: dict[str, Service] = {}
        self.slices: dict[str, EndpointSlice] = {}
        self.problems: list[SourceProblem] = []
        self.synced: set[str] = set()

    def on_service_add(self, service: Service) -> None:
        if service.namespace == NS:
            self.services[service.name] = service

    on_service_update = on_service_add

    def on_service_delete(self, namespace: str, name: str) -> None:
        pass

    def on_endpoint_slice_add(self, endpoint_slice: EndpointSlice) -> None:
        if endpoint_slice.namespace == NS:
            self.slices[endpoint_slice.name] = endpoint_slice

    on_endpoint_slice_update = on_endpoint_slice_add

    def on_endpoint_slice_delete(self, namespace: str, name: str) -> None:
        pass

    def on_synced(self, kind: str) -> None:
        self.synced.add(kind)

    def on_error(self, problem: SourceProblem) -> None:
        self.problems.append(problem)


@pytest.fixture
def admitted(kube_api: ControlPlane) -> Iterator[list[str]]:
    """Every object created in namespace admitted; what the server refused, if anything."""
    kube_api.create_namespace(NS)
    refused = []
    try:
        for obj in SERVICES:
            kube_api.request("POST", f"/api/v1/namespaces/{NS}/services", obj)
        for name, status in LB_STATUS.items():
            path = f"/api/v1/namespaces/{NS}/services/{name}/status"
            current = kube_api.request("GET", path)
            kube_api.request("PUT", path, {**current, "status": status})
        for obj in SLICES:
            kube_api.request(
                "POST", f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices", obj
            )
        yield refused
    finally:
        delete_namespace(kube_api, NS)


async def test_every_admitted_service_and_slice_is_accepted(
    kube_api: ControlPlane, admitted: list[str], tmp_path: Path
) -> None:
    recorder = Recorder()
    source = KubernetesSource(recorder, kubeconfig=kube_api.admin_kubeconfig)
    await source.start()
    try:
        await asyncio.wait_for(source.wait_synced(), 30)
    finally:
        await source.stop()
    refused = [str(p) for p in recorder.problems]
    assert refused == [], "\n".join(refused)
    want_services = {s["metadata"]["name"] for s in SERVICES} - IGNORED_SERVICES
    want_slices = {s["metadata"]["name"] for s in SLICES} - IGNORED_SLICES
    assert want_services <= set(recorder.services), want_services - set(recorder.services)
    assert want_slices <= set(recorder.slices), want_slices - set(recorder.slices)
