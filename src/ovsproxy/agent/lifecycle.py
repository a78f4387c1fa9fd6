"""The agent's life: start-up order and run (``Agent``), then shutdown and ``--cleanup``.

sources -> tracker -> proxier -> datapath (OpenFlow) and routes, on one event loop. With the
Kubernetes API as the source, this node's Node object is watched too (``agent.node``): its
eligibility for /healthz, and its addresses as the node IPs unless they are configured (the
node ingress waits up to ``NODE_WAIT`` for the Node's first list, then scans the devices). That loop
owns all mutable state; blocking libraries (ovsdbapp, the sandbox's subprocesses) run through
``asyncio.to_thread``. Shutdown leaves flows, groups and routes in place (a restarted agent
adopts them hitlessly) unless ``cleanup`` is set: then what ``ovsproxy cleanup`` removes of
what this run set up goes first (``agent.cleanup``), but the virtual next hop's host route and
neighbour entries stay for a later agent. The steering table, its policy routes and
the health-check servers are the node ingress's (``agent.nodeport``); the host-SNAT addresses
and their neighbour entries ``agent.hostsnat``'s (``--cleanup`` removes those too).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from typing import Any

from ovsproxy import __version__
from ovsproxy.agent import embedded
from ovsproxy.agent.cleanup import (
    CleanupReport,
    deliberately_left,
    remove_routes,
    remove_steering,
    remove_switch_state,
)
from ovsproxy.agent.core import NodeFacts, build_core, commit_followers
from ovsproxy.agent.counters import CounterPoller
from ovsproxy.agent.observability import StatusPages, register_metrics
from ovsproxy.agent.ovsdb_link import OVSDBLink, datapath_type_of, set_zone_timeouts
from ovsproxy.agent.ovsdb_link import connect as connect_ovsdb
from ovsproxy.agent.pods import PodWatcher
from ovsproxy.agent.switch_link import wait_for_switch
from ovsproxy.agent.sync import Syncer
from ovsproxy.agent.wiring import (
    Components,
    api_server_ips,
    build_host_snat,
    build_node_ingress,
    build_routes,
    build_source,
    external_ip_rule,
    manifest_paths,
    route_backend_name,
)
from ovsproxy.config import AgentConfig
from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath.reject import Rejector
from ovsproxy.healthcheck import ProxyHealth
from ovsproxy.metrics import HealthState, Metrics
from ovsproxy.model import IPAddress, IPFamily
from ovsproxy.openflow.connection import Channel
from ovsproxy.ovs.ovsdb import OVSDBGroupRegistry
from ovsproxy.proxy.external_ips import ExternalIPFilter
from ovsproxy.proxy.runner import SyncRunner

log = logging.getLogger("ovsproxy.agent")

# How long start-up waits for the Node object's first list before it reads the node IPs from
# the node's devices (the Node's addresses are taken whenever they come).
NODE_WAIT = 10.0


class Agent:
    """``await Agent(config).run(stop)``: starts everything in order, runs until ``stop`` is
    set, then shuts down (``shutdown``).

    ``parts`` holds the components, ``ready`` is set after the first complete sync, and
    ``pages.status_json()`` is what /status serves."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.node_wait = NODE_WAIT
        self.parts = Components(config)
        self.api_server_ips: frozenset[IPAddress] = frozenset()  # (Kubernetes API source)
        self.health = HealthState()
        # kube-proxy's proxy health: /healthz and /livez, and the health checks' view of us
        self.proxy_health = ProxyHealth()
        self.health.progress = self._progress
        self.health.node_eligible = lambda: self.proxy_health.node_eligible
        self.metrics = Metrics()
        self.pods = self.parts.pods = PodWatcher(config.bridge, config.gateway)
        self.pages = StatusPages(self.parts, self.metrics, self.health)
        self.syncer = Syncer(
            self.parts, self.metrics, self.health, self._first_sync, self.proxy_health
        )
        self.ready = self.syncer.ready
        self.tasks: list[asyncio.Task[Any]] = []

    async def run(self, stop: asyncio.Event) -> None:
        cfg, parts = self.config, self.parts
        log.info("ovsproxy %s starting (mode %s)", __version__, cfg.mode)
        try:
            # The source lists (and converts) while the node ingress, OVSDB and the switch are
            # set up: the tracker only records until the first sync, requested once all are
            # there. (It needs nothing of them, and the list is most of a cold start.)
            source_started = asyncio.create_task(self._start_source(), name="source start")
            self.tasks.append(source_started)
            ovsdb_endpoint, openflow_endpoint = await self._start_ovs()
            if cfg.steers:
                cfg = await self._start_node_ingress(source_started)
            # /healthz, /metrics and /status answer while OVSDB is awaited (not healthy yet).
            parts.ovsdb_link = OVSDBLink(ovsdb_endpoint)
            register_metrics(self.metrics, self.health, parts, self.syncer.openflow_errors)
            await self.pages.start_http()
            connected = await connect_ovsdb(parts.ovsdb_link, cfg.bridge, stop)
            if connected is None:
                return
            parts.ovsdb, generation = connected
            log.info("cookie generation %d", generation)
            await set_zone_timeouts(parts.ovsdb_link, parts.ovsdb, cfg.bridge)
            linux = route_backend_name(cfg.route_backend) == "linux"
            if cfg.mode == pl.Mode.STANDALONE and cfg.manage_routes and linux:
                cfg = await self._start_host_snat()
            if cfg.manage_routes:
                parts.routes, parts.discoverer = build_routes(cfg, parts.netns)
                await parts.routes.start()
                parts.discoverer.subscribe(parts.routes.apply_soon)
            # The channel (started below) and the core over it; group ids are recorded in
            # OVSDB for the next run.
            parts.channel = Channel(openflow_endpoint)
            node = NodeFacts(
                generation,
                OVSDBGroupRegistry(parts.ovsdb, cfg.bridge),
                self.pods.current,
                await datapath_type_of(parts.ovsdb, cfg.bridge),
            )
            followers = commit_followers(parts.node_ingress, parts.discoverer)
            parts.take_core(
                build_core(cfg, parts.channel, node, followers=followers, tracker=parts.tracker)
            )
            assert parts.proxier is not None
            choice = parts.proxier.mid_stream_choice
            log.info("mid-stream flows %s (%s)", "on" if choice.on else "off", choice.reason)
            parts.runner = SyncRunner(
                self.syncer,
                min_interval=cfg.min_sync_interval,
                full_resync_interval=cfg.full_resync_interval,
            )
            runner = parts.runner
            proxier, datapath = parts.proxier, parts.datapath
            assert datapath is not None
            parts.counters = CounterPoller(
                parts.channel,
                lambda: proxier.programmed,
                lambda: datapath.installed_groups,
                interval=cfg.counters_interval,
                max_series=cfg.counters_max_series,
            )

            def changed() -> None:
                # kube-proxy's per-family proxiers each queue every change
                for family in IPFamily:
                    self.proxy_health.queued_update(family)
                runner.request()

            parts.tracker.set_notify(changed)
            if parts.node is not None and parts.node_ingress is not None:
                parts.node.follow(self._node_ips_changed)
            await parts.channel.start(wait=False)
            if not await wait_for_switch(parts.channel, stop):
                return  # stopped while waiting
            if cfg.mode == pl.Mode.STANDALONE:
                await self.pods.read(parts.ovsdb)
                poll = self.pods.poll(parts.ovsdb, parts.runner.request)
                self.tasks.append(asyncio.create_task(poll, name="pods"))
            await source_started
            self._watch_service_cidrs()
            parts.runner.request(full=True)
            self.tasks.append(asyncio.create_task(parts.runner.run(), name="sync runner"))
            if cfg.counters_interval > 0:
                counters = parts.counters.run()
                self.tasks.append(asyncio.create_task(counters, name="counters"))
            await stop.wait()
        finally:
            await shutdown(parts, self.tasks, self.pages)

    async def _start_ovs(self) -> tuple[str, str]:
        """The OVSDB and OpenFlow endpoints: the configured OVS, or the embedded sandbox."""
        cfg, parts = self.config, self.parts
        if not cfg.embedded:
            assert cfg.ovsdb is not None and cfg.openflow is not None
            parts.netns = cfg.netns
            return cfg.ovsdb, cfg.openflow
        parts.sandbox = await embedded.start_sandbox(cfg)
        parts.netns = parts.sandbox.netns
        return parts.sandbox.ovsdb, parts.sandbox.openflow

    async def _start_node_ingress(self, source_started: asyncio.Task[None]) -> AgentConfig:
        """The steering table's policy routes and node IPs, before the datapath: the pipeline marks
        the node's own packets by its IPs (discovered ones included)."""
        parts = self.parts
        node_ingress = parts.node_ingress = build_node_ingress(
            self.config, parts.netns, self.proxy_health
        )
        await node_ingress.start(await self._node_object_ips(source_started))
        if not self.config.node_ip:
            self.config = dataclasses.replace(
                self.config, node_ip=tuple(str(ip) for ip in node_ingress.node_ips)
            )
            parts.config = self.config
            self._node_ips_known()
        return self.config

    async def _start_host_snat(self) -> AgentConfig:
        """The host-SNAT addresses, before the datapath: the pipeline's SNAT flows name them
        (the local pods are read first: an address a pod has is refused; the Node's podCIDRs,
        if it is listed by now, are the fallback for a gateway without a prefix)."""
        parts = self.parts
        assert parts.ovsdb is not None
        host_snat = parts.host_snat = build_host_snat(self.config, parts.netns)
        await self.pods.read(parts.ovsdb)
        node = parts.node.node if parts.node is not None else None
        addresses = await host_snat.start(self.pods.pods, node.pod_cidrs if node else ())
        self.config = parts.config = dataclasses.replace(
            self.config, host_snat_ip=tuple(str(ip) for ip in addresses)
        )
        return self.config

    async def _node_object_ips(self, source_started: asyncio.Task[None]) -> tuple[IPAddress, ...]:
        """The Node object's addresses, if the node IPs are not configured and the Node is
        watched: after its first list, waited for up to ``node_wait``."""
        if self.config.node_ip:
            return ()
        await asyncio.shield(source_started)  # (creates the watcher; it does not list)
        watcher = self.parts.node
        if watcher is None:
            return ()
        try:
            await asyncio.wait_for(watcher.synced.wait(), self.node_wait)
        except TimeoutError:
            log.warning(
                "Node %s not listed within %gs: node IPs from the node's devices until it is",
                watcher.name,
                self.node_wait,
            )
        return watcher.host_ips

    def _node_ips_changed(self, node_ips: tuple[IPAddress, ...]) -> None:
        """The Node's addresses changed: the steering table, the Classifier's node-IP flows and
        the NodePort frontends follow, in a full sync."""
        parts = self.parts
        node_ingress, proxier, runner = parts.node_ingress, parts.proxier, parts.runner
        if node_ingress is None or not node_ingress.set_node_ips(node_ips):
            return
        self.config = parts.config = dataclasses.replace(
            self.config, node_ip=tuple(str(ip) for ip in node_ingress.node_ips)
        )
        if proxier is not None:
            proxier.set_node_ips(node_ingress.node_ips, node_ingress.node_port_ips)
        self._node_ips_known()
        if runner is not None:
            runner.request(full=True)

    def _node_ips_known(self) -> None:
        """The node's own addresses are refused as external IPs from now on."""
        if self.parts.external_ips is not None:
            rule = external_ip_rule(self.config, self.api_server_ips)
            self.parts.external_ips.set_rule(rule)

    def _progress(self) -> tuple[bool, dict[str, Any]]:
        status, body = self.proxy_health.livez()
        return status == 200, body

    async def _start_source(self) -> None:
        parts = self.parts
        external = parts.external_ips = ExternalIPFilter(
            parts.tracker, external_ip_rule(self.config)
        )
        source = parts.source = build_source(self.config, external)
        await source.start()
        if not manifest_paths(self.config):
            from ovsproxy.agent.node import NodeWatcher
            from ovsproxy.sources.kubernetes import KubernetesSource

            assert isinstance(source, KubernetesSource)
            self.api_server_ips = await api_server_ips(source.api_server_host)
            external.set_rule(external_ip_rule(self.config, self.api_server_ips))
            parts.node = NodeWatcher(self.config.node_name, self.proxy_health)
            source.node(parts.node, self.config.node_name)

    def _watch_service_cidrs(self) -> None:
        """The ServiceCIDR informer, once the route discoverer exists (API source only)."""
        parts, source = self.parts, self.parts.source
        if parts.discoverer is not None and not manifest_paths(self.config):
            from ovsproxy.servicecidr import ServiceCIDRHandler
            from ovsproxy.sources.kubernetes import KubernetesSource

            assert isinstance(source, KubernetesSource)
            source.service_cidrs(ServiceCIDRHandler(parts.discoverer))

    def _first_sync(self) -> None:
        if self.parts.sandbox is not None and self.pages.http is not None:
            embedded.log_banner(self.parts, self.pages.http.port)


