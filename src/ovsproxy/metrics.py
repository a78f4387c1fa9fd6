"""Prometheus metrics and the /healthz, /livez + /metrics HTTP endpoint.

Counters that other packages keep as plain dicts (OpenFlow wire counters, route operations,
source events) are read at scrape time by collectors, so those packages never import
prometheus_client and their hot paths stay a dict increment.

Each agent has its own registry: several agents (tests) can run in one process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

# kube-proxy's buckets (pkg/proxy/metrics): sync durations 1 ms doubling to 16 s; network
# programming 0, 0.25 s, 0.5 s, every second to 59 s, every 5 s to 115 s, every 30 s to 5 min.
KUBE_PROXY_SYNC_BUCKETS = tuple(0.001 * 2**i for i in range(15))
KUBE_PROXY_PROGRAMMING_BUCKETS = (
    0.0,
    0.25,
    0.5,
    *(float(s) for s in range(1, 60)),
    *(float(s) for s in range(60, 120, 5)),
    *(float(s) for s in range(120, 301, 30)),
)

# (metric name, help, label names, reader returning {label values tuple: value})
CounterSource = tuple[str, str, tuple[str, ...], Callable[[], Mapping[tuple[str, ...], float]]]


class DictCollector(Collector):
    """Exposes counters and gauges kept elsewhere as plain dicts."""

    def __init__(self) -> None:
        self.counters: list[CounterSource] = []
        self.gauges: list[CounterSource] = []

    def collect(self) -> Iterable[Any]:
        kinds = (CounterMetricFamily, GaugeMetricFamily)
        for kind, sources in zip(kinds, (self.counters, self.gauges), strict=True):
            yield from self._collect(kind, sources)

    @staticmethod
    def _collect(kind: Any, sources: list[CounterSource]) -> Iterable[Any]:
        for name, help_text, labels, read in sources:
            family = kind(name, help_text, labels=list(labels))
            try:
                values = read()
            except Exception:  # a scrape must never take the agent down
                log.exception("metrics: reading %s failed", name)
                continue
            for label_values, value in values.items():
                family.add_metric(list(label_values), value)
            yield family

    def describe(self) -> Iterable[Any]:
        return []


@dataclass
class Metrics:
    registry: CollectorRegistry = field(
        default_factory=lambda: CollectorRegistry(auto_describe=True)
    )

    def __post_init__(self) -> None:
        r = self.registry
        self.sync_duration = Histogram(
            "ovsproxy_sync_duration_seconds",
            "Time of one proxier sync (diff + OVS + routes).",
            ["kind"],
            registry=r,
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.syncs = Counter("ovsproxy_syncs", "Proxier syncs by result.", ["result"], registry=r)
        self.services = Gauge("ovsproxy_services_installed", "Service ports installed.", registry=r)
        self.endpoints = Gauge(
            "ovsproxy_endpoints_installed",
            "Endpoints installed in select groups (all Service ports).",
            registry=r,
        )
        self.refused = Gauge(
            "ovsproxy_services_refused",
            "Service ports refused, by reason: switch (Open vSwitch refused their flows; they "
            "keep their last good state), conflict (a nodePort, healthCheckNodePort or "
            "address:port an older Service claims; not installed).",
            ["reason"],
            registry=r,
        )
        for reason in ("switch", "conflict"):
            self.refused.labels(reason)
        self.groups = Gauge("ovsproxy_groups_installed", "Select groups installed.", registry=r)
        self.flows = Gauge("ovsproxy_flows_installed", "Flows installed.", registry=r)
        self.openflow_connected = Gauge(
            "ovsproxy_openflow_connected", "1 while the OpenFlow channel is up.", registry=r
        )
        self.node_ports = Gauge(
            "ovsproxy_node_ports",
            "Service ports with a NodePort captured on this node.",
            registry=r,
        )
        self.steering_elements = Gauge(
            "ovsproxy_capture_elements",
            "Elements of the node's capture table's sets (NodePorts, external and LB IPs, "
            "source ranges).",
            registry=r,
        )
        self.health_check_servers = Gauge(
            "ovsproxy_health_check_servers",
            "healthCheckNodePort servers running on this node.",
            registry=r,
        )
        self.source_ranges = Gauge(
            "ovsproxy_load_balancer_source_ranges",
            "loadBalancerSourceRanges entries of the Service ports installed.",
            registry=r,
        )
        self.ovsdb_connected = Gauge(
            "ovsproxy_ovsdb_connected", "1 while the OVSDB session is up.", registry=r
        )
        self.last_sync_success = Gauge(
            "ovsproxy_last_sync_success_timestamp_seconds",
            "Unix time of the last successful sync.",
            registry=r,
        )
        self.not_pods = Gauge(
            "ovsproxy_bridge_interfaces_not_pods",
            "Interfaces on the bridge not read as pods (no external_ids:ip or attached-mac, "
            "or a bad ip): they get no flows. The gateway is not counted.",
            registry=r,
        )
        # kube-proxy's names (its kubeproxy_ prefix made ours), its buckets and semantics,
        # for the dashboards and alerts operators already have.
        self.sync_proxy_rules_duration = Histogram(
            "ovsproxy_sync_proxy_rules_duration_seconds",
            "Time of one sync, successful or not (kube-proxy's sync_proxy_rules_duration).",
            registry=r,
            buckets=KUBE_PROXY_SYNC_BUCKETS,
        )
        self.sync_proxy_rules_last_timestamp = Gauge(
            "ovsproxy_sync_proxy_rules_last_timestamp_seconds",
            "Unix time of the last successful sync.",
            registry=r,
        )
        self.network_programming = Histogram(
            "ovsproxy_network_programming_duration_seconds",
            "From an EndpointSlice change's trigger time (the slice's "
            "endpoints.kubernetes.io/last-change-trigger-time) to the commit carrying it.",
            registry=r,
            buckets=KUBE_PROXY_PROGRAMMING_BUCKETS,
        )
        self.dicts = DictCollector()
        r.register(self.dicts)

    def add_counter(
        self,
        name: str,
        help_text: str,
        labels: tuple[str, ...],
        read: Callable[[], Mapping[tuple[str, ...], float]],
    ) -> None:
        self.dicts.counters.append((name, help_text, labels, read))

    def add_gauge(self, source: CounterSource) -> None:
        """A gauge read at scrape time: (name, help, label names, reader), as a counter's."""
        self.dicts.gauges.append(source)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class HealthState:
    """What /healthz and /livez answer, kube-proxy's way (``ovsproxy.healthcheck.ProxyHealth``
    decides ``progress`` and ``node_eligible``; this module imports nothing of ours).

    Healthy: OVS is connected, a first sync has succeeded, and the proxy makes progress (no
    change has waited longer than the health timeout for a sync: an idle agent stays healthy).
    /livez is that; /healthz is also 503 while the node is going away (``node_eligible``).
    """

    def __init__(self) -> None:
        self.last_sync_ok: float | None = None  # time.monotonic()
        self.last_sync_error: str | None = None
        self.connected: Callable[[], bool] = lambda: False
        self.progress: Callable[[], tuple[bool, dict[str, Any]]] = lambda: (True, {})
        self.node_eligible: Callable[[], bool] = lambda: True

    def sync_result(self, ok: bool, error: str | None = None) -> None:
        if ok:
            self.last_sync_ok = time.monotonic()
            self.last_sync_error = None
        else:
            self.last_sync_error = error

    def check(self, *, node: bool = False) -> tuple[bool, dict[str, Any]]:
        """(healthy, body): /livez; with ``node``, /healthz (the node's eligibility too)."""
        now = time.monotonic()
        age = None if self.last_sync_ok is None else now - self.last_sync_ok
        connected = self.connected()
        progress, body = self.progress()
        healthy = connected and age is not None and progress
        out = {
            "healthy": healthy,
            "openflow_connected": connected,
            "last_sync_age_s": None if age is None else round(age, 3),
            "last_sync_error": self.last_sync_error,
            **body,
        }
        if node:
            eligible = self.node_eligible()
            out["nodeEligible"] = eligible
            out["healthy"] = healthy = healthy and eligible
        return healthy, out


