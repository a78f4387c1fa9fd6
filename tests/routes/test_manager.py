"""Route manager logic on an in-memory table with the kernel's rules (fast, for properties)."""

from __future__ import annotations

import asyncio
import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ovsproxy.model import IPFamily
from ovsproxy.routes import KernelRoute, OpKey, RouteManager
from ovsproxy.servicecidr import CIDRChange, to_network
from tests.routes.fakes import MemoryRouteBackend

net = ipaddress.ip_network
V4, V6 = IPFamily.IPv4, IPFamily.IPv6
HOP4 = ipaddress.ip_address("169.254.0.253")


def run(coro):  # hypothesis drives sync functions; each example gets its own loop
    return asyncio.run(coro)


def spelled(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, how: int) -> object:
    host = ip.max_prefixlen
    return [
        str(ip),
        f"{ip}/{host}",
        ip,
        ipaddress.ip_network(ip),
        ipaddress.ip_interface(f"{ip}/{host}"),
        f"  {ip}\t",
        ip.exploded.upper(),
        f"{ip.exploded}/{host}",
        f"{ip}/255.255.255.255" if ip.version == 4 else f"{ip.compressed.upper()}/{host}",
    ][how]


addresses = st.one_of(
    st.integers(0, 2**16 - 1).map(lambda n: ipaddress.IPv4Address(0x0A600000 + n)),
    st.integers(0, 2**16 - 1).map(lambda n: ipaddress.IPv6Address((0xFD00 << 112) + n)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(addresses, st.integers(0, 8)), min_size=1, max_size=12))
