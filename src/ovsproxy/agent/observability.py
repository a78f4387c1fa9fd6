"""What the agent shows about itself: the metrics it registers, /status and /dump.

``register_metrics`` adds the counters read from the run's components; ``StatusPages`` serves
/status and /dump next to /healthz and /metrics on one HTTP endpoint (``--metrics-address``).
Both only read the ``Components``, never change them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from ovsproxy import __version__
from ovsproxy.agent.wiring import Components
from ovsproxy.metrics import HealthState, HTTPEndpoint, Metrics
from ovsproxy.model.node import UnservedPath

log = logging.getLogger("ovsproxy.agent")

Samples = dict[tuple[str, ...], float]


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


def unserved_paths(parts: Components) -> list[UnservedPath]:
    """What the host-SNAT addresses and the node ingress cannot serve, with the reasons."""
    out: list[UnservedPath] = []
    if parts.host_snat is not None:
        out += parts.host_snat.unserved(parts.pods.pods if parts.pods else ())
    if parts.node_ingress is not None:
        out += parts.node_ingress.unserved
    return out


class StatusPages:
    """/status (JSON, what ``ovsproxy status`` renders) and /dump, served with /healthz and
    /metrics."""

    def __init__(self, parts: Components, metrics: Metrics, health: HealthState) -> None:
        self.parts = parts
        self.metrics = metrics
        self.health = health
        self.started = time.time()
        self.http: HTTPEndpoint | None = None

    # -- HTTP -----------------------------------------------------------------------------------
    async def start_http(self) -> HTTPEndpoint:
        host, port = self.parts.config.metrics_host_port
        self.http = HTTPEndpoint(self.metrics, self.health, host, port)
        self.http.extra_routes = {"/status": self.status_json, "/dump": self.dump_text}
        await self.http.start()
        log.info(
            "health and metrics on http://%s:%d/healthz /metrics /status /dump",
            host,
            self.http.port,
        )
        return self.http

    async def stop_http(self) -> None:
        if self.http is not None:
            await self.http.stop()

    # -- /status and /dump ----------------------------------------------------------------------
    def status_json(self) -> dict[str, Any]:
        parts = self.parts
        services = []
        conflicts = parts.proxier.conflicts if parts.proxier is not None else ()
        if parts.proxier is not None:
            for name, inst in sorted(parts.proxier.programmed.items(), key=lambda kv: str(kv[0])):
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
                    "load_balancer_source_ranges": [
                        str(r) for r in port.load_balancer_source_ranges
                    ],
                }
                entry.update(inst.status())
                services.append(entry)
        routes = []
        if parts.routes is not None:
            routes = sorted(str(r) for r in parts.routes.installed())
        dp, channel, sandbox = parts.datapath, parts.channel, parts.sandbox
        healthy, last_sync = self.health.check()
        config = parts.config
        return {
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
            "services": services,
            "problems": [str(p) for p in getattr(parts.source, "problems", [])][:100],
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

    def _ovsdb_status(self) -> dict[str, Any]:
        parts = self.parts
        out: dict[str, Any] = (
            dict(parts.ovsdb_link.status(parts.ovsdb)) if parts.ovsdb_link is not None else {}
        )
        registry = parts.group_registry
        if registry is not None:
            out["group_ids"] = registry.status()
        return out

    def dump_text(self) -> str:
        dp = self.parts.datapath
        text = "\n".join(dp.dump()) + "\n" if dp else ""
        node_ingress = self.parts.node_ingress
        if node_ingress is not None:
            text += "".join(f"{line}\n" for line in node_ingress.dump())
        return text
