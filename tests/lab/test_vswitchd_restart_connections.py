"""Issue 27: established Service connections survive a kill -9 and restart of ovs-vswitchd.

Two nodes; a client pod on node-1 keeps long-lived TCP connections of three kinds (the client
pushes, the server pushes, both) to two ClusterIP Services, one with its endpoint on node-1
(local) and one on node-2 (remote), over IPv4 and IPv6: twelve connections, 50 ms records
(``ovsproxy.ovs.streams``). Then:

1. both nodes' ovs-vswitchd are killed (-9) and restarted at once, the agents running;
2. node-1's agent is killed (-9), its ovs-vswitchd killed and restarted, and the agent started
   again 3 s later.

Every connection must see no reset and lose no byte (every record arrives, in order), and each
direction's first record after the switch is back is reported (the gap). Phase 1's goal is
that the connections move at the first retransmission after the switch is up (<= 1.5 s).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ovsproxy.lab.cluster import Lab, LabNode
from ovsproxy.lab.manifests import LabPort, LabService, addresses
from tests.lab.conftest import start_lab
from tests.lab.helpers import install

pytestmark = [pytest.mark.slow, pytest.mark.ovs]

STREAM_PORT = 9000
LOCAL_IPS = addresses("10.96.0.71", "fd00:10:96::71")
REMOTE_IPS = addresses("10.96.0.72", "fd00:10:96::72")
MODES = ("client", "server", "both")
GAP_GOAL = 1.5  # seconds from the switch back to the first record (phase 1)


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    yield from start_lab(2)


def _stream_servers(lab: Lab) -> list[subprocess.Popen[bytes]]:
    servers = []
    for node in lab.nodes.values():
        pod = node.pods[f"web-{node.index}"]
        ready = lab.workdir / f"streams-{pod.name}.ready"
        cmd = ["ip", "netns", "exec", pod.netns, sys.executable, "-m", "ovsproxy.ovs.streams"]
        cmd += ["serve", "--port", str(STREAM_PORT), "--ready-file", str(ready)]
        servers.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, start_new_session=True))
        deadline = time.monotonic() + 20
        while not ready.exists():
            if time.monotonic() > deadline:
                for server in servers:
                    server.kill()
                    server.wait(timeout=10)
                raise AssertionError(f"the stream server in {pod.name} did not start")
            time.sleep(0.05)
    return servers


def _targets() -> list[dict[str, Any]]:
    targets = []
    for where, ips in (("local", LOCAL_IPS), ("remote", REMOTE_IPS)):
        for ip in ips:
            for mode in MODES:
                name = f"{where} IPv{ip.version} {mode}"
                targets.append({"name": name, "host": str(ip), "port": 80, "mode": mode})
    return targets


def _start_client(node: LabNode, duration: float) -> subprocess.Popen[str]:
    pod = node.pods[f"client-{node.index}"]
    cmd = ["ip", "netns", "exec", pod.netns, sys.executable, "-m", "ovsproxy.ovs.streams"]
    cmd += ["run", "--targets", json.dumps(_targets()), "--duration", str(duration)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True)


def _restart_switches(nodes: list[LabNode]) -> float:
    """Kill every node's ovs-vswitchd (-9) at once, start them again; when all are back."""
    for node in nodes:
        node.sandbox.stop_vswitchd()
    time.sleep(1.0)  # down for a moment, as a crash and a supervisor's restart
    threads = [threading.Thread(target=n.sandbox.start_vswitchd) for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.time()


def _kill_agent(lab: Lab, node: LabNode) -> None:
    assert node.agent is not None
    os.kill(node.agent.pid, signal.SIGKILL)
    node.agent.wait(timeout=10)
    lab.stop_agent(node.name)


def _moved_after(direction: dict[str, Any], back: float) -> float | None:
    """Seconds from ``back`` to the end of the silence that spans it (None: none did)."""
    ends = [end for start, end in direction["gaps"] or () if start <= back <= end]
    return float(ends[0] - back) if ends else None


def test_connections_of_every_kind_survive_vswitchd_kills(lab: Lab, tmp_path: Path) -> None:
    node1, node2 = lab.nodes["node-1"], lab.nodes["node-2"]
    for name, ips, pod in (
        ("stream-local", LOCAL_IPS, "web-1"),
        ("stream-remote", REMOTE_IPS, "web-2"),
    ):
        service = LabService(name, ips, (LabPort("stream", 80, STREAM_PORT),), lab.endpoints(pod))
        install(lab, service)
    servers = _stream_servers(lab)
    client = _start_client(node1, duration=26)
    try:
        time.sleep(3)
        # Phase 1: both switches killed and restarted, the agents running.
        back1 = _restart_switches([node1, node2])
        time.sleep(8)
        # Phase 2: node-1's agent killed too; it comes back 3 s after its switch.
        _kill_agent(lab, node1)
        back2 = _restart_switches([node1])
        time.sleep(3)
        lab.start_agent(node1.name)
        agent_back = time.time()
        out, _ = client.communicate(timeout=120)
    finally:
        for proc in (client, *servers):
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
        if lab.nodes["node-1"].agent is None:
            lab.start_agent("node-1")
    results = json.loads(out)
    lines, failures = [], []
    for r in results:
        if r["error"]:
            failures.append(f"{r['name']}: {r['error']}")
        for direction in ("to_server", "to_client"):
            d = r[direction]
            if d is None:
                continue
            if d["received"] != d["sent"] or not d["in_order"]:
                failures.append(f"{r['name']} {direction}: {d['received']}/{d['sent']} records")
            gap1 = _moved_after(d, back1)
            gap2 = _moved_after(d, back2)
            lines.append(
                f"{r['name']:<22} {direction:<9} records {d['received']}/{d['sent']}, moved "
                f"{gap1 if gap1 is None else round(gap1, 2)} s after the switches were back; "
                f"phase 2: {gap2 if gap2 is None else round(gap2 - (agent_back - back2), 2)} s "
                "after the agent was back"
            )
            if gap1 is not None and gap1 > GAP_GOAL:
                failures.append(f"{r['name']} {direction}: moved {gap1:.2f} s after the switch")
    print("\n" + "\n".join(lines))
    (tmp_path / "results.json").write_text(json.dumps(results, indent=1))
    assert not failures, "\n".join(failures + lines)
