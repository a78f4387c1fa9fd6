"""The gateway side of host SNAT (Linux): the address's neighbour entry, and its route if needed.

The datapath SNATs the node's own Service connections to remote endpoints (and steered
external ones) to the host-SNAT address (``ovsproxy.model.hostsnat``); the endpoint's reply is
routed to this node and must enter OVS. So, per address, on the gateway::

    ip neigh replace ADDRESS lladdr VIRTUAL_MAC dev gw0 nud permanent
    ip route replace ADDRESS dev gw0 scope link proto 155   # only when no gateway prefix has it

Ownership: a permanent neighbour entry with the virtual MAC on the gateway is ours (no CNI
makes one; ``remove`` leaves the virtual next hop's, which ``RouteManager`` keeps); the route
is ours by its protocol. ``gateway_addresses`` reads the gateway's addresses, whose connected
prefixes are the node's pod CIDRs.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from typing import Any

from ovsproxy.model import IPAddress, IPFamily, node
from ovsproxy.routes.linux import LinuxRouteBackend

log = logging.getLogger(__name__)

_AF = {IPFamily.IPv4: socket.AF_INET, IPFamily.IPv6: socket.AF_INET6}
_NUD_PERMANENT = 0x80
_RT_SCOPE_UNIVERSE = 0

Interface = ipaddress.IPv4Interface | ipaddress.IPv6Interface


class HostSNATRoutes:
    """Neighbour entries (and host routes) for the host-SNAT addresses on one gateway."""

    def __init__(self, gateway: str, netns: str | None = None) -> None:
        self.gateway = gateway
        self.backend = LinuxRouteBackend(netns=netns)

    async def open(self) -> None:
        await self.backend.open()

    async def close(self) -> None:
        await self.backend.close()

    async def gateway_addresses(self) -> list[Interface]:
        """The gateway's global addresses with their prefixes, IPv4 first, in kernel order
        (``GatewayNotFoundError`` when it does not exist)."""
        index = await self.backend._index(self.gateway, refresh=True)
        found: list[Interface] = []
        for family in IPFamily:
            async for msg in await self.backend.ipr.addr("dump", family=_AF[family], index=index):
                if msg["index"] != index or msg.get("scope") != _RT_SCOPE_UNIVERSE:
                    continue
                found.append(ipaddress.ip_interface(f"{msg.get('address')}/{msg['prefixlen']}"))
        return found

    async def _neighbour(self, index: int, address: IPAddress) -> tuple[bool, bool]:
        """(present, ours: permanent with the virtual MAC)."""
        family = IPFamily.of(address)
        async for msg in await self.backend.ipr.neigh("dump", family=_AF[family], ifindex=index):
            if msg.get("dst") == str(address) and msg.get("ifindex", index) == index:
                mac = str(msg.get("lladdr", "")).lower()
                return True, mac == node.VIRTUAL_MAC and bool(msg["state"] & _NUD_PERMANENT)
        return False, False

    async def _host_route(self, index: int, address: IPAddress) -> bool:
        host = ipaddress.ip_network(address)
        family = IPFamily.of(address)
        for msg in await self.backend._dump_routes(index, family):
            if self.backend._dst(msg, family) == host and msg["proto"] == self.backend.protocol:
                return True
        return False

    def _route_spec(self, index: int, address: IPAddress) -> dict[str, Any]:
        """Our on-link host route to ``address`` (replace and delete name it alike)."""
        return {
            "dst": str(ipaddress.ip_network(address)),
            "oif": index,
            "scope": "link",
            "proto": self.backend.protocol,
            "table": self.backend.table,
        }

    async def ensure(self, address: IPAddress) -> list[str]:
        """The address's neighbour entry, and a host route when none of the gateway's prefixes
        holds it; returns the changes made (empty: all in place)."""
        index = await self.backend._index(self.gateway, refresh=True)
        changes = []
        _present, ours = await self._neighbour(index, address)
        if not ours:
            await self.backend._call(
                "neigh",
                "replace",
                dst=str(address),
                lladdr=node.VIRTUAL_MAC,
                ifindex=index,
                state="permanent",
            )
            changes.append(
                f"neighbour {address} lladdr {node.VIRTUAL_MAC} dev {self.gateway} permanent"
            )
        connected = any(address in i.network for i in await self.gateway_addresses())
        if not connected and not await self._host_route(index, address):
            await self.backend._call("route", "replace", **self._route_spec(index, address))
            changes.append(
                f"route {address} dev {self.gateway} scope link proto {self.backend.protocol}"
            )
        return changes

    async def installed(self, address: IPAddress) -> bool:
        """The address's neighbour entry is there, ours."""
        index = await self.backend._index(self.gateway, refresh=True)
        return (await self._neighbour(index, address))[1]

    async def remove(self, addresses: list[IPAddress]) -> list[str]:
        """Delete the neighbour entries (ours only) and host routes of ``addresses``; a no-op
        for what is absent, or when the gateway is gone (its entries went with it)."""
        found = await self.backend.ipr.link_lookup(ifname=self.gateway)
        if not found:
            return []
        index = found[0]
        changes = []
        for address in addresses:
            if address == node.VIRTUAL_SERVICE_IP[IPFamily.of(address)]:
                continue  # the virtual next hop's: the route manager's to keep
            if (await self._neighbour(index, address))[1]:
                await self.backend._call("neigh", "del", dst=str(address), ifindex=index)
                changes.append(f"neighbour {address} dev {self.gateway} removed")
            if await self._host_route(index, address):
                await self.backend._call("route", "del", **self._route_spec(index, address))
                changes.append(f"route {address} dev {self.gateway} removed")
        return changes
