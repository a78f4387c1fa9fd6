"""The agent: sources -> tracker -> proxier -> datapath (OpenFlow) and routes, on one event loop.

One asyncio loop owns all mutable state. Blocking libraries (ovsdbapp, the sandbox's
subprocesses) run through ``asyncio.to_thread``. Shutdown leaves flows, groups and routes in
place (a restarted agent adopts them hitlessly) unless ``cleanup`` is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ovsproxy import __version__
from ovsproxy.config import AgentConfig
from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath.datapath import Datapath
from ovsproxy.lab import EXAMPLES, build_lab
from ovsproxy.metrics import HealthState, HTTPEndpoint, Metrics
from ovsproxy.model import IPAddress
from ovsproxy.openflow import protocol as of
from ovsproxy.openflow.connection import Channel, OpenFlowError
from ovsproxy.ovs.ovsdb import OVSDB, OVSDBGroupRegistry, PodPort
from ovsproxy.ovs.sandbox import Sandbox
from ovsproxy.proxy.proxier import Proxier
from ovsproxy.proxy.runner import SyncRunner
from ovsproxy.proxy.tracker import ChangeTracker

log = logging.getLogger("ovsproxy.agent")

GENERATION_KEY = "ovsproxy-generation"
POD_POLL_INTERVAL = 2.0


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JSONFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in (
        "httpx",
        "httpx2",
        "httpcore",
        "httpcore2",
        "ovsdbapp",
        "pyroute2",
        "pyroute2.netlink.core",
        "pyroute2.ndb",
    ):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))


def next_generation(db: OVSDB, bridge: str) -> int:
    """A new cookie generation for this agent run, recorded on the bridge (1..65535)."""
    ext = db.api.db_get("Bridge", bridge, "external_ids").execute(check_error=True) or {}
    try:
        previous = int(ext.get(GENERATION_KEY, "0"))
    except ValueError:
        previous = 0
    generation = previous % 0xFFFF + 1
    db.api.db_set("Bridge", bridge, ("external_ids", {GENERATION_KEY: str(generation)})).execute(
        check_error=True
    )
    return generation


class ClusterIPFeed:
    """Turns the proxier's "all ClusterIPs now" into the discoverer's reference-counted
    add/delete calls."""

    def __init__(self, discoverer: Any) -> None:
        self.discoverer = discoverer
        self.known: frozenset[IPAddress] = frozenset()
        self.synced = False

    async def __call__(self, ips: frozenset[IPAddress]) -> None:
        added, removed = ips - self.known, self.known - ips
        if added:
            self.discoverer.add_cluster_ips(added)
        if removed:
            self.discoverer.delete_cluster_ips(removed)
        self.known = ips
        if not self.synced:
            self.synced = True
            self.discoverer.cluster_ips_synced()


class Agent:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.metrics = Metrics()
        self.health = HealthState()
        self.sandbox: Sandbox | None = None
        self.channel: Channel | None = None
        self.datapath: Datapath | None = None
        self.tracker = ChangeTracker()
        self.proxier: Proxier | None = None
        self.runner: SyncRunner | None = None
        self.source: Any = None
        self.routes: Any = None
        self.discoverer: Any = None
        self.http: HTTPEndpoint | None = None
        self.ovsdb: OVSDB | None = None
        self.openflow_errors: dict[str, int] = {}
        self.started = time.time()
        self.ready = asyncio.Event()
        self._pods: list[PodPort] = []
        self._tasks: list[asyncio.Task[Any]] = []
        self.rejector: Any = None
        self._routes_reconciled = False

    # -- wiring -----------------------------------------------------------------------------
    async def _start_ovs(self) -> tuple[str, str, str | None]:
        cfg = self.config
        if not cfg.embedded:
            assert cfg.ovsdb is not None and cfg.openflow is not None
            return cfg.ovsdb, cfg.openflow, cfg.netns
        log.info("no OVS given: starting the private OVS sandbox with the example lab")
        sandbox = Sandbox("run-" + os.urandom(2).hex(), bridge=cfg.bridge, gateway=cfg.gateway)
        await asyncio.to_thread(sandbox.up)
        self.sandbox = sandbox
        await asyncio.to_thread(build_lab, sandbox)
        log.info(
            "sandbox %s: bridge %s, node namespace %s, OpenFlow %s",
            sandbox.name,
            cfg.bridge,
            sandbox.netns,
            sandbox.openflow,
        )
        return sandbox.ovsdb, sandbox.openflow, sandbox.netns

    def _manifest_paths(self) -> list[str]:
        if self.config.manifests:
            return list(self.config.manifests)
        if self.config.embedded and not (self.config.kubeconfig or self.config.in_cluster):
            return [str(EXAMPLES)]
        return []

    async def _start_source(self) -> None:
        paths = self._manifest_paths()
        if paths:
            from ovsproxy.sources.manifests import ManifestSource

            self.source = ManifestSource([Path(p) for p in paths], self.tracker)
            log.info("source: manifests %s (watched for changes)", ", ".join(paths))
        else:
            from ovsproxy.sources.kubernetes import SERVICE_CIDRS, KubernetesSource

            self.source = KubernetesSource(self.tracker, kubeconfig=self.config.kubeconfig)
            log.info(
                "source: Kubernetes API (%s)",
                self.config.kubeconfig or "in-cluster / default kubeconfig",
            )
        await self.source.start()
        if self.discoverer is not None and not paths:
            from ovsproxy.servicecidr import ServiceCIDRInformerHandler

            self.source.informer(SERVICE_CIDRS, ServiceCIDRInformerHandler(self.discoverer))

    async def _start_routes(self, netns: str | None) -> None:
        if not self.config.manage_routes:
            return
        from ovsproxy.routes import RouteManager
        from ovsproxy.routes.linux import LinuxRouteBackend
        from ovsproxy.servicecidr import ServiceCIDRDiscoverer

        uses_api = not self._manifest_paths()
        self.discoverer = ServiceCIDRDiscoverer(
            configured=self.config.service_cidr, use_api=uses_api
        )
        self.routes = RouteManager(
            LinuxRouteBackend(netns=netns),
            self.config.gateway,
            sync_interval=self.config.route_sync_interval,
        )
        await self.routes.start()
        self.discoverer.subscribe(self.routes.apply_soon)

    async def _pods_now(self) -> list[PodPort]:
        return self._pods

    async def _poll_pods(self) -> None:
        """Local pods come and go without Service events: follow OVSDB."""
        assert self.ovsdb is not None
        while True:
            try:
                pods = await asyncio.to_thread(self.ovsdb.pod_ports, self.config.bridge)
                if pods != self._pods:
                    self._pods = pods
                    if self.runner is not None:
                        self.runner.request()
            except Exception as exc:
                log.warning("reading pod ports from OVSDB failed: %s", exc)
            await asyncio.sleep(POD_POLL_INTERVAL)

    async def _sync(self, full: bool) -> None:
        assert self.proxier is not None and self.datapath is not None
        kind = "full" if full else "partial"
        started = time.perf_counter()
        try:
            if full and self.datapath.commits and await self._switch_drifted():
                log.warning("switch lost flows or groups behind our back: rewriting all")
                await self.datapath.resync_switch()
            result = await self.proxier.sync(full)
        except Exception as exc:
            # An OVS error, raised as is or as the cause of a datapath error: count its name.
            error = exc if isinstance(exc, OpenFlowError) else exc.__cause__
            if isinstance(error, OpenFlowError):
                self.openflow_errors[error.name] = self.openflow_errors.get(error.name, 0) + 1
            self.metrics.syncs.labels("error").inc()
            self.health.sync_result(False, str(exc))
            raise
        if not self.tracker.synced:
            return
        if self.routes is not None and not self._routes_reconciled:
            # Start-up: converge the node's routes once, from the complete ClusterIP list,
            # before we call ourselves healthy.
            await self.routes.reconcile(self.discoverer.desired)
            self._routes_reconciled = True
        self.metrics.sync_duration.labels(kind).observe(time.perf_counter() - started)
        self.metrics.syncs.labels("ok").inc()
        self.metrics.last_sync_success.set(time.time())
        self.health.sync_result(True)
        self.metrics.services.set(len(self.proxier.services))
        self.metrics.refused.set(len(self.proxier.refused))
        self.metrics.endpoints.set(self.proxier.endpoint_count())
        self.metrics.groups.set(len(self.datapath.installed_groups))
        self.metrics.flows.set(len(self.datapath.installed_flows))
        if not self.ready.is_set():
            self.ready.set()
            log.info(
                "first sync done: %d Service ports, %d groups, %d flows",
                len(self.proxier.services),
                len(self.datapath.installed_groups),
                len(self.datapath.installed_flows),
            )
            if self.sandbox is not None:
                self._embedded_banner()
        del result

    async def _switch_drifted(self) -> bool:
        """Cheap drift check for the periodic full resync: does the switch still hold as many
        flows of this generation as the cache says? (Groups are not listed: OpenFlow cannot
        describe large ones; a lost group also loses the flows that use it.)"""
        assert self.channel is not None and self.datapath is not None
        dp = self.datapath
        cookies = await self.channel.flow_cookies(
            (pl.COOKIE_APP << pl.COOKIE_APP_SHIFT) | (dp.generation << pl.COOKIE_GENERATION_SHIFT),
            pl.COOKIE_APP_GENERATION_MASK,
        )
        return len(cookies) != len(dp.installed_flows)

    def _register_metrics(self) -> None:
        m = self.metrics

        def wire(direction: str, column: int) -> Callable[[], dict[tuple[str, ...], float]]:
            """Read one column (0 messages, 1 bytes) of the channel's counters by type."""

            def read() -> dict[tuple[str, ...], float]:
                if self.channel is None:
                    return {}
                table = getattr(self.channel.counters, direction)
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
            lambda: {(k,): float(v) for k, v in self.openflow_errors.items()},
        )
        m.add_counter(
            "ovsproxy_openflow_connections",
            "Successful OpenFlow handshakes.",
            (),
            lambda: {(): float(self.channel.connections if self.channel else 0)},
        )

        def routes() -> dict[tuple[str, ...], float]:
            if self.routes is None:
                return {}
            return {
                (k.op, k.result, str(k.family)): float(v) for k, v in self.routes.counters.items()
            }

        m.add_counter(
            "ovsproxy_route_operations",
            "Service route operations.",
            ("op", "result", "family"),
            routes,
        )
        stats = self.tracker.stats
        m.add_counter(
            "ovsproxy_source_events",
            "Source events by object kind and event.",
            ("event",),
            lambda: {(k,): float(v) for k, v in stats.events.items()},
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
        self.health.connected = lambda: self.channel is not None and self.channel.connected

    # -- run --------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        cfg = self.config
        log.info("ovsproxy %s starting (mode %s)", __version__, cfg.mode)
        try:
            ovsdb_ep, openflow_ep, netns = await self._start_ovs()
            self.ovsdb = await asyncio.to_thread(OVSDB, ovsdb_ep)
            generation = await asyncio.to_thread(next_generation, self.ovsdb, cfg.bridge)
            log.info("cookie generation %d", generation)

            async def on_connected() -> None:
                assert self.datapath is not None
                await self.datapath.on_connected()

            self.channel = Channel(
                openflow_ep, on_connected=on_connected, on_packet_in=self._on_packet_in
            )
            self.datapath = Datapath(
                self.channel,
                cfg.pipeline,
                generation,
                registry=OVSDBGroupRegistry(self.ovsdb, cfg.bridge),
            )
            self._register_metrics()
            host, port = cfg.metrics_host_port
            self.http = HTTPEndpoint(self.metrics, self.health, host, port)
            self.http.extra_routes = {"/status": self.status_json, "/dump": self.dump_text}
            await self.http.start()
            log.info(
                "health and metrics on http://%s:%d/healthz /metrics /status /dump",
                host,
                self.http.port,
            )
            await self._start_routes(netns)
            feed = ClusterIPFeed(self.discoverer) if self.discoverer is not None else None
            self.proxier = Proxier(
                self.tracker,
                self.datapath,
                node_name=cfg.node_name,
                zone=cfg.zone,
                pods=self._pods_now,
                on_cluster_ips=feed,
                **self._semantics_kwargs(),
            )
            self.runner = SyncRunner(
                self._sync,
                min_interval=cfg.min_sync_interval,
                full_resync_interval=cfg.full_resync_interval,
            )
            self.tracker.set_notify(self.runner.request)
            await self.channel.start(wait=False)
            await self.channel.wait_ready(timeout=30)
            if cfg.mode == pl.Mode.STANDALONE:
                self._pods = await asyncio.to_thread(self.ovsdb.pod_ports, cfg.bridge)
                self._tasks.append(asyncio.create_task(self._poll_pods(), name="pods"))
            await self._start_source()
            self.runner.request(full=True)
            self._tasks.append(asyncio.create_task(self.runner.run(), name="sync runner"))
            await stop.wait()
        finally:
            await self.shutdown()

    def _embedded_banner(self) -> None:
        """How to try the embedded default: the lab's ClusterIPs answer from its namespaces."""
        assert self.sandbox is not None and self.http is not None
        ns = self.sandbox.netns
        ips = sorted({str(ip) for ip in self.tracker.cluster_ips()})
        lines = [
            "embedded default is up. Try (as root, in another terminal):",
            f"  ip netns exec {ns} curl -s http://10.96.0.10/        # from the node",
            f"  ip netns exec {ns}-client curl -s http://10.96.0.10/  # from a pod",
            f"  ip netns exec {ns} curl -s 'http://[fd00:10:96::20]/'",
            f"  ovsproxy status --address 127.0.0.1:{self.http.port}",
            f"  ovsproxy dump --address 127.0.0.1:{self.http.port}",
            f"ClusterIPs: {', '.join(ips)}",
            f"Edit the manifests in {', '.join(self._manifest_paths())}: changes apply live. "
            "Ctrl-C stops and removes the sandbox.",
        ]
        for line in lines:
            log.info("%s", line)

    def _semantics_kwargs(self) -> dict[str, Any]:
        """Hooks of the Service-semantics features (reject on no endpoints), when present."""
        try:
            from ovsproxy.datapath import reject
        except ImportError:
            return {}
        factory = getattr(reject, "agent_wiring", None)
        if factory is None or self.channel is None:
            return {}
        self.rejector, kwargs = factory(self.channel, self.datapath)
        return dict(kwargs)

    def _on_packet_in(self, packet_in: of.PacketIn) -> None:
        if self.rejector is not None:
            self.rejector.handle(packet_in)

    async def shutdown(self) -> None:
        if self.runner is not None:
            self.runner.stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        if self.rejector is not None:
            with contextlib.suppress(Exception):
                await self.rejector.close()
        if self.source is not None:
            with contextlib.suppress(Exception):
                await self.source.stop()
        if self.config.cleanup:
            await self._cleanup_switch_and_routes()
        if self.routes is not None:
            with contextlib.suppress(Exception):
                await self.routes.stop()
        if self.http is not None:
            await self.http.stop()
        if self.channel is not None:
            await self.channel.close()
        if self.ovsdb is not None:
            await asyncio.to_thread(self.ovsdb.close)
        if self.sandbox is not None:
            await asyncio.to_thread(self.sandbox.down)
        log.info(
            "stopped%s",
            " (flows, groups and routes removed)"
            if self.config.cleanup
            else " (flows, groups and routes left in place for a hitless restart)",
        )

    async def _cleanup_switch_and_routes(self) -> None:
        """--cleanup: remove every flow and group we own, and our routes."""
        if self.datapath is not None and self.channel is not None and self.channel.connected:
            for owner in self.datapath.owners():
                self.datapath.unstage(owner)
            try:
                await self.datapath.commit()
            except Exception as exc:
                log.error("cleanup of flows and groups failed: %s", exc)
        if self.routes is not None:
            try:
                await self.routes.uninstall()
            except Exception as exc:
                log.error("cleanup of routes failed: %s", exc)

    # -- introspection ----------------------------------------------------------------------
    def status_json(self) -> dict[str, Any]:
        services = []
        if self.proxier is not None:
            for name, inst in sorted(self.proxier.services.items(), key=lambda kv: str(kv[0])):
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
                }
                extra = getattr(inst, "status", None)
                if callable(extra):
                    entry.update(extra())
                services.append(entry)
        routes = []
        if self.routes is not None:
            routes = sorted(str(r) for r in self.routes.installed())
        dp = self.datapath
        return {
            "version": __version__,
            "uptime_s": round(time.time() - self.started, 1),
            "sandbox": self.sandbox.name if self.sandbox else None,
            "node_namespace": self.sandbox.netns if self.sandbox else self.config.netns,
            "openflow": {
                "connected": bool(self.channel and self.channel.connected),
                "connections": self.channel.connections if self.channel else 0,
            },
            "generation": dp.generation if dp else None,
            "groups": len(dp.installed_groups) if dp else 0,
            "flows": len(dp.installed_flows) if dp else 0,
            "healthy": self.health.check()[0],
            "last_sync": self.health.check()[1],
            "routes": routes,
            "services": services,
            "problems": [str(p) for p in getattr(self.source, "problems", [])][:100],
            # Service ports the switch refused: they keep their last good state
            "refused": {
                str(name): reason
                for name, reason in (self.proxier.refused.items() if self.proxier else ())
            },
        }

    def dump_text(self) -> str:
        return "\n".join(self.datapath.dump()) + "\n" if self.datapath else ""
