"""What the agent shows about itself: the metrics it registers, /status and /dump.

``register_metrics`` adds the counters read from the run's components; ``StatusPages`` serves
the health paths on the node's address (``--health-address``) and /metrics, /status and /dump
on the operator's (``--metrics-address``, loopback by default).
Both only read the ``Components``, never change them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from ovsproxy import __version__
from ovsproxy.agent.counters import skew
from ovsproxy.agent.wiring import Components
from ovsproxy.datapath.desired import FlowKey
from ovsproxy.datapath.groups import InstalledGroup
from ovsproxy.datapath.switch_sync import dump_lines
from ovsproxy.gcpause import gc_paused
from ovsproxy.httpserver import Request, Response, is_loopback, raise_open_files_limit
from ovsproxy.metrics import HealthState, HTTPEndpoint, Metrics, health_routes, metrics_route
from ovsproxy.model import IPFamily, ServicePortName
from ovsproxy.model.node import UnservedPath
from ovsproxy.openflow import protocol as of
from ovsproxy.proxy.proxier import DROP, InstalledService

log = logging.getLogger("ovsproxy.agent")

Samples = dict[tuple[str, ...], float]
Snapshot = TypeVar("Snapshot")


def register_metrics(
    metrics: Metrics,
    health: HealthState,
    parts: Components,
    openflow_errors: Mapping[str, int],
) -> None:
    """The counters read at scrape time from the channel, the route manager, the tracker and
    the sync wrapper's error count; /healthz's view of the OpenFlow connection."""
    m = metrics

    def wire(direction: str, column: int) -> Callable[[], Samples]:
        """Read one column (0 messages, 1 bytes) of the channel's counters by type."""

        def read() -> Samples:
            if parts.channel is None:
                return {}
            table = getattr(parts.channel.counters, direction)
            return {(k,): float(v[column]) for k, v in table.items()}

        return read

    for direction in ("sent", "received", "bundled"):
        for column, unit in enumerate(("messages", "bytes")):
            m.add_counter(
                f"ovsproxy_openflow_{direction}_{unit}",
                f"OpenFlow {unit} {direction} by message type.",
                ("type",),
                wire(direction, column),
            )
    m.add_counter(
        "ovsproxy_openflow_errors",
        "OpenFlow errors from the switch by name.",
        ("error",),
        lambda: {(k,): float(v) for k, v in openflow_errors.items()},
    )
    m.add_counter(
        "ovsproxy_openflow_connections",
        "Successful OpenFlow handshakes.",
        (),
        lambda: {(): float(parts.channel.connections if parts.channel else 0)},
    )

    def routes() -> Samples:
        if parts.routes is None:
            return {}
        return {(k.op, k.result, str(k.family)): float(v) for k, v in parts.routes.counters.items()}

    m.add_counter(
        "ovsproxy_route_operations",
        "Service route operations.",
        ("op", "result", "family"),
        routes,
    )
    stats = parts.tracker.stats
    m.add_counter(
        "ovsproxy_source_events",
        "Source events by object kind and event.",
        ("event",),
        lambda: {(k,): float(v) for k, v in stats.events.items()},
    )

    def changes_of(kind: str) -> Callable[[], Samples]:
        """kube-proxy's change totals: every add, update and delete of that kind seen."""
        prefix = kind + "/"
        return lambda: {(): float(sum(v for k, v in stats.events.items() if k.startswith(prefix)))}

    m.add_counter(
        "ovsproxy_sync_proxy_rules_endpoint_changes",
        "EndpointSlice adds, updates and deletes seen (kube-proxy's endpoint_changes_total).",
        (),
        changes_of("EndpointSlice"),
    )
    m.add_counter(
        "ovsproxy_sync_proxy_rules_service_changes",
        "Service adds, updates and deletes seen (kube-proxy's service_changes_total).",
        (),
        changes_of("Service"),
    )
    m.add_counter(
        "ovsproxy_source_invalid_objects",
        "Objects rejected by validation.",
        ("kind",),
        lambda: {(k,): float(v) for k, v in stats.invalid.items()},
    )
    m.add_counter(
        "ovsproxy_source_errors",
        "Source errors (parse, API) by source.",
        ("source",),
        lambda: {(k,): float(v) for k, v in stats.errors.items()},
    )
    m.add_counter(
        "ovsproxy_capture_sync_errors",
        "Failed syncs of the node's capture table.",
        (),
        lambda: {(): float(parts.node_ingress.errors)} if parts.node_ingress is not None else {},
    )
    register_kube_proxy_metrics(metrics, health, parts)
    register_traffic_counters(metrics, parts)
    health.connected = lambda: parts.channel is not None and parts.channel.connected
    m.openflow_connected.set_function(lambda: float(health.connected()))
    m.ovsdb_connected.set_function(lambda: float(parts.ovsdb is not None and parts.ovsdb.connected))

    def registry_failures() -> Samples:
        registry = parts.group_registry
        return {(): float(registry.failures if registry is not None else 0)}

    m.add_counter(
        "ovsproxy_ovsdb_registry_save_failures",
        "Writes of the group-id registry to OVSDB that failed (each is retried).",
        (),
        registry_failures,
    )
    m.not_pods.set_function(lambda: float(len(parts.pods.not_pods) if parts.pods else 0))
    m.add_gauge(
        (
            "ovsproxy_unserved_paths",
            "Packet paths this node cannot serve (1 each; /status says why): no host-SNAT "
            "address, a reverse-path filter left strict.",
            ("path", "family"),
            lambda: {(p.path, f"IPv{int(p.family)}"): 1.0 for p in unserved_paths(parts)},
        )
    )


