"""`ovsproxy verify` on every node of a 3-node lab: clean when converged (Services with
endpoints on every node), exit 1 on the node whose flow, route and steering-table element (its
own node IP, read from its devices) were deleted by hand (and only there), clean again once
that node's agent has repaired them."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator

import pytest

from ovsproxy.lab.cluster import Lab
from ovsproxy.lab.manifests import LabPort, LabService, addresses

from .conftest import start_lab
from .helpers import install

pytestmark = [pytest.mark.slow, pytest.mark.ovs]


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    # A drift check every 2 s and routes repaired every second, so repairs are quick.
    yield from start_lab(
        3, agent_args=("--full-resync-interval", "2", "--route-sync-interval", "1")
    )


def verify(lab: Lab, node: str) -> subprocess.CompletedProcess[str]:
    cmd = lab.agent_command(lab.nodes[node])
    cmd[cmd.index("run")] = "verify"
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_verify_on_every_node_of_the_lab(lab: Lab) -> None:
    svc = LabService(
        "spread",
        addresses("10.96.1.80", "fd00:10:96::1:50"),
        (LabPort("http", 80, 8080),),
        lab.endpoints("web-1", "web-2", "web-3"),
    )
    install(lab, svc)
    for name in lab.nodes:
        result = verify(lab, name)
        assert result.returncode == 0, (name, result.stdout, result.stderr)
        assert "converged: no difference" in result.stdout
    node = lab.nodes["node-2"]
    flows = node.sandbox.ofctl("dump-flows", "table=13")
    lb = next(f for f in flows.splitlines() if "nw_dst=10.96.1.80," in f)
    match = lb.split(" actions=")[0].split("priority=")[1]
    routes = node.exec("ip", "route", "show", "proto", "155").stdout
    prefix = next(line.split()[0] for line in routes.splitlines() if " via " in line)
    assert node.agent is not None
    node.agent.send_signal(signal.SIGSTOP)  # no repair races the check
    try:
        node.sandbox.ofctl("del-flows", "--strict", f"table=13,priority={match}")
        node.exec("ip", "route", "del", prefix, "proto", "155")
        element = "element inet ovsproxy nodeport-ips-v4 { 192.168.50.2 }"
        node.exec(*f"nft delete {element}".split())
        drift = verify(lab, "node-2")
        others = [verify(lab, n).returncode for n in ("node-1", "node-3")]
    finally:
        node.agent.send_signal(signal.SIGCONT)
    assert drift.returncode == 1, drift.stdout + drift.stderr
    assert "missing flow: " in drift.stdout and "nw_dst=10.96.1.80" in drift.stdout
    assert f"missing route: {prefix} via " in drift.stdout
    assert f"missing nftables element: {element}\n" in drift.stdout, drift.stdout
    assert others == [0, 0]
    deadline = time.monotonic() + 30
    while (again := verify(lab, "node-2")).returncode != 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert again.returncode == 0, again.stdout


def test_verify_clean_with_a_nodeport_service(lab: Lab) -> None:
    """The agents install NodePort frontends (the virtual NodePort IP and the node IPs with the
    nodePort): verify's desired state has them too, so a converged node is clean."""
    svc = LabService(
        "verify-np",
        addresses("10.96.1.90", "fd00:10:96::1:5a"),
        (LabPort("http", 80, 8080, node_port=30790), LabPort("dns", 53, 5353, "UDP", 30790)),
        lab.endpoints("web-1", "web-2", "web-3"),
        type="NodePort",
    )
    install(lab, svc)
    for name in lab.nodes:
        flows = lab.nodes[name].sandbox.ofctl("dump-flows", "table=13")
        assert "tp_dst=30790" in flows, (name, flows)
        result = verify(lab, name)
        assert result.returncode == 0, (name, result.stdout, result.stderr)
        assert "converged: no difference" in result.stdout
