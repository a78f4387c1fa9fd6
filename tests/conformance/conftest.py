"""One 3-node lab with a real control plane for the whole conformance package.

The lab (tests/lab's multi-node cluster: each node its own OVS and agent process) is started
once with ``kube=True``: etcd, kube-apiserver and kube-controller-manager on loopback, every
node a Node object, the agents reading the API server with the shipped RBAC's ServiceAccount
token. Pods: every node N runs ``web-N`` (HTTP 8080, UDP 5353) and ``client-N`` (the lab's
defaults) and ``echo-N`` (HTTP on 80, 100 and 101, UDP on 80: the ports upstream's tests
give their pods); node-2 also runs ``echo-2b``; each has its Pod object in the ``lab``
namespace. Each test works in the ``conformance`` namespace through a ``Cluster``
(``kube.py``): its own Services (the API server's ClusterIPs and nodePorts), the Pod objects
of the pods it uses (the EndpointSlice controller makes their slices), all deleted when it
ends.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from ovsproxy.lab.cluster import HTTP_PORT, UDP_PORT, Lab, list_lab_records
from ovsproxy.model import IPFamily

from .kube import NAMESPACE, Cluster
from .probes import Gaps

ECHO_HTTP_PORTS = (80, 100, 101)
ECHO_UDP_PORTS = (80,)
FAMILIES = [pytest.param(IPFamily.IPv4, id="IPv4"), pytest.param(IPFamily.IPv6, id="IPv6")]


@pytest.fixture(scope="package")
def lab() -> Iterator[Lab]:
    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    with Lab(3, kube=True) as cluster:
        assert cluster.control_plane is not None
        cluster.control_plane.create_namespace(NAMESPACE)
        for node, pod_name in (
            ("node-1", "echo-1"),
            ("node-2", "echo-2"),
            ("node-3", "echo-3"),
            ("node-2", "echo-2b"),
        ):
            cluster.add_pod(node, pod_name, http_ports=ECHO_HTTP_PORTS, udp_ports=ECHO_UDP_PORTS)
        print(f"\nconformance lab {cluster.name}: up in {cluster.started_in:.2f} s")
        yield cluster
    mine = [r.name for r in list_lab_records() if r.owner_pid == os.getpid()]
    assert not mine, f"leftover labs {mine}"


@pytest.fixture
def cp(lab: Lab) -> Iterator[Cluster]:
    """One test's objects in the real API; deleted afterwards (and gone from every agent)."""
    cluster = Cluster(lab)
    try:
        yield cluster
    finally:
        cluster.cleanup()


@pytest.fixture
def gaps() -> Gaps:
    """The known NodePort gap's failures of one test (see probes.POD_TO_OWN_NODE_GAP)."""
    return Gaps()


@pytest.fixture(params=[p.values[0] for p in FAMILIES], ids=["IPv4", "IPv6"])
def family(request: pytest.FixtureRequest) -> IPFamily:
    value: IPFamily = request.param
    return value


__all__ = ["FAMILIES", "HTTP_PORT", "UDP_PORT"]
