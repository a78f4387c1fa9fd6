"""Traffic and agent-state probes for the conformance tests.

Upstream's e2e tests poll reachability from an exec pod until a generous timeout. Ours first
wait until every agent *reports* the expected state (its /status: the Service port and the
endpoints it programs, per node), then send the traffic once and assert on every answer: a
test fails on a wrong answer, not only on a timeout. Clients are every node's client pod and
every node's own namespace (upstream: one exec pod, sometimes a host-network pod).
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable, Iterable
from typing import Any

from ovsproxy.lab.cluster import Lab, LabNode
from ovsproxy.ovs.traffic import run_in_netns

from .apiserver import NAMESPACE, Pod


def client_pod(node: LabNode) -> str:
    return node.pods[f"client-{node.index}"].netns


def clients(lab: Lab, *, nodes: bool = True) -> list[tuple[str, str]]:
    """(label, network namespace): every node's client pod and, with ``nodes``, the node."""
    found = []
    for node in lab.nodes.values():
        found.append((f"{node.name} pod", client_pod(node)))
        if nodes:
            found.append((f"{node.name} node", node.netns))
    return found


def url(ip: str, port: int) -> str:
    return f"http://[{ip}]:{port}/" if ":" in ip else f"http://{ip}:{port}/"


def http(netns: str, ip: str, port: int, count: int, timeout: float = 2) -> dict[str, Any]:
    """``count`` requests, each on a new connection: answers per pod, failures by kind."""
    return run_in_netns(
        netns, "http", url(ip, port), "--count", str(count), "--timeout", str(timeout)
    )


def udp(
    netns: str,
    ip: str,
    port: int,
    count: int,
    timeout: float = 1,
    *,
    new_socket: bool = True,
    source_port: int = 0,
) -> dict[str, Any]:
    args = ["udp", ip, str(port), "--count", str(count), "--timeout", str(timeout)]
    if new_socket:
        args.append("--new-socket")
    if source_port:
        args += ["--source-port", str(source_port)]
    return run_in_netns(netns, *args)


def port_name(service: str, port: str, protocol: str = "TCP") -> str:
    """A Service port as the agents' /status names it."""
    return (
        f"{NAMESPACE}/{service}:{port}/{protocol}" if port else f"{NAMESPACE}/{service}/{protocol}"
    )


def endpoint_text(ip: Any, port: int) -> str:
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def endpoints_of(pods: Iterable[Pod], family: int, port: int) -> set[str]:
    return {endpoint_text(ip, port) for p in pods for ip in p.ips if ip.version == family}


def wait_programmed(
    lab: Lab,
    name: str,
    expected: set[str] | Callable[[str], set[str]],
    timeout: float = 30,
) -> None:
    """Until every agent programs exactly ``expected`` (``IP:port``; or a function of the node
    name) for the Service port ``name`` (``port_name``), and has the port at all."""

    def holds(node: str, status: dict[str, Any]) -> bool:
        want = expected(node) if callable(expected) else expected
        for service in status.get("services", []):
            if service["name"] == name:
                return set(service["endpoints"]) == want
        return False

    lab.wait_status(holds, timeout)


def wait_absent(lab: Lab, service: str, timeout: float = 30) -> None:
    """Until no agent has any port of ``service``."""
    prefix = f"{NAMESPACE}/{service}"

    def holds(node: str, status: dict[str, Any]) -> bool:
        return not any(
            s["name"].startswith((prefix + ":", prefix + "/")) for s in status["services"]
        )

    lab.wait_status(holds, timeout)


def dump(lab: Lab, node: str) -> str:
    """The node agent's /dump: our flows and groups in ovs-ofctl syntax."""
    address = lab.nodes[node].metrics_address
    with urllib.request.urlopen(f"http://{address}/dump", timeout=10) as resp:
        text: str = resp.read().decode()
    return text


def assert_not_programmed(lab: Lab, ip: str) -> None:
    """No flow of any agent matches the address (a stale ServiceLB flow would)."""
    for node in lab.nodes:
        text = dump(lab, node)
        assert f"={ip}," not in text and f"={ip} " not in text, (node, ip, text[:2000])


def assert_reaches(
    lab: Lab,
    ip: str,
    port: int,
    pods: set[str],
    *,
    count: int = 30,
    nodes: bool = True,
    served_port: int | None = None,
) -> None:
    """From every client: ``count`` new connections, none failing, answered by exactly
    ``pods`` (and, when given, on the pods' port ``served_port``)."""
    for label, netns in clients(lab, nodes=nodes):
        out = http(netns, ip, port, count)
        assert out["failed"] == 0, (label, ip, port, out["failures"], out)
        assert set(out["counts"]) == pods, (label, ip, port, out["counts"])
        if served_port is not None:
            assert set(out["ports"]) == {str(served_port)}, (label, out["ports"])


def assert_udp_reaches(
    lab: Lab, ip: str, port: int, pods: set[str], *, count: int = 20, nodes: bool = True
) -> None:
    for label, netns in clients(lab, nodes=nodes):
        out = udp(netns, ip, port, count)
        assert out["failed"] == 0, (label, ip, port, out["failures"], out)
        assert set(out["counts"]) <= pods and out["counts"], (label, out["counts"])


def assert_refused(lab: Lab, ip: str, port: int, *, count: int = 3, nodes: bool = True) -> None:
    """Every connection is actively refused (a TCP RST from the proxy, not a timeout)."""
    for label, netns in clients(lab, nodes=nodes):
        out = http(netns, ip, port, count, timeout=3)
        assert out["failures"] == {"refused": count}, (label, ip, port, out)


def assert_unreachable(
    lab: Lab, ip: str, port: int, *, protocol: str = "TCP", count: int = 2, nodes: bool = True
) -> None:
    """No answer at all (refused, reset, timed out or unreachable: as upstream, any failure)."""
    for label, netns in clients(lab, nodes=nodes):
        if protocol == "UDP":
            out = udp(netns, ip, port, count, timeout=1)
        else:
            out = http(netns, ip, port, count, timeout=1)
        assert out["failed"] == count and not out["counts"], (label, ip, port, protocol, out)


def eventually(check: Callable[[], None], timeout: float = 20, interval: float = 0.5) -> None:
    """Retry ``check`` (which asserts) until it passes; for what /status cannot show."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            check()
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(interval)
