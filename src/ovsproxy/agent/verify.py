"""``ovsproxy verify``: does the node hold what the agent's current input requires?

The desired side is built the way a fresh agent builds it, from the same configuration and by
the same code: the source (manifests or the Kubernetes API) fills a change tracker, the
proxier stages every Service port, the local pods (standalone) and the pipeline into a real
``Datapath``, which commits into a ``RecordingSwitch`` (nothing is sent anywhere); the route
discoverer is fed the proxier's ClusterIPs. The installed side is read from the node: our
flows (our cookie) and groups (our id range) through OVS's OpenFlow dumps, our routes (proto
155) through the route backend, the cookie generation and group-id registry from OVSDB.

Nothing is changed on the node. A group too large for OVS to describe (GROUP_DESC over 64 KB,
see README "Known limits") is compared by its bucket count from group statistics, and a
bucket-id probe (a bundle that fails by design, so nothing is applied) says whether its ids are
0..n-1; above the size group statistics can carry, only its existence is probed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from ovsproxy.agent.wiring import build_route_backend, build_source, manifest_paths
from ovsproxy.config import AgentConfig, ConfigError
from ovsproxy.datapath import compare
from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath.compare import Difference, GroupView
from ovsproxy.datapath.datapath import DESCRIBE_SAFE_BUCKETS, STATS_SAFE_BUCKETS, Datapath
from ovsproxy.datapath.reject import Rejector
from ovsproxy.model import IPFamily, IPNetwork
from ovsproxy.model.node import PodPort
from ovsproxy.openflow import protocol as of
from ovsproxy.openflow.connection import BundleError, Channel
from ovsproxy.ovs.ovsdb import OVSDB, OVSDBGroupRegistry
from ovsproxy.proxy.proxier import Proxier
from ovsproxy.proxy.tracker import ChangeTracker
from ovsproxy.servicecidr.feed import ClusterIPFeed

log = logging.getLogger("ovsproxy.verify")


@dataclass
class Desired:
    flows: dict[bytes, of.FlowMod]
    groups: dict[int, GroupView]
    routes: frozenset[IPNetwork] | None  # None: routes not managed
    services: int


@dataclass
class VerifyReport:
    differences: list[Difference] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    checked: dict[str, int] = field(default_factory=dict)  # what was compared, by kind

    @property
    def clean(self) -> bool:
        return not self.differences

    def text(self) -> str:
        lines = [str(d) for d in self.differences]
        lines += [f"note: {n}" for n in self.notes]
        summary = ", ".join(f"{count} {kind}" for kind, count in self.checked.items())
        if self.differences:
            lines.append(f"{len(self.differences)} difference(s) (compared {summary})")
        else:
            lines.append(f"converged: no difference (compared {summary})")
        return "\n".join(lines)


# -- the desired state ----------------------------------------------------------------------


async def _wait_synced(tracker: ChangeTracker, timeout: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not tracker.synced:
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"the sources did not deliver their initial lists in {timeout:g}s")
        await asyncio.sleep(0.05)


async def build_desired(
    config: AgentConfig,
    pods: list[PodPort],
    generation: int,
    *,
    timeout: float = 60.0,
) -> Desired:
    """What a fresh agent with this configuration installs (see the module docstring)."""
    tracker = ChangeTracker()
    discoverer = None
    if config.manage_routes:
        from ovsproxy.servicecidr import ServiceCIDRDiscoverer

        discoverer = ServiceCIDRDiscoverer(
            configured=config.service_cidr, use_api=not manifest_paths(config)
        )
    datapath = Datapath(compare.RecordingSwitch(), config.pipeline, generation)
    datapath.freeze_gc = False  # a one-shot process: nothing to keep out of the collector

    async def current_pods() -> list[PodPort]:
        return pods

    proxier = Proxier(
        tracker,
        datapath,
        node_name=config.node_name,
        zone=config.zone,
        pods=current_pods,
        on_cluster_ips=ClusterIPFeed(discoverer) if discoverer is not None else None,
        reject_action=Rejector(None).reject_action,
    )
    source = build_source(config, tracker)
    try:
        await source.start()
        if discoverer is not None and not manifest_paths(config):
            from ovsproxy.servicecidr import ServiceCIDRHandler
            from ovsproxy.sources.kubernetes import KubernetesSource

            assert isinstance(source, KubernetesSource)
            source.service_cidrs(ServiceCIDRHandler(discoverer))
        await _wait_synced(tracker, timeout)
        await proxier.sync(full=True)
        if discoverer is not None:
            deadline = asyncio.get_running_loop().time() + timeout
            while not discoverer.ready:
                if asyncio.get_running_loop().time() > deadline:
                    raise TimeoutError("the Service CIDRs could not be decided (ServiceCIDR API)")
                await asyncio.sleep(0.05)
    finally:
        with contextlib.suppress(Exception):
            await source.stop()
    groups = {
        gid: compare.desired_group_view(group) for gid, group in datapath.installed_groups.items()
    }
    return Desired(
        flows=dict(datapath.installed_flows),
        groups=groups,
        routes=discoverer.desired() if discoverer is not None else None,
        services=len(proxier.services),
    )


# -- the installed state --------------------------------------------------------------------


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


# -- all of it ------------------------------------------------------------------------------


async def verify(config: AgentConfig, *, timeout: float = 60.0) -> VerifyReport:
    """Compare the node with the desired state; nothing on the node is changed."""
    if config.embedded:
        raise ConfigError(
            "verify needs the OVS to check: give --ovsdb and --openflow (as to `ovsproxy run`)"
        )
    assert config.ovsdb is not None and config.openflow is not None
    report = VerifyReport()
    ovsdb = await asyncio.to_thread(OVSDB, config.ovsdb)
    try:
        generation = await asyncio.to_thread(ovsdb.generation, config.bridge)
        registry = await OVSDBGroupRegistry(ovsdb, config.bridge).load()
        pods: list[PodPort] = []
        if config.mode == pl.Mode.STANDALONE:
            pods = await asyncio.to_thread(ovsdb.pod_ports, config.bridge)
    finally:
        await asyncio.to_thread(ovsdb.close)
    desired = await build_desired(config, pods, generation or 1, timeout=timeout)
    channel = Channel(config.openflow)
    await channel.start(timeout=timeout)
    try:
        descs = await channel.dump_flows(
            cookie=pl.COOKIE_APP << pl.COOKIE_APP_SHIFT, cookie_mask=pl.COOKIE_APP_MASK
        )
        installed_flows = compare.flows_by_key(
            d.flow for d in descs if not compare.is_learned(d.flow)
        )
        groups = await read_groups(channel, config.pipeline, desired.groups, registry, report.notes)
    finally:
        await channel.close()
    diffs = compare.compare_switch(desired.flows, desired.groups, installed_flows, groups)
    diffs += compare.generation_differences(installed_flows, generation)
    if generation is None and installed_flows:
        diffs.append(
            Difference(
                compare.MISSING,
                "ovsdb",
                f"Bridge {config.bridge} external_ids:ovsproxy-generation",
                "flows of ours are installed but OVSDB records no cookie generation",
            )
        )
    if registry is not None or groups:
        unregistered = sorted(set(groups) - (registry or set()))
        if unregistered:
            diffs.append(
                Difference(
                    compare.DIFFERS,
                    "ovsdb",
                    f"Bridge {config.bridge} external_ids:ovsproxy-group-ids",
                    f"installed group(s) {_ids(unregistered)} are not recorded "
                    "(a restarted agent would not know them as ours)",
                )
            )
    report.checked = {
        "Service ports": desired.services,
        "flows": len(desired.flows),
        "groups": len(desired.groups),
    }
    if desired.routes is not None:
        installed_routes, hops = await read_routes(config)
        diffs += compare_routes(desired.routes, installed_routes, hops, config.gateway)
        report.checked["routes"] = len(desired.routes)
    report.differences = diffs
    return report


def _ids(ids: list[int]) -> str:
    shown = ", ".join(map(str, ids[:10]))
    return shown + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")
