"""The example lab: pods in a sandbox that match the bundled example manifests.

`ovsproxy run` (embedded default) and `ovsproxy demo` build it, so the ClusterIPs in
``ovsproxy/examples`` answer real HTTP right away. `ovsproxy run --kube` serves the same
objects from a real control plane (``example_control_plane``).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ovsproxy.ovs.sandbox import Pod, Sandbox

if TYPE_CHECKING:  # imported when used: the agent imports this module for EXAMPLES
    from ovsproxy.lab.controlplane import ControlPlane

EXAMPLES = Path(__file__).parent.parent / "examples"


@dataclass(frozen=True)
class LabPod:
    name: str
    ipv4: str
    ipv6: str | None
    http_ports: tuple[int, ...]

    @property
    def ips(self) -> tuple[str, ...]:
        return (self.ipv4,) if self.ipv6 is None else (self.ipv4, self.ipv6)


LAB_PODS = (
    LabPod("web-1", "10.244.0.11/24", "fd00:10:244::11/64", (8080, 9100)),
    LabPod("web-2", "10.244.0.12/24", "fd00:10:244::12/64", (8080,)),
    LabPod("api-1", "10.244.0.13/24", "fd00:10:244::13/64", (8080, 9100)),
    LabPod("api-2", "10.244.0.14/24", "fd00:10:244::14/64", (8080,)),
    LabPod("client", "10.244.0.100/24", "fd00:10:244::100/64", ()),
)


def build_lab(sandbox: Sandbox, namespace: str = "demo") -> dict[str, Pod]:
    return {
        spec.name: sandbox.add_pod(
            spec.name,
            ipv4=spec.ipv4,
            ipv6=spec.ipv6,
            namespace=namespace,
            http_ports=spec.http_ports,
        )
        for spec in LAB_PODS
    }


@contextlib.contextmanager
def example_control_plane(node_name: str) -> Iterator[ControlPlane]:
    """A control plane of the pinned release (``lab.controlplane``) holding the bundled
    examples, applied with kubectl into namespace ``demo`` (their fixed ClusterIPs lie in its
    default Service CIDRs), with the shipped RBAC applied and the sandbox's node registered as
    ``node_name`` (its pod CIDRs, Ready: no kubelet runs); removed, processes and files, on
    leaving. The agent's kubeconfig (the ovsproxy ServiceAccount's token) is
    ``agent_kubeconfig(api)``; a person's (the admin, namespace ``demo``) is
    ``user_kubeconfig(api)``."""
    from ovsproxy.lab.controlplane import ControlPlane
    from ovsproxy.lab.kubelet import Kubelet

    api = ControlPlane(f"ovsp-cp-run-{os.getpid()}")
    try:
        api.start()
        pod_cidrs = sorted(
            {str(ipaddress.ip_interface(a).network) for p in LAB_PODS for a in p.ips}
        )
        Kubelet(api).register_node(node_name, addresses=(), pod_cidrs=pod_cidrs)
        api.create_namespace("demo")
        api.kubectl("apply", "-f", str(EXAMPLES))
        api.ovsproxy_kubeconfig(agent_kubeconfig(api), seconds=7 * 86400)
        api.kubeconfig(user_kubeconfig(api), api.admin, namespace="demo")
        yield api
    finally:
        api.stop()


def agent_kubeconfig(api: ControlPlane) -> Path:
    return api.workdir / "agent.kubeconfig"


def user_kubeconfig(api: ControlPlane) -> Path:
    return api.workdir / "kubeconfig"
