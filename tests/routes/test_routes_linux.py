"""The route manager on real kernel routes, in a network namespace the test creates.

The kernel table is read back with iproute2 (``ip -j``), not with the code under test.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from ovsproxy.model import IPAddress, IPFamily, IPNetwork
from ovsproxy.routes import KernelRoute, RouteManager
from ovsproxy.routes.linux import ROUTE_PROTOCOL, LinuxRouteBackend
from ovsproxy.servicecidr import (
    AGGREGATION_FLOOR,
    ServiceCIDRDiscoverer,
    covers,
    parse_cluster_ip,
    service_cidr_for,
)
from tests.routes.conftest import Netns

net = ipaddress.ip_network
V4, V6 = IPFamily.IPv4, IPFamily.IPv6
HOP = {V4: "169.254.0.253", V6: "fc01::aabb:ccdd:eeff"}
V6_BASE = int(ipaddress.IPv6Address("fd00:10:96::"))


@dataclass(frozen=True)
class Case:
    """Per-family data for the parametrised scenarios."""

    family: IPFamily
    cluster_ips: tuple[str, ...]  # the seed's four ClusterIPs, or their IPv6 twins
    slash32: str  # host prefix length
    legacy_small: str  # a stale prefix inside the new CIDR
    legacy_wide: str  # a stale prefix containing the new CIDR
    legacy_elsewhere: str  # an older CIDR unrelated to the new one
    foreign_inside: str  # someone else's route inside the new CIDR
    foreign_other: str


CASES = [
    Case(
        V4,
        ("10.96.0.1", "10.96.0.10", "10.96.1.70", "10.96.10.217"),
        "/32",
        "10.96.5.0/24",
        "10.0.0.0/8",
        "192.168.100.0/24",
        "10.96.7.0/24",
        "172.16.0.0/16",
    ),
    Case(
        V6,
        ("fd00:10:96::1", "fd00:10:96::a", "fd00:10:96::146", "fd00:10:96::a:d9"),
        "/128",
        "fd00:10:96::500/120",
        "fd00::/16",
        "fd00:99::/64",
        "fd00:10:96::700/120",
        "fd00:aaaa::/64",
    ),
]
IDS = [c.family.name for c in CASES]


def spellings(ip: IPAddress, rng: random.Random) -> object:
    """One of the many ways a ClusterIP may reach us."""
    host = "/32" if ip.version == 4 else "/128"
    options: list[object] = [
        str(ip),
        f"{ip}{host}",
        ip,
        ipaddress.ip_network(ip),
        f" {ip} ",
        ip.exploded,
        f"{ip.exploded.upper()}{host}",
    ]
    return rng.choice(options)


def prepare_next_hop(ns: Netns, family: IPFamily) -> None:
    """What an earlier agent run left behind: neighbour and host route of the next hop."""
    v = f"-{family.value}"
    ns.ip(v, "neigh", "replace", HOP[family], "lladdr", "aa:bb:cc:dd:ee:ff", "dev", "gw0",
          "nud", "permanent")  # fmt: skip
    ns.ip(v, "route", "replace", HOP[family], "dev", "gw0", "scope", "link",
          "proto", str(ROUTE_PROTOCOL))  # fmt: skip


def add_ours(ns: Netns, family: IPFamily, dst: str) -> None:
    ns.add_route(f"{dst} via {HOP[family]} dev gw0 proto {ROUTE_PROTOCOL}", family)


def manager_for(ns: Netns, **kwargs: object) -> RouteManager:
    kwargs.setdefault("sync_interval", None)
    return RouteManager(LinuxRouteBackend(netns=ns.name), ns.gateway, **kwargs)  # type: ignore[arg-type]


def per_family_mutations(manager: RouteManager, family: IPFamily) -> int:
    return sum(manager.count(op, family=family.name) for op in ("add", "delete", "replace"))


# -- seed regression 1: valid routes, ClusterIPs in both spellings --------------------------


@pytest.mark.parametrize("case", CASES, ids=IDS)
async def test_seed_restart_with_per_ip_routes_in_both_spellings_deletes_none(
    netns: Netns, case: Case
) -> None:
    """The seed exactly: per-IP routes are present and valid, the desired set arrives with
    bare IPs for some and host prefixes for others; a reconcile deletes none of them."""
    first = manager_for(netns)
    await first.start()
    await first.reconcile(case.cluster_ips)
    await first.stop()
    installed = netns.service_routes(case.family)
    assert installed == {net(ip) for ip in case.cluster_ips}
    before = netns.all_route_keys()

    rng = random.Random(0)
    mixed = [ip if i % 2 else f"{ip}{case.slash32}" for i, ip in enumerate(case.cluster_ips)] + [
        spellings(ipaddress.ip_address(ip), rng) for ip in case.cluster_ips
    ]
    again = manager_for(netns)
    await again.start()
    changes = await again.reconcile(mixed)
    await again.stop()

    assert changes.deleted == ()
    assert changes.replaced == ()
    assert changes.added == ()
    assert set(changes.kept) == installed
    assert again.mutations == 0
    assert netns.all_route_keys() == before


@pytest.mark.parametrize("case", CASES, ids=IDS)
async def test_restart_with_the_aggregated_route_present_makes_no_changes(
    netns: Netns, case: Case
) -> None:
    d1 = ServiceCIDRDiscoverer()
    d1.add_cluster_ips(case.cluster_ips)
    d1.cluster_ips_synced()
    m1 = manager_for(netns)
    await m1.start()
    await m1.reconcile(d1.desired)
    await m1.stop()  # stopping leaves the routes in place
    (cidr,) = netns.service_routes(case.family)
    assert cidr == service_cidr_for(case.cluster_ips)[case.family]
    before = netns.all_route_keys()

    d2 = ServiceCIDRDiscoverer()
    d2.add_cluster_ips(f"{ip}{case.slash32}" for ip in case.cluster_ips)  # other spelling
    d2.cluster_ips_synced()
    m2 = manager_for(netns)
    await m2.start()
    changes = await m2.reconcile(d2.desired)
    await m2.stop()
    assert changes.kept == (cidr,)
    assert m2.count("delete") == 0
    assert m2.count("replace") == 0
    assert m2.count("add") == 0
    assert m2.count("next_hop", "changed") == 0
    assert netns.all_route_keys() == before


# -- seed regression 2: adds and reconciles from tasks and threads --------------------------


async def test_concurrent_adds_and_reconciles_never_uncover_a_known_cluster_ip(
    netns: Netns,
) -> None:
    rng = random.Random(2024)
    ips: list[IPAddress] = [
        ipaddress.IPv4Address(0x0A600000 + rng.randrange(2**16)) for _ in range(750)
    ]
    ips += [ipaddress.IPv6Address(V6_BASE + rng.randrange(2**16)) for _ in range(250)]
    rng.shuffle(ips)
    values = [spellings(ip, rng) for ip in ips]
    assert len(values) == 1000

    d = ServiceCIDRDiscoverer()
    d.cluster_ips_synced()
    # the periodic sync races too
    manager = manager_for(netns, sync_interval=0.05)
    await manager.start()
    await manager.reconcile(d.desired)

    # A reconcile input captured early and replayed late: the seed's race in another form.
    early = values[:3]
    for value in early:
        for change in d.add_cluster_ip(value):
            await manager.apply(change)
    stale_snapshot = set(d.desired())

    known: set[IPAddress] = {parse_cluster_ip(v) for v in early}  # type: ignore[misc, arg-type]
    known_lock = threading.Lock()
    stop = threading.Event()
    violations: list[str] = []
    samples = 0

    def sampler() -> None:
        nonlocal samples
        while not stop.is_set():
            with known_lock:
                snapshot = list(known)  # taken BEFORE reading the table
            routes = netns.service_routes()
            for ip in snapshot:
                if not covers(routes, ip):
                    violations.append(f"{ip} uncovered by {sorted(map(str, routes))}")
            samples += 1

    async def add_from_task(value: object) -> None:
        ip = parse_cluster_ip(value)  # type: ignore[arg-type]
        assert ip is not None
        for change in d.add_cluster_ip(value):  # type: ignore[arg-type]
            await manager.apply(change)
        # the CIDR covering ip may come from another caller's event still in flight:
        # ensure the current one (monotone, free when already there) before calling it known
        await manager.ensure(d.cidrs(IPFamily.of(ip)))
        with known_lock:
            known.add(ip)

    def add_from_thread(chunk: list[object]) -> None:
        for value in chunk:
            ip = parse_cluster_ip(value)  # type: ignore[arg-type]
            assert ip is not None
            for change in d.add_cluster_ip(value):  # type: ignore[arg-type]
                manager.from_thread.apply(change).result(30)
            manager.from_thread.ensure(d.cidrs(IPFamily.of(ip))).result(30)
            with known_lock:
                known.add(ip)

    async def task_chunk(chunk: list[object]) -> None:
        for value in chunk:
            await add_from_task(value)
            await asyncio.sleep(0)

    async def reconciler() -> None:
        for _ in range(30):
            await manager.reconcile(d.desired)  # read when the job runs
            await manager.reconcile(stale_snapshot)  # stale: must not delete anything newer
            await asyncio.sleep(0.003)

    def thread_reconciler() -> None:
        for _ in range(15):
            manager.from_thread.reconcile(d.desired()).result(30)  # snapshot, then queued
            time.sleep(0.005)

    rest = values[3:]
    task_values, thread_values = rest[: len(rest) // 2], rest[len(rest) // 2 :]
    sampler_thread = threading.Thread(target=sampler, daemon=True)
    sampler_thread.start()
    try:
        await asyncio.gather(
            *(task_chunk(task_values[i::8]) for i in range(8)),
            *(asyncio.to_thread(add_from_thread, thread_values[i::4]) for i in range(4)),
            reconciler(),
            asyncio.to_thread(thread_reconciler),
        )
        final = await manager.reconcile(d.desired)
    finally:
        stop.set()
        sampler_thread.join(10)
        await manager.stop()

    assert violations == []
    assert samples >= 10, "the sampler must actually have watched"
    expected = service_cidr_for(ips)
    assert d.desired() == set(expected.values())
    assert manager.routes() == d.desired()
    assert netns.service_routes() == d.desired()  # exactly the desired routes, nothing else
    assert final.mutations == 0
    assert len(known) == len(set(ips))
    assert all(covers(netns.service_routes(), ip) for ip in ips)


# -- 10,000 ClusterIPs --------------------------------------------------------------------


async def test_ten_thousand_cluster_ips_one_route_per_family_and_a_quiet_restart(
    netns: Netns,
) -> None:
    rng = random.Random(10_000)
    ips: list[IPAddress] = [
        ipaddress.IPv4Address(0x0A600000 + rng.randrange(2**16)) for _ in range(10_000)
    ]
    ips += [ipaddress.IPv6Address(V6_BASE + rng.randrange(2**16)) for _ in range(10_000)]
    rng.shuffle(ips)

    d = ServiceCIDRDiscoverer()
    d.cluster_ips_synced()  # an empty cluster at first start: everything arrives one by one
    manager = manager_for(netns)
    await manager.start()
    await manager.reconcile(d.desired)
    for ip in ips:
        for change in d.add_cluster_ip(ip):
            await manager.apply(change)
    await manager.stop()

    expected = service_cidr_for(ips)
    assert netns.service_routes(V4) == {expected[V4]}
    assert netns.service_routes(V6) == {expected[V6]}
    assert expected[V4].subnet_of(net("10.96.0.0/16"))
    assert expected[V6].subnet_of(net("fd00:10:96::/112"))  # type: ignore[arg-type]
    for family in (V4, V6):
        assert per_family_mutations(manager, family) <= 33, manager.counters
    assert manager.count(result="error") == 0

    # Agent restart: the new process computes the CIDR once from the complete list.
    before = netns.all_route_keys()
    d2 = ServiceCIDRDiscoverer()
    d2.add_cluster_ips(str(ip) for ip in reversed(ips))
    assert d2.cluster_ips_synced() != []
    restarted = manager_for(netns)
    await restarted.start()
    changes = await restarted.reconcile(d2.desired)
    await restarted.stop()
    assert restarted.count("delete") == 0
    assert restarted.count("replace") == 0
    assert restarted.count("add") == 0
    assert set(changes.kept) == set(expected.values())
    assert netns.all_route_keys() == before


# -- leftovers of an older version, and routes that are not ours ----------------------------


@pytest.mark.parametrize("case", CASES, ids=IDS)
async def test_leftovers_are_removed_and_foreign_routes_stay(netns: Netns, case: Case) -> None:
    fam = case.family
    prepare_next_hop(netns, fam)
    legacy = [f"{ip}{case.slash32}" for ip in case.cluster_ips]
    stale = [*legacy, case.legacy_small, case.legacy_wide, case.legacy_elsewhere]
    for dst in stale:
        add_ours(netns, fam, dst)
    # not ours: another protocol on the gateway, and our protocol on another device
    netns.add_route(f"{case.foreign_inside} via {HOP[fam]} dev gw0 proto static", fam)
    netns.add_route(f"{case.foreign_other} dev gw0", fam)
    netns.add_route(f"{case.legacy_small} dev gw0p proto {ROUTE_PROTOCOL} metric 50", fam)
    # and the other family's routes must not move at all
    other = CASES[1] if fam is V4 else CASES[0]
    prepare_next_hop(netns, other.family)
    add_ours(netns, other.family, other.legacy_elsewhere)
    other_before = netns.routes(other.family, dev=None)

    d = ServiceCIDRDiscoverer(families=[fam])
    d.add_cluster_ips(case.cluster_ips)
    d.cluster_ips_synced()
    (cidr,) = d.desired()
    before = netns.all_route_keys()
    manager = RouteManager(LinuxRouteBackend(netns=netns.name), "gw0", [fam], sync_interval=None)
    await manager.start()
    changes = await manager.reconcile(d.desired)
    await manager.stop()

    assert changes.added == (cidr,)
    assert set(changes.deleted) == {net(s) for s in stale}
    assert netns.service_routes(fam) == {cidr}  # proto 155 on gw0: only the new CIDR
    after = netns.all_route_keys()
    removed = {k for k in before - after}
    assert {net(k[0]) for k in removed} == {net(s) for s in stale}
    assert all(k[2] == "gw0" and k[3] == "155" for k in removed)
    foreign = {k for k in before if k[3] != "155" or k[2] != "gw0"}
    assert foreign <= after  # every foreign route is still there, unchanged
    assert netns.routes(other.family, dev=None) == other_before
    # make-before-break: the new CIDR went in before any stale route went out
    assert manager.count("add", "ok") == 1
    assert manager.count("delete", "ok") == len(stale)


async def test_foreign_route_on_the_desired_prefix_is_a_conflict_and_nothing_is_broken(
    netns: Netns,
) -> None:
    prepare_next_hop(netns, V4)
    netns.add_route(f"10.96.0.0/16 via {HOP[V4]} dev gw0 proto static")
    add_ours(netns, V4, "10.96.3.0/24")  # our older, narrower route
    before = netns.all_route_keys()
    manager = manager_for(netns, families=[V4])
    await manager.start()
    changes = await manager.reconcile(["10.96.0.0/16"])
    again = await manager.sync()
    await manager.stop()
    assert changes.conflicts == (net("10.96.0.0/16"),)
    # the stale /24 overlaps the prefix we could not install: kept (make-before-break)
    assert changes.skipped_deletes == (net("10.96.3.0/24"),)
    assert changes.deleted == ()
    assert again.conflicts == (net("10.96.0.0/16"),)
    assert netns.all_route_keys() == before


# -- periodic sync repairs ------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=IDS)
async def test_route_deleted_by_hand_is_back_within_one_sync_period(
    netns: Netns, case: Case
) -> None:
    fam = case.family
    period = 0.3
    d = ServiceCIDRDiscoverer()
    d.add_cluster_ips(case.cluster_ips)
    d.cluster_ips_synced()
    (cidr,) = d.desired()
    manager = manager_for(netns, sync_interval=period)
    await manager.start()
    try:
        await manager.reconcile(d.desired)
        assert netns.service_routes(fam) == {cidr}
        netns.ip(f"-{fam.value}", "route", "del", str(cidr), "dev", "gw0")
        netns.ip(f"-{fam.value}", "neigh", "del", HOP[fam], "dev", "gw0")
        assert netns.service_routes(fam) == set()
        started = time.monotonic()
        while netns.service_routes(fam) != {cidr}:
            assert time.monotonic() - started < period + 0.25, "not repaired within one period"
            await asyncio.sleep(0.01)
        neighbours = {n["dst"]: n for n in netns.neighbours()}
        assert neighbours[HOP[fam]]["lladdr"] == "aa:bb:cc:dd:ee:ff"
        assert "PERMANENT" in neighbours[HOP[fam]]["state"]
    finally:
        await manager.stop()
    assert manager.count("delete") == 0  # sync never deletes


async def test_sync_never_deletes_even_stale_routes(netns: Netns) -> None:
    prepare_next_hop(netns, V4)
    add_ours(netns, V4, "10.96.5.0/24")
    manager = manager_for(netns)
    await manager.start()
    await manager.ensure("10.96.0.0/16")  # before any reconcile: adds only
    await manager.sync()
    await manager.stop()
    assert netns.service_routes(V4) == {net("10.96.0.0/16"), net("10.96.5.0/24")}
    assert manager.count("delete") == 0


async def test_gateway_missing_at_start_is_retried_by_the_sync(netns: Netns) -> None:
    netns.ip("link", "del", "gw0")
    manager = manager_for(netns, sync_interval=0.1)
    await manager.start()
    try:
        changes = await manager.reconcile(["10.96.0.0/16"])
        assert changes.errors  # reported, not raised, and not forgotten
        netns.ip("link", "add", "gw0", "type", "veth", "peer", "name", "gw0p")
        netns.ip("link", "set", "gw0", "up")
        netns.ip("link", "set", "gw0p", "up")
        deadline = time.monotonic() + 3
        while netns.service_routes(V4) != {net("10.96.0.0/16")}:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
    finally:
        await manager.stop()


# -- make-before-break, observed at the kernel ---------------------------------------------


class WatchingBackend(LinuxRouteBackend):
    """Checks the kernel table at every delete: the wider route must already be there."""

    def __init__(self, ns: Netns, log: list[str]) -> None:
        super().__init__(netns=ns.name)
        self.ns = ns
        self.log = log

    async def add_route(self, gateway: str, dst: IPNetwork) -> KernelRoute:
        self.log.append(f"add {dst}")
        return await super().add_route(gateway, dst)

    async def delete_route(self, gateway: str, route: KernelRoute) -> None:
        present = self.ns.service_routes(route.family)
        wider = [r for r in present if r != route.dst and route.dst.subnet_of(r)]  # type: ignore[arg-type]
        self.log.append(f"delete {route.dst} (covered by {[str(w) for w in wider]})")
        await super().delete_route(gateway, route)


@pytest.mark.parametrize("case", CASES, ids=IDS)
async def test_growth_is_make_before_break(netns: Netns, case: Case) -> None:
    log: list[str] = []
    d = ServiceCIDRDiscoverer()
    d.cluster_ips_synced()
    manager = RouteManager(WatchingBackend(netns, log), "gw0", sync_interval=None)
    await manager.start()
    await manager.reconcile(d.desired)
    for ip in case.cluster_ips:
        for change in d.add_cluster_ip(ip):
            await manager.apply(change)
    await manager.stop()
    adds = [entry for entry in log if entry.startswith("add")]
    deletes = [entry for entry in log if entry.startswith("delete")]
    assert len(adds) == len(case.cluster_ips)  # each of the four grows the CIDR here
    assert len(deletes) == len(adds) - 1
    assert all("covered by []" not in entry for entry in deletes), log
    # strictly alternating add, delete: the wider one first every time
    assert [entry.split()[0] for entry in log] == ["add"] + ["add", "delete"] * len(deletes)


# -- the backend's own guard rails ----------------------------------------------------------


async def test_a_missing_namespace_is_an_error_not_a_new_namespace() -> None:
    name = "ovsp-rt-no-such-namespace"
    backend = LinuxRouteBackend(netns=name)
    with pytest.raises(FileNotFoundError):
        await backend.open()
    assert not (Path("/run/netns") / name).exists()


async def test_backend_refuses_to_delete_a_foreign_route(netns: Netns) -> None:
    prepare_next_hop(netns, V4)
    netns.add_route(f"10.96.0.0/16 via {HOP[V4]} dev gw0 proto static")
    backend = LinuxRouteBackend(netns=netns.name)
    await backend.open()
    try:
        (route,) = await backend.list_routes("gw0", V4)
        assert not route.ours
        with pytest.raises(Exception, match="not ours"):
            await backend.delete_route("gw0", route)
        # and a forged "ours" for that prefix does not match it: the kernel checks proto
        forged = KernelRoute(route.dst, route.gateway, ours=True)
        with pytest.raises(Exception, match="absent"):
            await backend.delete_route("gw0", forged)
    finally:
        await backend.close()
    assert netns.routes(V4)[0]["dst"] == "10.96.0.0/16"


# -- hostile neighbours (issue 35): never the node's own routes -----------------------------

UPLINK = "up0"
UPLINK_GW = {V4: "192.0.2.1", V6: "2001:db8:ff::1"}


def add_uplink(ns: Netns) -> None:
    """The node's uplink with its default routes, metric 100 (as DHCP / networkd make them)."""
    ns.ip("link", "add", UPLINK, "type", "veth", "peer", "name", f"{UPLINK}p")
    for dev in (UPLINK, f"{UPLINK}p"):
        ns.ip("link", "set", dev, "up")
    ns.ip("addr", "add", "192.0.2.2/24", "dev", UPLINK)
    ns.ip("-6", "addr", "add", "2001:db8:ff::2/64", "dev", UPLINK, "nodad")
    for family in (V4, V6):
        ns.add_route(f"default via {UPLINK_GW[family]} dev {UPLINK} metric 100", family)


