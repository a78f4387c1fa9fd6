"""What the node holds, for ``ovsproxy verify``: our groups read over OpenFlow (probed where
OVS cannot describe them), our Service routes through the route backend, and the routes
compared with the desired prefixes; the ``inet ovsproxy`` steering table through libnftables
(compared by ``steering.compare``), and the node IPs and host-SNAT addresses its desired
content depends on (the Node object's addresses with the Kubernetes API as the source, as the
agent takes them). Nothing on the node is changed: a probe is a bundle built to fail, and
nothing of a failed bundle is applied.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

from ovsproxy.agent.hostsnat import HostSNAT
from ovsproxy.agent.wiring import build_route_backend, manifest_paths, route_backend_name
from ovsproxy.config import AgentConfig
from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath.our_group_ids import DESCRIBE_SAFE_BUCKETS, STATS_SAFE_BUCKETS
from ovsproxy.diagnostics import compare
from ovsproxy.diagnostics.compare import Difference, GroupView
from ovsproxy.model import IPAddress, IPFamily, IPNetwork
from ovsproxy.model.node import PodPort
from ovsproxy.openflow import protocol as of
from ovsproxy.openflow.connection import BundleError, Channel
from ovsproxy.routes.steering import SteeringRoutes
from ovsproxy.steering import SteeringState, SteeringTable
from ovsproxy.steering.compare import compare_table

log = logging.getLogger("ovsproxy.verify")


async def _probe(channel: Channel, messages: list[of.Message]) -> str:
    """Send a bundle built to fail (its last message re-adds an existing group); nothing of a
    failed bundle is applied. Returns the failing error's name ("" if it committed)."""
    try:
        await channel.commit_bundle(messages)
    except BundleError as exc:
        return exc.name
    return ""


async def probe_group_exists(channel: Channel, group_id: int) -> bool:
    """ADD of the group in a bundle: refused with GROUP_EXISTS when it exists. A group that
    does not exist would be created by the commit, so the bundle ends with a REMOVE_BUCKET of
    a bucket no new (empty) group has, failing it either way."""
    name = await _probe(
        channel,
        [
            of.GroupMod(of.GroupModCommand.ADD, group_id),
            of.GroupMod(of.GroupModCommand.REMOVE_BUCKET, group_id, command_bucket_id=0),
        ],
    )
    return "GROUP_EXISTS" in name


async def probe_bucket_ids(channel: Channel, group_id: int, count: int) -> bool:
    """Whether the group's bucket ids include 0..count-1: removing each, then re-adding the
    (existing) group, fails on that last ADD only if every removal found its bucket."""
    messages: list[of.Message] = [
        of.GroupMod(of.GroupModCommand.REMOVE_BUCKET, group_id, command_bucket_id=i)
        for i in range(count)
    ]
    messages.append(of.GroupMod(of.GroupModCommand.ADD, group_id))
    return "GROUP_EXISTS" in await _probe(channel, messages)


def _ours(config: pl.PipelineConfig, gid: int) -> bool:
    return config.group_id_min <= gid <= config.group_id_max


async def read_groups(
    channel: Channel,
    config: pl.PipelineConfig,
    desired: dict[int, GroupView],
    registry: set[int] | None,
    notes: list[str],
) -> dict[int, GroupView]:
    """Our groups on the switch (see the module docstring for large ones)."""
    largest = max((g.n_buckets for g in desired.values()), default=0)
    counts: dict[int, int | None] = {}
    if largest <= STATS_SAFE_BUCKETS:
        for stats in await channel.group_stats():
            if _ours(config, stats.group_id):
                counts[stats.group_id] = stats.n_buckets
    else:
        # Group statistics of this group would overflow too: probe each candidate id.
        candidates = set(desired) | (registry or set())
        for gid in sorted(candidates):
            if _ours(config, gid) and await probe_group_exists(channel, gid):
                counts[gid] = None
        notes.append(
            f"a group of {largest} buckets is too large for OpenFlow's group statistics: "
            f"groups were found by probing {len(candidates)} candidate id(s) (desired and "
            "OVSDB-registered); a group of ours outside those is not seen"
        )
    views: dict[int, GroupView] = {}
    small = [gid for gid, n in counts.items() if n is not None and n <= DESCRIBE_SAFE_BUCKETS]
    if len(small) == len(counts):
        dumped = await channel.dump_groups(max_buckets=DESCRIBE_SAFE_BUCKETS) if small else []
    else:
        dumped = []
        for gid in small:
            dumped += await channel.dump_groups(gid, max_buckets=DESCRIBE_SAFE_BUCKETS)
    for group in dumped:
        if group.group_id in counts:
            views[group.group_id] = compare.installed_group_view(group)
    for gid, count in counts.items():
        if gid in views:
            continue
        if count is None:  # found by probe: no count either, only that it exists
            want = desired.get(gid)
            n = want.n_buckets if want is not None else 0
            text = f"group_id={gid},type=select (too large for group statistics)"
            views[gid] = GroupView(gid, None, n, None, text)
            continue
        views[gid] = compare.undescribed_group_view(gid, count)
        if await probe_bucket_ids(channel, gid, count):
            notes.append(
                f"group {gid}: {count} buckets (too large to dump), bucket ids 0..{count - 1}"
            )
        else:
            notes.append(
                f"group {gid}: {count} buckets (too large to dump), bucket ids not 0..{count - 1} "
                "(incremental changes keep each endpoint's id)"
            )
    return views