async def shutdown(parts: Components, tasks: list[asyncio.Task[Any]], pages: StatusPages) -> None:
    """Stop in the reverse order of start-up; with ``cleanup``, remove our state first."""
    if parts.runner is not None:
        parts.runner.stop()
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
    tasks.clear()
    if parts.semantics is not None:
        with contextlib.suppress(Exception):
            await parts.semantics.close()
    if parts.source is not None:
        with contextlib.suppress(Exception):
            await parts.source.stop()
    if parts.config.cleanup:
        await cleanup(parts)
    if parts.routes is not None:
        with contextlib.suppress(Exception):
            await parts.routes.stop()
    if parts.node_ingress is not None:
        with contextlib.suppress(Exception):
            await parts.node_ingress.close()
    if parts.host_snat is not None:
        with contextlib.suppress(Exception):
            await parts.host_snat.close()
    await pages.stop_http()
    if parts.channel is not None:
        await parts.channel.close()
    registry = parts.group_registry
    if registry is not None:
        await registry.close()
    if parts.ovsdb is not None:
        await asyncio.to_thread(parts.ovsdb.close)
    if parts.sandbox is not None:
        await asyncio.to_thread(parts.sandbox.down)
    log.info(
        "stopped%s",
        " (ours removed: see the cleanup lines)"
        if parts.config.cleanup
        else " (flows, groups and routes left in place for a hitless restart)",
    )


