"""A cluster's Kubernetes objects, built: what the benchmarks serve and load, and what tests
that need a realistic cluster read (tests and bench both import this; neither imports the
other).

* ``service_object`` / ``slice_object``: a Service and its EndpointSlice as the API server
  sends them in a list (no kind/apiVersion on items; uid, resourceVersion, creationTimestamp,
  managedFields, the controller's labels, annotations and ownerReference), with exactly the
  content of ``bench.dp.cluster`` (same names, ClusterIPs and endpoints: the addresses below),
  so the groups and flows the agent installs can be compared with ``ovs-ofctl`` loading
  ``dp``'s.
* ``manifest_files``: the same cluster as YAML manifests (what a user writes: no server-set
  fields), 1,000 Services a file.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import yaml

# Service i's ClusterIP is CLUSTER_IP_BASE + 1 + i; its endpoint j (of n) is
# ENDPOINT_BASE + i * n + j, on ENDPOINT_PORT.
ENDPOINT_PORT = 8080
CLUSTER_IP_BASE = int(ipaddress.IPv4Address("172.16.0.0"))
ENDPOINT_BASE = int(ipaddress.IPv4Address("10.0.1.0"))
NAMESPACE = "bench"
# bench.dp.cluster's ClusterIPs: room for 1,048,574 Services, and as large a range as
# kube-apiserver takes (20 bits of host part)
SERVICE_CIDR = "172.16.0.0/12"
# managed-by of the slices the EndpointSlice controller writes (what a list of them holds)
CONTROLLER = "endpointslice-controller.k8s.io"
SERVICES_PER_FILE = 1000
_CREATED = "2026-11-30T10:00:00Z"
_SUFFIX = "abcdefghijklmnopqrstuvwxyz0123456789"


def _suffix(i: int) -> str:
    out = []
    for _ in range(5):
        i, r = divmod(i * 7 + 3, len(_SUFFIX))
        out.append(_SUFFIX[r])
    return "".join(out)


def _uid(kind: int, i: int) -> str:
    return f"{kind:08x}-{i >> 16 & 0xFFFF:04x}-4{i & 0xFFF:03x}-8000-{i:012x}"


def service_object(i: int, *, server_fields: bool = True) -> dict[str, Any]:
    """Service ``svc-i``: ClusterIP bench.dp.cluster's i-th, port http 80/TCP -> 8080."""
    name = f"svc-{i}"
    ip = str(ipaddress.IPv4Address(CLUSTER_IP_BASE + 1 + i))
    meta: dict[str, Any] = {"name": name, "namespace": NAMESPACE, "labels": {"app": name}}
    if server_fields:
        meta.update(
            uid=_uid(1, i),
            resourceVersion="1",
            creationTimestamp=_CREATED,
            managedFields=[
                {
                    "manager": "kubectl-client-side-apply",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": _CREATED,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:metadata": {"f:labels": {".": {}, "f:app": {}}},
                        "f:spec": {
                            "f:internalTrafficPolicy": {},
                            "f:ports": {
                                ".": {},
                                'k:{"port":80,"protocol":"TCP"}': {
                                    ".": {},
                                    "f:name": {},
                                    "f:port": {},
                                    "f:protocol": {},
                                    "f:targetPort": {},
                                },
                            },
                            "f:selector": {},
                            "f:sessionAffinity": {},
                            "f:type": {},
                        },
                    },
                }
            ],
        )
    obj: dict[str, Any] = {
        "metadata": meta,
        "spec": {
            "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080}],
            "selector": {"app": name},
            "clusterIP": ip,
            "clusterIPs": [ip],
            "type": "ClusterIP",
            "sessionAffinity": "None",
            "ipFamilies": ["IPv4"],
            "ipFamilyPolicy": "SingleStack",
            "internalTrafficPolicy": "Cluster",
        },
    }
    if server_fields:
        obj["status"] = {"loadBalancer": {}}
    return obj


def endpoint_ips(i: int, endpoints: int) -> list[str]:
    return [str(ipaddress.IPv4Address(ENDPOINT_BASE + i * endpoints + j)) for j in range(endpoints)]


