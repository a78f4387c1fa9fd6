"""The shared sandbox's reset (tests/shared_sandbox.py): whatever a test leaves behind is
seen and removed, and what cannot be removed fails the test that left it."""

from __future__ import annotations

import os

import pytest

from ovsproxy.ovs.sandbox import Sandbox
from ovsproxy.ovs.traffic import run_in_netns
from tests.shared_sandbox import leave_as_found, read_state

pytestmark = [
    pytest.mark.ovs,
    pytest.mark.skipif(os.geteuid() != 0, reason="the OVS sandbox needs root"),
]

# What an agent leaves (and more), in the node namespace.
NODE_LEFTOVERS = (
    "ip link add left9 type veth peer name right9",
    "ip addr add 169.254.0.1/32 dev gw0",
    "ip neigh add 169.254.0.253 lladdr 0a:58:a9:fe:00:fd dev gw0 nud permanent",
    "ip route add 10.96.0.0/16 via 169.254.0.253 dev gw0 onlink proto 155",
    "ip -6 route add default dev gw0 table 155 proto 155",
    "ip rule add pref 155 fwmark 0x2000000/0x2000000 lookup 155 proto 155",
    "ip -6 rule add pref 155 fwmark 0x2000000/0x2000000 lookup 155 proto 155",
    "nft add table inet ovsproxy",
    # A chain that makes the node's kernel track connections.
    "nft add chain inet ovsproxy out { type filter hook output priority 0 ; }",
    "nft add rule inet ovsproxy out ct state new counter",
)


# A connection over the node's loopback, closed by the listening side first: a TIME_WAIT.
TIME_WAIT = """
import socket
server = socket.create_server(("127.0.0.1", 0))
client = socket.create_connection(server.getsockname())
accepted, _ = server.accept()
accepted.close()
client.recv(1)
client.close()
"""


def test_what_a_test_leaves_is_seen_and_removed(sandbox: Sandbox) -> None:
    found = read_state(sandbox)
    pod = sandbox.add_pod("leaver", http_ports=(8080,))
    sandbox.vsctl(
        "set",
        "bridge",
        sandbox.bridge,
        "external_ids:ovsproxy-generation=7",
        "fail_mode=standalone",
    )
    sandbox.vsctl("set-controller", sandbox.bridge, "ptcp:16654:127.0.0.1")
    sandbox.vsctl(
        *("--", "--id=@dp", "create", "Datapath", "external_ids:left=behind"),
        *("--", "set", "Open_vSwitch", ".", "datapaths:netdev=@dp"),
    )
    sandbox.vsctl("add-zone-tp", "netdev", "zone=65520", "tcp_time_wait=120")
    sandbox.vsctl("set", "Open_vSwitch", ".", "external_ids:left=behind")
    sandbox.ofctl("add-flow", "table=0,priority=2,ip,actions=ct(commit),NORMAL")
    sandbox.ofctl("add-flow", "table=0,priority=1,actions=NORMAL")
    sandbox.ofctl("add-group", "group_id=9,type=select,bucket=actions=drop")
    sandbox.ofctl("add-meter", "meter=3,pktps,band=type=drop,rate=10")
    for command in NODE_LEFTOVERS:
        sandbox.exec(*command.split())
    assert pod.ipv4 is not None
    answer = run_in_netns(sandbox.netns, "http", f"http://{pod.ipv4.ip}:8080/", "--count", "2")
    assert answer["counts"] == {"leaver": 2}, answer  # TCP through OVS conntrack
    sandbox.exec("python3", "-c", TIME_WAIT)

    seen = {line.split(":")[0] for line in found.differences(read_state(sandbox))}
    node = {f"{sandbox.netns} {name}" for name in ("links", "addresses", "neighbours")}
    node |= {f"{sandbox.netns} {name}" for name in ("routes", "rules", "nftables", "conntrack")}
    wanted = {"flows", "groups", "meters", "ports", "bridge", "interfaces", "ovs_conntrack"}
    wanted |= {"open_vswitch", "zones"}
    wanted |= {"pods", "namespaces", f"{sandbox.netns} sockets"} | node
    missing = {name for name in wanted if not any(s.startswith(name) for s in seen)}
    assert not missing, (missing, seen)

    leave_as_found(sandbox, found)
    assert read_state(sandbox) == found
    assert "leaver" not in sandbox.pods


def test_what_the_reset_cannot_put_back_fails_the_test(sandbox: Sandbox) -> None:
    # Found with a table of its own: the reset removes only tables that were not there.
    sandbox.exec("nft", "add", "table", "inet", "theirs")
    found = read_state(sandbox)
    sandbox.exec("nft", "add", "chain", "inet", "theirs", "changed")
    with pytest.raises(AssertionError, match=f"{sandbox.netns} nftables"):
        leave_as_found(sandbox, found)
    # Nor does it put back flows that were there: found with a flow, it deletes it.
    sandbox.exec("nft", "delete", "table", "inet", "theirs")
    sandbox.ofctl("add-flow", "table=3,priority=7,actions=drop")
    found = read_state(sandbox)
    with pytest.raises(AssertionError, match="flows: "):
        leave_as_found(sandbox, found)