def route_get(ns: Netns, address: str) -> dict:
    out = ns.ip("-j", "route", "get", address).stdout
    found: dict = json.loads(out)[0]
    return found


def default_routes(ns: Netns) -> list[tuple[str, str, str, int]]:
    return sorted(
        (r["dst"], r.get("gateway", ""), r["dev"], r.get("metric", 0))
        for r in ns.routes(dev=None)
        if r["dst"] == "default"
    )


async def test_far_apart_cluster_ips_never_take_the_nodes_default_route(netns: Netns) -> None:
    """Finding (issue 35): 10.96.0.1 beside 172.30.0.1 (and fd00:10:96::1 beside
    2001:db8:1::1) grew the Service route to 0.0.0.0/0 (::/2) via the virtual next hop at
    metric 0, ahead of the node's default route at metric 100 on its uplink."""
    add_uplink(netns)
    before = default_routes(netns)
    assert len(before) == 2
    d = ServiceCIDRDiscoverer()
    d.cluster_ips_synced()
    manager = manager_for(netns)
    await manager.start()
    await manager.reconcile(d.desired)
    for ip in ("10.96.0.1", "10.96.0.10", "172.30.0.1", "fd00:10:96::1", "2001:db8:1::1"):
        for change in d.add_cluster_ip(ip):
            await manager.apply(change)
    try:
        assert default_routes(netns) == before
        for outside in ("8.8.8.8", "2001:4860:4860::8888", "192.168.1.1"):
            assert route_get(netns, outside)["dev"] == UPLINK, outside
        for cluster_ip in ("10.96.0.1", "172.30.0.1", "fd00:10:96::1", "2001:db8:1::1"):
            assert route_get(netns, cluster_ip)["dev"] == "gw0", cluster_ip
        ours = netns.service_routes()
        assert all(n.prefixlen >= AGGREGATION_FLOOR[IPFamily.of(n)] for n in ours), ours
        assert ours == {
            net("10.96.0.0/28"),
            net("172.30.0.1/32"),
            net("fd00:10:96::1/128"),
            net("2001:db8:1::1/128"),
        }
        # The Service that needed 172.30.0.1 is gone: its route goes; 10.96.0.10's too, and
        # the /28 shrinks to 10.96.0.1/32, the narrower route in before the wider one goes.
        for ip in ("172.30.0.1", "10.96.0.10"):
            for change in d.delete_cluster_ip(ip):
                await manager.apply(change)
        assert netns.service_routes(V4) == {net("10.96.0.1/32")}
        assert default_routes(netns) == before
    finally:
        await manager.stop()


