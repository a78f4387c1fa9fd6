"""Linux backend: Service routes through netlink (pyroute2's asyncio API).

Ownership is the route protocol number ``ROUTE_PROTOCOL`` (``ip route ... proto 155``): every
route we add carries it, deletes name it (the kernel then refuses to delete a route with another
protocol), and a route without it is never touched. To see the name in ``ip route`` output::

    echo "155 ovsproxy" > /etc/iproute2/rt_protos.d/ovsproxy.conf

Parameterised by network namespace: ``netns=None`` is the agent's own namespace, a name is a
namespace under ``/run/netns`` (the sandbox's node namespace, or a test's).
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import socket
from pathlib import Path
from typing import Any

from pyroute2 import AsyncIPRoute
from pyroute2.netlink.exceptions import NetlinkError

from ovsproxy.model import IPAddress, IPFamily, IPNetwork
from ovsproxy.routes.backend import (
    VIRTUAL_MAC,
    VIRTUAL_NEXT_HOP,
    GatewayNotFoundError,
    KernelRoute,
    RouteAbsentError,
    RouteBackendError,
    RouteExistsError,
)

log = logging.getLogger(__name__)

# Our route protocol (rtm_protocol). Unassigned in iproute2's rt_protos (which lists 0-4 kernel,
# 8-18 daemons, 42 babel, 99 openr, 186-192 routing daemons) and not used by the CNIs we know
# (Calico uses 80). One byte, so any value 5..255 works; 155 it is.
ROUTE_PROTOCOL = 155
MAIN_TABLE = 254
NETNS_DIR = Path("/run/netns")

_AF = {IPFamily.IPv4: socket.AF_INET, IPFamily.IPv6: socket.AF_INET6}
_NUD_PERMANENT = 0x80
_RT_SCOPE_LINK = 253


class LinuxRouteBackend:
    """Routes on a device of one network namespace, main table, marked ``proto 155``."""

    name = "linux"

    def __init__(
        self,
        netns: str | None = None,
        *,
        protocol: int = ROUTE_PROTOCOL,
        table: int = MAIN_TABLE,
    ) -> None:
        if not 5 <= protocol <= 255:
            raise ValueError("route protocol must be 5..255 (0-4 belong to the kernel)")
        self.netns = netns
        self.protocol = protocol
        self.table = table
        self._ipr: AsyncIPRoute | None = None
        self._ifindex: dict[str, int] = {}

    async def open(self) -> None:
        if self._ipr is not None:
            return
        if self.netns is not None:
            # pyroute2 creates a missing namespace unless flags=0, and with flags=0 reports a
            # missing one only at the first request: check up front for a clear error.
            if "/" in self.netns or not (NETNS_DIR / self.netns).exists():
                raise FileNotFoundError(f"network namespace {self.netns!r} does not exist")
            ipr = AsyncIPRoute(netns=self.netns, flags=0)
        else:
            ipr = AsyncIPRoute()
        try:
            await ipr.link_lookup(ifname="lo")  # forces the socket open now
        except BaseException:
            ipr.close()
            raise
        self._ipr = ipr

    async def close(self) -> None:
        if self._ipr is not None:
            self._ipr.close()
            self._ipr = None
        self._ifindex.clear()

    @property
    def ipr(self) -> AsyncIPRoute:
        if self._ipr is None:
            raise RuntimeError("LinuxRouteBackend is not open")
        return self._ipr

    def next_hop(self, family: IPFamily) -> IPAddress:
        return VIRTUAL_NEXT_HOP[family]

    async def _index(self, gateway: str, *, refresh: bool = False) -> int:
        if refresh or gateway not in self._ifindex:
            found = await self.ipr.link_lookup(ifname=gateway)
            if not found:
                self._ifindex.pop(gateway, None)
                raise GatewayNotFoundError(f"gateway device {gateway!r} not found")
            self._ifindex[gateway] = found[0]
        return self._ifindex[gateway]

    async def _dump_routes(self, index: int, family: IPFamily) -> list[Any]:
        # Filter by table and device in the request AND here: a dump without a match is the
        # whole table, and we must never judge routes of other devices or tables.
        found = []
        async for msg in await self.ipr.route(
            "dump", family=_AF[family], table=self.table, oif=index
        ):
            table = msg.get("table")
            if table != self.table or msg.get("oif") != index or msg["type"] != 1:
                continue  # not main table, multipath/other device, or not unicast
            found.append(msg)
        return found

    @staticmethod
    def _dst(msg: Any, family: IPFamily) -> IPNetwork:
        dst = msg.get("dst")
        if dst is None:  # the default route carries no RTA_DST
            dst = "0.0.0.0" if family is IPFamily.IPv4 else "::"
        return ipaddress.ip_network(f"{dst}/{msg['dst_len']}", strict=False)

    async def ensure_next_hop(self, gateway: str, family: IPFamily) -> list[str]:
        index = await self._index(gateway, refresh=True)
        hop = VIRTUAL_NEXT_HOP[family]
        changes = []
        neighbour_ok = False
        async for msg in await self.ipr.neigh("dump", family=_AF[family], ifindex=index):
            if msg.get("dst") == str(hop):
                neighbour_ok = str(msg.get("lladdr", "")).lower() == VIRTUAL_MAC and bool(
                    msg["state"] & _NUD_PERMANENT
                )
        if not neighbour_ok:
            await self._call(
                "neigh",
                "replace",
                dst=str(hop),
                lladdr=VIRTUAL_MAC,
                ifindex=index,
                state="permanent",
            )
            changes.append(f"neighbour {hop} lladdr {VIRTUAL_MAC} dev {gateway} permanent")
        host = ipaddress.ip_network(hop)
        route_ok = False
        for msg in await self._dump_routes(index, family):
            if self._dst(msg, family) == host and msg.get("gateway") is None:
                route_ok = family is IPFamily.IPv6 or msg["scope"] == _RT_SCOPE_LINK
        if not route_ok:
            await self._call(
                "route",
                "replace",
                dst=str(host),
                oif=index,
                scope="link",
                proto=self.protocol,
                table=self.table,
            )
            changes.append(f"route {host} dev {gateway} scope link proto {self.protocol}")
        return changes

    async def remove_next_hop(
        self, gateway: str, family: IPFamily, *, neighbours: bool = True
    ) -> list[str]:
        """Undo ``ensure_next_hop`` (``ovsproxy cleanup``): our on-link host routes on the
        gateway (the next hop's; a host-SNAT address's, ``routes.hostsnat``), and with
        ``neighbours`` every permanent neighbour entry on the gateway that resolves to the
        virtual MAC (the next hop's, a host-SNAT address's). Returns what was removed; a
        missing gateway took them all with it."""
        try:
            index = await self._index(gateway, refresh=True)
        except GatewayNotFoundError:
            return []
        removed = []
        for msg in await self._dump_routes(index, family):
            host = self._dst(msg, family)
            if (
                host.prefixlen == host.max_prefixlen
                and msg.get("gateway") is None
                and msg["proto"] == self.protocol
            ):
                await self._call(
                    "route",
                    "del",
                    dst=str(host),
                    oif=index,
                    scope=msg["scope"],  # the kernel matches the scope of a delete too
                    proto=self.protocol,
                    table=self.table,
                )
                removed.append(f"route {host} dev {gateway} proto {self.protocol}")
        if neighbours:
            ours = [
                msg.get("dst")
                async for msg in await self.ipr.neigh("dump", family=_AF[family], ifindex=index)
                if msg.get("ifindex") == index
                and str(msg.get("lladdr", "")).lower() == VIRTUAL_MAC
                and msg["state"] & _NUD_PERMANENT
            ]
            for dst in ours:
                await self._call("neigh", "del", dst=dst, ifindex=index)
                removed.append(f"neighbour {dst} lladdr {VIRTUAL_MAC} dev {gateway} permanent")
        return removed

    async def list_routes(self, gateway: str, family: IPFamily) -> list[KernelRoute]:
        index = await self._index(gateway, refresh=True)
        host = ipaddress.ip_network(VIRTUAL_NEXT_HOP[family])
        routes = []
        for msg in await self._dump_routes(index, family):
            dst = self._dst(msg, family)
            gw = msg.get("gateway")
            if dst == host and gw is None:
                continue  # the next hop's own host route, managed by ensure_next_hop
            if gw is None and msg["proto"] == self.protocol and dst.prefixlen == dst.max_prefixlen:
                continue  # our on-link host route of a host-SNAT address (routes.hostsnat)
            routes.append(
                KernelRoute(
                    dst=dst,
                    gateway=ipaddress.ip_address(gw) if gw else None,
                    ours=msg["proto"] == self.protocol,
                    protocol=msg["proto"],
                    metric=msg.get("priority"),
                )
            )
        return routes

    async def list_table(self, gateway: str, family: IPFamily) -> list[KernelRoute]:
        """Every unicast route of ``family`` in our table on a device other than ``gateway``
        (the node's default route on its uplink, a CNI's routes, ...): never ours, so the
        manager treats a desired prefix equal to one of them as a conflict. A Service route
        on the same destination would take that route's traffic (ours has metric 0)."""
        index = await self._index(gateway, refresh=True)
        names = {
            link["index"]: link.get("ifname") or str(link["index"])
            async for link in await self.ipr.link("dump")
        }
        found = []
        async for msg in await self.ipr.route("dump", family=_AF[family], table=self.table):
            oif = msg.get("oif")
            if msg.get("table") != self.table or msg["type"] != 1 or oif == index:
                continue
            gw = msg.get("gateway")
            found.append(
                KernelRoute(
                    dst=self._dst(msg, family),
                    gateway=ipaddress.ip_address(gw) if gw else None,
                    ours=False,
                    protocol=msg["proto"],
                    metric=msg.get("priority"),
                    device=names.get(oif, str(oif)) if oif is not None else "multipath",
                )
            )
        return found

    async def add_route(self, gateway: str, dst: IPNetwork) -> KernelRoute:
        index = await self._index(gateway)
        hop = VIRTUAL_NEXT_HOP[IPFamily.of(dst)]
        await self._call(
            "route",
            "add",
            dst=str(dst),
            gateway=str(hop),
            oif=index,
            proto=self.protocol,
            table=self.table,
        )
        return KernelRoute(dst, hop, ours=True, protocol=self.protocol)

    async def replace_route(self, gateway: str, old: KernelRoute) -> KernelRoute:
        if not old.ours:
            raise RouteBackendError(f"refusing to replace a route that is not ours: {old}")
        index = await self._index(gateway)
        hop = VIRTUAL_NEXT_HOP[old.family]
        kwargs: dict[str, Any] = {}
        if old.metric is not None:
            kwargs["priority"] = old.metric  # replace matches on dst+priority: hit ours exactly
        await self._call(
            "route",
            "replace",
            dst=str(old.dst),
            gateway=str(hop),
            oif=index,
            proto=self.protocol,
            table=self.table,
            **kwargs,
        )
        return KernelRoute(old.dst, hop, ours=True, protocol=self.protocol, metric=old.metric)

    async def delete_route(self, gateway: str, route: KernelRoute) -> None:
        if not route.ours:
            raise RouteBackendError(f"refusing to delete a route that is not ours: {route}")
        index = await self._index(gateway)
        kwargs: dict[str, Any] = {}
        if route.gateway is not None:
            kwargs["gateway"] = str(route.gateway)
        if route.metric is not None:
            kwargs["priority"] = route.metric
        # proto in the request makes the kernel match it: a foreign route with the same dst is
        # never the one removed.
        await self._call(
            "route",
            "del",
            dst=str(route.dst),
            oif=index,
            proto=self.protocol,
            table=self.table,
            **kwargs,
        )

    async def _call(self, kind: str, command: str, **kwargs: Any) -> None:
        try:
            await getattr(self.ipr, kind)(command, **kwargs)
        except NetlinkError as exc:
            if exc.code == errno.EEXIST:
                raise RouteExistsError(f"{kind} {command} {kwargs}: exists") from exc
            if exc.code == errno.ESRCH:
                raise RouteAbsentError(f"{kind} {command} {kwargs}: absent") from exc
            if exc.code == errno.ENODEV:
                self._ifindex.clear()  # the gateway was recreated: look it up again next time
                raise GatewayNotFoundError(f"{kind} {command} {kwargs}: no such device") from exc
            raise RouteBackendError(f"{kind} {command} {kwargs}: {exc}") from exc
