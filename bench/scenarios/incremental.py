"""One endpoint change in a 10,000-Service cluster: ours vs a full MODIFY vs the seed's N+1.

Live, in one private sandbox, through the whole proxy: EndpointSlice event -> ``ChangeTracker``
-> ``Proxier.sync`` (checkpoint, categorise, build, stage) -> ``SwitchSync.commit`` (one bundle)
-> commit reply. The cluster (10,000 Services x 10 endpoints; 1,000 with ``--quick``) is
installed first by the proxier's initial sync (``initial_sync_s``), under the agent's memory
policy (``datapath.memory``: the collector paused, then the new state frozen).

* ``noop_messages``: an unchanged full resync (every Service re-staged): must be 0, and
  nothing is written to the switch at all (``noop_wire_bytes``).
* One endpoint added to one Service (10 -> 11), then removed, ``rounds`` times:
  ``event_to_commit_ms`` (median), ``update_group_messages`` (GROUP_MODs on the wire for the
  update: 1), ``insert_bucket_bytes`` (that GROUP_MOD: one bucket), ``update_wire_bytes``
  (everything written for the update: the bundle's control messages, the INSERT_BUCKET, whose
  bucket translates, and the new endpoint's mid-stream flow where the bridge's datapath
  gets them: the sandbox's is userspace). The same event in a 100-Service cluster
  (``event_to_commit_ms_100_services``): the cost does not depend on the number of Services.
* Baselines, measured by sending what that code sends for the same group to the same switch,
  each followed by a barrier: one full MODIFY of the group (Antrea's strategy, our
  encoding); and the seed's bug, N+1 MODIFYs of growing size (the group with bucket 0, then
  0-1, ... then all N, then all N again).
* The plot (``plot``): GROUP_MOD bytes for one added endpoint as the group grows from 10 to
  5,000 endpoints, for our INSERT_BUCKET, a full MODIFY and the N+1 sequence (log scales).
  Ours and the full MODIFY are the exact messages ``plan_group`` produces (ours also sent live
  at every size); the N+1 sequence is summed from the real encoded bucket sizes (hundreds of
  megabytes at 5,000 endpoints: not sent), chunked at the message limit like any big group.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import time
from pathlib import Path
from typing import Any

from bench import dp
from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath import service_flows as svc
from ovsproxy.datapath.fixed_flows import pipeline_flows
from ovsproxy.datapath.flow_context import Context
from ovsproxy.datapath.groups import MAX_BUNDLED_MESSAGE, GroupSpec, plan_group
from ovsproxy.datapath.memory import memory_policy
from ovsproxy.model import Endpoint, EndpointSlice, IPFamily, Service, SlicePort
from ovsproxy.model.handler import SYNC_ENDPOINT_SLICES, SYNC_SERVICES
from ovsproxy.openflow import protocol as of
from ovsproxy.openflow.connection import Channel
from ovsproxy.proxy.proxier import Proxier

NAME = "incremental"
DESCRIPTION = "One endpoint change in a 10,000-Service cluster vs a full MODIFY and the N+1 bug"

RESULTS = Path(__file__).resolve().parent.parent / "results"
PLOT_SIZES = [10, 20, 50, 100, 200, 500, 1000, 2000, 5000]
NEW_ENDPOINT = Endpoint(ipaddress.IPv4Address("10.255.255.1"), dp.ENDPOINT_PORT)


def _slice(port: Any, endpoints: tuple[Endpoint, ...]) -> EndpointSlice:
    name = port.name
    return EndpointSlice(
        name.namespace,
        f"{name.name}-x7k2p",
        name.name,
        (SlicePort(name.port, name.protocol, endpoints),),
    )


class Wire:
    """What the channel wrote between two snapshots."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.sent = channel.counters.total("sent")[1]
        self.groups = list(channel.counters.bundled.get("GROUP_MOD", [0, 0]))
        self.flows = list(channel.counters.bundled.get("FLOW_MOD", [0, 0]))

    def delta(self) -> dict[str, int]:
        counters = self.channel.counters
        groups = counters.bundled.get("GROUP_MOD", [0, 0])
        flows = counters.bundled.get("FLOW_MOD", [0, 0])
        return {
            "wire_bytes": counters.total("sent")[1] - self.sent,
            "group_messages": groups[0] - self.groups[0],
            "group_bytes": groups[1] - self.groups[1],
            "flow_messages": flows[0] - self.flows[0],
            "flow_bytes": flows[1] - self.flows[1],
        }


