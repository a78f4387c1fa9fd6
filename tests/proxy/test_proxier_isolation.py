"""One Service port the switch refuses never holds back the others, and keeps its last good
state (real OVS; the refusal is made by one port whose objects carry a flow OVS rejects)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from ovsproxy.datapath import service_flows as svc
from ovsproxy.model import ServicePort
from ovsproxy.openflow import protocol as of
from ovsproxy.ovs.sandbox import Sandbox
from ovsproxy.proxy.proxier import Proxier
from tests.semantics.harness import World, endpoint, make_world

pytestmark = pytest.mark.ovs


class Refusal:
    """Adds a flow that Open vSwitch refuses (its action uses a group that does not exist:
    OFPBAC_BAD_OUT_GROUP) to the objects of a Service port in a given state: ``broken`` holds
    (Service name, endpoint address) pairs, or a bare name for every state. Installed as the
    proxier's ``_objects_for`` (its seam for this)."""

    def __init__(self, proxier: Proxier) -> None:
        self.broken: set[str | tuple[str, str]] = set()
        self.proxier = proxier
        self.objects_for = proxier._objects_for

    def __call__(self, port: ServicePort, sets: list[svc.FrontendSet]) -> svc.ServiceObjects:
        objects = self.objects_for(port, sets)
        addresses = {str(ep.ip) for fset in sets for ep in fset.endpoints}
        name = port.name.name
        wanted = {name, *((name, address) for address in addresses)}
        if not wanted & self.broken:
            return objects
        bad = of.FlowMod(
            self.proxier.ctx.tables.service_lb,
            1,
            of.Match(eth_type=0x0800, ip_proto=6, tcp_dst=port.port),
            actions=[of.GroupAction(0xFFFFFF00 - 7)],
            cookie=objects.flows[0].cookie,
        )
        return svc.ServiceObjects(objects.groups, (*objects.flows, bad))


@pytest.fixture
async def world(sandbox: Sandbox) -> AsyncIterator[World]:
    w = await make_world(sandbox)
    refusal = w.extra["refusal"] = Refusal(w.proxier)
    w.proxier._objects_for = refusal  # type: ignore[method-assign]
    yield w
    await w.semantics.close()
    await w.channel.close()


def refuse(world: World, *broken: str | tuple[str, str]) -> None:
    world.extra["refusal"].broken = set(broken)


async def test_a_refused_service_port_does_not_hold_back_the_others(world: World) -> None:
    client = world.pod("client", http_ports=())
    a = world.pod("a", http_ports=(8080,))
    b = world.pod("b", http_ports=(8080,))
    world.service("good", ["10.96.0.11"])
    world.endpoints("good", [endpoint(a)])
    world.service("bad", ["10.96.0.12"])
    world.endpoints("bad", [endpoint(b)])
    refuse(world, "bad")
    await world.sync()
    names = {str(n) for n in world.proxier.refused}
    assert names == {"default/bad:p/TCP"}
    assert "OFPBAC_BAD_OUT_GROUP" in next(iter(world.proxier.refused.values()))
    good = await world.http(client, "http://10.96.0.11/", 5)
    assert good["counts"] == {"a": 5}  # installed although its neighbour was refused
    assert "10.96.0.12" not in world.sandbox.ofctl("dump-flows")  # never good: not installed


async def test_a_refused_change_keeps_the_last_good_state(world: World) -> None:
    client = world.pod("client", http_ports=())
    a = world.pod("a", http_ports=(8080,))
    b = world.pod("b", http_ports=(8080,))
    world.service("web", ["10.96.0.21"])
    world.endpoints("web", [endpoint(a)])
    await world.sync()
    assert (await world.http(client, "http://10.96.0.21/", 5))["counts"] == {"a": 5}
    # The next change of web is refused by the switch: web keeps answering from a, and a
    # Service changed in the same sync still goes in.
    refuse(world, ("web", str(b.ipv4.ip)))  # web with b as endpoint
    world.endpoints("web", [endpoint(b)])
    world.service("other", ["10.96.0.22"])
    world.endpoints("other", [endpoint(b)])
    await world.sync()
    assert {str(n) for n in world.proxier.refused} == {"default/web:p/TCP"}
    assert (await world.http(client, "http://10.96.0.21/", 5))["counts"] == {"a": 5}
    assert (await world.http(client, "http://10.96.0.22/", 5))["counts"] == {"b": 5}
    # Fixed (whatever OVS disliked is gone): the next change of web applies and clears it.
    refuse(world)
    world.endpoints("web", [endpoint(a), endpoint(b)])
    await world.sync()
    assert not world.proxier.refused
    both = await world.http(client, "http://10.96.0.21/", 30)
    assert set(both["counts"]) == {"a", "b"}
