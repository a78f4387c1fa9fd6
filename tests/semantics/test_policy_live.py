"""internalTrafficPolicy Local and UDP endpoint removal, end to end."""

from __future__ import annotations

import asyncio

import pytest

from ovsproxy.model import Protocol, TrafficPolicy
from ovsproxy.ovs.traffic import TCP_TIMEOUT_S
from tests.semantics.harness import NODE, World, endpoint

pytestmark = [pytest.mark.ovs, pytest.mark.shared_sandbox]

OTHER = "node-b"


async def test_internal_traffic_policy_local(world: World) -> None:
    client = world.pod("client")
    local = world.pod("local", http_ports=(8080,))
    remote = [world.pod(f"remote-{i}", http_ports=(8080,)) for i in range(2)]
    # Every pod runs in this sandbox; the EndpointSlice says which node each is on.
    world.service("web", ["10.96.0.30"], 80, itp=TrafficPolicy.LOCAL)
    world.endpoints("web", [endpoint(local, node=NODE), *(endpoint(p, node=OTHER) for p in remote)])
    world.service("cluster", ["10.96.0.31"], 80)
    world.endpoints(
        "cluster", [endpoint(local, node=NODE), *(endpoint(p, node=OTHER) for p in remote)]
    )
    await world.sync()
    result = await world.http(client, "http://10.96.0.30:80/", count=20)
    assert result["counts"] == {"local": 20}, result
    # The same endpoints without the policy: all three answer.
    both = await world.http(client, "http://10.96.0.31:80/", count=30)
    assert set(both["counts"]) == {"local", "remote-0", "remote-1"}, both

    status = next(s for n, s in world.proxier.services.items() if n.name == "web").status()
    v4 = status["families"]["IPv4"]
    assert v4["action"] == "forward" and v4["endpoints"] == [str(endpoint(local))]
    assert set(v4["excluded"].values()) == {"on another node (internalTrafficPolicy Local)"}

    # No endpoint on this node: dropped (endpoints exist elsewhere, so no reject).
    world.endpoints(
        "web", [endpoint(local, node=OTHER), *(endpoint(p, node=OTHER) for p in remote)]
    )
    await world.sync()
    failed = await world.http(client, "http://10.96.0.30:80/", count=2, timeout=0.5)
    assert failed["failures"] == {"timeout": 2}, failed
    inst = next(s for n, s in world.proxier.services.items() if n.name == "web")
    assert inst.dropping and not inst.rejecting
    assert inst.status()["families"]["IPv4"]["reason"].startswith("internalTrafficPolicy Local")


@pytest.mark.parametrize("mode", ["openflow", "appctl"])
async def test_udp_client_moves_on_its_next_datagram_when_its_endpoint_goes(
    world: World, mode: str
) -> None:
    if mode == "appctl":  # the fallback for OVS < 3.1, forced

        async def appctl(args):
            return await asyncio.to_thread(world.sandbox.appctl, *args)

        world.semantics.conntrack.appctl = appctl
        world.semantics.conntrack.stats.mode = "appctl"
    client = world.pod("client")
    old = world.pod("old", udp_ports=(5353,))
    new = world.pod("new", udp_ports=(5353,))
    world.service("dns", ["10.96.0.40"], 53, protocol=Protocol.UDP)
    world.endpoints("dns", [endpoint(old, 5353)], Protocol.UDP)
    await world.sync()

    # One socket (one conntrack entry), a datagram every 0.1 s; the servers both keep running,
    # so only a flushed conntrack entry makes the client change endpoint.
    talk = asyncio.create_task(world.udp(client, "10.96.0.40", 53, count=30, interval=0.1))
    await asyncio.sleep(1.2)
    world.endpoints("dns", [endpoint(new, 5353)], Protocol.UDP)
    await world.sync()
    result = await talk
    answers = [a.split(":")[0] for a in result["answers"]]
    assert answers[0] == "old" and answers[-1] == "new", answers
    switch = answers.index("new")
    assert set(answers[switch:]) == {"new"}, answers  # no datagram went back to "old"
    assert result["failed"] <= 1, result
    stats = world.semantics.conntrack.stats
    assert stats.mode == mode and stats.failures == 0, stats
    assert (stats.messages if mode == "openflow" else stats.appctl_entries) >= 1
    inst = next(iter(world.proxier.services.values()))
    assert inst.status()["conntrack_flushes"] == 1