def register_kube_proxy_metrics(metrics: Metrics, health: HealthState, parts: Components) -> None:
    """The part of kube-proxy's metric set read at scrape time (the sync wrapper observes
    the rest): pending changes, the last queued sync, Service ports without local endpoints,
    and the health answers (the sync wrapper hooks the conntrack flushes)."""
    m, tracker = metrics, parts.tracker
    m.add_gauge(
        (
            "ovsproxy_sync_proxy_rules_endpoint_changes_pending",
            "EndpointSlice changes recorded and not yet synced.",
            (),
            lambda: {(): float(tracker.endpoint_changes_pending)},
        )
    )
    m.add_gauge(
        (
            "ovsproxy_sync_proxy_rules_service_changes_pending",
            "Services whose ports changed and are not yet synced.",
            (),
            lambda: {(): float(tracker.service_changes_pending)},
        )
    )

    def last_queued() -> Samples:
        runner = parts.runner
        if runner is None or runner.last_queued is None:
            return {}
        return {(family.name,): runner.last_queued for family in IPFamily}

    m.add_gauge(
        (
            "ovsproxy_sync_proxy_rules_last_queued_timestamp_seconds",
            "Unix time a sync was last asked for (a change, or the runner's start).",
            ("ip_family",),
            last_queued,
        )
    )
    m.add_gauge(
        (
            "ovsproxy_sync_proxy_rules_no_local_endpoints_total",
            "Service ports with endpoints whose internal (or external) traffic policy is "
            "Local and that have no usable endpoint on this node: that traffic is dropped.",
            ("traffic_policy", "ip_family"),
            lambda: no_local_endpoints(parts),
        )
    )

    def answers(path: str) -> Callable[[], Samples]:
        return lambda: {(code,): float(n) for (p, code), n in health.answers.items() if p == path}

    for path, name in (("/healthz", "healthz"), ("/livez", "livez")):
        m.add_counter(
            f"ovsproxy_proxy_{name}",
            f"Answers to {path} by HTTP status code.",
            ("code",),
            answers(path),
        )


def no_local_endpoints(parts: Components) -> Samples:
    """kube-proxy's count of Service ports, per family, that have endpoints but drop internal
    (external) traffic because its policy is Local and none is usable on this node."""
    out: Samples = {
        (policy, family.name): 0.0 for policy in ("internal", "external") for family in IPFamily
    }
    if parts.proxier is None:
        return out
    for installed in parts.proxier.services.values():
        for family, selection in installed.families.items():
            if selection.action == DROP:
                out["internal", family.name] += 1
            if selection.has_external and selection.external_action == DROP:
                out["external", family.name] += 1
    return out


