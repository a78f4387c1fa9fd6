"""The lab's life: a node leaving, the CLI (`lab up|status|down`, `demo --nodes`), and nothing
left behind after `lab down`, after a failed test and after a crashed run."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ovsproxy.lab.cluster import LAB_REGISTRY, Lab, LabRecord, list_lab_records
from ovsproxy.lab.evidence import attached_rig
from ovsproxy.lab.manifests import LabPort, LabService, addresses, endpoint_texts, write_service
from ovsproxy.ovs.sandbox import netns_exists, pid_alive

from .conftest import start_lab
from .helpers import client_pod, clients, http

pytestmark = [pytest.mark.slow, pytest.mark.ovs]

OVSPROXY = [sys.executable, "-m", "ovsproxy"]


def _nothing_left(record: LabRecord) -> None:
    """No namespace, process, record or file of the lab remains."""
    namespaces = [*record.netns, *(f"ovsp-{name}" for name in record.sandboxes)]
    assert not [ns for ns in namespaces if netns_exists(ns)], namespaces
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"ovsp-{record.name}-" not in out, out
    assert not [p for p in record.agents.values() if pid_alive(p)], record.agents
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert record.workdir not in ps and f"ovsproxy-{record.name}-n" not in ps
    assert not Path(record.workdir).exists()
    assert not (LAB_REGISTRY / f"{record.name}.json").exists()


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    yield from start_lab(3)


def test_node_leaving(lab: Lab) -> None:
    """node-3 leaves: agent stopped, namespace gone, its endpoint removed from the slices; the
    other nodes stop sending there within one sync and no request fails."""
    service = LabService(
        "leaving",
        addresses("10.96.2.10", "fd00:10:96::2:10"),
        (LabPort("http", 80, 8080),),
        lab.endpoints(),
    )
    write_service(lab.manifests, service)
    lab.wait_endpoints("lab/leaving:http/TCP", endpoint_texts(service.endpoints, 8080))
    for ip in map(str, service.cluster_ips):
        out = http(lab, client_pod(lab.nodes["node-1"]), ip, 30)
        assert "web-3" in out["counts"], out

    node3 = lab.nodes["node-3"]
    agent_pid = node3.agent.pid if node3.agent else None
    lab.remove_node("node-3")
    assert not netns_exists(node3.netns)
    assert agent_pid is not None and not pid_alive(agent_pid)
    remaining = tuple(ep for ep in service.endpoints if ep.node != "node-3")
    started = time.monotonic()
    write_service(lab.manifests, dataclasses.replace(service, endpoints=remaining))
    # One sync: the manifest poll (0.5 s) plus the sync itself, on every remaining node.
    lab.wait_endpoints("lab/leaving:http/TCP", endpoint_texts(remaining, 8080), timeout=5)
    print(f"\nremaining nodes dropped node-3's endpoints {time.monotonic() - started:.2f} s after")
    for ip in map(str, service.cluster_ips):
        for label, netns in clients(lab):
            out = http(lab, netns, ip, 30)
            assert out["failed"] == 0, (label, out)
            assert set(out["counts"]) == {"web-1", "web-2"}, (label, out["counts"])


def test_failed_test_leaves_nothing() -> None:
    with pytest.raises(RuntimeError, match="the test failed"), Lab(2) as small:
        record = small.record
        assert record is not None and len(record.agents) == 2
        raise RuntimeError("the test failed")
    _nothing_left(record)


CRASHING = """
import sys, time
from ovsproxy.lab.cluster import Lab
lab = Lab(2, name=sys.argv[1]).up()
print("up", flush=True)
time.sleep(600)
"""


def test_crashed_run_is_cleaned_by_the_next() -> None:
    name = f"crash{os.getpid() % 10000}"
    proc = subprocess.Popen(
        [sys.executable, "-c", CRASHING, name], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
        record = LabRecord.load(LAB_REGISTRY / f"{name}.json")
        assert record is not None and netns_exists(record.netns[0])
        os.kill(proc.pid, signal.SIGKILL)  # no cleanup runs
        proc.wait()
        # Its agents and daemons (own sessions) outlive it, its namespaces too...
        assert all(pid_alive(p) for p in record.agents.values())
        assert netns_exists(f"ovsp-{record.sandboxes[0]}")
        # ...until the next lab starts.
        with Lab(1):
            assert name not in {r.name for r in list_lab_records()}
        _nothing_left(record)
    finally:
        if proc.poll() is None:
            proc.kill()
        subprocess.run([*OVSPROXY, "lab", "down", "--name", name], capture_output=True)


def test_cli_lab_up_status_down() -> None:
    name = f"cli{os.getpid() % 10000}"
    started = time.monotonic()
    up = subprocess.run(
        [*OVSPROXY, "lab", "up", "--nodes", "3", "--zones", "2", "--name", name, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    elapsed = time.monotonic() - started
    try:
        assert up.returncode == 0, up.stderr
        print(
            f"\n`ovsproxy lab up --nodes 3`: {elapsed:.2f} s "
            f"(lab itself {json.loads(up.stdout)['started_in_s']} s)"
        )
        status = subprocess.run(
            [*OVSPROXY, "lab", "status", "--name", name, "--json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert status.returncode == 0, status.stderr
        info = json.loads(status.stdout)
        assert [n["name"] for n in info["nodes"]] == ["node-1", "node-2", "node-3"]
        assert [n["zone"] for n in info["nodes"]] == ["zone-1", "zone-2", "zone-1"]
        for node in info["nodes"]:
            assert node["agent"]["running"] and node["agent"]["metrics"].startswith("http://")
            assert {p["name"] for p in node["pods"]} == {
                f"web-{node['name'][-1]}",
                f"client-{node['name'][-1]}",
            }
            assert netns_exists(node["netns"])
        # The lab is usable from outside: the default Service answers from every node.
        for node in info["nodes"]:
            client = next(p for p in node["pods"] if p["name"].startswith("client"))
            out = http(attached_rig(name), client["netns"], "10.96.0.10", 30)
            assert out["failed"] == 0 and set(out["counts"]) == {"web-1", "web-2", "web-3"}, out
        record = LabRecord.load(LAB_REGISTRY / f"{name}.json")
        assert record is not None and record.persistent
    finally:
        down = subprocess.run(
            [*OVSPROXY, "lab", "down", "--name", name], capture_output=True, text=True, timeout=60
        )
    assert down.returncode == 0, down.stderr
    _nothing_left(record)
    gone = subprocess.run(
        [*OVSPROXY, "lab", "status", "--name", name, "--json"], capture_output=True, text=True
    )
    assert gone.returncode == 1 and json.loads(gone.stdout)["running"] is False


def test_demo_nodes_json() -> None:
    result = subprocess.run(
        [*OVSPROXY, "demo", "--nodes", "3", "--json", "--requests", "30"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is True
    rows = report["phases"][0]["results"]
    for node in ("node-1", "node-2", "node-3"):
        mine = [r for r in rows if r["node"] == node]
        assert len(mine) == 4  # pod and node namespace, IPv4 and IPv6
        for row in mine:
            assert row["failed"] == 0 and set(row["counts"]) == {"web-1", "web-2", "web-3"}, row
    # The change goes through the API as Pods: web-3 deleted, web-1b started on node-1; the
    # selector's EndpointSlices follow and so does every node's traffic.
    assert report["change"]["deleted_pod"] == "web-3", report["change"]
    after = report["phases"][1]["results"]
    assert len(after) == 12
    for row in after:
        assert row["failed"] == 0 and set(row["counts"]) == {"web-1", "web-1b", "web-2"}, row
