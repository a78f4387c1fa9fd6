"""Prometheus metrics, /healthz, /livez and /readyz, and the HTTP endpoint serving them.

Counters that other packages keep as plain dicts (OpenFlow wire counters, route operations,
source events) are read at scrape time by collectors, so those packages never import
prometheus_client and their hot paths stay a dict increment.

Each agent has its own registry: several agents (tests) can run in one process.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter as CounterOf
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ovsproxy.httpserver import (
    ConnectionBudget,
    Handler,
    HTTPServer,
    Limits,
    RateLimitedLog,
    Request,
    Response,
    host_is_local_name,
)

log = logging.getLogger(__name__)

# kube-proxy's buckets (pkg/proxy/metrics): sync durations 1 ms doubling to 16 s; network
# programming 0.25 s, 0.5 s, every second to 59 s, every 5 s to 115 s, every 30 s to 5 min.
KUBE_PROXY_SYNC_BUCKETS = tuple(0.001 * 2**i for i in range(15))
KUBE_PROXY_PROGRAMMING_BUCKETS = (
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

        # kube-proxy's metric set (pkg/proxy/metrics): its names with our prefix for its
        # kubeproxy_, its types, buckets and labels, so that its dashboards and alerts work
        # with the prefix swapped. One sync here programs both families: what kube-proxy
        # observes once per family's proxier is observed once under each ip_family.
        # docs/observability.md's table says what each measures here.
        def family_histogram(name: str, help_text: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, help_text, ["ip_family"], registry=r, buckets=buckets)

        self.sync_proxy_rules_duration = family_histogram(
            "ovsproxy_sync_proxy_rules_duration_seconds",
            "Time of one sync, successful or not (kube-proxy's sync_proxy_rules_duration).",
            KUBE_PROXY_SYNC_BUCKETS,
        )
        self.sync_full_proxy_rules_duration = family_histogram(
            "ovsproxy_sync_full_proxy_rules_duration_seconds",
            "Time of one full sync (the periodic resync and the first), successful or not.",
            KUBE_PROXY_SYNC_BUCKETS,
        )
        self.sync_partial_proxy_rules_duration = family_histogram(
            "ovsproxy_sync_partial_proxy_rules_duration_seconds",
            "Time of one partial sync (the changed Service ports only), successful or not.",
            KUBE_PROXY_SYNC_BUCKETS,
        )
        self.sync_proxy_rules_last_timestamp = Gauge(
            "ovsproxy_sync_proxy_rules_last_timestamp_seconds",
            "Unix time of the last successful sync.",
            ["ip_family"],
            registry=r,
        )
        self.network_programming = family_histogram(
            "ovsproxy_network_programming_duration_seconds",
            "From an EndpointSlice change's trigger time (the slice's "
            "endpoints.kubernetes.io/last-change-trigger-time) to the commit carrying it.",
            KUBE_PROXY_PROGRAMMING_BUCKETS,
        )
        self.conntrack_reconciler_duration = family_histogram(
            "ovsproxy_conntrack_reconciler_sync_duration_seconds",
            "Time of one UDP conntrack flush (the filters of one batch of that family).",
            KUBE_PROXY_SYNC_BUCKETS,
        )
        self.conntrack_reconciler_deleted = Counter(
            "ovsproxy_conntrack_reconciler_deleted_entries",
            "UDP conntrack flush filters applied (each deletes every entry of one "
            "(frontend, endpoint) pair; the switch does not say how many entries).",
            ["ip_family"],
            registry=r,
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
        # Answers by (path, HTTP code): kube-proxy's proxy_healthz_total and proxy_livez_total
        self.answers: CounterOf[tuple[str, str]] = CounterOf()

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


def health_routes(health: HealthState) -> dict[str, Handler]:
    """/healthz and /readyz (the node's eligibility too) and /livez: what a kubelet or a load
    balancer asks, and all the node's address serves. Answers to /healthz and /livez are
    counted in ``health.answers`` (kube-proxy has no /readyz: its answers are not)."""

    def route(path: str, node: bool) -> Handler:
        async def answer(_request: Request) -> Response:
            healthy, body = health.check(node=node)
            code = 200 if healthy else 503
            if path != "/readyz":
                health.answers[path, str(code)] += 1
            return Response(code, json.dumps(body).encode(), "application/json")

        return answer

    return {
        "/healthz": route("/healthz", True),
        "/readyz": route("/readyz", True),
        "/livez": route("/livez", False),
    }


def metrics_route(metrics: Metrics) -> Handler:
    async def answer(_request: Request) -> Response:
        return Response(200, metrics.render(), "text/plain; version=0.0.4; charset=utf-8")

    return answer


class HTTPEndpoint:
    """One listening address and the routes it serves (a GET of an exact path each).

    ``local_names_only``: requests naming any host but an IP literal or localhost are refused
    (403), so a web page that rebinds its DNS name to 127.0.0.1 cannot read what loopback
    serves."""

    def __init__(
        self,
        host: str,
        port: int,
        routes: Mapping[str, Handler],
        *,
        limits: Limits | None = None,
        local_names_only: bool = False,
    ) -> None:
        self.host = host
        self.port = port
        self.routes = dict(routes)
        self.local_names_only = local_names_only
        self.budget = ConnectionBudget(limits or Limits(), RateLimitedLog(log))
        self._server = HTTPServer(self._handle, self.budget)

    async def start(self) -> None:
        self.port = await self._server.listen(self.host, self.port)

    async def stop(self) -> None:
        await self._server.close()

    async def _handle(self, request: Request) -> Response:
        if request.method != "GET":
            return Response(405, b"only GET\n", headers=(("Allow", "GET"),))
        if self.local_names_only and not host_is_local_name(request.headers.get("host")):
            return Response(403, b"served to loopback clients naming an IP or localhost only\n")
        route = self.routes.get(request.path)
        if route is None:
            return Response(404, b"not found\n")
        return await route(request)
