"""Kubernetes' session affinity e2e tests (test/e2e/network/service.go: execAffinityTestFor
NonLBService[WithTransition], execAffinityTestForSessionAffinityTimeout, checkAffinity), ported
to the 3-node lab.

checkAffinity(shouldHold): upstream sends AffinityConfirmCount (15) requests, each a new
connection, from an exec pod, and polls until the last 15 answers come from one pod (affinity
holds) or not (it does not). Ours sends the 15 and asserts on them directly, from every client
at the same time; with three pods, 15 answers from one pod without affinity has a chance of
3^-14. The Service: three pods serving their hostname (StartServeHostnameService), created
before its pods.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from ovsproxy.lab.cluster import HTTP_PORT, Lab
from ovsproxy.model import IPFamily

from .kube import Cluster, Port, pod
from .probes import (
    Gaps,
    client_pod,
    clients,
    endpoints_of,
    http,
    in_parallel,
    node_ip,
    port_name,
    wait_node_port,
    wait_programmed,
)

pytestmark = [pytest.mark.slow, pytest.mark.ovs]

AFFINITY_CONFIRM_COUNT = 15  # upstream's AffinityConfirmCount
# Seconds; upstream's SessionAffinityTimeout is 125. Long enough that a request 0.3 of it after
# the last (the clients run in this process: no start-up) is well within it.
AFFINITY_TIMEOUT = 6
PODS = ("web-1", "web-2", "web-3")


class Target:
    """Where the clients send: the ClusterIP from every client, or a node's IP:nodePort from
    the other nodes' client pods and the external client (and, known gap aside, its own)."""

    def __init__(self, lab: Lab, ip: str, port: int, targets: list[tuple[str, str]]) -> None:
        self.lab, self.ip, self.port, self.targets = lab, ip, port, targets

    def answers(self, count: int = AFFINITY_CONFIRM_COUNT) -> dict[str, dict[str, int]]:
        results = in_parallel(
            self.targets, lambda ns: http(self.lab, ns, self.ip, self.port, count)
        )
        for label, out in results.items():
            assert out["failed"] == 0, (label, self.ip, self.port, out)
        return {label: out["counts"] for label, out in results.items()}

    def check_affinity(self, should_hold: bool) -> dict[str, str]:
        """Upstream's checkAffinity; returns, when it holds, the pod each client sticks to."""
        stuck = {}
        for label, counts in self.answers().items():
            if should_hold:
                assert len(counts) == 1, (label, "affinity should hold but did not", counts)
                stuck[label] = next(iter(counts))
            else:
                assert len(counts) > 1, (label, "affinity should not hold but did", counts)
        return stuck


def _affinity_service(
    lab: Lab, cp: Cluster, family: IPFamily, name: str, type: str, gaps: Gaps, **spec: Any
) -> Target:
    pods = [pod(lab, p) for p in PODS]
    cp.create_service(name, family, [Port("", 80, HTTP_PORT)], type=type, **spec)
    cp.set_pods(name, pods)
    wanted = endpoints_of(pods, family, HTTP_PORT)
    wait_programmed(lab, port_name(name, ""), wanted)
    if type == "NodePort":
        node_port = cp.node_port(name)
        wait_node_port(lab, port_name(name, ""), node_port)
        # Upstream: the first node's IP; its own pod only if the known gap allows.
        targets = [(f"node-{i} pod", client_pod(lab.nodes[f"node-{i}"])) for i in (2, 3)]
        targets.append(("external", lab.external_netns))
        own = http(
            lab, client_pod(lab.nodes["node-1"]), node_ip(lab, "node-1", family), node_port, 3
        )
        if own["failures"] == {"timeout": 3}:
            gaps.seen.append(("node-1 pod", "->", "node-1", own["failures"]))
        else:
            targets.append(("node-1 pod", client_pod(lab.nodes["node-1"])))
        target = Target(lab, node_ip(lab, "node-1", family), node_port, targets)
    else:
        target = Target(lab, cp.cluster_ip(name), 80, clients(lab))
    # Upstream's CheckServiceReachability before the affinity checks.
    for label, counts in target.answers(3).items():
        assert set(counts) <= set(PODS), (label, counts)
    return target


def _affinity_test(
    lab: Lab, cp: Cluster, family: IPFamily, type: str, gaps: Gaps, transition: bool
) -> None:
    name = f"affinity-{type.lower()}{'-transition' if transition else ''}"
    target = _affinity_service(lab, cp, family, name, type, gaps, sessionAffinity="ClientIP")
    first = target.check_affinity(True)
    assert target.check_affinity(True) == first  # and it is the same pod the next time
    if transition:
        cp.update_service(name, lambda svc: svc["spec"].update(sessionAffinity="None"))
        _wait_affinity(lab, name, 0)
        target.check_affinity(False)
        cp.update_service(name, lambda svc: svc["spec"].update(sessionAffinity="ClientIP"))
        _wait_affinity(lab, name, 10800)
        target.check_affinity(True)
    if type == "NodePort":
        gaps.finish()