async def test_a_route_of_another_device_on_the_desired_prefix_is_a_conflict(
    netns: Netns,
) -> None:
    """The conflict check reads the whole table: the node's own 10.96.0.0/16 on its uplink at
    metric 100 was shadowed by ours at metric 0 (the kernel accepts a second route that
    differs in metric); the node's default route too, with --service-cidr 0.0.0.0/0."""
    add_uplink(netns)
    netns.add_route(f"10.96.0.0/16 via {UPLINK_GW[V4]} dev {UPLINK} metric 100")
    manager = manager_for(netns)
    await manager.start()
    try:
        changes = await manager.reconcile(["10.96.0.0/16", "10.97.0.0/16"])
    finally:
        await manager.stop()
    assert changes.conflicts == (net("10.96.0.0/16"),)
    assert netns.service_routes(V4) == {net("10.97.0.0/16")}
    assert route_get(netns, "10.96.0.1")["dev"] == UPLINK
    default = manager_for(netns)
    await default.start()
    try:
        changes = await default.reconcile(["0.0.0.0/0", "::/0"])
    finally:
        await default.stop()
    assert set(changes.conflicts) == {net("0.0.0.0/0"), net("::/0")}
    assert route_get(netns, "8.8.8.8")["dev"] == UPLINK
    assert route_get(netns, "2001:4860:4860::8888")["dev"] == UPLINK


async def test_shrinking_is_make_before_break(netns: Netns) -> None:
    log: list[str] = []
    d = ServiceCIDRDiscoverer()
    d.add_cluster_ips(["10.96.0.1", "10.96.200.1"])
    d.cluster_ips_synced()
    manager = RouteManager(WatchingBackend(netns, log), "gw0", sync_interval=None)
    await manager.start()
    await manager.reconcile(d.desired)
    log.clear()
    for change in d.delete_cluster_ip("10.96.200.1"):
        await manager.apply(change)
    await manager.stop()
    assert netns.service_routes(V4) == {net("10.96.0.1/32")}
    assert [entry.split()[:2] for entry in log] == [
        ["add", "10.96.0.1/32"],
        ["delete", "10.96.0.0/16"],
    ]
