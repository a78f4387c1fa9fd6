"""The conformance tests' vocabulary over the real control plane (``Lab(kube=True)``).

Upstream's e2e tests say "create a NodePort Service", "pod2 starts", "pod1 is deleted". Here
each is a request to the lab's kube-apiserver, and nothing of the control plane's part is
imitated: the API server allocates ClusterIPs and nodePorts, applies defaults and type
changes; kube-controller-manager's EndpointSlice controller makes the slices from the
Services' selectors and the Pods; the lab plays the kubelet (``lab.kubelet``).

Pods: the lab's network pods (``web-N``, ``echo-N``...) run for the whole package; a test
"starts" one by creating its Pod object in the test namespace, bound to the pod's node, with
its addresses, Ready, the labels that the test's Services select and the container ports the
test gives it (named ports where upstream names them), and "deletes" it as a cluster does:
graceful delete (``deletionTimestamp``: the controller marks the endpoint terminating), then
the kubelet's final delete. The network pod keeps running: a proxy that still sent traffic to
a deleted pod would get answers, so the tests would see it. Each Service selects the label
``<service name>: "true"``; a pod of two Services of one test carries both labels.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ovsproxy.lab.cluster import Lab
from ovsproxy.lab.controlplane import ApiError, ControlPlane
from ovsproxy.lab.kubelet import ContainerPort, Kubelet, PodSpec
from ovsproxy.model import IPAddress, IPFamily

Obj = dict[str, Any]

NAMESPACE = "conformance"
HEADLESS_LABEL = "service.kubernetes.io/headless"
PROXY_NAME_LABEL = "service.kubernetes.io/service-proxy-name"


@dataclass(frozen=True)
class Port:
    """A Service port; ``target`` is a number or a container port name (resolved per pod by
    the EndpointSlice controller)."""

    name: str
    port: int
    target: int | str
    protocol: str = "TCP"
    node_port: int | None = None  # asked for explicitly (else the API server allocates one)

    def as_dict(self) -> Obj:
        out: Obj = {
            "name": self.name,
            "port": self.port,
            "targetPort": self.target,
            "protocol": self.protocol,
        }
        if self.node_port is not None:
            out["nodePort"] = self.node_port
        return out


@dataclass(frozen=True)
class Pod:
    """One of the lab's network pods as a test uses it: its addresses, node and the named
    container ports its Pod object declares, as (name, protocol, number)."""

    name: str
    ips: tuple[IPAddress, ...]
    node: str
    named_ports: tuple[tuple[str, str, int], ...] = ()


def pod(lab: Lab, name: str, *named_ports: tuple[str, str, int]) -> Pod:
    """Lab pod ``name`` (on its node), with named container ports."""
    return Pod(name, tuple(lab.pod(name).ips), lab.node_of(name).name, tuple(named_ports))


def selector(service: str) -> dict[str, str]:
    return {service: "true"}


class Cluster:
    """One test's Services and Pods in the real API; ``cleanup()`` deletes what it made."""

    def __init__(self, lab: Lab, namespace: str = NAMESPACE) -> None:
        assert lab.control_plane is not None and lab.kubelet is not None, "needs Lab(kube=True)"
        self.lab = lab
        self.api: ControlPlane = lab.control_plane
        self.kubelet: Kubelet = lab.kubelet
        self.namespace = namespace
        self.services: set[str] = set()
        self.pods: dict[str, tuple[Pod, set[str]]] = {}  # running Pod objects: their Services

    # -- Services --------------------------------------------------------------------------
    def _path(self, kind: str, name: str = "") -> str:
        return f"/api/v1/namespaces/{self.namespace}/{kind}" + (f"/{name}" if name else "")

    def create_service(
        self,
        name: str,
        family: IPFamily,
        ports: Sequence[Port] = (),
        *,
        type: str = "ClusterIP",
        labels: dict[str, str] | None = None,
        pods: Sequence[Pod] = (),
        with_selector: bool = True,
        **spec: Any,
    ) -> Obj:
        """Create the Service (single-stack of ``family``, selecting its own label), then start
        ``pods`` as its pods; returns the Service as the API server stored it."""
        body: Obj = {"type": type, "ports": [p.as_dict() for p in ports], **spec}
        if with_selector:
            body["selector"] = selector(name)
        if type != "ExternalName":
            body.setdefault("ipFamilyPolicy", "SingleStack")
            body.setdefault("ipFamilies", [family.name])
        obj = self.api.request(
            "POST",
            self._path("services"),
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": name, "labels": dict(labels or {})},
                "spec": body,
            },
        )
        self.services.add(name)
        for pod in pods:
            self.add_pod(name, pod)
        return obj

    def service(self, name: str) -> Obj:
        return self.api.request("GET", self._path("services", name))

    def update_service(self, name: str, mutate: Callable[[Obj], None]) -> Obj:
        """Get, mutate, update (as the e2e jig's UpdateService, retried on a conflict)."""
        for _ in range(10):
            obj = self.service(name)
            mutate(obj)
            try:
                return self.api.request("PUT", self._path("services", name), obj)
            except ApiError as err:
                if err.status != 409:
                    raise
        raise AssertionError(f"service {name}: update conflicted 10 times")

    def delete_service(self, name: str) -> None:
        self.api.request("DELETE", self._path("services", name), ok=(200, 202, 404))
        self.services.discard(name)

    def cluster_ip(self, name: str) -> str:
        return str(self.service(name)["spec"]["clusterIP"])

    def node_port(self, name: str, index: int = 0) -> int:
        return int(self.service(name)["spec"]["ports"][index]["nodePort"])

    # -- Pods ------------------------------------------------------------------------------
    def _spec(self, pod: Pod, services: set[str]) -> PodSpec:
        labels: dict[str, str] = {}
        for service in sorted(services):
            labels |= selector(service)
        return PodSpec(
            name=pod.name,
            namespace=self.namespace,
            node=pod.node,
            ips=tuple(str(ip) for ip in pod.ips),
            labels=labels,
            ports=tuple(ContainerPort(n, proto, name) for name, proto, n in pod.named_ports),
        )

    def add_pod(self, service: str, pod: Pod) -> None:
        """``pod`` starts as a pod of ``service``: its Pod object is created (bound, Running,
        Ready); a pod another Service of the test already runs gets that Service's label."""
        if pod.name in self.pods:
            running, services = self.pods[pod.name]
            assert running == pod, f"{pod.name} already runs with other ports: {running}"
            services.add(service)
            self.api.request(
                "PATCH",
                self._path("pods", pod.name),
                {"metadata": {"labels": selector(service)}},
                content_type="application/merge-patch+json",
            )
            return
        self.pods[pod.name] = (pod, {service})
        self.kubelet.run_pod(self._spec(pod, {service}))

    def set_pods(self, service: str, pods: Sequence[Pod]) -> None:
        """``service``'s pods are now ``pods``: the others are deleted, the new ones start."""
        wanted = {p.name for p in pods}
        for name, (_, services) in list(self.pods.items()):
            if service in services and name not in wanted:
                self.delete_pod(name)
        for pod in pods:
            self.add_pod(service, pod)

    def terminate_pod(self, pod_name: str, *, drains: bool = False) -> None:
        """The Pod is deleted gracefully: it stays, with a deletionTimestamp (its endpoint
        terminating: serving while it ``drains``, i.e. answers during its grace period)."""
        pod, services = self.pods[pod_name]
        self.kubelet.terminate_pod(self._spec(pod, services), drains=drains)

    def delete_pod(self, pod_name: str, *, drains: bool = False) -> None:
        """The pod is deleted: terminating first, then gone (the kubelet's final delete)."""
        self.terminate_pod(pod_name, drains=drains)
        self.remove_pod(pod_name)

    def remove_pod(self, pod_name: str) -> None:
        self.pods.pop(pod_name)
        self.kubelet.remove_pod(self.namespace, pod_name)

    # -- the end of a test -----------------------------------------------------------------
    def cleanup(self, timeout: float = 30) -> None:
        """Delete the test's Services and Pods, then wait until no agent has a
        Service of the namespace left (the next test may reuse a Service's name)."""
        for name in sorted(self.services):
            self.delete_service(name)
        for name in sorted(self.pods):
            self.remove_pod(name)
        prefix = f"{self.namespace}/"
        self.lab.wait_status(
            lambda _n, st: not any(s["name"].startswith(prefix) for s in st["services"]),
            timeout,
        )
