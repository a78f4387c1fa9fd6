"""Per-connection balancing of select groups, end to end: every new connection (5-tuple) is
its own choice for TCP, UDP and SCTP, IPv4 and IPv6, and inserting a bucket moves only the
connections that the new bucket wins (the reason for the ``hash`` selection method).

Without hash ``fields``, Open vSwitch's default hash leaves UDP ports out: one client then
reaches one endpoint however many sockets it uses (issue 13)."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from ovsproxy.model import Protocol
from ovsproxy.ovs.sandbox import Pod
from tests.semantics.harness import World, endpoint

pytestmark = [pytest.mark.ovs, pytest.mark.shared_sandbox]

NAMES = ("ep-0", "ep-1", "ep-2")


def _pods(world: World, udp: bool = True) -> tuple[Pod, list[Pod]]:
    client = world.pod("client", ipv6="fd00:10:244::20/64")
    servers = [
        world.pod(
            name,
            ipv6=f"fd00:10:244::{0x21 + i:x}/64",
            http_ports=(8080,),
            udp_ports=(5353,) if udp else (),
        )
        for i, name in enumerate(NAMES)
    ]
    return client, servers


@pytest.mark.parametrize("v6", [False, True], ids=["ipv4", "ipv6"])
async def test_udp_and_tcp_from_distinct_sockets_reach_every_endpoint(
    world: World, v6: bool
) -> None:
    client, servers = _pods(world)
    cluster_ip = "fd00:10:96::50" if v6 else "10.96.0.50"
    world.service("dns", [cluster_ip], 53, protocol=Protocol.UDP)
    world.endpoints("dns", [endpoint(p, 5353, v6=v6) for p in servers], Protocol.UDP)
    world.service("web", [cluster_ip], 80)
    world.endpoints("web", [endpoint(p, v6=v6) for p in servers])
    await world.sync()

    # 40 datagrams, each from a new socket (a new source port, a new conntrack entry): with
    # three endpoints, each misses all 40 with probability (2/3)^40, about 1e-7.
    udp = await world.udp(client, cluster_ip, 53, count=40, new_socket=True)
    assert udp["failed"] == 0, udp
    assert set(udp["counts"]) == set(NAMES), (udp, world.sandbox.ofctl("dump-groups"))
    url = f"http://[{cluster_ip}]:80/" if v6 else f"http://{cluster_ip}:80/"
    tcp = await world.http(client, url, count=40)
    assert tcp["failed"] == 0, tcp
    assert set(tcp["counts"]) == set(NAMES), tcp


_UDP_FROM_PORTS = """
import json, socket, sys
host, first, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
family = socket.AF_INET6 if ":" in host else socket.AF_INET
answers = {}
for sport in range(first, first + n):
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("", sport))
        s.settimeout(2.0)
        s.sendto(b"ping", (host, 53))
        answers[sport] = s.recv(64).decode().split(":")[0]
print(json.dumps(answers))
"""


async def _udp_from_ports(world: World, client: Pod, host: str, first: int, n: int) -> dict:
    out = await asyncio.to_thread(
        world.sandbox.exec,
        "ip",
        "netns",
        "exec",
        client.netns,
        "python3",
        "-c",
        _UDP_FROM_PORTS,
        host,
        str(first),
        str(n),
    )
    return {int(k): v for k, v in json.loads(out.stdout).items()}


@pytest.mark.parametrize("v6", [False, True], ids=["ipv4", "ipv6"])
async def test_inserting_a_bucket_moves_only_the_connections_it_wins(
    world: World, v6: bool
) -> None:
    """Connections alive across an endpoint's insertion keep their endpoints; and the same
    5-tuples as new connections (their conntrack entries flushed, so the group selects
    again) each keep their endpoint or go to the new one."""
    client, servers = _pods(world)
    cluster_ip = "fd00:10:96::51" if v6 else "10.96.0.51"
    world.service("dns", [cluster_ip], 53, protocol=Protocol.UDP)
    world.endpoints("dns", [endpoint(p, 5353, v6=v6) for p in servers[:2]], Protocol.UDP)
    await world.sync()
    before = await _udp_from_ports(world, client, cluster_ip, 41000, 40)
    assert set(before.values()) == set(NAMES[:2]), before  # balanced per source port

    world.endpoints("dns", [endpoint(p, 5353, v6=v6) for p in servers], Protocol.UDP)
    result = await world.proxier.sync()
    # One INSERT_BUCKET, not a MODIFY (which would carry the group whole).
    assert (result.commit.group_messages, result.commit.groups_incremental) == (1, 1)
    alive = await _udp_from_ports(world, client, cluster_ip, 41000, 40)
    assert alive == before
    await asyncio.to_thread(world.sandbox.appctl, "dpctl/flush-conntrack")
    after = await _udp_from_ports(world, client, cluster_ip, 41000, 40)
    moved = {p: (before[p], after[p]) for p in before if before[p] != after[p]}
    assert all(new == NAMES[2] for _, new in moved.values()), moved
    assert moved, after  # the new endpoint wins some: about a third of them


def _trace(world: World, flow: str) -> str:
    return world.sandbox.appctl("ofproto/trace", world.sandbox.bridge, flow, "--ct-next", "trk,new")


_NAT = re.compile(r"nat\(dst=\[?([0-9a-f.:]+?)\]?:5353\)")


@pytest.mark.parametrize("v6", [False, True], ids=["ipv4", "ipv6"])
async def test_sctp_connections_are_balanced_by_their_ports(world: World, v6: bool) -> None:
    """No SCTP sockets on this kernel: Open vSwitch's own packet trace shows which endpoint
    the group picks for SCTP connections that differ only in their source port."""
    client, servers = _pods(world, udp=False)
    cluster_ip = "fd00:10:96::52" if v6 else "10.96.0.52"
    world.service("sig", [cluster_ip], 53, protocol=Protocol.SCTP)
    world.endpoints("sig", [endpoint(p, 5353, v6=v6) for p in servers], Protocol.SCTP)
    await world.sync()
    if v6:
        src, dst = f"ipv6_src={client.ipv6.ip},ipv6_dst={cluster_ip}", "sctp6"  # type: ignore[union-attr]
    else:
        src, dst = f"nw_src={client.ipv4.ip},nw_dst={cluster_ip}", "sctp"
    chosen = {}
    for sport in range(42000, 42030):
        flow = f"in_port={client.ofport},{dst},dl_src={client.mac},{src}"
        flow += f",sctp_src={sport},sctp_dst=53"
        trace = await asyncio.to_thread(_trace, world, flow)
        actions = [line for line in trace.splitlines() if line.startswith("Datapath actions:")]
        found = _NAT.findall("\n".join(actions))
        assert found, trace
        chosen[sport] = found[0]
    expected = {str(p.ipv6.ip if v6 else p.ipv4.ip) for p in servers}  # type: ignore[union-attr]
    assert set(chosen.values()) == expected, chosen