def test_manager_keys_are_canonical_whatever_the_spelling(items: list) -> None:
    """Seed regression 3: every key is an ipaddress network equal to its own canonical
    re-parse, the same set results from any spelling, and no route is ever added twice or
    deleted for a spelling difference."""

    async def scenario(values: list[object]) -> tuple[frozenset, MemoryRouteBackend]:
        backend = MemoryRouteBackend()
        async with RouteManager(backend, "gw0", sync_interval=None) as manager:
            await manager.reconcile(values[: len(values) // 2])
            for value in values[len(values) // 2 :]:
                await manager.ensure(value)
            await manager.reconcile(values)  # a restart-style reconcile with every spelling
            await manager.sync()
            routes = manager.routes()
            assert manager.installed() == routes
        return routes, backend

    values = [spelled(ip, how) for ip, how in items]
    canonical = [str(ip) for ip, _ in items]
    routes, backend = run(scenario(values))
    reference, _ = run(scenario(canonical))
    assert routes == reference
    for key in routes:
        assert isinstance(key, ipaddress.IPv4Network | ipaddress.IPv6Network)
        assert to_network(str(key)) == key
        assert str(key) == str(ipaddress.ip_network(str(key)))
    assert set(backend.table) == routes
    assert backend.ops.count(("delete", next(iter(routes)))) == 0
    added = [dst for op, dst in backend.ops if op == "add"]
    assert len(added) == len(set(added))  # never the same prefix twice
    # every address given is covered by a route of its family
    for ip, _ in items:
        assert any(ip in r for r in routes if r.version == ip.version)


async def test_a_failed_wider_add_keeps_the_narrower_route() -> None:
    backend = MemoryRouteBackend(fail_adds={net("10.96.0.0/16")})
    async with RouteManager(backend, "gw0", sync_interval=None) as manager:
        await manager.reconcile(["10.96.0.0/24"])
        changes = await manager.ensure("10.96.0.0/16")
        assert changes.errors and changes.added == ()
        assert changes.skipped_deletes == (net("10.96.0.0/24"),)
        assert set(backend.table) == {net("10.96.0.0/24")}
        backend.fail_adds.clear()
        changes = await manager.sync()  # sync installs it, but never deletes
        assert changes.added == (net("10.96.0.0/16"),)
        assert set(backend.table) == {net("10.96.0.0/16"), net("10.96.0.0/24")}
        changes = await manager.reconcile()  # the next reconcile removes the stale one
        assert changes.deleted == (net("10.96.0.0/24"),)
        assert set(backend.table) == {net("10.96.0.0/16")}
    assert manager.counters[OpKey("add", "error", "IPv4")] == 1


async def test_nothing_is_deleted_before_the_first_reconcile() -> None:
    backend = MemoryRouteBackend()
    stale = KernelRoute(net("10.0.0.0/8"), HOP4, ours=True)
    backend.table[stale.dst] = stale
    async with RouteManager(backend, "gw0", sync_interval=None) as manager:
        await manager.sync()  # learns the stale route
        await manager.ensure("10.96.0.0/16")
        assert net("10.0.0.0/8") in backend.table
        changes = await manager.reconcile(manager.routes())
        assert changes.deleted == (net("10.0.0.0/8"),)


async def test_apply_drops_stale_generations_and_withdraws_only_what_the_event_withdrew() -> None:
    backend = MemoryRouteBackend()
    async with RouteManager(backend, "gw0", sync_interval=None) as manager:
        await manager.reconcile()
        a, b, c = net("10.96.0.0/16"), net("10.200.0.0/16"), net("10.100.0.0/16")
        await manager.ensure(c)  # someone else's ensure: not the discoverer's to withdraw
        await manager.apply(CIDRChange(V4, (), (a, b), generation=2))
        assert manager.routes() == {a, b, c}
        # generation 1 arrives late (another thread): dropped, nothing changes
        late = await manager.apply(CIDRChange(V4, (), (a,), generation=1))
        assert late.mutations == 0
        assert manager.counters[OpKey("apply", "stale", "IPv4")] == 1
        # a ServiceCIDR was deleted: b is withdrawn, deleted after nothing needs adding
        changes = await manager.apply(CIDRChange(V4, (a, b), (a,), generation=3))
        assert changes.deleted == (b,)
        assert manager.routes() == {a, c}
        assert set(backend.table) == {a, c}


async def test_growth_through_apply_is_add_then_delete() -> None:
    backend = MemoryRouteBackend()
    async with RouteManager(backend, "gw0", sync_interval=None) as manager:
        await manager.reconcile()
        await manager.apply(CIDRChange(V4, (), (net("10.10.0.1/32"),), 1))
        await manager.apply(CIDRChange(V4, (net("10.10.0.1/32"),), (net("10.10.0.0/30"),), 2))
        await manager.apply(CIDRChange(V6, (), (net("10::1/128"),), 3))
    assert backend.ops == [
        ("add", net("10.10.0.1/32")),
        ("add", net("10.10.0.0/30")),
        ("delete", net("10.10.0.1/32")),
        ("add", net("10::1/128")),
    ]
    assert manager.mutations == 4
    assert manager.count("add", family="IPv4") == 2


async def test_unmanaged_family_is_ignored() -> None:
    backend = MemoryRouteBackend()
    async with RouteManager(backend, "gw0", [V4], sync_interval=None) as manager:
        await manager.reconcile(["10.96.0.0/16", "fd00::/112"])
        assert manager.routes() == {net("10.96.0.0/16")}
        assert (await manager.apply(CIDRChange(V6, (), (net("fd00::/112"),), 1))).mutations == 0
    assert set(backend.table) == {net("10.96.0.0/16")}


async def test_not_started_and_wrong_loop_errors() -> None:
    manager = RouteManager(MemoryRouteBackend(), "gw0", sync_interval=None)
    with pytest.raises(RuntimeError, match="not started"):
        await manager.ensure("10.96.0.0/16")
    with pytest.raises(RuntimeError, match="not started"):
        manager.from_thread.ensure("10.96.0.0/16")
    async with manager:
        with pytest.raises(RuntimeError, match="own loop"):
            manager.from_thread.sync()
        # and from a real thread it works
        result = await asyncio.to_thread(lambda: manager.from_thread.ensure("10.96.0.1").result(5))
        assert result.added == (net("10.96.0.1/32"),)


async def test_invalid_input_fails_the_caller_not_the_worker() -> None:
    async with RouteManager(MemoryRouteBackend(), "gw0", sync_interval=None) as manager:
        with pytest.raises(ValueError):
            await manager.ensure("not-an-ip")
        assert (await manager.ensure("10.96.0.1")).added == (net("10.96.0.1/32"),)
        assert manager.running


async def test_a_cancelled_caller_does_not_abort_its_job() -> None:
    backend = MemoryRouteBackend()
    async with RouteManager(backend, "gw0", sync_interval=None) as manager:
        task = asyncio.create_task(manager.ensure("10.96.0.0/16"))
        await asyncio.sleep(0)
        task.cancel()
        await manager.sync()  # queued after it: by now the job has run completely
        assert net("10.96.0.0/16") in backend.table


async def test_discoverer_subscription_with_apply_soon_from_loop_and_threads() -> None:
    from ovsproxy.servicecidr import ServiceCIDRDiscoverer

    backend = MemoryRouteBackend()
    d = ServiceCIDRDiscoverer()
    async with RouteManager(backend, "gw0", sync_interval=None) as manager:
        d.subscribe(manager.apply_soon)
        d.cluster_ips_synced()
        await manager.reconcile(d.desired)
        for ip in ["10.10.0.1", "10.10.0.2", "10.10.0.5"]:
            d.add_cluster_ip(ip)  # handler runs here, on the loop
        await asyncio.to_thread(d.add_cluster_ip, "10::1")  # and on another thread
        await asyncio.to_thread(d.add_cluster_ips, ["10::2", "10::5"])
    # stop() waited for the queued applies
    assert set(backend.table) == {net("10.10.0.0/29"), net("10::/125")}
    assert manager.count("apply", "stale") == 0


async def test_reconcile_refuses_a_discoverer_that_is_not_ready() -> None:
    from ovsproxy.servicecidr import ServiceCIDRDiscoverer

    backend = MemoryRouteBackend()
    backend.table[net("10.96.0.0/16")] = KernelRoute(net("10.96.0.0/16"), HOP4, ours=True)
    d = ServiceCIDRDiscoverer()
    d.add_cluster_ip("10.96.0.1")  # the source has not synced yet
    async with RouteManager(backend, "gw0", sync_interval=None) as manager:
        with pytest.raises(RuntimeError, match="not ready"):
            await manager.reconcile(d.desired)
        assert net("10.96.0.0/16") in backend.table  # the valid route survived
        d.cluster_ips_synced()
        changes = await manager.reconcile(d.desired)
    assert changes.added == (net("10.96.0.1/32"),)
    assert changes.deleted == (net("10.96.0.0/16"),)
