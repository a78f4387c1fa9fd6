"""TEST DOUBLE of what the Kubernetes control plane does to Services, for the conformance tests.

The agents read the fake API server (support/k8s_fake, real HTTP list/watch) and nothing else.
This module writes into it what kube-apiserver and the EndpointSlice controller would, so the
tests can say "create a NodePort Service", "pod2 starts", "pod1 is deleted" as upstream's e2e
tests do:

* the API server's part of a Service: ClusterIP allocation from the lab's Service CIDRs (one
  family per Service, as on a single-stack cluster), nodePort allocation from 30000-32767 for
  NodePort and LoadBalancer Services (kept across updates of the same port, released on delete
  and when the type no longer needs one), defaults (sessionAffinity None, traffic policies
  Cluster), and the type changes: to ExternalName clears clusterIP(s) and nodePorts, from
  ExternalName allocates a ClusterIP;
* the EndpointSlice controller's part: one slice per set of resolved ports (pods whose named
  target ports resolve differently get different slices), labelled with the Service's own
  labels plus ``kubernetes.io/service-name`` and ``endpointslice.kubernetes.io/managed-by``
  (the controller copies them, which is why a Service labelled for another proxy takes its
  slices along), ``service.kubernetes.io/headless`` on the slices of a headless Service, and no
  slices at all for an ExternalName Service;
* a pod's life as its endpoint shows it: ready; deleted -> terminating (ready false; serving
  while it drains, when the test says so) -> gone.

``FakeApiThread`` runs the fake API server on its own event loop in a thread, so synchronous
tests (and the agents, separate processes) can use it while the test waits on traffic.
"""

from __future__ import annotations

import asyncio
import copy
import ipaddress
import threading
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from ovsproxy.lab.cluster import SERVICE_CIDRS
from ovsproxy.model import IPAddress, IPFamily
from support.k8s_fake import FakeKubeApi

Obj = dict[str, Any]
T = TypeVar("T")

NAMESPACE = "conformance"
NODE_PORT_RANGE = range(30000, 32768)
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
HEADLESS_LABEL = "service.kubernetes.io/headless"
PROXY_NAME_LABEL = "service.kubernetes.io/service-proxy-name"