def endpoint_object(i: int, ip: str, pod: int) -> dict[str, Any]:
    return {
        "addresses": [ip],
        "conditions": {"ready": True, "serving": True, "terminating": False},
        "targetRef": {
            "kind": "Pod",
            "namespace": NAMESPACE,
            "name": f"svc-{i}-7d9f8b6c5-{_suffix(pod)}",
            "uid": _uid(3, pod),
        },
        "nodeName": f"node-{pod % 7}",
        "zone": f"zone-{pod % 3}",
    }


def slice_name(i: int) -> str:
    return f"svc-{i}-{_suffix(i)}"


def slice_object(
    i: int,
    endpoints: list[dict[str, Any]],
    *,
    server_fields: bool = True,
    annotations: dict[str, str] | None = None,
    managed_by: str = CONTROLLER,
) -> dict[str, Any]:
    """Service ``i``'s EndpointSlice; with ``server_fields``, as the EndpointSlice controller
    wrote it and the API server lists it, else what a writer sends (``annotations`` are
    added either way; ``managed_by``: its managed-by label)."""
    service = f"svc-{i}"
    meta: dict[str, Any] = {
        "name": slice_name(i),
        "namespace": NAMESPACE,
        "labels": {
            "app": service,
            "endpointslice.kubernetes.io/managed-by": managed_by,
            "kubernetes.io/service-name": service,
        },
    }
    if server_fields:
        meta.update(
            generateName=f"{service}-",
            uid=_uid(2, i),
            resourceVersion="1",
            generation=1,
            creationTimestamp=_CREATED,
            annotations={"endpoints.kubernetes.io/last-change-trigger-time": _CREATED},
            ownerReferences=[
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "name": service,
                    "uid": _uid(1, i),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            managedFields=[
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "apiVersion": "discovery.k8s.io/v1",
                    "time": _CREATED,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:addressType": {},
                        "f:endpoints": {},
                        "f:metadata": {
                            "f:annotations": {
                                ".": {},
                                "f:endpoints.kubernetes.io/last-change-trigger-time": {},
                            },
                            "f:generateName": {},
                            "f:labels": {
                                ".": {},
                                "f:app": {},
                                "f:endpointslice.kubernetes.io/managed-by": {},
                                "f:kubernetes.io/service-name": {},
                            },
                            "f:ownerReferences": {
                                ".": {},
                                f'k:{{"uid":"{_uid(1, i)}"}}': {},
                            },
                        },
                        "f:ports": {},
                    },
                }
            ],
        )
    if annotations:
        meta["annotations"] = {**meta.get("annotations", {}), **annotations}
    return {
        "metadata": meta,
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "http", "protocol": "TCP", "port": ENDPOINT_PORT}],
    }


def endpoints_of(i: int, endpoints: int) -> list[dict[str, Any]]:
    """Service ``i``'s ``endpoints`` endpoints (pods ``i * endpoints`` onwards)."""
    return [
        endpoint_object(i, ip, i * endpoints + j) for j, ip in enumerate(endpoint_ips(i, endpoints))
    ]


def cluster_objects(
    services: int, endpoints: int, *, server_fields: bool = True
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(Services, EndpointSlices) of bench.dp.cluster(services, endpoints)."""
    svcs = [service_object(i, server_fields=server_fields) for i in range(services)]
    slices = [
        slice_object(i, endpoints_of(i, endpoints), server_fields=server_fields)
        for i in range(services)
    ]
    return svcs, slices


def manifest_files(directory: Path, services: int, endpoints: int) -> list[Path]:
    """The same cluster as manifests (Service, then its EndpointSlice), 1,000 a file."""
    svcs, slices = cluster_objects(services, endpoints, server_fields=False)
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    files = []
    for start in range(0, services, SERVICES_PER_FILE):
        docs: list[dict[str, Any]] = []
        for i in range(start, min(start + SERVICES_PER_FILE, services)):
            docs.append({"apiVersion": "v1", "kind": "Service", **svcs[i]})
            docs.append({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", **slices[i]})
        path = directory / f"services-{start // SERVICES_PER_FILE:03d}.yaml"
        path.write_text(yaml.dump_all(docs, Dumper=dumper, sort_keys=False))
        files.append(path)
    return files
