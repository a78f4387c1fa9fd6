"""``ovsproxy verify``: does the node hold what the agent's current input requires?

The desired side is built the way a fresh agent builds it, from the same configuration and by
the same code: the source (manifests or the Kubernetes API) fills a change tracker, the
proxier stages every Service port, the local pods (standalone) and the pipeline into a real
``SwitchSync``, which commits into a ``RecordingSwitch`` (nothing is sent anywhere); the route
discoverer is fed the proxier's ClusterIPs. The installed side is read from the node: our
flows (our cookie) and groups (our id range) through OVS's OpenFlow dumps, our routes (proto
155) through the route backend, the cookie generation and group-id registry from OVSDB, and
(when the agent steers NodePorts) the ``inet ovsproxy`` nftables table: its chains, sets and
every element, against the content the steering tracker derives from the same Service ports
and the node's IPs.

Nothing is changed on the node. A group too large for OVS to describe (GROUP_DESC over 64 KB,
see docs/limits.md) is compared by its bucket count from group statistics, and a
bucket-id probe (a bundle that fails by design, so nothing is applied) says whether its ids are
0..n-1; above the size group statistics can carry, only its existence is probed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from dataclasses import dataclass, field

from ovsproxy.agent.core import NodeFacts, Semantics, build_core, commit_followers
from ovsproxy.agent.installed import (
    compare_routes,
    compare_steering,
    node_ips,
    read_groups,
    read_routes,
    read_steering_table,
    with_host_snat,
)
from ovsproxy.agent.ovsdb_link import datapath_type_of
from ovsproxy.agent.wiring import build_source, external_ip_rule, manifest_paths
from ovsproxy.config import AgentConfig, ConfigError
from ovsproxy.datapath import pipeline as pl
from ovsproxy.diagnostics import compare
from ovsproxy.diagnostics.compare import Difference, GroupView
from ovsproxy.gcpause import gc_paused
from ovsproxy.model import IPAddress, IPNetwork
from ovsproxy.model.node import PodPort
from ovsproxy.openflow import protocol as of
from ovsproxy.openflow.connection import Channel
from ovsproxy.ovs.ovsdb import OVSDB, OVSDBGroupRegistry
from ovsproxy.proxy.external_ips import ExternalIPFilter
from ovsproxy.proxy.tracker import ChangeTracker
from ovsproxy.steering import NodePortAddresses, SteeringState, desired_state

log = logging.getLogger("ovsproxy.verify")


@dataclass
class Desired:
    flows: dict[bytes, of.FlowMod]
    groups: dict[int, GroupView]
    routes: frozenset[IPNetwork] | None  # None: routes not managed
    services: int
    steering: SteeringState | None = None  # None: no node-side steering


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
    steering_node_ips: tuple[IPAddress, ...] | None = None,
    datapath_type: str | None = None,
) -> Desired:
    """What a fresh agent with this configuration installs (see the module docstring);
    with ``steering_node_ips``, the steering table's content on a node with those IPs (the
    NodePort frontends are those of ``config.node_ip``: ``desired_for`` sets it to them)."""
    discoverer = None
    if config.manage_routes:
        from ovsproxy.servicecidr import ServiceCIDRDiscoverer

        discoverer = ServiceCIDRDiscoverer(
            configured=config.service_cidr, use_api=not manifest_paths(config)
        )

    async def current_pods() -> list[PodPort]:
        return pods

    core = build_core(
        config,
        compare.RecordingSwitch(),
        NodeFacts(generation, pods=current_pods, datapath_type=datapath_type),
        semantics=Semantics.FLOWS,
        followers=commit_followers(None, discoverer),
        freeze_gc=False,  # a one-shot process: nothing to keep out of the collector
    )
    tracker, datapath, proxier = core.tracker, core.datapath, core.proxier
    # (the agent's rule on external IPs, with the node IPs configured: what it would serve)
    source = build_source(config, ExternalIPFilter(tracker, external_ip_rule(config)))
    try:
        await source.start()
        if discoverer is not None and not manifest_paths(config):
            from ovsproxy.servicecidr import ServiceCIDRHandler
            from ovsproxy.sources.kubernetes import KubernetesSource

            assert isinstance(source, KubernetesSource)
            source.service_cidrs(ServiceCIDRHandler(discoverer))
        await _wait_synced(tracker, timeout)
        with gc_paused():  # as the agent's sync (see agent.sync)
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
    steering = None
    if steering_node_ips is not None:
        steering = desired_state(
            (installed.state.port for installed in proxier.services.values()),
            steering_node_ips,
            NodePortAddresses.parse(config.node_port_addresses),
        )
    return Desired(
        flows=dict(datapath.installed_flows),
        groups=groups,
        routes=discoverer.desired() if discoverer is not None else None,
        services=len(proxier.services),
        steering=steering,
    )


# -- all of it ------------------------------------------------------------------------------


async def verify(config: AgentConfig, *, timeout: float = 60.0) -> VerifyReport:
    """Compare the node with the desired state; nothing on the node is changed."""
    if config.embedded:
        raise ConfigError(
            "verify needs the OVS to check: give --ovsdb and --openflow (as to `ovsproxy run`)"
        )
    held = await read_ovsdb(config)
    desired = await desired_for(config, held, timeout=timeout)
    return await compare_node(config, desired, held, timeout=timeout)


@dataclass(frozen=True, slots=True)
class OVSDBState:
    """What verify reads from OVSDB: the cookie generation, the group-id registry, the pods."""

    generation: int | None
    registry: set[int] | None
    pods: list[PodPort]
    # the bridge's, which decides the mid-stream flows as it does for the agent (None: unread)
    datapath_type: str | None = None


async def read_ovsdb(config: AgentConfig) -> OVSDBState:
    assert config.ovsdb is not None
    ovsdb = await asyncio.to_thread(OVSDB, config.ovsdb)
    try:
        generation = await asyncio.to_thread(ovsdb.generation, config.bridge)
        registry = await OVSDBGroupRegistry(ovsdb, config.bridge).load()
        datapath_type = await datapath_type_of(ovsdb, config.bridge)
        pods: list[PodPort] = []
        if config.mode == pl.Mode.STANDALONE:
            pods = await asyncio.to_thread(ovsdb.pod_ports, config.bridge)
    finally:
        await asyncio.to_thread(ovsdb.close)
    return OVSDBState(generation, registry, pods, datapath_type)


async def desired_for(config: AgentConfig, held: OVSDBState, *, timeout: float = 60.0) -> Desired:
    """The desired state for the node whose OVSDB holds ``held`` (and its node IPs)."""
    ips = await node_ips(config) if config.steers else None
    if ips and not config.node_ip:
        # As the agent does: the IPs it found are its pipeline's node IPs (Classifier flows).
        config = dataclasses.replace(config, node_ip=tuple(str(ip) for ip in ips))
    config = await with_host_snat(config, held.pods)
    return await build_desired(
        config,
        held.pods,
        held.generation or 1,
        timeout=timeout,
        steering_node_ips=ips,
        datapath_type=held.datapath_type,
    )


async def compare_node(
    config: AgentConfig, desired: Desired, held: OVSDBState, *, timeout: float = 60.0
) -> VerifyReport:
    """The node's flows, groups, routes and steering table against ``desired`` (one desired
    state can be compared again and again while a node converges to it, as bench chaos does)."""
    assert config.openflow is not None
    generation, registry = held.generation, held.registry
    report = VerifyReport()
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
    if desired.steering is not None:
        diffs += compare_steering(await read_steering_table(config), desired.steering)
        report.checked["capture elements"] = desired.steering.size
    report.differences = diffs
    return report


def _ids(ids: list[int]) -> str:
    shown = ", ".join(map(str, ids[:10]))
    return shown + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")
