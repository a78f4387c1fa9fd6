"""The kubelet's part, played by the lab: Node objects for its nodes and Pod objects for its pods.

No kubelet runs here; the pods are network namespaces the lab makes. So that a Service with a
selector gets its EndpointSlices from kube-controller-manager exactly as on a cluster, the lab
writes what a kubelet would:

* a node: the Node object (labels: hostname, zone), then its status (addresses, Ready);
* a pod: the Pod object with ``spec.nodeName`` (created by the kubelet-less way: already bound),
  then its status through the status subresource: Running, its pod IPs, Ready (the
  EndpointSlice controller reads these);
* a pod's end: ``terminate`` deletes it with a grace period (the API server sets
  ``deletionTimestamp``: the controller marks the endpoint terminating), optionally marking it
  not ready while it drains; ``remove`` ends it with grace period 0, as a kubelet does once the
  containers are gone.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ovsproxy.lab.controlplane import ApiError, ControlPlane

Obj = dict[str, Any]
ZONE_LABEL = "topology.kubernetes.io/zone"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"  # never pulled: no kubelet runs it
CONTAINER = "main"  # each pod's one container


@dataclass(frozen=True)
class ContainerPort:
    port: int
    protocol: str = "TCP"
    name: str | None = None

    def as_dict(self) -> Obj:
        out: Obj = {"containerPort": self.port, "protocol": self.protocol}
        if self.name:
            out["name"] = self.name
        return out


@dataclass(frozen=True)
class PodSpec:
    """What the lab tells the API about one of its pods."""

    name: str
    namespace: str
    node: str
    ips: tuple[str, ...]
    labels: Mapping[str, str] = field(default_factory=dict)
    ports: tuple[ContainerPort, ...] = ()


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Kubelet:
    """Writes the kubelet's part of Nodes and Pods into a real API server."""

    def __init__(self, api: ControlPlane) -> None:
        self.api = api

    # -- nodes
    def register_node(
        self,
        name: str,
        *,
        addresses: Sequence[str],
        pod_cidrs: Sequence[str] = (),
        zone: str | None = None,
        ready: bool = True,
    ) -> Obj:
        labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}
        if zone:
            labels[ZONE_LABEL] = zone
        spec: Obj = {}
        if pod_cidrs:
            spec = {"podCIDR": pod_cidrs[0], "podCIDRs": list(pod_cidrs)}
        self.api.request(
            "POST",
            "/api/v1/nodes",
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": labels},
                "spec": spec,
            },
            ok=(201, 409),
        )
        status = self.set_node_status(name, addresses=addresses, ready=ready)
        if ready:
            self._untaint_not_ready(name)
        return status

    def _untaint_not_ready(self, name: str) -> None:
        """kube-apiserver taints a new Node ``node.kubernetes.io/not-ready`` (admission
        TaintNodesByCondition); the node lifecycle controller lifts it once the node reports
        Ready. That controller does not run here (it would evict the kubelet-less pods), so
        the lab lifts it, as it would."""
        node = self.api.request("GET", f"/api/v1/nodes/{name}")
        taints = node.get("spec", {}).get("taints") or []
        kept = [t for t in taints if t.get("key") != NOT_READY_TAINT]
        if len(kept) != len(taints):
            self.api.request(
                "PATCH",
                f"/api/v1/nodes/{name}",
                {"spec": {"taints": kept or None}},
                content_type="application/merge-patch+json",
            )

    def set_node_status(self, name: str, *, addresses: Sequence[str], ready: bool = True) -> Obj:
        now = _now()
        status = {
            "addresses": [{"type": "InternalIP", "address": a} for a in addresses]
            + [{"type": "Hostname", "address": name}],
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "False",
                    "reason": "KubeletReady" if ready else "KubeletNotReady",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
        }
        return self.api.request(
            "PATCH",
            f"/api/v1/nodes/{name}/status",
            {"status": status},
            content_type="application/merge-patch+json",
        )

    def remove_node(self, name: str) -> None:
        self.api.request("DELETE", f"/api/v1/nodes/{name}", ok=(200, 202, 404))

    # -- pods
    def run_pod(self, pod: PodSpec, *, ready: bool = True) -> Obj:
        """Create the Pod bound to its node, then report it Running with its IPs."""
        container: Obj = {"name": CONTAINER, "image": PAUSE_IMAGE}
        if pod.ports:
            container["ports"] = [p.as_dict() for p in pod.ports]
        self.api.request(
            "POST",
            f"/api/v1/namespaces/{pod.namespace}/pods",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": pod.name, "labels": dict(pod.labels)},
                "spec": {
                    "nodeName": pod.node,
                    "containers": [container],
                    "automountServiceAccountToken": False,
                    "terminationGracePeriodSeconds": 30,
                },
            },
        )
        return self.set_pod_ready(pod, ready=ready)

    def set_pod_ready(self, pod: PodSpec, *, ready: bool) -> Obj:
        now = _now()
        value = "True" if ready else "False"
        status = {
            "phase": "Running",
            "podIP": pod.ips[0] if pod.ips else None,
            "podIPs": [{"ip": ip} for ip in pod.ips],
            "startTime": now,
            "conditions": [
                {"type": kind, "status": value, "lastTransitionTime": now}
                for kind in ("Ready", "ContainersReady")
            ]
            + [
                {"type": kind, "status": "True", "lastTransitionTime": now}
                for kind in ("Initialized", "PodScheduled")
            ],
            # What kubectl's READY column counts.
            "containerStatuses": [
                {
                    "name": CONTAINER,
                    "image": PAUSE_IMAGE,
                    "imageID": "",
                    "ready": ready,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": now}},
                }
            ],
        }
        return self.api.request(
            "PATCH",
            f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/status",
            {"status": status},
            content_type="application/merge-patch+json",
        )

    def terminate_pod(self, pod: PodSpec, *, drains: bool = False) -> None:
        """Delete the Pod gracefully: it stays, with a deletionTimestamp, until ``remove_pod``.
        Unless it ``drains`` (still serving while it ends), it is reported not ready first."""
        if not drains:
            self.set_pod_ready(pod, ready=False)
        self.api.request(
            "DELETE",
            f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}",
            {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 3600},
        )

    def remove_pod(self, namespace: str, name: str) -> None:
        """The Pod gone for good (grace period 0), as a kubelet ends it."""
        try:
            self.api.request(
                "DELETE",
                f"/api/v1/namespaces/{namespace}/pods/{name}",
                {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
            )
        except ApiError as err:
            if err.status != 404:
                raise