InstalledRoutes = dict[IPFamily, list[tuple[IPNetwork, str]]]


async def read_routes(config: AgentConfig) -> tuple[InstalledRoutes, dict[IPFamily, str]]:
    """Our Service routes on the gateway per family, (destination, next hop), and the next
    hop our routes use."""
    backend = build_route_backend(config, config.netns)
    await backend.open()
    try:
        out: InstalledRoutes = {}
        for family in IPFamily:
            routes = await backend.list_routes(config.gateway, family)
            out[family] = [(r.dst, str(r.gateway)) for r in routes if r.ours]
        return out, {f: str(backend.next_hop(f)) for f in IPFamily}
    finally:
        await backend.close()


def compare_routes(
    desired: frozenset[IPNetwork],
    installed: InstalledRoutes,
    next_hops: dict[IPFamily, str],
    gateway: str,
) -> list[Difference]:
    """A desired prefix is covered by our route to it or to a wider prefix (the running
    agent's prefix only grows, a fresh one starts from the current ClusterIPs); a route of
    ours that covers no desired prefix is unexpected, and one via another next hop differs."""
    diffs: list[Difference] = []
    used: set[IPNetwork] = set()
    for net in sorted(desired, key=lambda n: (n.version, n)):
        family = IPFamily.of(net)
        hop = next_hops[family]
        covering = [
            (dst, via)
            for dst, via in installed.get(family, [])
            if net.subnet_of(dst)  # type: ignore[arg-type]
        ]
        text = f"{net} via {hop} dev {gateway} proto 155"
        if not covering:
            diffs.append(Difference(compare.MISSING, "route", text))
            continue
        for dst, via in covering:
            used.add(dst)
            if via != hop:
                diffs.append(
                    Difference(
                        compare.DIFFERS,
                        "route",
                        f"{dst} via {via} dev {gateway} proto 155",
                        f"next hop {via}, wanted {hop}",
                    )
                )
    for routes in installed.values():
        for dst, via in routes:
            if dst not in used:
                diffs.append(
                    Difference(
                        compare.UNEXPECTED, "route", f"{dst} via {via} dev {gateway} proto 155"
                    )
                )
    return diffs


async def node_ips(config: AgentConfig) -> tuple[IPAddress, ...]:
    """The node's IPs as the agent decides them: configured; else, with the Kubernetes API as
    the source, the Node object's addresses; else read from the node's devices (the steering
    table's content and the Classifier's node-IP flows depend on them)."""
    if config.node_ips:
        return config.node_ips
    if not manifest_paths(config):
        ips = await node_object_ips(config)
        if ips:
            return ips
    routes = SteeringRoutes(config.gateway, config.netns)
    await routes.open()
    try:
        return tuple(await routes.node_addresses())
    finally:
        await routes.close()


async def with_host_snat(config: AgentConfig, pods: list[PodPort]) -> AgentConfig:
    """``config`` with the host-SNAT addresses the agent takes on this node (``agent.hostsnat``;
    its pipeline's SNAT flows name them), read from the gateway, nothing installed."""
    linux = route_backend_name(config.route_backend) == "linux"
    if config.mode != pl.Mode.STANDALONE or not config.manage_routes or not linux:
        return config
    host_snat = HostSNAT(config, config.netns)
    try:
        choices = await host_snat.choose(pods)
    finally:
        await host_snat.close()
    chosen = [str(c.address) for c in choices.values() if c.address is not None]
    return dataclasses.replace(config, host_snat_ip=tuple(chosen))


async def node_object_ips(config: AgentConfig) -> tuple[IPAddress, ...]:
    """The addresses of the Node named ``config.node_name`` (``Node.host_ips``), listed once
    with the agent's field selector; none when it is not found or the list fails."""
    from ovsproxy.sources.kubernetes import NODES, kube_http_client
    from ovsproxy.sources.nodes import convert_node, node_field_selector

    client = await asyncio.to_thread(
        kube_http_client, kubeconfig=config.kubeconfig, in_cluster=config.in_cluster
    )
    try:
        response = await client.get(
            NODES.path(), params={"fieldSelector": node_field_selector(config.node_name)}
        )
    finally:
        await client.aclose()
    if response.status_code != 200:
        # The server's message says why (a 403 names the verb and the resource).
        log.warning(
            "Node %s: list answered %d: %s",
            config.node_name,
            response.status_code,
            response.text[:300],
        )
        return ()
    items = response.json().get("items") or []
    return convert_node(items[0]).host_ips if items else ()


async def read_steering_table(config: AgentConfig) -> dict[str, Any] | None:
    """The ``inet ovsproxy`` table as listed (None: absent)."""
    table = SteeringTable(config.netns)
    try:
        return await table.listing()
    finally:
        await table.close()


def compare_steering(listing: dict[str, Any] | None, desired: SteeringState) -> list[Difference]:
    return [Difference(d.kind, d.what, d.text, d.detail) for d in compare_table(listing, desired)]
