"""Probing a lab's Services from its pods and node namespaces.

Traffic goes through ``ovsproxy.lab.evidence.probe``: a failed request's result carries its
``evidence`` (conntrack of its 5-tuple in every switch and node kernel, counter deltas, drop
flows, the agents' state), printed beside the failed assertion. A call with a timeout shorter
than one TCP retransmission (``TCP_TIMEOUT_S``) expects no answer or measures timing: its
failures are the test's subject and are not explained.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ovsproxy.lab.cluster import Lab, LabNode
from ovsproxy.lab.evidence import RigNode, lab_rig, probe
from ovsproxy.lab.manifests import LabEndpoint, LabService, endpoint_texts, write_service
from ovsproxy.ovs.traffic import TCP_TIMEOUT_S


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


def rig(lab: Lab | Sequence[RigNode]) -> Sequence[RigNode]:
    return lab_rig(lab) if isinstance(lab, Lab) else lab


def http(
    lab: Lab | Sequence[RigNode],
    netns: str,
    ip: str,
    count: int,
    port: int = 80,
    timeout: float = TCP_TIMEOUT_S,
) -> dict[str, Any]:
    return probe(
        rig(lab),
        netns,
        "http",
        url(ip, port),
        "--count",
        str(count),
        "--timeout",
        str(timeout),
        explain=timeout >= TCP_TIMEOUT_S,
    )


def udp(
    lab: Lab | Sequence[RigNode],
    netns: str,
    ip: str,
    count: int,
    port: int = 53,
    timeout: float = 1,
) -> dict[str, Any]:
    return probe(
        rig(lab),
        netns,
        "udp",
        ip,
        str(port),
        "--count",
        str(count),
        "--new-socket",
        "--timeout",
        str(timeout),
        explain=timeout >= 1,
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