async def test_without_a_flush_the_udp_client_stays_on_the_removed_endpoint(world: World) -> None:
    """The control experiment: what the flush prevents."""
    world.semantics.conntrack.stats.mode = "unsupported"
    client = world.pod("client")
    old = world.pod("old", udp_ports=(5353,))
    new = world.pod("new", udp_ports=(5353,))
    world.service("dns", ["10.96.0.40"], 53, protocol=Protocol.UDP)
    world.endpoints("dns", [endpoint(old, 5353)], Protocol.UDP)
    await world.sync()
    talk = asyncio.create_task(world.udp(client, "10.96.0.40", 53, count=15, interval=0.1))
    await asyncio.sleep(0.8)
    world.endpoints("dns", [endpoint(new, 5353)], Protocol.UDP)
    await world.sync()
    result = await talk
    assert set(result["counts"]) == {"old"}, result
    stats = world.semantics.conntrack.stats
    # The new frontend's untranslated entries, then the removed pair: asked for, not sent.
    assert stats.requests == 2 and stats.messages == 0, stats
    assert stats.recent == [f"UDP 10.96.0.40:53 -> {old.ipv4.ip}:5353 (zone 65520)"], stats


@pytest.mark.parametrize("flush", [True, False], ids=["flushed", "control"])
async def test_a_udp_client_that_sent_before_the_frontend_existed_reaches_it(
    world: World, flush: bool
) -> None:
    """A datagram to an address that is not yet a frontend is committed as a plain
    connection. From the same source port after the Service port appears: without the flush
    of the frontend's untranslated entries, conntrack's second datagram of that tuple is
    "new" (the group picks) but not NATed, later ones are established; every one is lost."""
    if not flush:
        world.semantics.conntrack.stats.mode = "unsupported"
    client = world.pod("client")
    dns = world.pod("dns", udp_ports=(5353,))
    await world.sync()  # the pipeline, no Service yet
    before = await world.udp(client, "10.96.0.42", 53, count=1, timeout=0.3, source_port=40053)
    assert before["failed"] == 1, before  # no Service yet
    world.service("dns", ["10.96.0.42"], 53, protocol=Protocol.UDP)
    world.endpoints("dns", [endpoint(dns, 5353)], Protocol.UDP)
    await world.sync()
    after = await world.udp(client, "10.96.0.42", 53, count=3, source_port=40053)
    stats = world.semantics.conntrack.stats
    if flush:
        assert after["counts"] == {"dns": 3}, after
        assert "UDP 10.96.0.42:53 -> itself (untranslated) (zone 65520)" in stats.recent
    else:
        assert after["failed"] == 3, after


@pytest.mark.parametrize("flush", [True, False], ids=["flushed", "control"])
async def test_a_tcp_connect_begun_before_the_frontend_existed_completes(
    world: World, flush: bool
) -> None:
    """The SYN of a connect() that began before the Service port existed was committed as a
    plain connection (SYN_SENT); the retransmitted SYN, or a new socket on the same source
    port, is then established in conntrack and never translated. With the flush it is new."""
    if not flush:
        world.semantics.conntrack.stats.mode = "unsupported"
    client = world.pod("client")
    web = world.pod("web", http_ports=(8080,))
    await world.sync()
    url = "http://10.96.0.43:80/"
    before = await world.http(client, url, count=1, timeout=0.3, source_port=40080)
    assert before["failures"] == {"timeout": 1}, before
    world.service("web", ["10.96.0.43"], 80)
    world.endpoints("web", [endpoint(web, 8080)])
    await world.sync()
    timeout = TCP_TIMEOUT_S if flush else 1.5
    after = await world.http(client, url, count=1, timeout=timeout, source_port=40080)
    if flush:
        assert after["counts"] == {"web": 1}, after
    else:
        assert after["failures"] == {"timeout": 1}, after
