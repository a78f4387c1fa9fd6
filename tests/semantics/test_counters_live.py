"""Live traffic counters (``agent.counters``) on a real switch: new connections of known count
from a pod to several Services, read back from the switch's group statistics, equal what was
sent, per Service port and per endpoint; the skew signal flags a Service whose group lost an
endpoint's bucket by hand."""

from __future__ import annotations

import pytest

from ovsproxy.agent.counters import CounterPoller, skew
from ovsproxy.datapath.service_flows import endpoint_key
from ovsproxy.model import Protocol
from tests.semantics.harness import NODE, NS, World, endpoint

pytestmark = [pytest.mark.ovs, pytest.mark.shared_sandbox]

NAMES = ("ep-0", "ep-1", "ep-2")


async def test_connections_per_service_and_endpoint_equal_what_was_sent(world: World) -> None:
    client = world.pod("client")
    servers = [world.pod(n, http_ports=(8080,), udp_ports=(5353,)) for n in NAMES]
    world.service("web", ["10.96.0.60"], 80)
    world.endpoints("web", [endpoint(p) for p in servers])
    world.service("api", ["10.96.0.61"], 80)
    world.endpoints("api", [endpoint(p) for p in servers])
    world.service("dns", ["10.96.0.62"], 53, protocol=Protocol.UDP)
    world.endpoints("dns", [endpoint(p, 5353) for p in servers], Protocol.UDP)
    await world.sync()
    poller = CounterPoller(
        world.channel, lambda: world.proxier.programmed, lambda: world.datapath.installed_groups
    )
    before = await poller.poll()
    assert set(before.ports.values()) == {0}

    # api's group loses ep-2's bucket by hand (the agent does not know).
    api = next(i for n, i in world.proxier.programmed.items() if n.name == "api")
    (group_id,) = api.group_ids.values()
    ep2 = servers[2]
    assert ep2.ipv4 is not None
    bucket = world.datapath.installed_groups[group_id].ids[endpoint_key(ep2.ipv4.ip, 8080)]
    world.sandbox.ofctl(
        "remove-buckets", f"group_id={group_id},command_bucket_id={bucket}", "-O", "OpenFlow15"
    )

    web = await world.http(client, "http://10.96.0.60:80/", count=45)
    api_sent = await world.http(client, "http://10.96.0.61:80/", count=30)
    dns = await world.udp(client, "10.96.0.62", 53, count=12, new_socket=True)
    for sent in (web, api_sent, dns):
        assert sent["failed"] == 0, sent
    after = await poller.poll()
    assert after.exact

    def port(name: str, protocol: str = "TCP") -> int:
        return after.ports[NS, name, "p", protocol]

    assert (port("web"), port("api"), port("dns", "UDP")) == (45, 30, 12)
    # Per endpoint, what each server answered (it names itself).
    for service, sent, protocol in (("web", web, "TCP"), ("api", api_sent, "TCP")):
        for name, pod in zip(NAMES, servers, strict=True):
            labels = (NS, service, "p", protocol, f"{pod.ipv4.ip}:8080", NODE)  # type: ignore[union-attr]
            counted = after.endpoints[labels]
            assert counted == sent["counts"].get(name, 0), (service, name, after.endpoints)
    for name, pod in zip(NAMES, servers, strict=True):
        labels = (NS, "dns", "p", "UDP", f"{pod.ipv4.ip}:5353", NODE)  # type: ignore[union-attr]
        assert after.endpoints[labels] == dns["counts"].get(name, 0), after.endpoints

    # Skew: api's ep-2 got none of its share (1/3); web's endpoints are near theirs.
    skews = skew(after, {})
    assert skews[NS, "api", "p", "TCP"] >= 1 / 3 - 1e-9, skews
    assert skews[NS, "web", "p", "TCP"] < 0.3, (skews, web)
