"""Probing a lab's Services from its pods and node namespaces."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ovsproxy.lab.cluster import Lab, LabNode
from ovsproxy.lab.manifests import LabEndpoint, LabService, endpoint_texts, write_service
from ovsproxy.ovs.traffic import run_in_netns


def client_pod(node: LabNode) -> str:
    return node.pods[f"client-{node.index}"].netns


def clients(lab: Lab) -> list[tuple[str, str]]:
    """(label, network namespace): every node's client pod and the node itself."""
    found = []
    for node in lab.nodes.values():
        found.append((f"{node.name} pod", client_pod(node)))
        found.append((f"{node.name} node", node.netns))
    return found


def url(ip: str, port: int = 80) -> str:
    return f"http://[{ip}]:{port}/" if ":" in ip else f"http://{ip}:{port}/"


def http(netns: str, ip: str, count: int, port: int = 80, timeout: float = 2) -> dict[str, Any]:
    return run_in_netns(
        netns, "http", url(ip, port), "--count", str(count), "--timeout", str(timeout)
    )


def udp(netns: str, ip: str, count: int, port: int = 53, timeout: float = 1) -> dict[str, Any]:
    return run_in_netns(
        netns,
        "udp",
        ip,
        str(port),
        "--count",
        str(count),
        "--new-socket",
        "--timeout",
        str(timeout),
    )


def install(
    lab: Lab,
    service: LabService,
    selected: Callable[[str], Sequence[LabEndpoint]] | None = None,
    timeout: float = 20,
) -> None:
    """Write the Service and wait until every agent programs the endpoints ``selected(node)``
    picks for it (default: all of the Service's endpoints)."""
    write_service(lab.manifests, service)
    for port in service.ports:
        name = f"{service.namespace}/{service.name}:{port.name}/{port.protocol}"

        def want(node: str, target: int = port.target_port) -> set[str]:
            chosen = selected(node) if selected is not None else service.endpoints
            return endpoint_texts(chosen, target)

        lab.wait_endpoints(name, want, timeout)