def _wait_affinity(lab: Lab, name: str, seconds: int) -> None:
    full = port_name(name, "")
    lab.wait_status(
        lambda _n, st: any(
            s["name"] == full and s["session_affinity_s"] == seconds for s in st["services"]
        )
    )


def _affinity_timeout_test(lab: Lab, cp: Cluster, family: IPFamily, type: str, gaps: Gaps) -> None:
    name = f"affinity-{type.lower()}-timeout"
    target = _affinity_service(
        lab,
        cp,
        family,
        name,
        type,
        gaps,
        sessionAffinity="ClientIP",
        sessionAffinityConfig={"clientIP": {"timeoutSeconds": AFFINITY_TIMEOUT}},
    )
    stuck = target.check_affinity(True)
    # Beyond upstream: connections coming more often than the timeout keep the same pod.
    for _ in range(2):
        time.sleep(AFFINITY_TIMEOUT * 0.3)
        for label, counts in target.answers(1).items():
            assert set(counts) == {stuck[label]}, (label, "moved within the timeout", counts)
    # Upstream: after the timeout, a new connection may go elsewhere; within 10 tries (one
    # request, then a pause longer than the timeout) some client gets a different pod.
    seen: dict[str, set[str]] = {label: {pod} for label, pod in stuck.items()}
    for _ in range(10):
        time.sleep(AFFINITY_TIMEOUT + 2)
        for label, counts in target.answers(1).items():
            seen[label] |= set(counts)
        if all(len(pods) > 1 for pods in seen.values()):
            break
    assert all(len(pods) > 1 for pods in seen.values()), ("sticky after the timeout", seen)
    if type == "NodePort":
        gaps.finish()


def test_should_have_session_affinity_work_for_service_with_type_clusterIP(
    lab: Lab, cp: Cluster, gaps: Gaps, family: IPFamily
) -> None:
    """Upstream: "[sig-network] Services should have session affinity work for service with
    type clusterIP [LinuxOnly] [Conformance]".

    sessionAffinity ClientIP, three pods: consecutive requests (new connections) to the
    ClusterIP all reach the same pod.

    Beyond upstream: every node's client pod and node namespace at once, each sticking to its
    own pod, and to the same one in a second round."""
    _affinity_test(lab, cp, family, "ClusterIP", gaps, transition=False)


def test_should_be_able_to_switch_session_affinity_for_service_with_type_clusterIP(
    lab: Lab, cp: Cluster, gaps: Gaps, family: IPFamily
) -> None:
    """Upstream: "[sig-network] Services should be able to switch session affinity for service
    with type clusterIP [LinuxOnly] [Conformance]".

    ClientIP, then updated to None: requests spread over the pods; back to ClientIP: they
    stick again.

    Beyond upstream: from every client; each switch is waited for on every agent, then checked
    at once (no converging retries)."""
    _affinity_test(lab, cp, family, "ClusterIP", gaps, transition=True)


def test_should_have_session_affinity_timeout_work_for_service_with_type_clusterIP(
    lab: Lab, cp: Cluster, gaps: Gaps, family: IPFamily
) -> None:
    """Upstream: "[sig-network] Services should have session affinity timeout work for service
    with type clusterIP [LinuxOnly]".

    ClientIP with a timeout (upstream 125 s, here 6 s): requests stick until the timeout
    expires; after it, a later request reaches another pod (10 tries, each after a pause
    longer than the timeout).

    Beyond upstream: requests closer together than the timeout keep sticking (the timer
    restarts with each connection); every client must see the change, not just one."""
    _affinity_timeout_test(lab, cp, family, "ClusterIP", gaps)


def test_should_have_session_affinity_work_for_NodePort_service(
    lab: Lab, cp: Cluster, gaps: Gaps, family: IPFamily
) -> None:
    """Upstream: "[sig-network] Services should have session affinity work for NodePort
    service [LinuxOnly] [Conformance]".

    As for clusterIP, through the first node's IP:nodePort.

    Beyond upstream: from the other nodes' client pods and the external client at once."""
    _affinity_test(lab, cp, family, "NodePort", gaps, transition=False)


def test_should_be_able_to_switch_session_affinity_for_NodePort_service(
    lab: Lab, cp: Cluster, gaps: Gaps, family: IPFamily
) -> None:
    """Upstream: "[sig-network] Services should be able to switch session affinity for
    NodePort service [LinuxOnly] [Conformance]".

    As the clusterIP switch test, through the first node's IP:nodePort.

    Beyond upstream: as for clusterIP."""
    _affinity_test(lab, cp, family, "NodePort", gaps, transition=True)


def test_should_have_session_affinity_timeout_work_for_NodePort_service(
    lab: Lab, cp: Cluster, gaps: Gaps, family: IPFamily
) -> None:
    """Upstream: "[sig-network] Services should have session affinity timeout work for
    NodePort service [LinuxOnly]".

    As the clusterIP timeout test, through the first node's IP:nodePort.

    Beyond upstream: as for clusterIP."""
    _affinity_timeout_test(lab, cp, family, "NodePort", gaps)