def register_traffic_counters(metrics: Metrics, parts: Components) -> None:
    """Live traffic per Service port and per endpoint (``agent.counters``), as of the last
    poll of the switch's group statistics."""
    ports = ("namespace", "service", "port", "protocol")

    def read(series: str) -> Callable[[], Samples]:
        def samples() -> Samples:
            counters = parts.counters
            if counters is None:
                return {}
            result: Samples = getattr(counters, series)()
            return result

        return samples

    metrics.add_counter(
        "ovsproxy_service_connections",
        "New connections per Service port (its select groups' packets: only a connection's "
        "first packet crosses a group), as of the last read of the switch's counters.",
        ports,
        read("port_series"),
    )
    metrics.add_counter(
        "ovsproxy_endpoint_connections",
        "New connections per endpoint of a Service port (its buckets' packets).",
        (*ports, "endpoint", "node"),
        read("endpoint_series"),
    )

    def exact() -> Samples:
        counters = parts.counters
        if counters is None or counters.last is None:
            return {}
        return {(): float(counters.last.exact)}

    metrics.add_gauge(
        (
            "ovsproxy_service_counters_exact",
            "1 while the connection counters are exact; 0 once a bucket was seen counting "
            "down (ovs-vswitchd restarted, a group or bucket replaced): what it counted "
            "between the read before and the reset is lost.",
            (),
            exact,
        )
    )

    def skew_of() -> Samples:
        counters = parts.counters
        if counters is None or counters.last is None:
            return {}
        return {k: v for k, v in skew(counters.last, {}).items()}

    metrics.add_gauge(
        (
            "ovsproxy_service_connection_skew",
            "Per Service port: the largest gap between an endpoint's share of its new "
            "connections and its share of the weights (0 as weighted, up to 1).",
            ports,
            skew_of,
        )
    )


def unserved_paths(parts: Components) -> list[UnservedPath]:
    """What the host-SNAT addresses and the node ingress cannot serve, with the reasons."""
    out: list[UnservedPath] = []
    if parts.host_snat is not None:
        out += parts.host_snat.unserved(parts.pods.pods if parts.pods else ())
    if parts.node_ingress is not None:
        out += parts.node_ingress.unserved
    return out


@dataclass(frozen=True, slots=True)
class StatusSnapshot:
    """What /status shows, taken on the event loop at one instant: everything but the Service
    ports as built values (small), the Service ports as the proxier's published entries (a
    copy of its dict's items; the entries are replaced by a sync, not changed)."""

    head: dict[str, Any]
    services: tuple[tuple[ServicePortName, InstalledService], ...]


@dataclass(frozen=True, slots=True)
class DumpSnapshot:
    groups: dict[int, InstalledGroup]
    flows: Mapping[FlowKey, of.FlowMod]
    node_ingress: tuple[str, ...]


def service_entry(name: ServicePortName, inst: InstalledService) -> dict[str, Any]:
    port = inst.state.port
    entry = {
        "name": str(name),
        "cluster_ips": [str(ip) for ip in port.cluster_ips],
        "port": port.port,
        "protocol": str(port.protocol),
        "group_ids": {str(int(f)): g for f, g in inst.group_ids.items()},
        "endpoints": [str(ep) for ep in inst.endpoints],
        "all_endpoints": len(inst.state.endpoints),
        "rejecting": inst.rejecting,
        "session_affinity_s": port.affinity_timeout,
        "internal_traffic_policy": str(port.internal_traffic_policy),
        "type": str(port.type),
        "node_port": port.node_port,
        "health_check_node_port": port.health_check_node_port,
        "external_ips": [str(ip) for ip in port.external_ips],
        "load_balancer_ips": [str(ip) for ip in port.load_balancer_ips],
        "load_balancer_source_ranges": [str(r) for r in port.load_balancer_source_ranges],
    }
    entry.update(inst.status())
    return entry


def _sorted_services(
    snapshot: StatusSnapshot,
) -> list[tuple[ServicePortName, InstalledService]]:
    return sorted(snapshot.services, key=lambda kv: str(kv[0]))


def status_document(snapshot: StatusSnapshot) -> dict[str, Any]:
    """/status as a value (``ovsproxy demo`` and tests read it so)."""
    services = [service_entry(name, inst) for name, inst in _sorted_services(snapshot)]
    return {**snapshot.head, "services": services}


def render_status(snapshot: StatusSnapshot) -> bytes:
    """/status's JSON, one Service port at a time: each ``json.dumps`` is short, so the event
    loop's thread gets the interpreter back between them (one call over the whole document
    would hold it for as long as the encoding takes)."""
    head = ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in snapshot.head.items())
    services = ", ".join(json.dumps(service_entry(n, i)) for n, i in _sorted_services(snapshot))
    return f'{{{head}, "services": [{services}]}}'.encode()


