"""A Service without endpoints refuses at once, as kube-proxy's does: TCP connect gets
"connection refused" (our RST), UDP gets ICMP / ICMPv6 port unreachable (ECONNREFUSED on a
connected socket) — answered by the agent from a metered packet-in, out of the client's port."""

from __future__ import annotations

import asyncio
import re
import sys

import pytest

from ovsproxy.model import Protocol
from tests.semantics.harness import World, endpoint

pytestmark = [pytest.mark.ovs, pytest.mark.shared_sandbox]


async def test_no_endpoints_refuses_tcp_and_udp_at_once_v4_and_v6(world: World) -> None:
    client = world.pod("client", ipv6="fd00:10:244::20/64")
    web = world.pod("web", ipv6="fd00:10:244::21/64", http_ports=(8080,), udp_ports=(5353,))
    world.service("web", ["10.96.0.10", "fd00:10:96::10"], 80)
    world.service("dns", ["10.96.0.11", "fd00:10:96::11"], 53, protocol=Protocol.UDP)
    await world.sync()
    inst = world.proxier.services
    assert all(s.rejecting for s in inst.values())
    assert {s.status()["families"]["IPv4"]["action"] for s in inst.values()} == {"reject"}

    for url in ("http://10.96.0.10:80/", "http://[fd00:10:96::10]:80/"):
        result = await world.http(client, url, count=3, timeout=3.0)
        assert result["failures"] == {"refused": 3}, result
        assert result["max_latency_s"] < 1.0, result
    for host in ("10.96.0.11", "fd00:10:96::11"):
        result = await world.udp(client, host, 53, count=3, timeout=3.0)
        assert result["failures"] == {"refused": 3}, result
    stats = world.semantics.rejector.stats
    assert stats.by_protocol.get("tcp-rst", 0) >= 6
    assert stats.by_protocol.get("icmp", 0) >= 3 and stats.by_protocol.get("icmpv6", 0) >= 3
    assert stats.meter == "installed" and stats.send_errors == 0

    # With an endpoint, the same frontends answer.
    world.endpoints("web", [endpoint(web), endpoint(web, v6=True)])
    world.endpoints("dns", [endpoint(web, 5353), endpoint(web, 5353, v6=True)], Protocol.UDP)
    await world.sync()
    assert not any(s.rejecting for s in world.proxier.services.values())
    ok = await world.http(client, "http://[fd00:10:96::10]:80/", count=3)
    assert ok["counts"] == {"web": 3}, ok
    ok = await world.udp(client, "10.96.0.11", 53, count=3)
    assert ok["counts"] == {"web": 3}, ok


async def test_a_flood_is_metered_before_it_reaches_the_agent(world: World) -> None:
    client = world.pod("client")
    world.service("dns", ["10.96.0.12"], 53, protocol=Protocol.UDP)
    await world.sync()
    assert "meter=24177" in world.sandbox.ofctl("dump-meters")
    flood = (
        "import socket,time\n"
        "s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
        "t=time.monotonic()\n"
        "for i in range(3000):\n"
        "    s.sendto(b'x',('10.96.0.12',53))\n"
        "    if i % 50 == 49: time.sleep(0.02)\n"
        "print(time.monotonic()-t)\n"
    )
    # Paced (about 2,500/s for 1.2 s): a flood sent at once overflows the port's queue on a
    # busy machine before the switch reads it, and packets that never reach the meter say
    # nothing about it.
    started = asyncio.get_running_loop().time()
    await asyncio.to_thread(client.exec, sys.executable, "-c", flood)
    await asyncio.sleep(0.3)
    elapsed = asyncio.get_running_loop().time() - started
    stats = world.semantics.rejector.stats
    # The meter (100/s, burst 200) lets through at most burst + rate * time of 3000 packets.
    assert 0 < stats.packet_ins <= 200 + 100 * elapsed + 20, (stats, elapsed)
    metered = re.search(r"packet_in_count:(\d+)", world.sandbox.ofctl("meter-stats"))
    assert metered and int(metered.group(1)) > 3 * stats.packet_ins  # the rest was dropped


async def test_rejecting_survives_a_vswitchd_restart_meter_first(world: World) -> None:
    client = world.pod("client")
    world.service("web", ["10.96.0.13"], 80)
    await world.sync()
    connections = world.channel.connections
    await asyncio.to_thread(world.sandbox.restart_vswitchd)
    for _ in range(100):  # the channel reconnects; its hook installs the meter, then replays
        await asyncio.sleep(0.05)
        if world.channel.connections > connections and world.channel.connected:
            break
    assert world.channel.connected
    assert "meter=24177" in world.sandbox.ofctl("dump-meters")
    result = await world.http(client, "http://10.96.0.13:80/", count=3, timeout=3.0)
    assert result["failures"] == {"refused": 3}, result
    # The replayed reject flow is bound to the meter (it was added after the meter).
    stats = world.sandbox.ofctl("meter-stats")
    assert re.search(r"packet_in_count:[1-9]", stats), stats


@pytest.mark.parametrize("ask", [True, False], ids=["not-refused", "control"])
async def test_a_connection_that_meets_a_stale_reject_flow_is_not_refused(
    world: World, ask: bool
) -> None:
    """Open vSwitch applies a commit to its cached datapath flows only when its revalidators
    get to them. With them paused (``revalidator/pause``), the datapath still sends the
    frontend's SYN to the agent after the commit that gave it an endpoint: the agent does
    not refuse it, and once the revalidators ran the retransmitted SYN reaches the endpoint.
    The control: a rejector that does not ask the proxier refuses the connection."""
    client = world.pod("client")
    web = world.pod("web", http_ports=(8080,))
    world.service("web", ["10.96.0.12"], 80)
    await world.sync()
    refused = await world.http(client, "http://10.96.0.12:80/", count=2, timeout=1.0)
    assert refused["failures"] == {"refused": 2}, refused  # the reject flow is cached now
    if not ask:
        world.semantics.rejector.forwards = None
    world.sandbox.appctl("revalidator/pause")
    try:
        world.endpoints("web", [endpoint(web)])
        await world.sync()
        talk = asyncio.create_task(world.http(client, "http://10.96.0.12:80/", count=1))
        await asyncio.sleep(0.5)  # its first SYN met the stale flow
    finally:
        world.sandbox.appctl("revalidator/resume")
    await asyncio.to_thread(world.sandbox.appctl, "revalidator/wait")
    result = await talk
    stats = world.semantics.rejector.stats
    if ask:
        assert result["counts"] == {"web": 1}, (result["failures"], stats, result)
        assert result["retransmitted"] == 1 and stats.forwarding_now >= 1, (stats, result)
    else:
        assert result["failures"] == {"refused": 1}, result
