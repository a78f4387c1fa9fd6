"""Breaking the rig on purpose is caught (issue 23): a packet dropped on the path makes the probe
report the failed request with its 5-tuple and evidence naming where it died; a request that
needed a retransmission is counted, not failed; the pods' servers listen with a real backlog.

One single-node lab: client-1 and web-1 on node-1, the lab's ``web`` Service. The broken part
is one OpenFlow flow of our own (cookie ``DROP_COOKIE``, top priority in table 0) that drops the
client's TCP packets from one bound source port: one 5-tuple, nothing else.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from ovsproxy.lab.cluster import HTTP_PORT, Lab
from ovsproxy.lab.evidence import lab_rig, probe
from ovsproxy.ovs.podserver import LISTEN_BACKLOG
from ovsproxy.ovs.traffic import TCP_TIMEOUT_S

from .conftest import start_lab
from .helpers import install, url

pytestmark = [pytest.mark.slow, pytest.mark.ovs]

DROP_COOKIE = 0xE71D
SOURCE_PORT = 40123


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    for lab in start_lab(1):
        install(lab, lab.web_service())
        yield lab


def drop_from(lab: Lab, source_port: int) -> None:
    client = lab.pod("client-1")
    lab.nodes["node-1"].sandbox.ofctl(
        "add-flow",
        f"cookie={DROP_COOKIE:#x},table=0,priority=65535,tcp,in_port={client.ofport},"
        f"nw_src={client.ipv4.ip if client.ipv4 else ''},tp_src={source_port},actions=drop",
    )


def undrop(lab: Lab) -> None:
    lab.nodes["node-1"].sandbox.ofctl("del-flows", f"cookie={DROP_COOKIE:#x}/-1")


def web_ip(lab: Lab) -> str:
    return str(lab.web_service().cluster_ips[0])


def request(lab: Lab, source_port: int) -> dict:
    args = ("http", url(web_ip(lab)), "--count", "1", "--timeout", str(TCP_TIMEOUT_S))
    return probe(lab_rig(lab), lab.pod("client-1").netns, *args, "--source-port", str(source_port))


def test_a_dropped_syn_is_reported_with_where_it_died(lab: Lab) -> None:
    client = lab.pod("client-1")
    drop_from(lab, SOURCE_PORT)
    try:
        out = request(lab, SOURCE_PORT)
    finally:
        undrop(lab)
    assert out["failures"] == {"timeout": 1}, out
    (failed,) = out["failed_requests"]
    # the client's report: the 5-tuple, the phase, the kernel's retransmissions of the SYN
    assert failed["proto"] == "tcp" and failed["phase"] == "connect", failed
    assert (failed["src"], failed["source_port"]) == (str(client.ipv4.ip), SOURCE_PORT), failed
    assert (failed["dst"], failed["dport"]) == (web_ip(lab), 80), failed
    assert failed["tcp_info"]["total_retrans"] >= 1, failed
    evidence = out["evidence"]
    # where it died: the drop flow counted the SYN and its retransmission...
    (drop,) = [f for f in evidence["drop_flows"]["node-1"] if f"tp_src={SOURCE_PORT}" in f]
    n_packets = int(drop.split("n_packets=")[1].split(",")[0])
    assert n_packets == 1 + failed["tcp_info"]["total_retrans"], evidence["drop_flows"]
    # ... so the switch's conntrack never saw the connection, nor did the node's kernel
    assert evidence["conntrack_ovs"]["node-1"] == [], evidence["conntrack_ovs"]
    assert evidence["conntrack_kernel"]["node-1"] == [], evidence["conntrack_kernel"]
    # the client's kernel retransmitted the SYN; the server saw nothing to overflow
    assert evidence["nstat"][client.netns].get("TcpExtTCPSynRetrans", 0) >= 1, evidence["nstat"]
    web = lab.pod("web-1").netns
    assert "TcpExtListenOverflows" not in evidence["nstat"].get(web, {}), evidence["nstat"]
    # the agent was connected and synced all along
    agent = evidence["agents"]["node-1"]
    assert agent["openflow"]["connected"] and agent["last_sync"], agent
    # the same 5-tuple, the flow gone: answered, and nothing to explain
    again = request(lab, SOURCE_PORT)
    assert again["failed"] == 0 and "evidence" not in again, again


def test_a_request_that_needed_a_retransmission_is_counted_not_failed(lab: Lab) -> None:
    """The first SYN is dropped, the flow removed before the kernel resends it (after 1 s):
    the request is answered, and counted in ``retransmitted`` by its connect time (once the
    connection is up, TCP_INFO's total_retrans no longer counts the SYN: measured)."""
    port = SOURCE_PORT + 1
    drop_from(lab, port)
    cmd = [
        *("ip", "netns", "exec", lab.pod("client-1").netns, sys.executable),
        *("-m", "ovsproxy.ovs.traffic", "http", url(web_ip(lab)), "--source-port", str(port)),
    ]
    client = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)
    finally:
        undrop(lab)
    stdout, _ = client.communicate(timeout=30)
    out = json.loads(stdout)
    assert out["failed"] == 0 and out["retransmitted"] == 1, out
    (slow,) = out["retransmitted_requests"]
    assert 0.9 <= slow["connect_s"] < TCP_TIMEOUT_S, slow


def test_pod_servers_listen_with_a_backlog_for_parallel_clients(lab: Lab) -> None:
    """``ss -ltn``'s Send-Q of a listening socket is its backlog (socketserver's default: 5)."""
    listening = lab.pod("web-1").exec("ss", "-Hltn", f"sport = :{HTTP_PORT}").stdout.split()
    assert listening[2] == str(LISTEN_BACKLOG), listening
