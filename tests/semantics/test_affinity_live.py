"""ClientIP session affinity end to end: stickiness, an idle timer refreshed by new
connections (kube-proxy's ``recent`` semantics), expiry, and moving at once when the endpoint
goes away while other clients keep theirs."""

from __future__ import annotations

import asyncio
import re

import pytest

from ovsproxy.datapath import pipeline as pl
from tests.semantics.harness import World, endpoint, make_world

pytestmark = [pytest.mark.ovs, pytest.mark.shared_sandbox]

URL = "http://10.96.0.20:80/"


def sole(result: dict) -> str:
    assert result["failed"] == 0, result
    assert len(result["counts"]) == 1, result
    return next(iter(result["counts"]))


def duration(flow: str) -> float:
    m = re.search(r"duration=([\d.]+)s", flow)
    assert m, flow
    return float(m.group(1))


async def three_backends(world: World, affinity: int) -> list:
    pods = [world.pod(f"web-{i}", http_ports=(8080,)) for i in range(3)]
    world.service("web", ["10.96.0.20"], 80, affinity=affinity)
    world.endpoints("web", [endpoint(p) for p in pods])
    await world.sync()
    return pods


async def test_affinity_sticks_refreshes_on_new_connections_and_expires(world: World) -> None:
    client = world.pod("client")
    await three_backends(world, affinity=2)
    inst = world.proxier.services[next(iter(world.proxier.services))]
    assert "OVS idle_timeout" in inst.status()["affinity"]
    assert "selection_method=hash" in world.sandbox.ofctl("dump-groups")

    first = sole(await world.http(client, URL, count=20))
    (flow,) = world.learned_flows()
    assert "idle_timeout=2" in flow and "hard_timeout" not in flow
    assert f"cookie={pl.learned_cookie(2):#x}" in flow

    # A new connection every 0.9 s keeps the timer from running out: after 3 s (> 2 s) it
    # is the same learned flow, and the client has not moved.
    for _ in range(3):
        await asyncio.sleep(0.9)
        assert sole(await world.http(client, URL, count=1)) == first
    (same,) = world.learned_flows()
    assert duration(same) > 2.5, same

    # Idle for longer than the timeout: the learned flow expires; the next connection is
    # balanced afresh (a new learned flow) and sticks again.
    for _ in range(40):
        await asyncio.sleep(0.25)
        if not world.learned_flows():
            break
    assert world.learned_flows() == []
    sole(await world.http(client, URL, count=20))
    (fresh,) = world.learned_flows()
    assert duration(fresh) < 2.0


@pytest.mark.slow
async def test_after_the_timeout_a_client_can_land_elsewhere(world: World) -> None:
    client = world.pod("client")
    await three_backends(world, affinity=1)
    seen = {sole(await world.http(client, URL, count=5))}
    for _ in range(10):  # P(never moving) = (1/3)**10
        for _ in range(40):
            await asyncio.sleep(0.2)
            if not world.learned_flows():
                break
        seen.add(sole(await world.http(client, URL, count=5)))
        if len(seen) > 1:
            break
    assert len(seen) > 1, seen


async def test_removing_the_sticky_endpoint_moves_the_client_at_once(world: World) -> None:
    clients = [world.pod(f"client-{i}") for i in range(3)]
    pods = await three_backends(world, affinity=600)
    stuck = {c.name: sole(await world.http(c, URL, count=5)) for c in clients}
    assert len(world.learned_flows()) == 3
    gone = stuck["client-0"]
    world.endpoints("web", [endpoint(p) for p in pods if p.name != gone])
    await world.sync()

    moved = sole(await world.http(clients[0], URL, count=20))
    assert moved != gone
    # The others keep their endpoint (unless it was the one that left: then they move too).
    for c in clients[1:]:
        now = sole(await world.http(c, URL, count=5))
        if stuck[c.name] != gone:
            assert now == stuck[c.name]
        else:
            assert now != gone
    # client-0 learned its new endpoint (one flow per client, same frontend).
    assert len(world.learned_flows()) == 3


async def test_affinity_above_the_ovs_limit_is_expired_by_the_agent(sandbox) -> None:
    # The OVS limit lowered to 1 s, so a 2 s timeout takes the agent's path in seconds.
    world = await make_world(sandbox, max_ovs_timeout=1)
    try:
        client = world.pod("client")
        await three_backends(world, affinity=2)
        inst = next(iter(world.proxier.services.values()))
        assert "expired by the agent" in inst.status()["affinity"]
        first = sole(await world.http(client, URL, count=10))
        (flow,) = world.learned_flows()
        assert "idle_timeout" not in flow
        assert f"cookie={pl.learned_cookie(2, swept=True):#x}" in flow
        sweeper = world.semantics.sweeper
        assert await sweeper.sweep_once() == 0  # idle for less than 2 s
        await asyncio.sleep(1.2)
        assert sole(await world.http(client, URL, count=1)) == first  # refreshes the idle age
        await asyncio.sleep(1.2)
        assert await sweeper.sweep_once() == 0  # 1.2 s idle: kept
        await asyncio.sleep(1.5)
        assert await sweeper.sweep_once() == 1
        assert world.learned_flows() == []
        assert sweeper.stats.deleted == 1
    finally:
        await world.semantics.close()
        await world.channel.close()
