"""One 3-node lab for the whole conformance package, its agents reading the fake API server.

The lab (tests/lab's multi-node cluster: each node its own OVS and agent process) is started
once: its agents get ``--kubeconfig`` pointing at a fake API server that runs in a thread of
the test process; ``ControlPlane`` writes Services and EndpointSlices there as the control
plane would. Pods: every node N runs ``web-N`` (HTTP 8080, UDP 5353) and ``client-N`` (the
lab's defaults) and ``echo-N`` (HTTP on 80, 100 and 101, UDP on 80: the ports upstream's tests
give their pods); node-2 also runs ``echo-2b``. Each test creates its own Services (their own
ClusterIPs and nodePorts) and deletes them when it ends.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.apiserver import ControlPlane, FakeApiThread, Pod

from ovsproxy.lab.cluster import HTTP_PORT, UDP_PORT, Lab, list_lab_records
from ovsproxy.model import IPFamily

from .probes import Gaps

ECHO_HTTP_PORTS = (80, 100, 101)
ECHO_UDP_PORTS = (80,)
FAMILIES = [pytest.param(IPFamily.IPv4, id="IPv4"), pytest.param(IPFamily.IPv6, id="IPv6")]


@pytest.fixture(scope="package")
def api() -> Iterator[FakeApiThread]:
    server = FakeApiThread()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _add_echo_pod(lab: Lab, node_name: str, pod_name: str) -> None:
    """A pod with the next free address of the node's pod CIDRs (as ``Lab.add_pod``), serving
    the ports upstream's test pods listen on."""
    node = lab.nodes[node_name]
    v4, v6 = node.pod_cidrs
    used = {int(p.ipv4.ip) for p in node.pods.values() if p.ipv4 is not None}
    host = next(h for h in range(10, 250) if int(v4[h]) not in used)
    node.sandbox.add_pod(
        pod_name,
        ipv4=f"{v4[host]}/{v4.prefixlen}",
        ipv6=f"{v6[host]}/{v6.prefixlen}",
        namespace="conformance",
        http_ports=ECHO_HTTP_PORTS,
        udp_ports=ECHO_UDP_PORTS,
    )


@pytest.fixture(scope="package")
def lab(api: FakeApiThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    kubeconfig = api.kubeconfig(Path(tmp_path_factory.mktemp("api")) / "kubeconfig")
    with Lab(3, source_args=("--kubeconfig", str(kubeconfig))) as cluster:
        for index in (1, 2, 3):
            _add_echo_pod(cluster, f"node-{index}", f"echo-{index}")
        _add_echo_pod(cluster, "node-2", "echo-2b")
        print(f"\nconformance lab {cluster.name}: up in {cluster.started_in:.2f} s")
        yield cluster
    mine = [r.name for r in list_lab_records() if r.owner_pid == os.getpid()]
    assert not mine, f"leftover labs {mine}"


@pytest.fixture
def cp(api: FakeApiThread, lab: Lab) -> Iterator[ControlPlane]:
    """The control plane for one test; the Services it created are deleted afterwards."""
    _BLOCKS[0] += 1
    plane = ControlPlane(api, block=_BLOCKS[0])
    yield plane
    for name in list(plane.services):
        plane.delete_service(name)


_BLOCKS = [0]  # the last ControlPlane block handed out


@pytest.fixture
def gaps() -> Gaps:
    """The known NodePort gap's failures of one test (see probes.POD_TO_OWN_NODE_GAP)."""
    return Gaps()


def pod(lab: Lab, name: str, *named_ports: tuple[str, str, int]) -> Pod:
    """Lab pod ``name`` as an endpoint (on its node), with named container ports."""
    return Pod(name, tuple(lab.pod(name).ips), lab.node_of(name).name, tuple(named_ports))


@pytest.fixture(params=[p.values[0] for p in FAMILIES], ids=["IPv4", "IPv6"])
def family(request: pytest.FixtureRequest) -> IPFamily:
    value: IPFamily = request.param
    return value


__all__ = ["FAMILIES", "HTTP_PORT", "UDP_PORT", "pod"]
