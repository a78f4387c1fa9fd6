"""The host-SNAT address: its derivation (pure, with hypothesis) and its neighbour entry on a
real gateway in a namespace the test creates (read back with iproute2, not the code under
test); the gateway's reverse-path filter check."""

from __future__ import annotations

import asyncio
import io
import ipaddress
import json
import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from ovsproxy.agent.hostsnat import HOST_SNAT_PATHS, HostSNAT
from ovsproxy.agent.nodeport import NodeIngress
from ovsproxy.agent.observability import StatusPages, register_metrics
from ovsproxy.agent.pods import PodWatcher
from ovsproxy.agent.wiring import Components
from ovsproxy.cli.status_cmd import render_status
from ovsproxy.config import AgentConfig, load
from ovsproxy.healthcheck import ProxyHealth
from ovsproxy.metrics import HealthState, Metrics
from ovsproxy.model import IPFamily, IPNetwork
from ovsproxy.model.hostsnat import (
    choose_host_snat,
    connected_prefixes,
    host_snat_address,
)
from ovsproxy.model.node import VIRTUAL_MAC, PodPort
from ovsproxy.routes import RouteManager, rpfilter
from ovsproxy.routes.linux import LinuxRouteBackend
from tests.routes.conftest import Netns

V4, V6 = IPFamily.IPv4, IPFamily.IPv6
ip = ipaddress.ip_address
net = ipaddress.ip_network


@st.composite
def pod_cidrs(draw: st.DrawFn) -> IPNetwork:
    version = draw(st.sampled_from([4, 6]))
    bits = 32 if version == 4 else 128
    prefix = draw(st.integers(0 if version == 4 else 8, bits))
    value = draw(st.integers(0, 2**bits - 1))
    kind = ipaddress.IPv4Network if version == 4 else ipaddress.IPv6Network
    return kind((value, prefix), strict=False)


@given(pod_cidrs())
def test_the_reservation_is_inside_below_the_last_address_or_refused(cidr: IPNetwork) -> None:
    if cidr.num_addresses < 4:
        with pytest.raises(ValueError, match=f"pod CIDR {cidr} has .* too small"):
            host_snat_address(cidr)
        return
    address = host_snat_address(cidr)
    assert address in cidr
    assert int(address) == int(cidr.broadcast_address) - 1  # the documented position
    assert address not in (cidr.network_address, cidr.broadcast_address)


def test_the_reservation_of_the_lab_and_readme_cidrs() -> None:
    assert host_snat_address(net("10.244.1.0/24")) == ip("10.244.1.254")
    assert host_snat_address(net("fd00:10:244:1::/64")) == ip("fd00:10:244:1:ffff:ffff:ffff:fffe")


def test_choose_refuses_an_address_a_pod_or_the_gateway_has() -> None:
    cidrs = [net("10.244.1.0/24"), net("fd00:10:244:1::/64")]
    chosen = choose_host_snat(V4, override=None, pod_cidrs=cidrs, gateway_ips=[], pod_ips=[])
    assert chosen.address == ip("10.244.1.254") and chosen.origin == "pod CIDR 10.244.1.0/24"
    taken = choose_host_snat(
        V4, override=None, pod_cidrs=cidrs, gateway_ips=[], pod_ips=[ip("10.244.1.254")]
    )
    assert taken.address is None and "10.244.1.254 is used by a local pod" in taken.reason
    gateway = choose_host_snat(
        V4, override=None, pod_cidrs=cidrs, gateway_ips=[ip("10.244.1.254")], pod_ips=[]
    )
    assert gateway.address is None and "the gateway's own address" in gateway.reason
    none = choose_host_snat(V6, override=None, pod_cidrs=cidrs[:1], gateway_ips=[], pod_ips=[])
    assert none.address is None and none.reason == "no IPv6 pod CIDR known for this node"
    flag = choose_host_snat(
        V4, override=ip("10.244.1.200"), pod_cidrs=cidrs, gateway_ips=[], pod_ips=[]
    )
    assert flag.address == ip("10.244.1.200") and flag.origin == "--host-snat-ip"


def test_connected_prefixes_skip_link_local_and_duplicates() -> None:
    found = connected_prefixes(
        [
            ipaddress.ip_interface("10.244.1.1/24"),
            ipaddress.ip_interface("10.244.1.2/24"),
            ipaddress.ip_interface("fe80::1/64"),
            ipaddress.ip_interface("fd00:10:244:1::1/64"),
        ]
    )
    assert found == [net("10.244.1.0/24"), net("fd00:10:244:1::/64")]


