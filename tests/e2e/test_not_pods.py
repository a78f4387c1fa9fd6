"""Interfaces on the bridge that a CNI has not recorded as pods: logged once, counted, shown."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ovsproxy.agent.pods import POD_POLL_INTERVAL
from ovsproxy.lab import build_lab
from ovsproxy.ovs.sandbox import Sandbox
from tests.e2e.harness import AgentProcess, copy_examples

pytestmark = [pytest.mark.slow, pytest.mark.ovs]

METRIC = "ovsproxy_bridge_interfaces_not_pods"


@pytest.fixture
def agent(sandbox: Sandbox, tmp_path: Path) -> Iterator[AgentProcess]:
    build_lab(sandbox)
    agent = AgentProcess(sandbox, copy_examples(tmp_path / "manifests"), tmp_path / "agent.log")
    agent.start()
    try:
        yield agent
    finally:
        agent.stop()


def _bridge_port(sandbox: Sandbox, name: str, **external_ids: str) -> None:
    """A veth on the bridge (in the node namespace) with the given external_ids only."""
    sandbox.exec("ip", "link", "add", name, "type", "veth", "peer", "name", f"{name}-peer")
    sandbox.exec("ip", "link", "set", name, "up")
    sandbox.vsctl("add-port", sandbox.bridge, name)
    for key, value in external_ids.items():
        sandbox.vsctl("set", "Interface", name, f'external_ids:{key}="{value}"')


def _status_text(agent: AgentProcess) -> str:
    address = f"127.0.0.1:{agent.port}"
    cmd = [sys.executable, "-m", "ovsproxy", "status", "--address", address]
    return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=60).stdout


def test_interfaces_that_are_not_pods_are_logged_once_counted_and_shown(
    agent: AgentProcess, sandbox: Sandbox
) -> None:
    assert agent.metric(METRIC) == 0  # the lab's pods are recorded; the gateway is no pod
    assert agent.status()["not_pods"] == []
    _bridge_port(sandbox, "uplink0")
    _bridge_port(sandbox, "half0", ip="10.244.0.50")
    _bridge_port(sandbox, "bad0", ip="10.244.0.300", **{"attached-mac": "0a:58:00:00:00:50"})
    agent.wait_for(lambda: agent.metric(METRIC) == 3, timeout=3 * POD_POLL_INTERVAL + 5)
    expected = [
        {"interface": "bad0", "reason": "bad external_ids:ip '10.244.0.300'"},
        {"interface": "half0", "reason": "no external_ids:attached-mac"},
        {"interface": "uplink0", "reason": "no external_ids:ip and external_ids:attached-mac"},
    ]
    assert agent.status()["not_pods"] == expected
    # Several polls later, each is still in the log once.
    time.sleep(2.5 * POD_POLL_INTERVAL)
    for entry in expected:
        line = (
            f"interface {entry['interface']} on bridge br0 is not read as a pod "
            f"({entry['reason']}): it gets no flows"
        )
        assert agent.log().count(line) == 1, (line, agent.log()[-3000:])
    text = _status_text(agent)
    assert "bridge interfaces not read as pods (no flows)" in text
    assert "uplink0: no external_ids:ip and external_ids:attached-mac" in text
    assert "half0: no external_ids:attached-mac" in text
    code, body = agent.get("/status")
    assert code == 200 and json.loads(body)["not_pods"] == expected
    # The CNI completes one: it becomes a pod (flows in), and leaves the list.
    sandbox.vsctl("set", "Interface", "half0", 'external_ids:attached-mac="0a:58:00:00:00:51"')
    agent.wait_for(lambda: agent.metric(METRIC) == 2, timeout=3 * POD_POLL_INTERVAL + 5)
    assert [e["interface"] for e in agent.status()["not_pods"]] == ["bad0", "uplink0"]
    agent.wait_for(
        lambda: "nw_dst=10.244.0.50" in sandbox.ofctl("dump-flows"),
        timeout=3 * POD_POLL_INTERVAL + 5,
        what="the completed pod's forwarding flow",
    )
