"""ovsdb-server away at start-up, or restarted under load: the agent waits and says so,
keeps forwarding, applies changes, and what it keeps in OVSDB (cookie generation, group ids)
stays consistent with the switch."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ovsproxy.ovs.ovsdb import decode_id_ranges
from ovsproxy.ovs.sandbox import Pod, Sandbox
from ovsproxy.ovs.traffic import TCP_TIMEOUT_S
from tests.e2e.harness import AgentProcess, copy_examples

pytestmark = [pytest.mark.slow, pytest.mark.ovs, pytest.mark.shared_sandbox]

WEB = "http://10.96.0.10/"


class Node:
    def __init__(
        self, sandbox: Sandbox, pods: dict[str, Pod], manifests: Path, agent: AgentProcess
    ):
        self.sandbox, self.pods, self.manifests, self.agent = sandbox, pods, manifests, agent

    def http(self, url: str, count: int, **kw: Any) -> dict[str, Any]:
        timeout = float(kw.pop("timeout", TCP_TIMEOUT_S))
        args = ["http", url, "--count", str(count)]
        for key, value in kw.items():
            args += [f"--{key}", str(value)]
        return self.agent.traffic(self.pods["client"].netns, *args, timeout=timeout)

    def external_id(self, key: str) -> str:
        out = self.sandbox.vsctl("--if-exists", "get", "Bridge", "br0", f"external_ids:{key}")
        return out.strip().strip('"')

    def switch_group_ids(self) -> set[int]:
        dumped = self.sandbox.ofctl("dump-groups")
        return {
            int(line.split("group_id=")[1].split(",")[0])
            for line in dumped.splitlines()
            if "group_id=" in line
        }

    def verify(self) -> subprocess.CompletedProcess[str]:
        cmd = [
            sys.executable,
            "-m",
            "ovsproxy",
            "verify",
            "--ovsdb",
            self.sandbox.ovsdb,
            "--openflow",
            self.sandbox.openflow,
            "--netns",
            self.sandbox.netns,
            "--manifests",
            str(self.manifests),
            "--node-name",
            "node-1",
        ]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.fixture
def node(example_pods: dict[str, Pod], sandbox: Sandbox, tmp_path: Path) -> Iterator[Node]:
    pods = example_pods
    manifests = copy_examples(tmp_path / "manifests")
    agent = AgentProcess(sandbox, manifests, tmp_path / "agent.log")
    try:
        yield Node(sandbox, pods, manifests, agent)
    finally:
        agent.stop()


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def test_agent_started_before_ovsdb_server_waits_says_so_then_works(node: Node) -> None:
    node.sandbox.stop_ovsdb_server()
    seen: dict[str, Any] = {}

    def start_ovsdb_later() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # the agent answers /status while it waits
            try:
                status = node.agent.status()
                if status["ovsdb"].get("start_attempts", 0) >= 3:
                    seen["status"] = status
                    break
            except Exception:
                pass
            time.sleep(0.2)
        seen["healthz"] = node.agent.get("/healthz")[0]
        _, seen["metrics"] = node.agent.get("/metrics")
        node.sandbox.start_ovsdb_server()

    starter = threading.Thread(target=start_ovsdb_later)
    starter.start()
    try:
        node.agent.start(timeout=60)
    finally:
        starter.join(30)
    waiting = seen["status"]["ovsdb"]
    assert waiting["connected"] is False and waiting["start_attempts"] >= 3
    assert "Could not retrieve schema" in waiting["last_error"]
    assert seen["healthz"] == 503
    assert "ovsproxy_ovsdb_connected 0.0" in seen["metrics"]
    log = node.agent.log()
    assert log.count("is not reachable") == 1, log  # said once (then every 10th attempt)
    assert "the agent starts once it answers" in log
    assert "answers after" in log
    assert node.http(WEB, 20)["failed"] == 0
    status = node.agent.status()
    assert status["ovsdb"]["connected"] is True and status["ovsdb"]["group_ids"]["saved"]
    assert node.agent.metric("ovsproxy_ovsdb_connected") == 1
    assert node.external_id("ovsproxy-generation") == "1" == str(status["generation"])
    assert decode_id_ranges(node.external_id("ovsproxy-group-ids")) == node.switch_group_ids()
    assert node.verify().returncode == 0


def test_ovsdb_server_restart_under_load_loses_nothing_and_keeps_ovsdb_consistent(
    node: Node,
) -> None:
    """ovs-vswitchd's main loop does nothing while it has no OVSDB (it waits for its database
    lock): no OpenFlow, and on the userspace datapath no forwarding for ports its main thread
    polls (veths, taps): packets wait in their sockets and go on once vswitchd has its database
    back (after its own reconnect backoff). So requests are delayed, not lost: the client's
    timeout is longer than that pause. A change made during the outage is applied once
    ovsdb-server is back, and its new group id reaches OVSDB's registry."""
    node.agent.start()
    generation = node.external_id("ovsproxy-generation")
    groups_before = node.switch_group_ids()
    assert decode_id_ranges(node.external_id("ovsproxy-group-ids")) == groups_before
    result: dict[str, Any] = {}
    load = threading.Thread(
        target=lambda: result.update(node.http(WEB, 0, duration=12, interval=0.02, timeout=15))
    )
    started = time.monotonic()
    marks: dict[str, float] = {}  # when each step happened, for a failure's message

    def mark(what: str) -> None:
        marks[what] = round(time.monotonic() - started, 3)

    load.start()
    try:
        time.sleep(1)
        mark("ovsdb-server killed")
        node.sandbox.stop_ovsdb_server()  # kill -9
        # While it is away: a new Service (a new group, a new group id for the registry).
        (node.manifests / "extra.yaml").write_text(EXTRA)
        node.agent.wait_for(
            lambda: not node.agent.status()["ovsdb"]["connected"],
            timeout=10,
            what="the agent to see OVSDB gone",
        )
        assert node.agent.metric("ovsproxy_ovsdb_connected") == 0
        time.sleep(2)
        mark("ovsdb-server started")
        node.sandbox.start_ovsdb_server()
        node.agent.wait_for(
            lambda: node.http("http://10.96.0.77/", 1, timeout=1)["failed"] == 0,
            timeout=30,
            what="the Service added during the outage, once ovsdb-server is back",
        )
        node.agent.wait_for(
            lambda: node.agent.status()["ovsdb"]["group_ids"]["saved"],
            timeout=20,
            what="the group-id registry written after the restart",
        )
        mark("registry saved")
        # A change after the restart is applied: api-1 replaces web-2 in the web Service.
        _edit(
            node.manifests / "web.yaml", "- addresses: [10.244.0.12]", "- addresses: [10.244.0.13]"
        )
    finally:
        load.join(60)
    assert result["sent"] > 100 and result["failed"] == 0, (
        result["failures"],
        result["failure_times"],
        marks,
    )
    node.agent.wait_for(
        lambda: "api-1" in node.http(WEB, 20)["counts"], timeout=15, what="the web change"
    )
    status = node.agent.status()
    assert status["healthy"] and status["ovsdb"]["connected"]
    assert node.agent.metric("ovsproxy_ovsdb_connected") == 1
    # OVSDB's state matches the switch: same generation, every group id of ours recorded.
    assert node.external_id("ovsproxy-generation") == generation == str(status["generation"])
    switch = node.switch_group_ids()
    assert len(switch) == len(groups_before) + 1
    assert decode_id_ranges(node.external_id("ovsproxy-group-ids")) == switch
    clean = node.verify()
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert node.agent.proc is not None and node.agent.proc.poll() is None  # never crashed
    # The next agent run continues from what OVSDB holds.
    assert node.agent.stop() == 0
    node.agent.start()
    assert node.external_id("ovsproxy-generation") == str(int(generation) + 1)
    assert node.switch_group_ids() == switch
    assert json.loads(node.agent.get("/status")[1])["ovsdb"]["group_ids"]["saved"]


EXTRA = (
    "apiVersion: v1\nkind: Service\nmetadata: {name: extra, namespace: demo}\n"
    "spec:\n  clusterIP: 10.96.0.77\n  ports: [{name: http, port: 80, targetPort: 8080}]\n"
    "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n"
    "metadata: {name: extra, namespace: demo, labels: {kubernetes.io/service-name: extra}}\n"
    "addressType: IPv4\nports: [{name: http, port: 8080, protocol: TCP}]\n"
    "endpoints: [{addresses: [10.244.0.13], conditions: {ready: true}}]\n"
)