async def _proxy(sb: Any, services: int) -> tuple[Channel, Proxier, dp.Cluster, float]:
    channel, core = await dp.connect(sb)
    tracker, proxier = core.tracker, core.proxier
    ports = dp.cluster(services, 10)
    for port, endpoints in ports:
        tracker.on_service_add(Service(port.name.namespace, port.name.name, (port,)))
        tracker.on_endpoint_slice_add(_slice(port, endpoints))
    tracker.on_synced(SYNC_SERVICES)
    tracker.on_synced(SYNC_ENDPOINT_SLICES)
    started = time.perf_counter()
    with memory_policy(core.datapath):  # as the agent's sync runs it (agent.sync)
        await proxier.sync()
    return channel, proxier, ports, time.perf_counter() - started


async def _one_endpoint_changes(
    channel: Channel, proxier: Proxier, ports: dp.Cluster, rounds: int
) -> dict[str, Any]:
    port, endpoints = ports[0]
    grown = (*endpoints, NEW_ENDPOINT)
    adds: list[tuple[float, dict[str, int], int]] = []
    removes: list[tuple[float, dict[str, int], int]] = []
    for _ in range(rounds):
        for target, sink in ((grown, adds), (endpoints, removes)):
            wire = Wire(channel)
            started = time.perf_counter()
            proxier.tracker.on_endpoint_slice_update(_slice(port, target))
            result = await proxier.sync()
            elapsed = time.perf_counter() - started
            sink.append((elapsed, wire.delta(), result.commit.messages))
    proxier.tracker.on_endpoint_slice_update(_slice(port, grown))  # end with 11 endpoints
    await proxier.sync()
    add = adds[-1][1]
    remove = removes[-1][1]
    return {
        "event_to_commit_ms": round(dp.median([a[0] for a in adds]) * 1e3, 2),
        "remove_event_to_commit_ms": round(dp.median([r[0] for r in removes]) * 1e3, 2),
        "update_messages": adds[-1][2],
        "update_group_messages": add["group_messages"],
        "insert_bucket_bytes": add["group_bytes"],
        "update_flow_messages": add["flow_messages"],
        "update_wire_bytes": add["wire_bytes"],
        "remove_group_messages": remove["group_messages"],
        "remove_bucket_bytes": remove["group_bytes"],
        "remove_wire_bytes": remove["wire_bytes"],
        "every_update_one_group_message": all(
            a[1]["group_messages"] == 1 for a in (*adds, *removes)
        ),
    }


async def _send_plain(channel: Channel, messages: list[of.Message]) -> tuple[float, int]:
    """Messages as that code sends them (no bundle), then a barrier: (seconds, bytes)."""
    before = channel.counters.total("sent")[1]
    started = time.perf_counter()
    await channel.send(messages)
    return time.perf_counter() - started, channel.counters.total("sent")[1] - before


def _full_modify(spec: GroupSpec) -> list[of.Message]:
    return list(plan_group(spec, None, present_unknown=True).messages)


def _n_plus_one(spec: GroupSpec) -> list[of.Message]:
    """The seed's sequence: a MODIFY after each bucket is added, then the group's own."""
    messages: list[of.Message] = []
    for k in range(1, len(spec.buckets) + 1):
        messages += _full_modify(GroupSpec(spec.group_id, spec.buckets[:k], spec.selection_method))
    return messages + _full_modify(spec)