# -- live: the gateway of a namespace ---------------------------------------------------------
def _neigh(ns: Netns, family: int) -> dict[str, dict]:
    out = ns.ip("-j", f"-{family}", "neigh", "show", "dev", ns.gateway).stdout
    return {n["dst"]: n for n in json.loads(out or "[]")}


def _address_gateway(ns: Netns) -> None:
    ns.ip("addr", "add", "10.244.1.1/24", "dev", ns.gateway)
    ns.ip("addr", "add", "fd00:10:244:1::1/64", "dev", ns.gateway, "nodad")


def _agent(ns: Netns, **flags: object) -> HostSNAT:
    return HostSNAT(load(gateway=ns.gateway, netns=ns.name, **flags), ns.name)


def test_the_agent_derives_installs_and_cleans_up_its_neighbour_entries(netns: Netns) -> None:
    _address_gateway(netns)
    netns.ip("neigh", "add", "10.244.1.7", "lladdr", "02:00:00:00:00:07", "dev", netns.gateway)

    async def run() -> tuple[tuple[object, ...], list[object], list[str]]:
        host_snat = _agent(netns)
        try:
            addresses = await host_snat.start([])
            unserved = host_snat.unserved([])
            removed = await host_snat.cleanup()
            assert len(removed) == 2, removed
            again = await host_snat.routes.remove(list(addresses))  # twice: a no-op
            return addresses, unserved, again
        finally:
            await host_snat.close()

    snat4, snat6 = ip("10.244.1.254"), ip("fd00:10:244:1:ffff:ffff:ffff:fffe")

    async def installed() -> tuple[object, ...]:
        host_snat = _agent(netns)
        try:
            return await host_snat.start([])
        finally:
            await host_snat.close()

    assert asyncio.run(installed()) == (snat4, snat6)
    for family, address in ((4, snat4), (6, snat6)):
        entry = _neigh(netns, family)[str(address)]
        assert entry["lladdr"] == VIRTUAL_MAC and "PERMANENT" in entry["state"], entry
    # Connected through the gateway's prefixes: no host route is added.
    assert not [r for r in netns.routes() if r.get("protocol") == "155"], netns.routes()

    addresses, unserved, again = asyncio.run(run())  # a second start: nothing to change
    assert addresses == (snat4, snat6) and unserved == [] and again == []
    assert str(snat4) not in _neigh(netns, 4) and str(snat6) not in _neigh(netns, 6)
    assert "10.244.1.7" in _neigh(netns, 4)  # someone else's entry stays


def test_an_override_outside_the_gateway_prefixes_gets_a_host_route(netns: Netns) -> None:
    _address_gateway(netns)

    async def run() -> None:
        host_snat = _agent(netns, host_snat_ip=["10.250.0.9"])
        try:
            assert await host_snat.start([]) == (
                ip("10.250.0.9"),
                ip("fd00:10:244:1:ffff:ffff:ffff:fffe"),
            )
            routes = [r for r in netns.routes(V4) if r.get("protocol") == "155"]
            assert [r["dst"] for r in routes] == ["10.250.0.9"], routes
            # The Service route manager on the same gateway leaves it alone (not a stale route).
            manager = RouteManager(LinuxRouteBackend(netns=netns.name), netns.gateway, [V4])
            await manager.start()
            changes = await manager.reconcile([net("10.96.0.0/16")])
            await manager.stop()
            assert changes.added == (net("10.96.0.0/16"),) and changes.deleted == ()
            ours = {r["dst"] for r in netns.routes(V4) if r.get("protocol") == "155"}
            assert "10.250.0.9" in ours, ours
            await host_snat.cleanup()
            assert "10.250.0.9" not in {r["dst"] for r in netns.routes(V4)}
        finally:
            await host_snat.close()

    asyncio.run(run())


