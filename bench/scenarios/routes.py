"""Node Service routes: one route per family for any number of ClusterIPs, quiet restarts.

Runs on real kernel routes in private network namespaces (needs root). Phases:

1. ``incremental``: N random ClusterIPs per family (10.96.0.0/16 and fd00:10:96::/112), fed
   one by one after the source synced -- the worst case for route churn -- through the
   discoverer into the manager. Figures: ``routes_final``, ``ops_total`` (route add/delete/
   replace), ops per family (target <= 33), ClusterIPs per second; and the adversarial order
   that grows the prefix one bit per ClusterIP (``worst_order_ops_*``: exactly 1 + 2 x 16).
2. ``restart``: a new discoverer computes the CIDR once from the full list, a new manager
   reconciles: ``restart_adds``, ``restart_deletes``, ``restart_replaces`` (target: all 0).
3. ``baseline``, measured in the same run: the seed's design, one route per ClusterIP, in a
   second namespace (routes and time to install them), then ``upgrade``: a reconcile to the
   aggregated routes there, which must remove every per-IP route after adding the new ones.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import random
import subprocess
import time
import uuid
from typing import Any

from ovsproxy.model import IPAddress, IPFamily
from ovsproxy.ovs.namespaces import create_netns, delete_netns
from ovsproxy.routes import RouteManager
from ovsproxy.routes.linux import ROUTE_PROTOCOL, LinuxRouteBackend
from ovsproxy.servicecidr import ServiceCIDRDiscoverer

NAME = "routes"
DESCRIPTION = "Service routes: N ClusterIPs -> one route per family; zero-change restart"

GATEWAY = "gw0"
V4_BASE = int(ipaddress.IPv4Address("10.96.0.0"))
V6_BASE = int(ipaddress.IPv6Address("fd00:10:96::"))


class Namespace:
    """A throw-away network namespace with a veth gateway; deleted on exit, always."""

    def __init__(self, tag: str) -> None:
        self.name = f"ovsp-bench-{tag}-{os.getpid()}-{uuid.uuid4().hex[:6]}"

    def ip(self, *args: str) -> str:
        done = subprocess.run(
            ["ip", "-n", self.name, *args], capture_output=True, text=True, check=True
        )
        return done.stdout

    def __enter__(self) -> Namespace:
        create_netns(self.name)  # recorded first: a killed run's namespace is swept
        try:
            self.ip("link", "add", GATEWAY, "type", "veth", "peer", "name", f"{GATEWAY}p")
            for dev in ("lo", GATEWAY, f"{GATEWAY}p"):
                self.ip("link", "set", dev, "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        delete_netns(self.name)

    def our_routes(self) -> list[str]:
        found = []
        for family in ("-4", "-6"):
            out = self.ip("-j", family, "route", "show", "table", "main", "dev", GATEWAY)
            for r in json.loads(out or "[]"):
                if r.get("protocol") == str(ROUTE_PROTOCOL) and r.get("gateway"):
                    found.append(r["dst"])
        return found


def cluster_ips(n: int, seed: int) -> list[IPAddress]:
    rng = random.Random(seed)
    ips: list[IPAddress] = [ipaddress.IPv4Address(V4_BASE + rng.randrange(2**16)) for _ in range(n)]
    ips += [ipaddress.IPv6Address(V6_BASE + rng.randrange(2**16)) for _ in range(n)]
    rng.shuffle(ips)
    return ips


def mutations(manager: RouteManager, family: str | None = None) -> int:
    return sum(manager.count(op, family=family) for op in ("add", "delete", "replace"))


async def incremental_and_restart(ns: Namespace, ips: list[IPAddress]) -> dict[str, Any]:
    discoverer = ServiceCIDRDiscoverer()
    discoverer.cluster_ips_synced()
    manager = RouteManager(LinuxRouteBackend(netns=ns.name), GATEWAY, sync_interval=None)
    await manager.start()
    await manager.reconcile(discoverer.desired)
    started = time.perf_counter()
    for ip in ips:
        for change in discoverer.add_cluster_ip(ip):
            await manager.apply(change)
    feed_s = time.perf_counter() - started
    await manager.stop()
    final = ns.our_routes()

    restarted_discoverer = ServiceCIDRDiscoverer()
    restarted_discoverer.add_cluster_ips(ips)
    restarted_discoverer.cluster_ips_synced()
    restarted = RouteManager(LinuxRouteBackend(netns=ns.name), GATEWAY, sync_interval=None)
    await restarted.start()
    started = time.perf_counter()
    changes = await restarted.reconcile(restarted_discoverer.desired)
    restart_s = time.perf_counter() - started
    await restarted.stop()
    return {
        "routes_final": len(final),
        "final_cidrs": sorted(final),
        "ops_total": mutations(manager),
        "ops_ipv4": mutations(manager, IPFamily.IPv4.name),
        "ops_ipv6": mutations(manager, IPFamily.IPv6.name),
        "ops_target_per_family": 33,
        "feed_s": round(feed_s, 4),
        "cluster_ips_per_s": round(len(ips) / feed_s) if feed_s else None,
        "restart_adds": restarted.count("add"),
        "restart_deletes": restarted.count("delete"),
        "restart_replaces": restarted.count("replace"),
        "restart_kept": len(changes.kept),
        "restart_reconcile_ms": round(restart_s * 1000, 2),
        "errors": manager.count(result="error") + restarted.count(result="error"),
    }


async def worst_order(ns: Namespace) -> dict[str, Any]:
    """The order that grows the CIDR one bit at a time: base, base+1, base+2, base+4, ..."""
    ips: list[IPAddress] = []
    for base, cls in ((V4_BASE, ipaddress.IPv4Address), (V6_BASE, ipaddress.IPv6Address)):
        ips += [cls(base)] + [cls(base + (1 << k)) for k in range(16)]
    discoverer = ServiceCIDRDiscoverer()
    discoverer.cluster_ips_synced()
    manager = RouteManager(LinuxRouteBackend(netns=ns.name), GATEWAY, sync_interval=None)
    await manager.start()
    await manager.reconcile(discoverer.desired)
    for ip in ips:
        for change in discoverer.add_cluster_ip(ip):
            await manager.apply(change)
    await manager.stop()
    return {
        "worst_order_ops_ipv4": mutations(manager, IPFamily.IPv4.name),
        "worst_order_ops_ipv6": mutations(manager, IPFamily.IPv6.name),
        "worst_order_routes_final": len(ns.our_routes()),
    }


async def baseline_and_upgrade(ns: Namespace, ips: list[IPAddress]) -> dict[str, Any]:
    # The seed's design: one route per ClusterIP (installed by the same backend, marked ours).
    per_ip = RouteManager(LinuxRouteBackend(netns=ns.name), GATEWAY, sync_interval=None)
    await per_ip.start()
    started = time.perf_counter()
    await per_ip.reconcile(ips)
    baseline_s = time.perf_counter() - started
    await per_ip.stop()
    baseline_routes = len(ns.our_routes())

    discoverer = ServiceCIDRDiscoverer()
    discoverer.add_cluster_ips(ips)
    discoverer.cluster_ips_synced()
    upgraded = RouteManager(LinuxRouteBackend(netns=ns.name), GATEWAY, sync_interval=None)
    await upgraded.start()
    started = time.perf_counter()
    changes = await upgraded.reconcile(discoverer.desired)
    upgrade_s = time.perf_counter() - started
    await upgraded.stop()
    return {
        "baseline_per_ip_routes": baseline_routes,
        "baseline_install_s": round(baseline_s, 3),
        "baseline_ops": mutations(per_ip),
        "upgrade_adds": len(changes.added),
        "upgrade_deletes": len(changes.deleted),
        "upgrade_reconcile_s": round(upgrade_s, 3),
        "upgrade_routes_after": len(ns.our_routes()),
    }


def run(quick: bool = False) -> dict[str, Any]:
    if os.geteuid() != 0:
        raise PermissionError("the routes bench needs root (it creates network namespaces)")
    n = 1_000 if quick else 10_000
    ips = cluster_ips(n, seed=10_000)
    result: dict[str, Any] = {"cluster_ips_per_family": n}
    with Namespace("routes") as ns:
        result |= asyncio.run(incremental_and_restart(ns, ips))
    with Namespace("worst") as ns:
        result |= asyncio.run(worst_order(ns))
    with Namespace("baseline") as ns:
        result |= asyncio.run(baseline_and_upgrade(ns, ips))
    if result["routes_final"]:
        result["route_ratio_vs_per_ip"] = round(
            result["baseline_per_ip_routes"] / result["routes_final"], 1
        )
    return result