class FakeApiThread:
    """The fake API server on an event loop of its own (a daemon thread)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.api = FakeKubeApi(bookmark_interval=5.0)
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def start(self) -> None:
        self._thread.start()
        self.call(self.api.start())

    def stop(self) -> None:
        self.call(self.api.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def run(self, func: Callable[[], T]) -> T:
        """Run ``func`` on the API's loop (its watchers' queues belong to that loop)."""

        async def wrapper() -> T:
            return func()

        return self.call(wrapper())

    def apply(self, plural: str, obj: Obj) -> Obj:
        return self.run(lambda: self.api.apply(plural, obj))

    def delete(self, plural: str, namespace: str, name: str) -> None:
        self.run(lambda: self.api.delete(plural, namespace, name))

    def kubeconfig(self, path: Path) -> Path:
        return self.api.kubeconfig(path)


@dataclass(frozen=True)
class Port:
    """A Service port; ``target`` is a number or a container port name (resolved per pod)."""

    name: str
    port: int
    target: int | str
    protocol: str = "TCP"
    node_port: int | None = None  # asked for explicitly (else allocated when needed)


@dataclass(frozen=True)
class Pod:
    """A pod as an endpoint: its addresses, node, named container ports and conditions."""

    name: str
    ips: tuple[IPAddress, ...]
    node: str
    named_ports: tuple[tuple[str, str, int], ...] = ()  # (name, protocol, number)
    ready: bool = True
    serving: bool = True
    terminating: bool = False

    def resolve(self, port: Port) -> int | None:
        if isinstance(port.target, int):
            return port.target
        for name, protocol, number in self.named_ports:
            if name == port.target and protocol == port.protocol:
                return number
        return None  # the controller leaves the port out for this pod


@dataclass
class ServiceRecord:
    name: str
    family: IPFamily
    obj: Obj
    pods: list[Pod] = field(default_factory=list)
    slices: set[str] = field(default_factory=set)


class ControlPlane:
    """kube-apiserver's Service handling and the EndpointSlice controller, over the fake API."""

    def __init__(self, api: FakeApiThread, block: int = 0, namespace: str = NAMESPACE) -> None:
        """``block``: this instance allocates ClusterIPs from its own 256 addresses and starts
        its nodePorts 20 apart from other blocks' (one block per test: nothing one test used
        is handed to the next while agents may still be draining it)."""
        self.api = api
        self.namespace = namespace
        self.services: dict[str, ServiceRecord] = {}
        self._cidrs = {
            IPFamily.of(net.network_address): net
            for net in (ipaddress.ip_network(c) for c in SERVICE_CIDRS)
        }
        # From 0x1000 on: clear of the lab's own Services.
        self._next_ip = dict.fromkeys(self._cidrs, 0x1000 + 0x100 * block)
        self._node_ports: set[int] = set()
        self._next_node_port = NODE_PORT_RANGE.start + 20 * block

    # -- the API server: allocation --------------------------------------------------------
    def allocate_cluster_ip(self, family: IPFamily) -> IPAddress:
        self._next_ip[family] += 1
        return self._cidrs[family][self._next_ip[family]]

    def allocate_node_port(self, wanted: int | None = None) -> int:
        if wanted is not None:
            if wanted in self._node_ports:
                raise ValueError(f"provided port is already allocated: {wanted}")
            if wanted not in NODE_PORT_RANGE:
                raise ValueError(f"provided port is not in the valid range: {wanted}")
            self._node_ports.add(wanted)
            return wanted
        while self._next_node_port in self._node_ports:
            self._next_node_port += 1
        port = self._next_node_port
        self._node_ports.add(port)
        return port

    def node_port_in_use(self, port: int) -> bool:
        return port in self._node_ports

    def _release_node_ports(self, spec: Obj) -> None:
        for p in spec.get("ports", []):
            self._node_ports.discard(p.pop("nodePort", None))

    # -- Services -------------------------------------------------------------------------
    def create_service(
        self,
        name: str,
        family: IPFamily,
        ports: Sequence[Port] = (),
        *,
        type: str = "ClusterIP",
        labels: dict[str, str] | None = None,
        pods: Sequence[Pod] = (),
        slices_first: bool = True,
        **spec: Any,
    ) -> Obj:
        """Create a Service as the API server stores it, with ``pods`` as its endpoints.
        ``slices_first``: publish its slices before the Service itself (the proxy's two
        watches may well deliver them in that order)."""
        obj: Obj = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": self.namespace, "labels": dict(labels or {})},
            "spec": {"type": type, "ports": [self._port(p) for p in ports], **spec},
        }
        record = ServiceRecord(name, family, obj, list(pods))
        self._admit(obj, family, previous=None)
        self.services[name] = record
        if slices_first:
            self._sync_slices(record)
            self.api.apply("services", obj)
        else:
            self.api.apply("services", obj)
            self._sync_slices(record)
        return copy.deepcopy(obj)

    def update_service(self, name: str, mutate: Callable[[Obj], None]) -> Obj:
        """Get, mutate, update (as the e2e jig's UpdateService): the API server re-admits the
        object, the controller re-syncs the slices (labels, type, ports)."""
        record = self.services[name]
        previous = copy.deepcopy(record.obj)
        obj = copy.deepcopy(record.obj)
        mutate(obj)
        self._admit(obj, record.family, previous=previous)
        record.obj = obj
        self.api.apply("services", obj)
        self._sync_slices(record)
        return copy.deepcopy(obj)

    def delete_service(self, name: str) -> None:
        record = self.services.pop(name)
        self._release_node_ports(record.obj["spec"])
        self.api.delete("services", self.namespace, name)
        # The slices go with their Service (garbage collection of owned objects).
        for slice_name in sorted(record.slices):
            self.api.delete("endpointslices", self.namespace, slice_name)

    def service(self, name: str) -> Obj:
        return copy.deepcopy(self.services[name].obj)

    def cluster_ip(self, name: str) -> str:
        return str(self.services[name].obj["spec"]["clusterIP"])

    def node_port(self, name: str, index: int = 0) -> int:
        return int(self.services[name].obj["spec"]["ports"][index]["nodePort"])

    @staticmethod
    def _port(port: Port) -> Obj:
        obj: Obj = {
            "name": port.name,
            "port": port.port,
            "targetPort": port.target,
            "protocol": port.protocol,
        }
        if port.node_port is not None:
            obj["nodePort"] = port.node_port
        return obj

    def _admit(self, obj: Obj, family: IPFamily, previous: Obj | None) -> None:
        """Defaults, ClusterIP and nodePort allocation, as the API server on create/update."""
        spec = obj["spec"]
        before = (previous or {}).get("spec", {})
        service_type = spec.setdefault("type", "ClusterIP")
        if service_type == "ExternalName":
            for key in ("clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"):
                spec.pop(key, None)
            spec.pop("sessionAffinityConfig", None)
            spec["sessionAffinity"] = "None"
            self._release_node_ports(spec)
            self._release_node_ports(copy.deepcopy(before))
            spec.pop("externalTrafficPolicy", None)
            spec.pop("internalTrafficPolicy", None)
            return
        spec.pop("externalName", None)
        if spec.get("clusterIP") != "None" and not spec.get("clusterIP"):
            ip = before.get("clusterIP") or str(self.allocate_cluster_ip(family))
            spec["clusterIP"] = ip
        spec["clusterIPs"] = [spec["clusterIP"]]
        spec["ipFamilies"] = [f"IPv{int(family)}"]
        spec["ipFamilyPolicy"] = "SingleStack"
        spec.setdefault("sessionAffinity", "None")
        if spec["sessionAffinity"] == "ClientIP":
            config = spec.setdefault("sessionAffinityConfig", {}).setdefault("clientIP", {})
            config.setdefault("timeoutSeconds", 10800)
        else:
            spec.pop("sessionAffinityConfig", None)
        spec.setdefault("internalTrafficPolicy", "Cluster")
        old_node_ports = {
            (p.get("name"), p.get("protocol")): p["nodePort"]
            for p in before.get("ports", [])
            if "nodePort" in p
        }
        if service_type in ("NodePort", "LoadBalancer"):
            spec.setdefault("externalTrafficPolicy", "Cluster")
            kept: set[int] = set()
            for p in spec["ports"]:
                key = (p.get("name"), p.get("protocol"))
                if "nodePort" in p and p["nodePort"] != old_node_ports.get(key):
                    self.allocate_node_port(p["nodePort"])
                elif "nodePort" not in p and key in old_node_ports:
                    p["nodePort"] = old_node_ports[key]
                elif "nodePort" not in p:
                    p["nodePort"] = self.allocate_node_port()
                kept.add(p["nodePort"])
            for port in old_node_ports.values():
                if port not in kept:
                    self._node_ports.discard(port)
        else:
            spec.pop("externalTrafficPolicy", None)
            for p in spec["ports"]:
                p.pop("nodePort", None)
            self._node_ports.difference_update(old_node_ports.values())

    # -- the EndpointSlice controller -----------------------------------------------------
    def set_pods(self, name: str, pods: Sequence[Pod]) -> None:
        """The Service's selected pods are now ``pods`` (with their conditions)."""
        record = self.services[name]
        record.pods = list(pods)
        self._sync_slices(record)

    def add_pod(self, name: str, pod: Pod) -> None:
        record = self.services[name]
        self.set_pods(name, [*(p for p in record.pods if p.name != pod.name), pod])

    def delete_pod(self, name: str, pod_name: str, *, drains: bool = False) -> None:
        """A pod is deleted: its endpoint first turns terminating (not ready; serving only while
        it ``drains``, i.e. it keeps answering during its grace period), then disappears."""
        self.terminate_pod(name, pod_name, drains=drains)
        record = self.services[name]
        self.set_pods(name, [p for p in record.pods if p.name != pod_name])

    def terminate_pod(self, name: str, pod_name: str, *, drains: bool) -> None:
        record = self.services[name]
        self.set_pods(
            name,
            [
                replace(p, ready=False, serving=drains, terminating=True)
                if p.name == pod_name
                else p
                for p in record.pods
            ],
        )

    def _sync_slices(self, record: ServiceRecord) -> None:
        spec = record.obj["spec"]
        wanted: dict[str, Obj] = {}
        if spec.get("type") != "ExternalName":
            groups: dict[tuple[tuple[str, str, int], ...], list[Pod]] = {}
            for pod in record.pods:
                if not any(IPFamily.of(ip) == record.family for ip in pod.ips):
                    continue
                resolved = []
                for p in spec["ports"]:
                    target = pod.resolve(
                        Port(p["name"], p["port"], p["targetPort"], p.get("protocol", "TCP"))
                    )
                    if target is not None:
                        resolved.append((p["name"], p.get("protocol", "TCP"), target))
                groups.setdefault(tuple(resolved), []).append(pod)
            if not groups:
                groups[()] = []  # the controller's placeholder: a slice with no endpoints
            for index, (ports, pods) in enumerate(sorted(groups.items())):
                slice_name = f"{record.name}-{record.family.name.lower()}-{index}"
                wanted[slice_name] = self._slice(record, slice_name, ports, pods)
        for obj in wanted.values():
            self.api.apply("endpointslices", obj)
        for slice_name in sorted(record.slices - set(wanted)):
            self.api.delete("endpointslices", self.namespace, slice_name)
        record.slices = set(wanted)

    def _slice(
        self,
        record: ServiceRecord,
        slice_name: str,
        ports: tuple[tuple[str, str, int], ...],
        pods: list[Pod],
    ) -> Obj:
        labels = dict(record.obj["metadata"].get("labels") or {})
        labels.pop(HEADLESS_LABEL, None)  # the controller owns this one
        labels[SERVICE_NAME_LABEL] = record.name
        labels[MANAGED_BY_LABEL] = "endpointslice-controller.k8s.io"
        if record.obj["spec"].get("clusterIP") == "None":
            labels[HEADLESS_LABEL] = ""
        return {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": slice_name,
                "namespace": self.namespace,
                "labels": labels,
                "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": record.name}],
            },
            "addressType": record.family.name,
            "ports": [{"name": n, "protocol": proto, "port": num} for n, proto, num in ports],
            "endpoints": [
                {
                    "addresses": [str(ip) for ip in pod.ips if IPFamily.of(ip) == record.family],
                    "conditions": {
                        "ready": pod.ready,
                        "serving": pod.serving,
                        "terminating": pod.terminating,
                    },
                    "nodeName": pod.node,
                    "targetRef": {"kind": "Pod", "namespace": self.namespace, "name": pod.name},
                }
                for pod in sorted(pods, key=lambda p: p.name)
            ],
        }