def render_dump(snapshot: DumpSnapshot) -> bytes:
    lines = dump_lines(snapshot.groups, snapshot.flows)
    lines.extend(snapshot.node_ingress)
    return "".join(f"{line}\n" for line in lines).encode()


def without_collection(render: Callable[[Snapshot], bytes], snapshot: Snapshot) -> bytes:
    """``render(snapshot)`` with the cyclic collector paused: a render allocates a container
    per Service port and per flow, enough to set off full collections of the agent's heap on
    the render's thread, each holding the interpreter lock (and the event loop) for as long as
    the heap takes to traverse. Its values make no reference cycles: reference counting frees
    them all."""
    with gc_paused():
        return render(snapshot)


class StatusPages:
    """The agent's HTTP endpoints: the node's (``health_address``: /healthz, /readyz, /livez
    only) and the operator's (``metrics_address``: those, /metrics, and on loopback only
    /status, what ``ovsproxy status`` renders, and /dump).

    /status and /dump are rendered on a worker thread from a snapshot taken on the event loop,
    one render at a time: a request that comes while one runs waits for it (the connection
    cap bounds how many wait), so the loop's syncs and the health probes are never behind a
    render."""

    def __init__(self, parts: Components, metrics: Metrics, health: HealthState) -> None:
        self.parts = parts
        self.metrics = metrics
        self.health = health
        self.started = time.time()
        self.http: HTTPEndpoint | None = None  # the operator's (metrics_address)
        self.node_http: HTTPEndpoint | None = None  # the node's (health_address)
        self._render_lock = asyncio.Lock()

    # -- HTTP -----------------------------------------------------------------------------------
    async def start_http(self) -> HTTPEndpoint:
        soft, _hard = raise_open_files_limit()
        config = self.parts.config
        health = health_routes(self.health)
        node_address = config.health_host_port
        if node_address is not None:
            self.node_http = HTTPEndpoint(*node_address, health)
            await self.node_http.start()
            log.info(
                "health on http://%s:%d/healthz /readyz /livez",
                node_address[0],
                self.node_http.port,
            )
        host, port = config.metrics_host_port
        routes = {**health, "/metrics": metrics_route(self.metrics)}
        operator = is_loopback(host)
        if operator:
            routes |= {
                "/status": self._serve_status,
                "/dump": self._serve_dump,
                "/counters": self._serve_counters,
            }
        self.http = HTTPEndpoint(host, port, routes, local_names_only=operator)
        await self.http.start()
        log.info(
            "metrics on http://%s:%d/metrics %s (open-files limit %d)",
            host,
            self.http.port,
            "/status /dump" if operator else "(/status /dump: on a loopback address only)",
            soft,
        )
        return self.http

    async def stop_http(self) -> None:
        for endpoint in (self.http, self.node_http):
            if endpoint is not None:
                await endpoint.stop()

    async def _serve_status(self, _request: Request) -> Response:
        async with self._render_lock:
            body = await asyncio.to_thread(
                without_collection, render_status, self.status_snapshot()
            )
        return Response(200, body, "application/json")

    async def _serve_counters(self, _request: Request) -> Response:
        """The traffic counters read from the switch now (``agent.counters``), as JSON."""
        counters = self.parts.counters
        if counters is None:
            return Response(503, b"no switch yet\n")
        reading = await counters.poll()
        body = {
            "at": reading.at,
            "exact": reading.exact,
            "services": [
                {"labels": list(labels), "connections": n} for labels, n in reading.ports.items()
            ],
            "endpoints": [
                {"labels": list(labels), "connections": n}
                for labels, n in reading.endpoints.items()
            ],
            "skew": [{"labels": list(k), "skew": v} for k, v in skew(reading, {}).items()],
        }
        return Response(200, json.dumps(body).encode(), "application/json")

    async def _serve_dump(self, _request: Request) -> Response:
        async with self._render_lock:
            dump = self.dump_snapshot()
            body = await asyncio.to_thread(without_collection, render_dump, dump)
        return Response(200, body)

    # -- /status and /dump ----------------------------------------------------------------------
    def status_json(self) -> dict[str, Any]:
        return status_document(self.status_snapshot())

    def status_snapshot(self) -> StatusSnapshot:
        parts = self.parts
        conflicts = parts.proxier.conflicts if parts.proxier is not None else ()
        programmed = parts.proxier.programmed if parts.proxier is not None else {}
        external = parts.external_ips
        external_problems = list(external.problems.values()) if external is not None else []
        routes = []
        if parts.routes is not None:
            routes = sorted(str(r) for r in parts.routes.installed())
        dp, channel, sandbox = parts.datapath, parts.channel, parts.sandbox
        healthy, last_sync = self.health.check()
        config = parts.config
        head = {
            # Where the switch is and how our tables are numbered (`ovsproxy trace` reads it).
            "ovs": {
                "bridge": config.bridge,
                "gateway": config.gateway,
                "ovsdb": parts.ovsdb.endpoint if parts.ovsdb else config.ovsdb,
                "openflow": str(channel.endpoint) if channel else config.openflow,
                "mode": str(config.mode),
                "first_table": config.first_table,
                "next_table": config.next_table,
                "host_snat_ips": list(config.host_snat_ip),
                # whether mid-stream flows are installed, and why (proxy.mid_stream.choose)
                "mid_stream_flows": (
                    parts.proxier.mid_stream_choice.status() if parts.proxier else None
                ),
            },
            "version": __version__,
            "uptime_s": round(time.time() - self.started, 1),
            "node_name": config.node_name,
            "sandbox": sandbox.name if sandbox else None,
            "node_namespace": sandbox.netns if sandbox else parts.config.netns,
            "openflow": {
                "connected": bool(channel and channel.connected),
                "connections": channel.connections if channel else 0,
            },
            "ovsdb": self._ovsdb_status(),
            "generation": dp.generation if dp else None,
            "groups": len(dp.installed_groups) if dp else 0,
            "flows": len(dp.installed_flows) if dp else 0,
            "healthy": healthy,
            "last_sync": last_sync,
            "routes": routes,
            "node_ports": parts.node_ingress.status() if parts.node_ingress is not None else None,
            "host_snat": parts.host_snat.status() if parts.host_snat is not None else None,
            # Paths this node cannot serve, and why (ovsproxy_unserved_paths)
            "unserved_paths": [
                {"path": p.path, "family": f"IPv{int(p.family)}", "reason": p.reason}
                for p in unserved_paths(parts)
            ],
            # The Node object (Kubernetes API source only): eligibility, addresses, podCIDRs
            "node": parts.node.status() if parts.node is not None else None,
            # Rejects, conntrack flushes (the last filters too), invalid RSTs, affinity sweeps
            "semantics": parts.semantics.status() if parts.semantics is not None else None,
            "problems": [
                *(str(p) for p in getattr(parts.source, "problems", [])),
                *(str(p) for ps in external_problems for p in ps),
            ][:100],
            # Service ports refused because an older Service claims one of their ports
            "conflicts": [
                {
                    "refused": str(c.refused),
                    "owner": str(c.owner),
                    "claim": c.claim,
                    "problem": str(c),
                }
                for c in conflicts
            ],
            # Interfaces on the bridge that get no flows, and why (standalone mode)
            "not_pods": [
                {"interface": name, "reason": reason}
                for name, reason in sorted(parts.pods.not_pods.items() if parts.pods else ())
            ],
            # Service ports the switch refused: they keep their last good state
            "refused": {
                str(name): reason
                for name, reason in (parts.proxier.refused.items() if parts.proxier else ())
            },
        }
        # The items are copied here (one C call); they are sorted where they are rendered.
        return StatusSnapshot(head, tuple(programmed.items()))

    def dump_snapshot(self) -> DumpSnapshot:
        dp = self.parts.datapath
        groups, flows = dp.installed_snapshot() if dp is not None else ({}, {})
        node_ingress = self.parts.node_ingress
        lines = tuple(node_ingress.dump()) if node_ingress is not None else ()
        return DumpSnapshot(groups, flows, lines)

    def _ovsdb_status(self) -> dict[str, Any]:
        parts = self.parts
        out: dict[str, Any] = (
            dict(parts.ovsdb_link.status(parts.ovsdb)) if parts.ovsdb_link is not None else {}
        )
        registry = parts.group_registry
        if registry is not None:
            out["group_ids"] = registry.status()
        return out
