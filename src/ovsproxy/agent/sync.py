"""The sync wrapper the runner calls: drift repair, the proxier's sync, and what follows it.

Around ``Proxier.sync``: on a periodic full sync, a switch that lost flows behind our back is
rewritten first (``SwitchSync.drifted``); a failure counts the OVS error by name and marks the
agent unhealthy; once the sources have synced, the node's routes are converged once from the
complete ClusterIP list before the agent calls itself healthy and ready, the gauges are set, and
the proxy health learns that every queued change is in (kube-proxy's ``Updated``). The drift
repair and the proxier's sync run under one memory policy (``datapath.memory.memory_policy``:
the cyclic garbage collector paused; after a big commit, the new state frozen and the heap's
free pages given back to the OS); last, the garbage collector is settled (``gcpause.settle``: what
the sync left young is collected, the survivors frozen), so that no collection later traverses
the cluster's state in the middle of an event or a sync; a periodic full resync at least
``COMPACT_EVERY`` after the last compaction compacts instead (``gcpause.compact``: a collection
over the frozen objects too, for reference cycles that became garbage after they were frozen).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable

from ovsproxy import gcpause
from ovsproxy.agent.wiring import Components
from ovsproxy.datapath.memory import memory_policy
from ovsproxy.healthcheck import ProxyHealth
from ovsproxy.metrics import HealthState, Metrics
from ovsproxy.model import IPFamily
from ovsproxy.openflow.errors import OpenFlowError

log = logging.getLogger("ovsproxy.agent")

# A compaction (a collection over the whole heap) at the first periodic full resync this long
# after the last one: full resyncs may be every minute, and a compaction's cost is the size of
# the cluster's state, like a full sync's.
COMPACT_EVERY = 3600.0


class Syncer:
    """``SyncRunner(Syncer(...))``: one call per sync. ``ready`` is set after the first
    complete one; ``on_first_sync`` runs then (the embedded default's banner)."""

    def __init__(
        self,
        parts: Components,
        metrics: Metrics,
        health: HealthState,
        on_first_sync: Callable[[], None] = lambda: None,
        proxy_health: ProxyHealth | None = None,
    ) -> None:
        self.parts = parts
        self.proxy_health = proxy_health
        self.metrics = metrics
        self.health = health
        self.on_first_sync = on_first_sync
        self.openflow_errors: Counter[str] = Counter()  # OVS errors of failed syncs, by name
        self.ready = asyncio.Event()
        self._routes_reconciled = False
        self.settle_gc = True  # see gcpause.settle
        self.last_gc: gcpause.Collected | None = None  # the last settle's or compaction's
        self.gc_compactions = 0
        self._compacted_at = time.monotonic()

    def _observe_duration(self, full: bool, seconds: float) -> None:
        """kube-proxy's sync durations: one sync programs both families, so it is observed
        under each ip_family (as each of kube-proxy's per-family proxiers observes its own)."""
        m = self.metrics
        by_kind = m.sync_full_proxy_rules_duration if full else m.sync_partial_proxy_rules_duration
        for family in IPFamily:
            m.sync_proxy_rules_duration.labels(family.name).observe(seconds)
            by_kind.labels(family.name).observe(seconds)

    def _conntrack_flushed(self, family: IPFamily, seconds: float, filters: int) -> None:
        """kube-proxy's conntrack reconciler metrics, from our UDP conntrack flushes: one flush
        of ``filters`` filters of ``family`` that took ``seconds``."""
        self.metrics.conntrack_reconciler_duration.labels(family.name).observe(seconds)
        self.metrics.conntrack_reconciler_deleted.labels(family.name).inc(filters)

    async def __call__(self, full: bool) -> bool:
        """One sync; True when it is done but left Service ports the switch refused, for the
        runner to sync again with backoff (``proxy.runner``): each sync tries them again."""
        parts = self.parts
        assert parts.proxier is not None and parts.datapath is not None
        proxier, datapath = parts.proxier, parts.datapath
        if parts.semantics is not None:  # (built after the metrics are registered)
            parts.semantics.conntrack.on_flushed = self._conntrack_flushed
        started = time.perf_counter()
        try:
            if full and datapath.commits and await datapath.drifted():
                log.warning("switch lost flows or groups behind our back: rewriting all")
                with memory_policy(datapath):
                    await datapath.resync_switch()
            # The collector is off while the sync builds (a full sync makes over a million
            # long-lived acyclic values: every collection would traverse them again) and on
            # until its commit is in; settled below.
            with memory_policy(datapath):
                result = await proxier.sync(full)
        except Exception as exc:
            # An OVS error, raised as is or as the cause of a datapath error: count its name.
            error = exc if isinstance(exc, OpenFlowError) else exc.__cause__
            if isinstance(error, OpenFlowError):
                self.openflow_errors[error.name] += 1
            self.metrics.syncs.labels("error").inc()
            self.health.sync_result(False, str(exc))
            raise
        finally:
            if parts.tracker.synced:  # (kube-proxy times failed syncs too)
                self._observe_duration(full, time.perf_counter() - started)
        if not parts.tracker.synced:
            return False
        for family, latency in result.programming_latencies:
            self.metrics.network_programming.labels(family.name).observe(latency)
        if parts.routes is not None and not self._routes_reconciled:
            # Start-up: converge the node's routes once, from the complete ClusterIP list,
            # before we call ourselves healthy.
            assert parts.discoverer is not None
            await parts.routes.reconcile(parts.discoverer.desired)
            self._routes_reconciled = True
        m = self.metrics
        m.sync_duration.labels("full" if full else "partial").observe(time.perf_counter() - started)
        m.syncs.labels("ok").inc()
        now = time.time()
        m.last_sync_success.set(now)
        for family in IPFamily:
            m.sync_proxy_rules_last_timestamp.labels(family.name).set(now)
        self.health.sync_result(True)
        if self.proxy_health is not None:
            for family in IPFamily:
                self.proxy_health.updated(family)
        m.services.set(len(proxier.services))
        m.refused.labels("switch").set(len(proxier.refused))
        m.refused.labels("conflict").set(proxier.conflicts_refused)
        m.endpoints.set(proxier.endpoint_count())
        m.groups.set(len(datapath.installed_groups))
        m.flows.set(len(datapath.installed_flows))
        node_ingress = parts.node_ingress
        if node_ingress is not None:
            m.node_ports.set(node_ingress.node_port_count)
            m.source_ranges.set(node_ingress.source_range_count)
            m.steering_elements.set(node_ingress.element_count)
            m.health_check_servers.set(node_ingress.health_checks.running)
        first = not self.ready.is_set()
        if first:
            self.ready.set()
            log.info(
                "first sync done: %d Service ports, %d groups, %d flows",
                len(proxier.services),
                len(datapath.installed_groups),
                len(datapath.installed_flows),
            )
            self.on_first_sync()
        if self.settle_gc:
            # Last: nothing waits on it here (the commit is in, the gauges are set).
            if full and not first and time.monotonic() - self._compacted_at >= COMPACT_EVERY:
                self.last_gc = gcpause.compact()  # at a periodic full resync
                self._compacted_at = time.monotonic()
                self.gc_compactions += 1
                if self.last_gc is not None and self.last_gc.objects:
                    log.info(
                        "garbage collector: %d object(s) in reference cycles freed in %.3fs",
                        self.last_gc.objects,
                        self.last_gc.seconds,
                    )
            else:
                self.last_gc = gcpause.settle()
        return bool(proxier.refused)
