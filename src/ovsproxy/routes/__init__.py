"""Node routes to Services: one owner (``RouteManager``), two backends (Linux, Windows).

Which prefixes to route is decided by ``ovsproxy.servicecidr``; this package only makes the
routing table match, safely. See docs/routes.md.
"""

from ovsproxy.routes.backend import (
    VIRTUAL_MAC,
    VIRTUAL_NEXT_HOP,
    GatewayNotFoundError,
    KernelRoute,
    RouteAbsentError,
    RouteBackend,
    RouteBackendError,
    RouteExistsError,
)
from ovsproxy.routes.manager import FromThread, OpKey, RouteChanges, RouteManager

__all__ = [
    "VIRTUAL_MAC",
    "VIRTUAL_NEXT_HOP",
    "FromThread",
    "GatewayNotFoundError",
    "KernelRoute",
    "OpKey",
    "RouteAbsentError",
    "RouteBackend",
    "RouteBackendError",
    "RouteChanges",
    "RouteExistsError",
    "RouteManager",
]