async def cleanup(parts: Components) -> None:
    """--cleanup: on exit, what ``ovsproxy cleanup`` removes of what this run set up (the
    steps of ``agent.cleanup``) but the virtual next hop, and the host-SNAT addresses'
    neighbour entries and host routes, each line logged."""
    config, report = parts.config, CleanupReport()
    if parts.datapath is not None and parts.channel is not None and parts.channel.connected:
        rejector = parts.semantics.rejector if parts.semantics else Rejector(parts.channel)
        await remove_switch_state(parts.datapath, rejector, parts.ovsdb, config.bridge, report)
    elif parts.datapath is not None:
        report.errors.append("OpenFlow not connected: flows, groups and the meter stay")
    if parts.routes is not None:
        await remove_routes(parts.routes, next_hop=False, neighbours=False, report=report)
    if parts.node_ingress is not None:
        await remove_steering(parts.node_ingress.table, parts.node_ingress.routes, report)
    if parts.host_snat is not None:
        try:
            report.removed += await parts.host_snat.cleanup()
        except Exception as exc:
            report.errors.append(f"host-SNAT neighbour entries: {type(exc).__name__}: {exc}")
    for item in report.removed:
        log.info("cleanup: removed %s", item)
    for item in deliberately_left(config, on_exit=True):
        log.info("cleanup: left on purpose: %s", item)
    for item in report.errors:
        log.error("cleanup failed: %s", item)