class HTTPEndpoint:
    """A tiny asyncio HTTP/1.0 server for /healthz and /metrics (kube-proxy uses :10256)."""

    def __init__(self, metrics: Metrics, health: HealthState, host: str, port: int) -> None:
        self.metrics = metrics
        self.health = health
        self.host = host
        self.port = port
        self._server: asyncio.base_events.Server | None = None
        # path -> callable returning a dict (served as JSON) or a str (served as text)
        self.extra_routes: dict[str, Callable[[], Any]] = {}

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        import json

        try:
            request = await asyncio.wait_for(reader.readline(), timeout=5)
            while (await asyncio.wait_for(reader.readline(), timeout=5)) not in (b"\r\n", b""):
                pass
            parts = request.decode("latin-1").split()
            path = parts[1] if len(parts) >= 2 else "/"
            path = path.split("?", 1)[0]
            if path in ("/healthz", "/livez", "/readyz"):
                healthy, body = self.health.check(node=path != "/livez")
                status = "200 OK" if healthy else "503 Service Unavailable"
                payload = json.dumps(body).encode()
                ctype = "application/json"
            elif path in self.extra_routes:
                result = self.extra_routes[path]()
                if isinstance(result, str):
                    status, payload, ctype = "200 OK", result.encode(), "text/plain"
                else:
                    status, payload = "200 OK", json.dumps(result).encode()
                    ctype = "application/json"
            elif path == "/metrics":
                status, payload = "200 OK", self.metrics.render()
                ctype = "text/plain; version=0.0.4; charset=utf-8"
            else:
                status, payload, ctype = "404 Not Found", b"not found\n", "text/plain"
            head = (
                f"HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + payload)
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
