"""The interface between the route manager and an operating system's routing table.

A backend knows how to list, add, replace and delete routes on one device and how to set up
the virtual next hop; it knows nothing about which routes should exist. The manager decides,
the backend executes. Two implementations: ``linux`` (netlink via pyroute2) and ``windows``
(NetTCPIP cmdlets via PowerShell).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ovsproxy.model import IPAddress, IPFamily, IPNetwork, node

# The virtual next hop every Service route uses: the node's virtual Service IP (see
# ovsproxy.model.node; the datapath SNATs hairpin traffic to the same address).
VIRTUAL_NEXT_HOP: dict[IPFamily, IPAddress] = node.VIRTUAL_SERVICE_IP
VIRTUAL_MAC: str = node.VIRTUAL_MAC


class RouteBackendError(Exception):
    """A routing-table operation failed."""


class RouteExistsError(RouteBackendError):
    """A route with this destination exists already (ours or not): nothing was changed."""


class RouteAbsentError(RouteBackendError):
    """The route to delete is not there (someone removed it already)."""


class GatewayNotFoundError(RouteBackendError):
    """The gateway device does not exist (yet)."""


@dataclass(frozen=True, slots=True)
class KernelRoute:
    """One route on the gateway device as the backend found (or created) it.

    ``ours`` is the backend's ownership mark (Linux: our route protocol number; Windows: our
    route metric). ``gateway`` is the next hop, ``None`` for an on-link route.
    """

    dst: IPNetwork
    gateway: IPAddress | None
    ours: bool
    protocol: int | str | None = None  # for logs: the mark the backend read
    metric: int | None = None
    device: str | None = None  # set for a route of another device (``list_table``)

    @property
    def family(self) -> IPFamily:
        return IPFamily.of(self.dst)

    def __str__(self) -> str:
        via = f" via {self.gateway}" if self.gateway is not None else ""
        dev = f" dev {self.device}" if self.device is not None else ""
        mark = "ours" if self.ours else f"foreign proto={self.protocol}"
        metric = f" metric {self.metric}" if self.metric is not None else ""
        return f"{self.dst}{via}{dev}{metric} ({mark})"


@runtime_checkable
class RouteBackend(Protocol):
    """What the manager needs from an OS. All methods are called from ONE task at a time."""

    name: str

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    def next_hop(self, family: IPFamily) -> IPAddress:
        """The next hop every Service route of ``family`` uses."""
        ...

    async def ensure_next_hop(self, gateway: str, family: IPFamily) -> list[str]:
        """Make the virtual next hop usable (neighbour + host route); idempotent.

        Returns a description of each change made (empty when everything was in place), so the
        manager can count and log them.
        """
        ...

    async def list_routes(self, gateway: str, family: IPFamily) -> list[KernelRoute]:
        """Every route of ``family`` on ``gateway`` in the table we manage, ours or not,
        except the next hop's own host route."""
        ...

    # Optional: ``list_table(gateway, family)``, every route of the table on devices other
    # than ``gateway`` (never ours), for the manager's conflict check (Linux has it).

    async def add_route(self, gateway: str, dst: IPNetwork) -> KernelRoute:
        """Add ``dst via next_hop dev gateway`` with our mark; ``RouteExistsError`` if taken."""
        ...

    async def replace_route(self, gateway: str, old: KernelRoute) -> KernelRoute:
        """Repoint one of OUR routes (wrong next hop) to the virtual next hop, same dst."""
        ...

    async def delete_route(self, gateway: str, route: KernelRoute) -> None:
        """Delete exactly this route, and only if it carries our mark; ``RouteAbsentError``
        if it is not there."""
        ...