async def _baselines(
    channel: Channel, proxier: Proxier, ports: dp.Cluster, rounds: int
) -> dict[str, Any]:
    # the changed Service's group, now with 11 endpoints
    gid = proxier.groups.ids_of(ports[0][0].name)[IPFamily.IPv4]
    spec = proxier.datapath.desired_group(gid)
    assert spec is not None and len(spec.buckets) == 11, spec
    full = _full_modify(spec)
    n1 = _n_plus_one(spec)
    full_runs = [await _send_plain(channel, full) for _ in range(rounds)]
    n1_runs = [await _send_plain(channel, n1) for _ in range(rounds)]
    return {
        "group_endpoints": len(spec.buckets),
        "full_modify_messages": len(full),
        "full_modify_bytes": sum(m.length for m in full),
        "full_modify_ms": round(dp.median([r[0] for r in full_runs]) * 1e3, 2),
        "full_modify_wire_bytes": full_runs[-1][1],
        "n_plus_1_messages": len(n1),
        "n_plus_1_bytes": sum(m.length for m in n1),
        "n_plus_1_ms": round(dp.median([r[0] for r in n1_runs]) * 1e3, 2),
        "n_plus_1_wire_bytes": n1_runs[-1][1],
    }


# -- bytes as the group grows (the plot) ---------------------------------------------------


def _group(n: int, gid: int = 1) -> GroupSpec:
    port, endpoints = dp.cluster(1, n)[0]
    ctx = Context(pl.Tables.for_config(dp.CONFIG), dp.GENERATION)
    (group,) = svc.service_objects(ctx, port, endpoints, {IPFamily.IPv4: gid}).groups
    return group


def _n_plus_one_bytes(spec: GroupSpec) -> int:
    """Bytes of the N+1 sequence from the real bucket encodings: message k carries buckets
    0..k-1; a message over the limit is chunked (greedy, like every big group), and the
    chunking of a prefix is the prefix of the chunking of the whole group."""
    method = spec.selection_method
    first = of.group_mod_overhead(*method) if method is not None else of.group_mod_overhead()
    later = of.group_mod_overhead(None)
    sizes = [len(of.Bucket(i, b.actions, b.weight).wire) for i, b in enumerate(spec.buckets)]
    total = 0
    prefix = 0
    chunks = 1
    room = MAX_BUNDLED_MESSAGE - first
    for size in sizes:
        if size > room:
            chunks += 1
            room = MAX_BUNDLED_MESSAGE - later
        room -= size
        prefix += size
        total += first + prefix + (chunks - 1) * later  # the MODIFY after this bucket
    return total + first + prefix + (chunks - 1) * later  # ...and the group's own


def _plot_data(sizes: list[int]) -> list[dict[str, int]]:
    rows = []
    for n in sizes:
        before, after = _group(n - 1), _group(n)
        installed = plan_group(before, None).result
        ours = plan_group(after, installed)
        row = {
            "endpoints": n,
            "ours_bytes": sum(m.length for m in ours.messages),
            "ours_messages": len(ours.messages),
            "full_modify_bytes": sum(m.length for m in _full_modify(after)),
            "n_plus_1_bytes": _n_plus_one_bytes(after),
        }
        if n <= 200:  # the arithmetic against the real messages
            assert row["n_plus_1_bytes"] == sum(m.length for m in _n_plus_one(after)), n
        rows.append(row)
    return rows


