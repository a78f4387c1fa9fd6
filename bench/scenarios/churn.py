"""Churn: 10,000 Services x 10 endpoints installed, then a steady stream of EndpointSlice
updates through the fake Kubernetes API's watch, at 100 and 1,000 endpoint changes per
second for 30 s each, with the agent's min-sync-interval 0, its default (0.1 s) and 1 s.

The agent is the real one in ``bench.agent_probe`` (started from the API like ``ovsproxy
run``; the runner's minimum interval is set between windows, as ``--min-sync-interval``
would). Pod churn spread over Services: each update picks a Service at random and changes
one endpoint of its slice (a pod at 10 endpoints goes away, one at 9 gets a new pod with a
new address), so every update is one endpoint change. Each update is stamped with its send
time; it ends at the reply to the commit of the sync that consumed it.

Per window: p50/p99/max from the update's send to the commit reply, OpenFlow messages and
bytes written per second, syncs, and the agent's CPU time over the window as a share of one
core (``/proc/<pid>/stat``, all its threads). Of the latency, the delivery: the send to the
agent's informer handler (the fake API, the HTTP stream, the decode). The agent's cyclic
garbage collections over the window: their time, count and the longest one (a collection
stops the agent's event loop: events arriving meanwhile wait, and so does a sync in progress).
Only the window's own updates are timed: ``carried_over`` counts earlier ones (the warm-up, a
previous window's backlog) the agent was still taking in, and ``kept_up`` says whether every
update of the window was committed. The fake API and the generator share the bench's process:
its setup heap is frozen and its collector off while the windows run (its collections over
the cluster and the watch history stalled the watch, and counted as the agent's latency).
Goals at 100/s: p99 <= 10 ms plus the min-sync interval, CPU <= 25% of one core; met or not is
judged at the agent's default interval (each window says its own).
"""

from __future__ import annotations

import asyncio
import gc
import ipaddress
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from support import cluster

from bench import agentrun, dp, kubeapi
from bench.agent_probe import STAMP
from ovsproxy.config import AgentConfig

NAME = "churn"
DESCRIPTION = "EndpointSlice updates at 100 and 1,000 endpoint changes/s through the watch"

GOAL_P99_MS = 10.0  # plus the min-sync interval
# none, the agent's default, and kube-proxy's default
INTERVALS = sorted({0.0, AgentConfig().min_sync_interval, 1.0})
GOAL_CPU_PERCENT = 25.0


class Churn:
    """The cluster's endpoints as the generator knows them; one update at a time."""

    def __init__(self, api: kubeapi.ServingKubeApi, services: int, endpoints: int) -> None:
        self.api = api
        self.services = services
        self.endpoints = endpoints
        self.state = [
            [
                cluster.endpoint_object(i, ip, i * endpoints + j)
                for j, ip in enumerate(cluster.endpoint_ips(i, endpoints))
            ]
            for i in range(services)
        ]
        self.next_pod = services * endpoints
        self.rng = random.Random(16)
        self.sent = 0

    def update(self) -> None:
        i = self.rng.randrange(self.services)
        eps = self.state[i]
        if len(eps) >= self.endpoints:
            eps = eps[:]
            del eps[self.rng.randrange(len(eps))]
        else:
            pod = self.next_pod
            self.next_pod += 1
            ip = str(ipaddress.IPv4Address(cluster.ENDPOINT_BASE + pod))
            eps = [*eps, cluster.endpoint_object(i, ip, pod)]
        self.state[i] = eps
        obj = cluster.slice_object(i, eps, annotations={STAMP: repr(time.time())})
        self.api.apply_fast("endpointslices", obj)
        self.sent += 1

    async def stream(self, rate: float, seconds: float) -> int:
        """``rate`` updates per second for ``seconds``; returns how many were sent."""
        started = time.perf_counter()
        sent = 0
        while (elapsed := time.perf_counter() - started) < seconds:
            due = int(elapsed * rate) + 1
            while sent < due:
                self.update()
                sent += 1
            await asyncio.sleep(max(0.0, (sent / rate) - (time.perf_counter() - started)))
        return sent


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


