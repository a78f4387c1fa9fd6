"""Windows backend: Service routes through the NetTCPIP cmdlets, driven by the same manager.

Commands go through a ``PowerShellRunner`` (``ovsproxy.routes.powershell``) and answer with
``ConvertTo-Json``; every address read back is parsed into an ``ipaddress`` object before it is
compared (the seed's bug was comparing ``10.96.0.1`` with ``10.96.0.1/32`` as strings).

Ownership: NetTCPIP has no free-form route tag, and ``Protocol`` is an enum of routing
protocols that New-NetRoute sets to NetMgmt for everyone. Our mark is the route metric:
``RouteMetric 155`` (the same number as the Linux protocol, to remember one figure) on the
gateway interface, in the ``ActiveStore`` (not persistent: a reboot starts clean, and the agent
re-creates what is needed). A route with any other metric is never removed. Removes name the
prefix, interface, next hop AND metric, so they cannot hit another owner's route.

The virtual next hop is set up as Antrea does on Windows: a permanent neighbour for
169.254.0.253 (MAC aa-bb-cc-dd-ee-ff) and an on-link /32 route to it, without which Windows
refuses routes via that address.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import re
from typing import Any

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
from ovsproxy.routes.powershell import PowerShellResult, PowerShellRunner, SubprocessPowerShell

log = logging.getLogger(__name__)

ROUTE_METRIC = 155
POLICY_STORE = "ActiveStore"
_FAMILY = {IPFamily.IPv4: "IPv4", IPFamily.IPv6: "IPv6"}
_ON_LINK = {IPFamily.IPv4: "0.0.0.0", IPFamily.IPv6: "::"}
_SAFE_ALIAS = re.compile(r"[^\x00-\x1f`\"$]{1,256}")  # fullmatch: "$" would allow a final \n


# PowerShell also ends a single-quoted string at the typographic single quotes.
_SINGLE_QUOTES = ("'", "\u2018", "\u2019", "\u201a", "\u201b")


def quote(text: str) -> str:
    """A PowerShell single-quoted literal: no expansion inside; every quote is doubled."""
    for q in _SINGLE_QUOTES:
        text = text.replace(q, q + q)
    return "'" + text + "'"


def _mac(text: str) -> str:
    return text.strip().lower().replace("-", ":")


class WindowsRouteBackend:
    """Routes on one interface (``-InterfaceAlias``), marked by ``RouteMetric``."""

    name = "windows"

    def __init__(
        self,
        runner: PowerShellRunner | None = None,
        *,
        metric: int = ROUTE_METRIC,
    ) -> None:
        if not 0 < metric < 9999:
            raise ValueError("RouteMetric must be 1..9998")
        self.runner = runner if runner is not None else SubprocessPowerShell()
        self.metric = metric

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def next_hop(self, family: IPFamily) -> IPAddress:
        return VIRTUAL_NEXT_HOP[family]

    # -- commands (public so tests and docs can show the exact text) ------------------------

    @staticmethod
    def _alias(gateway: str) -> str:
        if not _SAFE_ALIAS.fullmatch(gateway):
            raise ValueError(f"unsafe interface alias: {gateway!r}")
        return quote(gateway)

    def cmd_list_routes(self, gateway: str, family: IPFamily) -> str:
        return (
            f"$r = @(Get-NetRoute -InterfaceAlias {self._alias(gateway)} "
            f"-AddressFamily {_FAMILY[family]} -PolicyStore {POLICY_STORE} "
            "-ErrorAction SilentlyContinue | "
            "Select-Object DestinationPrefix,NextHop,RouteMetric); "
            "ConvertTo-Json -InputObject $r -Compress"
        )

    def cmd_get_neighbor(self, gateway: str, family: IPFamily) -> str:
        return (
            f"$n = @(Get-NetNeighbor -InterfaceAlias {self._alias(gateway)} "
            f"-IPAddress {quote(str(VIRTUAL_NEXT_HOP[family]))} -PolicyStore {POLICY_STORE} "
            "-ErrorAction SilentlyContinue | "
            "Select-Object IPAddress,LinkLayerAddress,@{n='State';e={[string]$_.State}}); "
            "ConvertTo-Json -InputObject $n -Compress"
        )

    def cmd_remove_neighbor(self, gateway: str, family: IPFamily) -> str:
        return (
            f"Remove-NetNeighbor -InterfaceAlias {self._alias(gateway)} "
            f"-IPAddress {quote(str(VIRTUAL_NEXT_HOP[family]))} -PolicyStore {POLICY_STORE} "
            "-Confirm:$false"
        )

    def cmd_new_neighbor(self, gateway: str, family: IPFamily) -> str:
        mac = VIRTUAL_MAC.replace(":", "-")
        return (
            f"New-NetNeighbor -InterfaceAlias {self._alias(gateway)} "
            f"-IPAddress {quote(str(VIRTUAL_NEXT_HOP[family]))} -LinkLayerAddress {quote(mac)} "
            f"-State Permanent -PolicyStore {POLICY_STORE} | Out-Null"
        )

    def cmd_new_route(self, gateway: str, dst: IPNetwork, next_hop: str) -> str:
        return (
            f"New-NetRoute -DestinationPrefix {quote(str(dst))} "
            f"-InterfaceAlias {self._alias(gateway)} -NextHop {quote(next_hop)} "
            f"-RouteMetric {self.metric} -PolicyStore {POLICY_STORE} | Out-Null"
        )

    def cmd_remove_route(self, gateway: str, dst: IPNetwork, next_hop: str) -> str:
        return (
            f"Remove-NetRoute -DestinationPrefix {quote(str(dst))} "
            f"-InterfaceAlias {self._alias(gateway)} -NextHop {quote(next_hop)} "
            f"-RouteMetric {self.metric} -PolicyStore {POLICY_STORE} -Confirm:$false"
        )

    # -- the backend interface ---------------------------------------------------------------

    async def ensure_next_hop(self, gateway: str, family: IPFamily) -> list[str]:
        hop = VIRTUAL_NEXT_HOP[family]
        changes: list[str] = []
        neighbours = _records(await self._run(self.cmd_get_neighbor(gateway, family)))
        present = [n for n in neighbours if _same_ip(n.get("IPAddress"), hop)]
        ok = any(
            _mac(str(n.get("LinkLayerAddress", ""))) == VIRTUAL_MAC
            and str(n.get("State", "")).lower() == "permanent"
            for n in present
        )
        if not ok:
            if present:  # wrong MAC or not permanent: Set-NetNeighbor cannot change the state
                await self._run(self.cmd_remove_neighbor(gateway, family))
            await self._run(self.cmd_new_neighbor(gateway, family))
            changes.append(f"neighbour {hop} {VIRTUAL_MAC} on {gateway} permanent")
        host = ipaddress.ip_network(hop)
        routes = _records(await self._run(self.cmd_list_routes(gateway, family)))
        # Any on-link host route to the next hop does the job, whoever made it.
        if not any(
            _network(r.get("DestinationPrefix")) == host and _on_link(r.get("NextHop"))
            for r in routes
        ):
            await self._run(self.cmd_new_route(gateway, host, _ON_LINK[family]))
            changes.append(f"route {host} on-link on {gateway} metric {self.metric}")
        return changes

    async def list_routes(self, gateway: str, family: IPFamily) -> list[KernelRoute]:
        host = ipaddress.ip_network(VIRTUAL_NEXT_HOP[family])
        routes = []
        for record in _records(await self._run(self.cmd_list_routes(gateway, family))):
            dst = _network(record.get("DestinationPrefix"))
            if dst is None or dst.version != family:
                continue
            gateway_ip = _address(record.get("NextHop"))
            if gateway_ip is not None and gateway_ip.is_unspecified:
                gateway_ip = None
            if dst == host and gateway_ip is None:
                continue  # the next hop's own route, managed by ensure_next_hop
            metric = record.get("RouteMetric")
            routes.append(
                KernelRoute(
                    dst=dst,
                    gateway=gateway_ip,
                    ours=metric == self.metric,
                    protocol=f"metric {metric}",
                    metric=metric if isinstance(metric, int) else None,
                )
            )
        return routes

    async def add_route(self, gateway: str, dst: IPNetwork) -> KernelRoute:
        hop = VIRTUAL_NEXT_HOP[IPFamily.of(dst)]
        await self._run(self.cmd_new_route(gateway, dst, str(hop)))
        mark = f"metric {self.metric}"
        return KernelRoute(dst, hop, ours=True, protocol=mark, metric=self.metric)

    async def replace_route(self, gateway: str, old: KernelRoute) -> KernelRoute:
        if not old.ours:
            raise RouteBackendError(f"refusing to replace a route that is not ours: {old}")
        # Routes differing in next hop coexist on Windows: add the new one, then remove the old.
        new = await self.add_route(gateway, old.dst)
        try:
            await self.delete_route(gateway, old)
        except RouteAbsentError:
            pass
        return new

    async def delete_route(self, gateway: str, route: KernelRoute) -> None:
        if not route.ours:
            raise RouteBackendError(f"refusing to delete a route that is not ours: {route}")
        hop = str(route.gateway) if route.gateway is not None else _ON_LINK[route.family]
        await self._run(self.cmd_remove_route(gateway, route.dst, hop))

    async def _run(self, command: str) -> PowerShellResult:
        result = await self.runner.run(command)
        if result.ok:
            return result
        message = (result.stderr or result.stdout).strip()
        lowered = message.lower()
        if "already exists" in lowered:
            raise RouteExistsError(message)
        if "no matching msft_netroute" in lowered or "no matching msft_netneighbor" in lowered:
            raise RouteAbsentError(message)
        if "no msft_netadapter" in lowered or "no matching msft_netipinterface" in lowered:
            raise GatewayNotFoundError(message)
        raise RouteBackendError(f"exit {result.exit_code}: {message}")


def _records(result: PowerShellResult) -> list[dict[str, Any]]:
    text = result.stdout.strip()
    if not text:
        return []
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RouteBackendError(f"PowerShell did not answer JSON: {text[:200]!r}") from exc
    if isinstance(data, dict):  # ConvertTo-Json unwraps a single object
        data = [data]
    return [d for d in data if isinstance(d, dict)]


def _network(value: Any) -> IPNetwork | None:
    try:
        return ipaddress.ip_network(str(value).strip(), strict=False)
    except ValueError:
        return None


def _address(value: Any) -> IPAddress | None:
    if value is None:
        return None
    try:
        return ipaddress.ip_address(str(value).strip().split("%")[0])
    except ValueError:
        return None


def _same_ip(value: Any, ip: IPAddress) -> bool:
    return _address(value) == ip


def _on_link(value: Any) -> bool:
    address = _address(value)
    return address is None or address.is_unspecified