def test_a_pod_on_the_reserved_address_is_refused_and_reported(netns: Netns) -> None:
    _address_gateway(netns)
    pod = PodPort("veth1", 2, "squatter", "default", (ip("10.244.1.254"),), "02:00:00:00:00:01")

    async def run() -> HostSNAT:
        host_snat = _agent(netns)
        try:
            await host_snat.start([pod])
            return host_snat
        finally:
            await host_snat.close()

    host_snat = asyncio.run(run())
    assert host_snat.addresses == (ip("fd00:10:244:1:ffff:ffff:ffff:fffe"),)
    assert "10.244.1.254" not in _neigh(netns, 4)
    unserved = host_snat.unserved([pod])
    assert [(u.path, u.family) for u in unserved] == [(p, V4) for p in HOST_SNAT_PATHS]
    assert "10.244.1.254 is used by a local pod" in unserved[0].reason
    assert host_snat.status()["IPv4"]["address"] is None
    # /status, `ovsproxy status` and /metrics say so.
    parts = Components(AgentConfig())
    parts.host_snat = host_snat
    parts.pods = PodWatcher("br0", "gw0")
    parts.pods.pods = [pod]
    metrics = Metrics()
    register_metrics(metrics, HealthState(), parts, {})
    rendered = metrics.render().decode()
    for path in HOST_SNAT_PATHS:
        line = f'ovsproxy_unserved_paths{{family="IPv4",path="{path}"}} 1.0'
        assert line in rendered, rendered
    info = StatusPages(parts, metrics, HealthState()).status_json()
    assert [(u["path"], u["family"]) for u in info["unserved_paths"]] == [
        (p, "IPv4") for p in HOST_SNAT_PATHS
    ]
    out = io.StringIO()
    render_status(info, Console(file=out, width=300, color_system=None))
    assert "node-to-remote-endpoint (IPv4): 10.244.1.254 is used by a local pod" in out.getvalue()


def test_no_gateway_addresses_means_no_address_with_the_reason(netns: Netns) -> None:
    async def run() -> HostSNAT:
        host_snat = _agent(netns)
        try:
            assert await host_snat.start([]) == ()
            return host_snat
        finally:
            await host_snat.close()

    reasons = {str(u) for u in asyncio.run(run()).unserved([])}
    assert "node-to-remote-endpoint (IPv4): no IPv4 pod CIDR known for this node" in reasons


def test_a_strict_rp_filter_on_the_gateway_is_made_loose(netns: Netns) -> None:
    """Linux applies the larger of all and the device: all=1 stays, gw0=2 makes it loose."""
    sysctl = ["ip", "netns", "exec", netns.name, "sysctl", "-qw"]
    subprocess.run([*sysctl, "net.ipv4.conf.all.rp_filter=1"], check=True)
    assert rpfilter.read(netns.gateway, netns.name) == rpfilter.RPFilter(all=1, device=0)
    assert rpfilter.read(netns.gateway, netns.name).strict

    ingress = NodeIngress(load(gateway=netns.gateway, netns=netns.name), netns.name, ProxyHealth())
    ingress._check_rp_filter()
    assert rpfilter.read(netns.gateway, netns.name) == rpfilter.RPFilter(all=1, device=2)
    assert ingress.unserved == [] and ingress.rp_filter["effective"] == 2, ingress.rp_filter
    out = subprocess.run(
        ["ip", "netns", "exec", netns.name, "sysctl", "-n", "net.ipv4.conf.all.rp_filter"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "1"  # nothing but the gateway's own value is changed


def test_the_nodes_pod_cidrs_are_the_fallback(netns: Netns) -> None:
    """The gateway's prefix first (what the node routes); the Node's spec.podCIDRs for a family
    the gateway has none of, whose address then gets a host route on the gateway."""
    netns.ip("addr", "add", "fd00:10:244:1::1/64", "dev", netns.gateway, "nodad")
    cidrs = [net("10.250.1.0/24"), net("fd00:99::/64")]

    async def run() -> tuple[object, ...]:
        host_snat = _agent(netns)
        try:
            return await host_snat.start([], node_pod_cidrs=cidrs)
        finally:
            await host_snat.close()

    assert asyncio.run(run()) == (ip("10.250.1.254"), ip("fd00:10:244:1:ffff:ffff:ffff:fffe"))
    assert "10.250.1.254" in {r["dst"] for r in netns.routes(V4) if r.get("protocol") == "155"}

    async def one_shot_cleanup() -> list[str]:  # what `ovsproxy cleanup` runs on the gateway
        backend = LinuxRouteBackend(netns=netns.name)
        await backend.open()
        try:
            return await backend.remove_next_hop(netns.gateway, V4)
        finally:
            await backend.close()

    removed = asyncio.run(one_shot_cleanup())
    assert "route 10.250.1.254/32 dev gw0 proto 155" in removed, removed
    assert "10.250.1.254" not in {r["dst"] for r in netns.routes(V4)}
    assert "10.250.1.254" not in _neigh(netns, 4)