async def _ours_live(sb: Any, sizes: list[int]) -> dict[int, int]:
    """Our GROUP_MOD bytes for the N-th endpoint, as the switch receives them."""
    channel, core = await dp.connect(sb)
    datapath = core.datapath
    try:
        ctx = Context(datapath.tables, dp.GENERATION)
        datapath.stage(dp.PIPELINE_OWNER, (), pipeline_flows(ctx))
        measured = {}
        for n in sizes:
            port, endpoints = dp.cluster(1, n, namespace=f"plot{n}")[0]
            gid = 100 + n
            objects = svc.service_objects(ctx, port, endpoints[:-1], {IPFamily.IPv4: gid})
            datapath.stage(port.name, objects.groups, objects.staged)
            await datapath.commit()
            wire = Wire(channel)
            objects = svc.service_objects(ctx, port, endpoints, {IPFamily.IPv4: gid})
            datapath.stage(port.name, objects.groups, objects.staged)
            await datapath.commit()
            measured[n] = wire.delta()["group_bytes"]
            datapath.unstage(port.name)  # the next size reuses the ClusterIP and endpoints
            await datapath.commit()
        return measured
    finally:
        await channel.close()


def _plot(rows: list[dict[str, int]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r["endpoints"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    ax.plot(x, [r["n_plus_1_bytes"] for r in rows], "o-", label="seed bug: N+1 MODIFYs")
    ax.plot(
        x, [r["full_modify_bytes"] for r in rows], "s-", label="one full MODIFY (Antrea's strategy)"
    )
    ax.plot(x, [r["ours_bytes"] for r in rows], "^-", label="ovsproxy: one INSERT_BUCKET")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("endpoints in the group (after the change)")
    ax.set_ylabel("GROUP_MOD bytes on the wire")
    ax.set_title("One endpoint added to a select group")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def run(quick: bool) -> dict[str, Any]:
    services = 1_000 if quick else 10_000
    rounds = 10 if quick else 30
    sizes = PLOT_SIZES

    async def live(sb: Any) -> dict[str, Any]:
        channel, proxier, ports, initial = await _proxy(sb, services)
        try:
            wire = Wire(channel)
            started = time.perf_counter()
            noop = await proxier.sync(full=True)
            noop_s = time.perf_counter() - started
            result: dict[str, Any] = {
                "services": services,
                "endpoints_per_service": 10,
                "initial_sync_s": round(initial, 3),
                "noop_messages": noop.commit.messages,
                "noop_wire_bytes": wire.delta()["wire_bytes"],
                "noop_full_resync_s": round(noop_s, 3),
            }
            result.update(await _one_endpoint_changes(channel, proxier, ports, rounds))
            result.update(await _baselines(channel, proxier, ports, rounds))
        finally:
            await channel.close()
        dp.reset_switch(sb)
        channel, proxier, ports, _ = await _proxy(sb, 100)
        try:
            small = await _one_endpoint_changes(channel, proxier, ports, rounds)
        finally:
            await channel.close()
        result["event_to_commit_ms_100_services"] = small["event_to_commit_ms"]
        dp.reset_switch(sb)
        result["plot_ours_live_bytes"] = await _ours_live(sb, sizes)
        return result

    with dp.sandbox() as sb:
        result = asyncio.run(live(sb))
    rows = _plot_data(sizes)
    for row in rows:
        if result["plot_ours_live_bytes"][row["endpoints"]] != row["ours_bytes"]:
            raise AssertionError(f"live bytes differ from the plan: {row}")
    del result["plot_ours_live_bytes"]
    result["ratio_full_modify_vs_ours_bytes"] = round(
        result["full_modify_bytes"] / result["insert_bucket_bytes"], 1
    )
    result["ratio_n_plus_1_vs_ours_bytes"] = round(
        result["n_plus_1_bytes"] / result["insert_bucket_bytes"], 1
    )
    result["bytes_by_group_size"] = rows
    RESULTS.mkdir(exist_ok=True)
    suffix = "-quick" if quick else ""
    path = RESULTS / f"{dt.date.today().isoformat()}-incremental-bytes{suffix}.png"
    _plot(rows, path)
    result["plot"] = str(path.relative_to(RESULTS.parent.parent))
    return result
