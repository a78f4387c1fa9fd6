"""The policy routing of node-side steering (Linux): steered packets go to the gateway.

The steering table (``ovsproxy.steering``) marks every packet of a NodePort, external IP or
load-balancer IP connection with ``NODE_STEERING_MARK``. Per IP family, one rule and one route
take all of them into OVS::

    ip rule add fwmark MARK/MARK lookup NODE_STEERING_ROUTE_TABLE priority 155 proto 155
    ip route add default via VIRTUAL_SERVICE_IP dev gw0 table NODE_STEERING_ROUTE_TABLE proto 155

The next hop is the virtual Service IP that the Service routes use; its permanent neighbour
entry and host route are the route backend's (``ensure_next_hop``, called first here).
Ownership: the rule is ours when it has our priority, mark and table and carries protocol 155;
the route is ours in our table with protocol 155. Nothing else is touched. ``remove`` deletes
exactly these (``--cleanup``).
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import socket
from typing import Any

from pyroute2.netlink.exceptions import NetlinkError

from ovsproxy.model import IPAddress, IPFamily, node
from ovsproxy.routes.backend import RouteBackendError
from ovsproxy.routes.linux import ROUTE_PROTOCOL, LinuxRouteBackend

log = logging.getLogger(__name__)

RULE_PRIORITY = 155  # before the main table's rule (32766)
_AF = {IPFamily.IPv4: socket.AF_INET, IPFamily.IPv6: socket.AF_INET6}
_DEFAULT = {IPFamily.IPv4: "0.0.0.0/0", IPFamily.IPv6: "::/0"}


class SteeringRoutes:
    """One rule and one default route per family in our table, on one gateway device."""

    def __init__(self, gateway: str, netns: str | None = None) -> None:
        self.gateway = gateway
        # Its own netlink socket: the route manager's backend is driven by its worker alone.
        self.backend = LinuxRouteBackend(netns=netns)
        self.mark = node.NODE_STEERING_MARK
        self.table = node.NODE_STEERING_ROUTE_TABLE

    async def open(self) -> None:
        await self.backend.open()

    async def close(self) -> None:
        await self.backend.close()

    def _rule(self, family: IPFamily) -> dict[str, Any]:
        return {
            "family": _AF[family],
            "fwmark": self.mark,
            "fwmask": self.mark,
            "table": self.table,
            "priority": RULE_PRIORITY,
            "protocol": ROUTE_PROTOCOL,
        }

    async def _rule_present(self, family: IPFamily) -> bool:
        async for msg in await self.backend.ipr.rule("dump", family=_AF[family]):
            if (
                msg.get("priority") == RULE_PRIORITY
                and msg.get("fwmark") == self.mark
                and msg.get("fwmask") == self.mark
                and msg.get("table") == self.table
            ):
                return True
        return False

    async def _routes(self, family: IPFamily) -> list[Any]:
        found = []
        try:
            async for msg in await self.backend.ipr.route(
                "dump", family=_AF[family], table=self.table
            ):
                if msg.get("table") == self.table and msg.get("proto") == ROUTE_PROTOCOL:
                    found.append(msg)
        except NetlinkError as exc:
            if exc.code != errno.ENOENT:  # no such table yet: nothing there
                raise
        return found

    async def ensure(self, families: list[IPFamily]) -> list[str]:
        """Make the rule and route of each family present; returns the changes made."""
        changes: list[str] = []
        index = await self.backend._index(self.gateway, refresh=True)
        for family in families:
            changes += await self.backend.ensure_next_hop(self.gateway, family)
            hop = str(node.VIRTUAL_SERVICE_IP[family])
            if not await self._rule_present(family):
                await self._call("rule", "add", **self._rule(family))
                changes.append(
                    f"rule fwmark {self.mark:#x}/{self.mark:#x} lookup {self.table} (IPv{family})"
                )
            routes = await self._routes(family)
            if not any(
                msg.get("gateway") == hop and msg.get("oif") == index and msg["dst_len"] == 0
                for msg in routes
            ):
                await self._call(
                    "route",
                    "replace",
                    family=_AF[family],
                    dst=_DEFAULT[family],
                    gateway=hop,
                    oif=index,
                    table=self.table,
                    proto=ROUTE_PROTOCOL,
                )
                changes.append(f"route default via {hop} dev {self.gateway} table {self.table}")
        return changes

    async def remove(self) -> list[str]:
        """Delete our rule and our table's routes, both families (a no-op when absent);
        returns what was removed."""
        changes: list[str] = []
        for family in IPFamily:
            while await self._rule_present(family):
                await self._call("rule", "del", **self._rule(family))
                changes.append(
                    f"rule fwmark {self.mark:#x}/{self.mark:#x} lookup {self.table} (IPv{family})"
                )
            for msg in await self._routes(family):
                dst_len = msg["dst_len"]
                dst = msg.get("dst") or _DEFAULT[family].split("/")[0]
                await self._call(
                    "route",
                    "del",
                    family=_AF[family],
                    dst=f"{dst}/{dst_len}",
                    table=self.table,
                    proto=ROUTE_PROTOCOL,
                )
                changes.append(f"route {dst}/{dst_len} table {self.table} proto {ROUTE_PROTOCOL}")
        return changes

    async def installed(self) -> list[str]:
        """Our rules and routes as text (status)."""
        out = []
        for family in IPFamily:
            if await self._rule_present(family):
                out.append(f"IPv{family}: fwmark {self.mark:#x}/{self.mark:#x} lookup {self.table}")
            for msg in await self._routes(family):
                out.append(f"IPv{family}: table {self.table} default via {msg.get('gateway')}")
        return out

    async def node_addresses(self) -> list[IPAddress]:
        """The node's IPs when none are configured: the global addresses of its devices other
        than loopback and the gateway, IPv4 first, each family in device order."""
        ipr = self.backend.ipr
        names = {}
        async for link in await ipr.link("dump"):
            names[link["index"]] = link.get("ifname")
        found: list[tuple[int, int, IPAddress]] = []
        for family in IPFamily:
            async for msg in await ipr.addr("dump", family=_AF[family]):
                if names.get(msg["index"]) in (None, "lo", self.gateway):
                    continue
                if msg.get("scope") != 0:  # global scope only (not link or host)
                    continue
                ip = ipaddress.ip_address(msg.get("address"))
                if ip.is_link_local or ip.is_loopback:
                    continue
                found.append((int(family), msg["index"], ip))
        return [ip for _, _, ip in sorted(found, key=lambda t: (t[0], t[1]))]

    async def _call(self, kind: str, command: str, **kwargs: Any) -> None:
        try:
            await getattr(self.backend.ipr, kind)(command, **kwargs)
        except NetlinkError as exc:
            raise RouteBackendError(f"capture {kind} {command} {kwargs}: {exc}") from exc
