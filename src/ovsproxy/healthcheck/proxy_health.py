"""The proxy's own health, with kube-proxy's ``/healthz`` and ``/livez`` semantics (pure).

kube-proxy (pkg/proxy/healthcheck/proxy_health.go): per IP family, a sync is *queued* when a
Service or EndpointSlice change arrives and *updated* when the datapath reflects it. The proxy
is healthy unless some family has had an update queued for longer than ``health_timeout``
without a sync completing (a proxy that is starting, or fully synced, is healthy).

* ``/livez``: that health alone (is the proxy making progress?).
* ``/healthz``: that health *and* the node is eligible: not being deleted and not tainted
  ``ToBeDeletedByClusterAutoscaler``, so load balancers drain a node that is going away while
  its proxy is still alive.
* The per-Service health checks (``serviceProxyHealthy``) use the proxy's health without the
  node's eligibility, as kube-proxy's ``IsHealthy``.

Wiring (not done here): the metrics server's /healthz and /livez call ``healthz()`` /
``livez()``; the agent calls ``queued_update`` when the change tracker takes a change,
``updated`` after a successful proxier sync, and ``sync_node`` from the Node informer.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from typing import Any

from ovsproxy.model import IPFamily
from ovsproxy.model.node import Node

TO_BE_DELETED_TAINT = "ToBeDeletedByClusterAutoscaler"


class ProxyHealth:
    """kube-proxy's ProxyHealthServer state, without the HTTP server."""

    def __init__(
        self,
        health_timeout: float = 60.0,  # kube-proxy: 2 x its 30 s sync period
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.health_timeout = health_timeout
        self._clock = clock
        self._last_updated: dict[IPFamily, float] = {}
        self._oldest_queued: dict[IPFamily, float] = {}
        self._node_eligible = True  # until a Node event says otherwise

    def queued_update(self, family: IPFamily) -> None:
        """A change arrived that the datapath does not show yet."""
        self._oldest_queued.setdefault(family, self._clock())

    def updated(self, family: IPFamily) -> None:
        """The datapath reflects everything received so far."""
        self._oldest_queued.pop(family, None)
        self._last_updated[family] = self._clock()

    def sync_node(self, node: Node | None) -> None:
        """From this node's Node object, on every add and update; ``None`` once it is deleted.
        Not eligible: deleted, being deleted (a deletionTimestamp), or tainted
        ``ToBeDeletedByClusterAutoscaler`` (any effect). kube-proxy's ``SyncNode``; its newest
        releases exit on the Node's delete event instead, which leaves /healthz unanswered:
        a 503 says the same to a load balancer and keeps /livez and the datapath serving."""
        self._node_eligible = (
            node is not None and not node.deleting and TO_BE_DELETED_TAINT not in node.taints
        )

    @property
    def node_eligible(self) -> bool:
        return self._node_eligible

    def _health(self) -> tuple[bool, float | None]:
        now = self._clock()
        last: float | None = None
        for family, updated in self._last_updated.items():
            if last is None or updated > last:
                last = updated
            queued = self._oldest_queued.get(family)
            if queued is not None and now - queued >= self.health_timeout:
                return False, updated
        return True, last

    def is_healthy(self) -> bool:
        """The proxy's health, ignoring the node (what the Service health checks report)."""
        return self._health()[0]

    def livez(self) -> tuple[int, dict[str, Any]]:
        """HTTP status and JSON body of ``/livez``."""
        healthy, last = self._health()
        now = self._clock()
        # As kube-proxy: a healthy answer reports lastUpdated = now (older clients read it so).
        body = {"lastUpdated": _iso(now if healthy else last), "currentTime": _iso(now)}
        return (200 if healthy else 503), body

    def healthz(self) -> tuple[int, dict[str, Any]]:
        """HTTP status and JSON body of ``/healthz``: also 503 on a node going away."""
        healthy, last = self._health()
        healthy = healthy and self._node_eligible
        now = self._clock()
        body = {
            "lastUpdated": _iso(now if healthy else last),
            "currentTime": _iso(now),
            "nodeEligible": self._node_eligible,
        }
        return (200 if healthy else 503), body


def _iso(stamp: float | None) -> str:
    if stamp is None:
        return "0001-01-01T00:00:00Z"  # Go's zero time, what kube-proxy prints before a sync
    return dt.datetime.fromtimestamp(stamp, dt.UTC).isoformat().replace("+00:00", "Z")
