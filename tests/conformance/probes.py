"""Traffic and agent-state probes for the conformance tests.

Upstream's e2e tests poll reachability from an exec pod until a generous timeout. Ours first
wait until every agent *reports* the expected state (its /status: the Service port and the
endpoints it programs, per node), then send the traffic once and assert on every answer: a
test fails on a wrong answer, not only on a timeout. Clients are every node's client pod and
every node's own namespace (upstream: one exec pod, sometimes a host-network pod).
"""

from __future__ import annotations

import concurrent.futures
import functools
import time
import urllib.request
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from ovsproxy.lab import evidence
from ovsproxy.lab.cluster import Lab, LabNode
from ovsproxy.model import IPFamily
from ovsproxy.ovs.traffic import TCP_TIMEOUT_S

from .kube import NAMESPACE, Pod


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


def in_parallel(
    targets: list[tuple[str, str]], probe: Callable[[str], dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """``probe(netns)`` for every (label, namespace) at once, by label in the targets' order.
    Each probe is a traffic process of its own: a client waiting out its timeouts does not
    hold up the next one."""
    with concurrent.futures.ThreadPoolExecutor(len(targets)) as pool:
        futures = {label: pool.submit(probe, netns) for label, netns in targets}
        return {label: future.result() for label, future in futures.items()}


def url(ip: str, port: int) -> str:
    return f"http://[{ip}]:{port}/" if ":" in ip else f"http://{ip}:{port}/"


def http(
    lab: Lab,
    netns: str,
    ip: str,
    port: int,
    count: int,
    timeout: float = TCP_TIMEOUT_S,
    *,
    explain: bool | None = None,
) -> dict[str, Any]:
    """``count`` requests, each on a new connection: answers per pod, failures by kind; lost
    ones with their ``evidence`` (``ovsproxy.lab.evidence``) unless ``explain`` is False or,
    by default, the timeout is shorter than one retransmission (then no answer is what the
    caller expects, or it measures timing)."""
    args = ("http", url(ip, port), "--count", str(count), "--timeout", str(timeout))
    explain = timeout >= TCP_TIMEOUT_S if explain is None else explain
    return evidence.probe(evidence.lab_rig(lab), netns, *args, explain=explain)


def udp(
    lab: Lab,
    netns: str,
    ip: str,
    port: int,
    count: int,
    timeout: float = 1,
    *,
    new_socket: bool = True,
    source_port: int = 0,
    explain: bool | None = None,
) -> dict[str, Any]:
    """``count`` datagrams; lost ones explained unless ``explain`` is False or, by default, the
    timeout is under 1 s (no answer expected)."""
    args = ["udp", ip, str(port), "--count", str(count), "--timeout", str(timeout)]
    if new_socket:
        args.append("--new-socket")
    if source_port:
        args += ["--source-port", str(source_port)]
    explain = timeout >= 1 if explain is None else explain
    return evidence.probe(evidence.lab_rig(lab), netns, *args, explain=explain)


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


def assert_not_programmed(lab: Lab, ip: str, timeout: float = 10) -> None:
    """No flow of any agent matches the address (a stale ServiceLB flow would), within
    ``timeout`` (/status drops a Service when the proxier does, the flows go with the commit
    that follows)."""

    def check() -> None:
        for node in lab.nodes:
            stale = [
                line
                for line in dump(lab, node).splitlines()
                if f"={ip}," in line or f"={ip} " in line or line.endswith(f"={ip}")
            ]
            assert not stale, (node, ip, stale)

    eventually(check, timeout)


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
        out = http(lab, netns, ip, port, count)
        if out["failed"]:  # out["evidence"]: where the lost requests went
            raise AssertionError((label, ip, port, out["failures"], out))
        assert set(out["counts"]) == pods, (label, ip, port, out["counts"])
        if served_port is not None:
            assert set(out["ports"]) == {str(served_port)}, (label, out["ports"])


def assert_udp_reaches(
    lab: Lab, ip: str, port: int, pods: set[str], *, count: int = 20, nodes: bool = True
) -> None:
    for label, netns in clients(lab, nodes=nodes):
        out = udp(lab, netns, ip, port, count)
        assert out["failed"] == 0, (label, ip, port, out["failures"], out)
        assert set(out["counts"]) <= pods and out["counts"], (label, out["counts"])


def assert_refused(lab: Lab, ip: str, port: int, *, count: int = 3, nodes: bool = True) -> None:
    """Every connection is actively refused (a TCP RST from the proxy, not a timeout)."""
    probe = functools.partial(http, lab, ip=ip, port=port, count=count, timeout=3)
    for label, out in in_parallel(clients(lab, nodes=nodes), probe).items():
        assert out["failures"] == {"refused": count}, (label, ip, port, out)


def assert_unreachable(
    lab: Lab, ip: str, port: int, *, protocol: str = "TCP", count: int = 2, nodes: bool = True
) -> None:
    """No answer at all (refused, reset, timed out or unreachable: as upstream, any failure)."""
    send = udp if protocol == "UDP" else http
    probe = functools.partial(send, lab, ip=ip, port=port, count=count, timeout=1, explain=False)
    for label, out in in_parallel(clients(lab, nodes=nodes), probe).items():
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


def node_ip(lab: Lab, node: str, family: IPFamily) -> str:
    return next(str(ip) for ip in lab.nodes[node].node_ips if ip.version == family)


def wait_node_port(lab: Lab, name: str, node_port: int, timeout: float = 30) -> None:
    """Until every agent has the Service port with ``node_port`` (its /status)."""

    def holds(_node: str, status: dict) -> bool:
        return any(
            s["name"] == name and s.get("node_port") == node_port for s in status["services"]
        )

    lab.wait_status(holds, timeout)


# A known gap of the NodePort wiring this suite was written against (h-nodeport-wire): a pod
# connecting to its *own* node's IP:nodePort times out (the node DNATs it to the virtual
# NodePort IP and routes it back into OVS through gw0, source still the pod's address, where it
# is dropped as a local pod's address arriving from elsewhere, or its reply bypasses the node's
# un-DNAT). Upstream's checkNodePortServiceReachability does try every node from its exec pod.
# Every NodePort test still checks all of it: other failures fail the test; this one alone
# makes it xfail; when it is gone while this is True, the test fails so the flag gets cleared.
POD_TO_OWN_NODE_GAP = False
GAP_REASON = "NodePort from a pod to its own node's IP times out (NodePort wiring, known gap)"


class Gaps:
    """The known-gap failures a test saw; ``finish()`` decides the test's outcome by them."""

    def __init__(self) -> None:
        self.seen: list[tuple[object, ...]] = []

    def finish(self) -> None:
        if self.seen and POD_TO_OWN_NODE_GAP:
            pytest.xfail(f"{GAP_REASON}: {self.seen[:3]}")
        if not self.seen and POD_TO_OWN_NODE_GAP:
            pytest.fail("pod -> own node's nodePort works now: set POD_TO_OWN_NODE_GAP = False")
        assert not self.seen, self.seen
