"""Service and EndpointSlice manifests for labs, written as the API server would hold them.

The lab's agents read one manifests directory; tests and the demo describe a Service with its
endpoints (pods of the lab) and write it there atomically (a watcher never sees half a file).
Topology hints are written as the EndpointSlice controller would for PreferSameZone: every
endpoint hinted for its own zone.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ovsproxy.model import IPAddress, IPFamily


@dataclass(frozen=True, slots=True)
class LabEndpoint:
    """One endpoint: a pod's addresses, where it runs, and its conditions."""

    pod: str
    ips: tuple[IPAddress, ...]
    node: str
    zone: str | None = None
    ready: bool = True
    serving: bool = True
    terminating: bool = False


@dataclass(frozen=True, slots=True)
class LabPort:
    name: str
    port: int
    target_port: int
    protocol: str = "TCP"
    node_port: int = 0  # with a Service type NodePort or LoadBalancer


@dataclass(frozen=True, slots=True)
class LabService:
    name: str
    cluster_ips: tuple[IPAddress, ...]
    ports: tuple[LabPort, ...]
    endpoints: tuple[LabEndpoint, ...] = ()
    namespace: str = "lab"
    internal_traffic_policy: str | None = None  # "Local" or "Cluster"
    traffic_distribution: str | None = None  # e.g. "PreferSameZone"
    session_affinity_timeout: int | None = None  # seconds: ClientIP affinity
    extra_spec: dict[str, Any] = field(default_factory=dict)
    type: str = "ClusterIP"  # NodePort, LoadBalancer
    # status.loadBalancer.ingress: (ip, ipMode or None)
    load_balancer_ingress: tuple[tuple[str, str | None], ...] = ()
    created: str | None = None  # metadata.creationTimestamp (RFC 3339)

    def documents(self) -> list[dict[str, Any]]:
        families = [IPFamily.of(ip) for ip in self.cluster_ips]
        spec: dict[str, Any] = {
            "type": self.type,
            "clusterIP": str(self.cluster_ips[0]),
            "clusterIPs": [str(ip) for ip in self.cluster_ips],
            "ipFamilies": [f"IPv{int(f)}" for f in families],
            "ipFamilyPolicy": "RequireDualStack" if len(families) > 1 else "SingleStack",
            "ports": [
                {
                    "name": p.name,
                    "port": p.port,
                    "targetPort": p.target_port,
                    "protocol": p.protocol,
                    **({"nodePort": p.node_port} if p.node_port else {}),
                }
                for p in self.ports
            ],
        }
        if self.internal_traffic_policy:
            spec["internalTrafficPolicy"] = self.internal_traffic_policy
        if self.traffic_distribution:
            spec["trafficDistribution"] = self.traffic_distribution
        if self.session_affinity_timeout is not None:
            spec["sessionAffinity"] = "ClientIP"
            spec["sessionAffinityConfig"] = {
                "clientIP": {"timeoutSeconds": self.session_affinity_timeout}
            }
        spec.update(self.extra_spec)
        service: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": spec,
        }
        if self.created is not None:
            service["metadata"]["creationTimestamp"] = self.created
        if self.load_balancer_ingress:
            ingress = [
                {"ip": ip, **({"ipMode": mode} if mode else {})}
                for ip, mode in self.load_balancer_ingress
            ]
            service["status"] = {"loadBalancer": {"ingress": ingress}}
        docs: list[dict[str, Any]] = [service]
        for family in families:
            docs.append(self._slice(family))
        return docs

    def _slice(self, family: IPFamily) -> dict[str, Any]:
        endpoints = []
        for ep in self.endpoints:
            ips = [str(ip) for ip in ep.ips if IPFamily.of(ip) == family]
            if not ips:
                continue
            entry: dict[str, Any] = {
                "addresses": ips,
                "conditions": {
                    "ready": ep.ready,
                    "serving": ep.serving,
                    "terminating": ep.terminating,
                },
                "nodeName": ep.node,
                "targetRef": {"kind": "Pod", "namespace": self.namespace, "name": ep.pod},
            }
            if ep.zone:
                entry["zone"] = ep.zone
                if self.traffic_distribution in ("PreferClose", "PreferSameZone"):
                    entry["hints"] = {"forZones": [{"name": ep.zone}]}
            endpoints.append(entry)
        return {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": f"{self.name}-ipv{int(family)}",
                "namespace": self.namespace,
                "labels": {"kubernetes.io/service-name": self.name},
            },
            "addressType": f"IPv{int(family)}",
            "ports": [
                {"name": p.name, "port": p.target_port, "protocol": p.protocol} for p in self.ports
            ],
            "endpoints": endpoints,
        }

    def to_yaml(self) -> str:
        return yaml.safe_dump_all(self.documents(), sort_keys=False)


def write_service(directory: Path, service: LabService) -> Path:
    """Write (or replace) the Service's manifest file atomically; returns its path."""
    path = directory / f"{service.namespace}-{service.name}.yaml"
    tmp = directory / f".{path.name}.tmp"
    tmp.write_text(service.to_yaml())
    os.replace(tmp, path)
    return path


def remove_service(directory: Path, service: LabService | str, namespace: str = "lab") -> None:
    name = service.name if isinstance(service, LabService) else service
    ns = service.namespace if isinstance(service, LabService) else namespace
    (directory / f"{ns}-{name}.yaml").unlink(missing_ok=True)


def addresses(*texts: str) -> tuple[IPAddress, ...]:
    return tuple(ipaddress.ip_address(t) for t in texts)


def endpoint_text(ip: IPAddress, port: int) -> str:
    """An endpoint as the agent's status names it: ``10.0.0.1:80``, ``[fd00::1]:80``."""
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def endpoint_texts(endpoints: Sequence[LabEndpoint], port: int) -> set[str]:
    return {endpoint_text(ip, port) for ep in endpoints for ip in ep.ips}
