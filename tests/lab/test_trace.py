"""`ovsproxy trace` on a 3-node lab: each trace is read from one node's agent and switch, and
a real request with the traced 5-tuple (the client's source port bound) must reach the endpoint
the trace named — local or on another node, from a pod and from the node itself (host SNAT)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from ovsproxy.cli import main as cli
from ovsproxy.lab.cluster import HTTP_PORT, UDP_PORT, Lab
from ovsproxy.lab.manifests import LabPort, LabService, addresses
from ovsproxy.ovs.traffic import run_in_netns

from .conftest import start_lab
from .helpers import client_pod, install, url

pytestmark = [pytest.mark.slow, pytest.mark.ovs]

PORTS = (LabPort("http", 80, HTTP_PORT), LabPort("dns", 53, UDP_PORT, "UDP"))
SOURCE_PORTS = range(42000, 42010)


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    for lab in start_lab(3):
        web = LabService(
            "tr-web", addresses("10.96.2.10", "fd00:10:96::2:10"), PORTS, lab.endpoints()
        )
        empty = LabService("tr-empty", addresses("10.96.2.20", "fd00:10:96::2:20"), PORTS, ())
        local = LabService(
            "tr-local",
            addresses("10.96.2.30", "fd00:10:96::2:30"),
            PORTS,
            lab.endpoints("web-3"),
            internal_traffic_policy="Local",
        )
        install(lab, web)
        install(lab, empty)
        on_node_3 = local.endpoints
        install(lab, local, lambda node, eps=on_node_3: eps if node == "node-3" else ())
        yield lab


def trace(lab: Lab, node: str, src: str, dst: str, *extra: str) -> subprocess.CompletedProcess[str]:
    address = lab.nodes[node].metrics_address
    cmd = [sys.executable, "-m", "ovsproxy", "trace", src, dst, "--address", address, *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def trace_json(lab: Lab, node: str, src: str, dst: str, *extra: str) -> dict[str, Any]:
    """``ovsproxy trace --json``, the command run in this process: the module traces some
    60 times, and a Python start-up each would cost more than the trace (``trace`` above runs
    the command as a user does)."""
    address = lab.nodes[node].metrics_address
    args = ["trace", src, dst, "--address", address, "--json", *extra]
    done = CliRunner().invoke(cli, args)
    assert done.exit_code == 0, (done.output, done.exception)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def pod_of(lab: Lab, endpoint: str) -> str:
    ip = endpoint.rpartition(":")[0].strip("[]")
    for node in lab.nodes.values():
        for pod in node.pods.values():
            if ip in {str(a) for a in pod.ips}:
                return pod.name
    raise KeyError(endpoint)


def request(netns: str, ip: str, port: int, source_port: int, proto: str) -> dict[str, Any]:
    if proto == "udp":
        args = ["udp", ip, str(port), "--count", "1", "--source-port", str(source_port)]
    else:
        args = ["http", url(ip, port), "--count", "1", "--source-port", str(source_port)]
    # A first connection may wait for neighbour discovery on three hops (IPv6 under load):
    # time enough for a SYN retransmission, which keeps the 5-tuple.
    return run_in_netns(netns, *args, "--timeout", "5")


@pytest.mark.parametrize(
    ("source", "family", "proto"),
    [
        pytest.param("pod", 4, "tcp", id="pod-IPv4-TCP"),
        pytest.param("pod", 6, "tcp", id="pod-IPv6-TCP"),
        pytest.param("pod", 4, "udp", id="pod-IPv4-UDP"),
        pytest.param("node", 4, "tcp", id="node-IPv4-TCP"),
    ],
)
def test_trace_names_the_endpoint_a_real_request_reaches(
    lab: Lab, source: str, family: int, proto: str
) -> None:
    node = lab.nodes["node-1"]
    src, netns = ("client-1", client_pod(node)) if source == "pod" else ("node", node.netns)
    ip = "10.96.2.10" if family == 4 else "fd00:10:96::2:10"
    port = 80 if proto == "tcp" else 53
    dst = f"[{ip}]:{port}" if family == 6 else f"{ip}:{port}"
    seen = set()
    # Own ports per family: an IPv6 client binds [::]:PORT, which a TIME_WAIT of the IPv4
    # test's connection from PORT would refuse (EADDRINUSE).
    for sport in (p + (200 if family == 6 else 0) for p in SOURCE_PORTS):
        result = trace_json(lab, "node-1", src, dst, "--source-port", str(sport))
        assert result["verdict"] == "forwarded", result
        assert (
            result["destination"]["service"]
            == f"lab/tr-web:{'http/TCP' if proto == 'tcp' else 'dns/UDP'}"
        )
        assert result["buckets"] == 3
        traced = pod_of(lab, result["endpoint"])
        remote = traced != "web-1"
        if remote and source == "pod":
            # not a pod of node-1: NORMAL toward gw0, the node routes it (host-gw)
            assert result["leaves"]["kind"] == "normal", result["leaves"]
            assert result["endpoint_pod"] is None
        elif remote:
            # the node's own connection to another node: host SNAT, back out the gateway
            kinds = [(n["kind"], n["to"].rpartition(":")[0]) for n in result["nat"]]
            assert kinds[1] == ("SNAT", "10.244.1.254"), result["nat"]
            assert result["leaves"]["kind"] == "gateway"
        else:
            assert result["leaves"]["pod"] == "lab/web-1"
        answer = request(netns, ip, port, sport, proto)
        assert answer["failed"] == 0, (sport, result["endpoint"], answer["failures"])
        assert answer["counts"] == {traced: 1}, (sport, result["endpoint"], answer)
        seen.add(traced)
    assert "web-1" in seen and seen - {"web-1"}, seen  # local and remote endpoints both traced


def test_service_without_endpoints_says_rejected(lab: Lab) -> None:
    done = trace(lab, "node-2", "client-2", "lab/tr-empty:http")
    assert done.returncode == 0, done.stderr
    assert "REJECTED   no usable endpoints" in done.stdout, done.stdout
    udp = trace_json(lab, "node-2", "client-2", "lab/tr-empty:dns")
    assert udp["verdict"] == "rejected" and "ICMP port unreachable" in udp["reason"]
    answer = request(client_pod(lab.nodes["node-2"]), "10.96.2.20", 80, 42100, "tcp")
    assert answer["failures"] == {"refused": 1}, answer


def test_local_policy_from_the_wrong_node_says_dropped_and_why(lab: Lab) -> None:
    done = trace(lab, "node-1", "client-1", "lab/tr-local:http")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "DROPPED    internalTrafficPolicy Local: no usable endpoint on this node" in text, text
    assert "not used: 10.244.3.10:8080: on another node (internalTrafficPolicy Local)" in text
    answer = request(client_pod(lab.nodes["node-1"]), "10.96.2.30", 80, 42101, "tcp")
    assert answer["failures"] == {"timeout": 1}, answer
    # On the endpoint's own node the same Service forwards to it.
    result = trace_json(lab, "node-3", "client-3", "lab/tr-local:http", "--source-port", "42102")
    assert result["verdict"] == "forwarded"
    assert result["endpoint_pod"] == "lab/web-3"
    answer = request(client_pod(lab.nodes["node-3"]), "10.96.2.30", 80, 42102, "tcp")
    assert answer["counts"] == {"web-3": 1}, answer


def test_nodeport_from_outside_and_from_a_pod(lab: Lab) -> None:
    """A NodePort traced from the external client (through the node's steering table, then
    OVS) and from a pod (matched in OVS at once), each against a real request. Runs once the
    agent reports NodePorts in /status (the NodePort wiring)."""
    if "node_ports" not in lab.agent_status("node-1"):
        pytest.skip("this agent does not wire NodePorts yet")
    node_port = 30180
    svc = LabService(
        "tr-np",
        addresses("10.96.2.40", "fd00:10:96::2:40"),
        (LabPort("http", 80, HTTP_PORT),),
        lab.endpoints(),
        extra_spec={
            "type": "NodePort",
            "ports": [{"name": "http", "port": 80, "targetPort": HTTP_PORT, "nodePort": node_port}],
        },
    )
    install(lab, svc)
    node_ip = str(lab.nodes["node-1"].node_ips[0])
    sources = [
        ("192.168.50.100", lab.external_netns),
        ("client-1", client_pod(lab.nodes["node-1"])),
    ]
    for src, netns in sources:
        seen = set()
        for sport in SOURCE_PORTS:
            result = trace_json(
                lab, "node-1", src, f"{node_ip}:{node_port}", "--source-port", str(sport)
            )
            assert result["verdict"] == "forwarded", result
            assert result["destination"]["kind"] == "NodePort"
            if src == "client-1":
                assert result["before_ovs"] is None
                assert result["frontend"] == f"tcp,nw_dst={node_ip},tp_dst={node_port}"
            else:
                assert "capture table DNATs" in result["before_ovs"]
                # externalTrafficPolicy Cluster: OVS sees (and hashes) the gateway's address
                assert "masquerades 192.168.50.100 to 10.244.1.1" in result["before_ovs"]
            traced = pod_of(lab, result["endpoint"])
            answer = request(netns, node_ip, node_port, sport, "tcp")
            assert answer["counts"] == {traced: 1}, (src, sport, result["endpoint"], answer)
            seen.add(traced)
        assert len(seen) > 1, seen
