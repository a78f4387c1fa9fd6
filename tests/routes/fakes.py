"""An in-memory backend with the kernel's rules, for pure manager-logic tests (hypothesis)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ovsproxy.model import IPAddress, IPFamily, IPNetwork
from ovsproxy.routes.backend import (
    VIRTUAL_NEXT_HOP,
    KernelRoute,
    RouteAbsentError,
    RouteBackendError,
    RouteExistsError,
)


@dataclass
class MemoryRouteBackend:
    """One table, one device. Like the kernel: one route per destination, EEXIST on a second."""

    name: str = "memory"
    table: dict[IPNetwork, KernelRoute] = field(default_factory=dict)
    ops: list[tuple[str, IPNetwork]] = field(default_factory=list)
    fail_adds: set[IPNetwork] = field(default_factory=set)
    next_hops: set[IPFamily] = field(default_factory=set)

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def next_hop(self, family: IPFamily) -> IPAddress:
        return VIRTUAL_NEXT_HOP[family]

    async def ensure_next_hop(self, gateway: str, family: IPFamily) -> list[str]:
        if family in self.next_hops:
            return []
        self.next_hops.add(family)
        return [f"next hop {family.name}"]

    async def list_routes(self, gateway: str, family: IPFamily) -> list[KernelRoute]:
        return [r for dst, r in sorted(self.table.items(), key=str) if dst.version == family]

    async def add_route(self, gateway: str, dst: IPNetwork) -> KernelRoute:
        self.ops.append(("add", dst))
        if dst in self.fail_adds:
            raise RouteBackendError(f"injected failure for {dst}")
        if dst in self.table:
            raise RouteExistsError(str(dst))
        route = KernelRoute(dst, VIRTUAL_NEXT_HOP[IPFamily.of(dst)], ours=True)
        self.table[dst] = route
        return route

    async def replace_route(self, gateway: str, old: KernelRoute) -> KernelRoute:
        self.ops.append(("replace", old.dst))
        route = KernelRoute(old.dst, VIRTUAL_NEXT_HOP[old.family], ours=True)
        self.table[old.dst] = route
        return route

    async def delete_route(self, gateway: str, route: KernelRoute) -> None:
        self.ops.append(("delete", route.dst))
        current = self.table.get(route.dst)
        if current is None or not current.ours:
            raise RouteAbsentError(str(route.dst))
        del self.table[route.dst]
