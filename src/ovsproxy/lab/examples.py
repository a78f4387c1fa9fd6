"""The example lab: pods in a sandbox that match the bundled example manifests.

`ovsproxy run` (embedded default) and `ovsproxy demo` build it, so the ClusterIPs in
``ovsproxy/examples`` answer real HTTP right away.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ovsproxy.ovs.sandbox import Pod, Sandbox

EXAMPLES = Path(__file__).parent.parent / "examples"


@dataclass(frozen=True)
class LabPod:
    name: str
    ipv4: str
    ipv6: str | None
    http_ports: tuple[int, ...]


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