async def _window(
    sb: Any,
    probe: agentrun.ProbeProcess,
    churn: Churn,
    rate: float,
    seconds: float,
    interval: float,
) -> dict[str, Any]:
    await probe.ask({"cmd": "min_interval", "value": interval})
    await churn.stream(min(rate, 100.0), min(1.0, seconds / 4))  # warm-up, not measured
    await asyncio.sleep(interval + 0.2)
    await probe.ask({"cmd": "window"})
    cpu, ovs = probe.cpu(), dp.ovs_cpu(sb)
    started, own = time.perf_counter(), time.process_time()
    sent = await churn.stream(rate, seconds)
    elapsed = time.perf_counter() - started
    own = time.process_time() - own
    cpu = probe.cpu() - cpu
    ovs_after = dp.ovs_cpu(sb)
    report = await probe.ask({"cmd": "report", "expect": sent})
    latencies = [x * 1000 for x in report["latencies"]]
    deliveries = [x * 1000 for x in report["deliveries"]]
    p99 = _percentile(latencies, 0.99)
    result = {
        "rate_per_s": rate,
        "min_sync_interval_s": interval,
        "seconds": round(elapsed, 2),
        "updates": sent,
        "committed": len(latencies),
        # every update of the window committed (within a minute of its end)
        "kept_up": len(latencies) == sent,
        # updates sent before the window that the agent was still taking in during it
        "carried_over": report["carried_over"],
        "p50_ms": round(_percentile(latencies, 0.5), 2),
        "p99_ms": round(p99, 2),
        "max_ms": round(max(latencies), 2) if latencies else None,
        "mean_ms": round(statistics.fmean(latencies), 2) if latencies else None,
        # of which the watch's delivery: the send to the agent's informer handler
        "delivery_p50_ms": round(_percentile(deliveries, 0.5), 2),
        "delivery_p99_ms": round(_percentile(deliveries, 0.99), 2),
        "syncs": report["syncs"],
        "syncs_per_s": round(report["syncs"] / elapsed, 1),
        "messages_per_s": round(report["messages"] / report["wall_s"], 1),
        "bytes_per_s": round(report["bytes"] / report["wall_s"]),
        "agent_cpu_percent": round(100 * cpu / elapsed, 1),
        # the generator and the fake API (this process): near 100, they are the bottleneck
        "bench_cpu_percent": round(100 * own / elapsed, 1),
        "ovs_cpu_percent": None
        if ovs is None or ovs_after is None
        else round(100 * (ovs_after - ovs) / elapsed, 1),
        # where the agent's time goes over the window (seconds, wall inside the agent)
        "agent_s": {
            k: round(report[f"{k}_s"], 3)
            for k in (
                "decode",
                "convert",
                "track",
                "sync_wall",
                "sync_track",
                "sync_build",
                "sync_stage",
                "sync_commit",
                "gc",
            )
        },
        "changed_per_sync": round(report["changed"] / max(report["syncs"], 1), 1),
        # the agent's cyclic garbage collections over the window (those after each sync
        # included) and the longest one: a collection stops everything in the agent
        "gc_collections": report["gc_collections"],
        "gc_longest_ms": round(report["gc_longest_s"] * 1000, 1),
    }
    if rate <= 100:
        result["goal_p99_ms"] = GOAL_P99_MS + interval * 1000
        result["goal_cpu_percent"] = GOAL_CPU_PERCENT
        result["goal_p99_met"] = p99 <= result["goal_p99_ms"]
        result["goal_cpu_met"] = result["agent_cpu_percent"] <= GOAL_CPU_PERCENT
    return result


async def _measure(
    sb: Any, services: int, endpoints: int, seconds: float, rates: list[float], tmp: Path
) -> dict[str, Any]:
    api, _ = await agentrun.serve_cluster(services, endpoints)
    try:
        kubeconfig = str(api.kubeconfig(tmp / "kubeconfig"))
        agentrun.reset(sb)
        probe = await agentrun.start_probe(agentrun.agent_config(sb, {"kubeconfig": kubeconfig}))
        try:
            churn = Churn(api, services, endpoints)
            # The fake API's cluster and the generator's state are long-lived: out of the
            # bench process's collector, whose full collections over them (most of a second
            # at 10,000 Services) would otherwise stall the watch and count as the agent's.
            # Then no collections at all: every update adds an object tree to the fake's
            # watch history (acyclic, kept to the end), and collections over those slowed
            # the watch more with every window.
            gc.collect()
            gc.freeze()
            gc.disable()
            windows = []
            for interval in INTERVALS:
                for rate in rates:
                    windows.append(await _window(sb, probe, churn, rate, seconds, interval))
            idle_cpu, idle_s = probe.cpu(), min(2.0, seconds / 2)
            await asyncio.sleep(idle_s)
            idle = 100 * (probe.cpu() - idle_cpu) / idle_s
        finally:
            await probe.stop()
            agentrun.reset(sb)
    finally:
        gc.enable()
        gc.unfreeze()
        await api.stop()
    by_key = {
        f"{int(w['rate_per_s'])}/s, interval {w['min_sync_interval_s']:g} s": w for w in windows
    }
    # The goals hold at the agent's default interval (issue 26); the other windows show what
    # none and kube-proxy's 1 s would give.
    default = AgentConfig().min_sync_interval
    judged = [w for w in windows if "goal_p99_met" in w and w["min_sync_interval_s"] == default]
    return {
        "services": services,
        "endpoints_per_service": endpoints,
        "seconds_per_window": seconds,
        "cold_start_s": probe.ready["marks"]["ready"],
        "idle_cpu_percent": round(idle, 1),
        "goal_p99_ms": f"{GOAL_P99_MS} + min-sync-interval (at 100/s)",
        "goal_cpu_percent": GOAL_CPU_PERCENT,
        "default_min_sync_interval_s": default,
        "goals_met": bool(judged) and all(w["goal_p99_met"] and w["goal_cpu_met"] for w in judged),
        "windows": by_key,
    }


def run(quick: bool) -> dict[str, Any]:
    services, seconds = (1_000, 2.0) if quick else (10_000, 30.0)
    with tempfile.TemporaryDirectory(prefix="ovsproxy-bench-churn-") as tmp, dp.sandbox() as sb:
        return asyncio.run(_measure(sb, services, 10, seconds, [100.0, 1000.0], Path(tmp)))
