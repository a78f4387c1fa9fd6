"""A small node for the steering tests, all in namespaces the test creates::

    client ns  192.168.50.100, .200 / fd50::100, ::200   (two sources: allowed and denied)
        | veth
    node ns    eth0 192.168.50.1 / fd50::1   -- the table under test lives here
        | gw0 10.99.0.1 / fd99::1            (fwmark NODE_STEERING_MARK -> table 155 -> gw0)
    ovs ns     gw0p 10.99.0.2 / fd99::2, owns the virtual NodePort IPs and the LB/external
               IPs, runs the probe server: a stand-in for OVS answering from behind gw0

Deleting the namespaces removes everything (devices, routes, rules, nft tables, servers).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ovsproxy.datapath.pipeline import (
    NODE_STEERING_MARK,
    NODE_STEERING_ROUTE_TABLE,
    VIRTUAL_NODEPORT_IP,
)
from ovsproxy.model import IPFamily
from ovsproxy.ovs.namespaces import create_netns, delete_netns

PREFIX = "ovsp-cap-"
PROBE = Path(__file__).with_name("probe.py")
LB_V4, LB_V6 = "203.0.113.1", "2001:db8::1"
EXT_V4, EXT_V6 = "192.0.2.1", "2001:db8:2::1"


OVS_ADDRESSES = [
    str(VIRTUAL_NODEPORT_IP[IPFamily.IPv4]),
    str(VIRTUAL_NODEPORT_IP[IPFamily.IPv6]),
    LB_V4,
    LB_V6,
    EXT_V4,
    EXT_V6,
]


def sh(*args: str, check: bool = True) -> str:
    done = subprocess.run(args, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


@dataclass
class Node:
    tag: str
    servers: list[subprocess.Popen[str]] = field(default_factory=list)

    @property
    def node(self) -> str:
        return f"{PREFIX}{self.tag}-n"

    @property
    def client(self) -> str:
        return f"{PREFIX}{self.tag}-c"

    @property
    def ovs(self) -> str:
        return f"{PREFIX}{self.tag}-o"

    def run(self, netns: str, *args: str, check: bool = True) -> str:
        return sh("ip", "netns", "exec", netns, *args, check=check)

    def nft(self, *args: str, netns: str | None = None) -> str:
        return self.run(netns or self.node, "nft", *args)

    def load_nft(self, ruleset: str) -> None:
        """Someone else's tables, loaded into the node with ``nft -f -``."""
        cmd = ["ip", "netns", "exec", self.node, "nft", "-f", "-"]
        subprocess.run(cmd, input=ruleset, text=True, check=True)

    def serve(self, port: int) -> None:
        proc = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                self.ovs,
                sys.executable,
                str(PROBE),
                "serve",
                str(port),
                *OVS_ADDRESSES,
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        self.servers.append(proc)

    def connect(
        self, netns: str, host: str, port: int, source: str | None = None, udp: bool = False
    ) -> str:
        args = [sys.executable, str(PROBE), "connect", host, str(port)]
        if source:
            args.append(source)
        if udp:
            args.append("udp")
        return self.run(netns, *args).strip()


def _build(n: Node) -> None:
    for ns in (n.node, n.client, n.ovs):
        create_netns(ns)  # recorded first: a killed run's namespaces are swept
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        for key in ("net.ipv6.conf.all.accept_dad", "net.ipv6.conf.default.accept_dad"):
            n.run(ns, "sysctl", "-qw", f"{key}=0")
    for key in ("net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"):
        n.run(n.node, "sysctl", "-qw", key)
    # Replies from behind gw0 come from addresses only the fwmark table routes there.
    for dev in ("all", "default"):
        n.run(n.node, "sysctl", "-qw", f"net.ipv4.conf.{dev}.rp_filter=0")
    sh("ip", "-n", n.node, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0c")
    sh("ip", "-n", n.node, "link", "set", "eth0c", "netns", n.client)
    sh("ip", "-n", n.node, "link", "add", "gw0", "type", "veth", "peer", "name", "gw0p")
    sh("ip", "-n", n.node, "link", "set", "gw0p", "netns", n.ovs)
    for ns, dev, addrs in (
        (n.node, "eth0", ["192.168.50.1/24", "fd50::1/64"]),
        (
            n.client,
            "eth0c",
            ["192.168.50.100/24", "192.168.50.200/24", "fd50::100/64", "fd50::200/64"],
        ),
        (n.node, "gw0", ["10.99.0.1/30", "fd99::1/64"]),
        (n.ovs, "gw0p", ["10.99.0.2/30", "fd99::2/64"]),
    ):
        for addr in addrs:
            sh("ip", "-n", ns, "addr", "add", addr, "dev", dev, *(["nodad"] if ":" in addr else []))
        sh("ip", "-n", ns, "link", "set", dev, "up")
    for addr in OVS_ADDRESSES:
        sh("ip", "-n", n.ovs, "addr", "add", addr, "dev", "lo")
    sh("ip", "-n", n.ovs, "route", "add", "default", "via", "10.99.0.1")
    sh("ip", "-n", n.ovs, "-6", "route", "add", "default", "via", "fd99::1")
    for route in ((LB_V4, "192.168.50.1"), (EXT_V4, "192.168.50.1")):
        sh("ip", "-n", n.client, "route", "add", route[0], "via", route[1])
    for route in ((LB_V6, "fd50::1"), (EXT_V6, "fd50::1")):
        sh("ip", "-n", n.client, "-6", "route", "add", route[0], "via", route[1])
    # What the routes layer will install: one rule and one route per family.
    table = str(NODE_STEERING_ROUTE_TABLE)
    mark = f"{NODE_STEERING_MARK:#x}/{NODE_STEERING_MARK:#x}"
    for fam, via in (("-4", "10.99.0.2"), ("-6", "fd99::2")):
        sh("ip", "-n", n.node, fam, "rule", "add", "fwmark", mark, "lookup", table)
        sh(
            "ip",
            "-n",
            n.node,
            fam,
            "route",
            "add",
            "default",
            "via",
            via,
            "dev",
            "gw0",
            "table",
            table,
        )


def _sweep() -> None:
    run_dir = Path("/run/netns")
    if not run_dir.exists():
        return
    for entry in run_dir.iterdir():
        if entry.name.startswith(PREFIX):
            pid = entry.name[len(PREFIX) :].split("-")[0]
            if pid.isdigit() and int(pid) != os.getpid() and not Path(f"/proc/{pid}").exists():
                sh("ip", "netns", "del", entry.name, check=False)


@pytest.fixture
def node() -> Iterator[Node]:
    if os.geteuid() != 0:
        pytest.skip("needs root to create network namespaces")
    _sweep()
    n = Node(f"{os.getpid()}-{uuid.uuid4().hex[:6]}")
    try:
        _build(n)
        yield n
    finally:
        for proc in n.servers:
            proc.terminate()
            proc.wait(timeout=5)
        for ns in (n.node, n.client, n.ovs):
            delete_netns(ns)
