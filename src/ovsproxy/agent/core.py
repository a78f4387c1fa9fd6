"""The core of an agent, built one way for every user: ``build_core(config, switch, node)``.

The core is the change tracker, the datapath over a switch, the proxier, the Service
semantics (reject, conntrack flushes, affinity sweep) and the followers of each commit (given
by the caller). The agent
(``agent.lifecycle``), ``ovsproxy verify`` (the desired state, committed into a
``RecordingSwitch``), the tests' harnesses and the benchmarks all build it here, so each gets
the agent's wiring: the proxier's node name, zone, NodePort frontends and node IPs from the
configuration (NodePort IPs: ``AgentConfig.node_port_ips``), the switch's reconnection replaying
the datapath, and the Service semantics' hooks. ``Semantics`` says how much of the semantics a
user runs: all of it over a live channel, only the reject flows (their frontends as the agent's,
nothing sent), or none.

What follows a commit is a list of followers (``proxy.followers``) the proxier calls in one
place; the agent's are ``commit_followers``: the node ingress's steering table, its health-check
servers, then the route discoverer's ClusterIP feed.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ovsproxy.config import AgentConfig
from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath.affinity import SWEEP_INTERVAL
from ovsproxy.datapath.memory import memory_policy
from ovsproxy.datapath.our_group_ids import GroupRegistry
from ovsproxy.datapath.reject import Rejector
from ovsproxy.datapath.semantics import SemanticsHelpers
from ovsproxy.datapath.switch_sync import Switch, SwitchSync
from ovsproxy.model.node import PodPort
from ovsproxy.openflow import protocol as of
from ovsproxy.openflow.connection import Channel
from ovsproxy.proxy.followers import Follower
from ovsproxy.proxy.mid_stream import choose as choose_mid_stream
from ovsproxy.proxy.proxier import Proxier
from ovsproxy.proxy.tracker import ChangeTracker
from ovsproxy.servicecidr.feed import ClusterIPFeed

if TYPE_CHECKING:
    from ovsproxy.agent.nodeport import NodeIngress
    from ovsproxy.servicecidr import ServiceCIDRDiscoverer


class Semantics(enum.Enum):
    """How much of the Service semantics the core runs."""

    # Over a live ``Channel``: reject packet-ins answered (TCP RST, ICMP), UDP conntrack
    # flushed after removals, learned affinity flows deleted and swept, the reject meter
    # installed before every replay (the agent, the live tests)
    LIVE = "live"
    # The agent's flows, rejects included; nothing sent after a commit (``verify``, tests of
    # what the agent stages)
    FLOWS = "flows"
    # Frontends without endpoints drop; nothing sent after a commit (the benchmarks, tests of
    # the proxier on a fake switch)
    NONE = "none"


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What the core is told of the node beyond its configuration (read from OVSDB)."""

    generation: int = 1  # the cookie generation of this run
    registry: GroupRegistry | None = None  # where the group ids are kept for the next run
    pods: Callable[[], Awaitable[list[PodPort]]] | None = None  # the local pods (standalone)
    # the bridge's datapath type, which decides the mid-stream flows (None: not read)
    datapath_type: str | None = None


@dataclass(frozen=True, slots=True)
class Core:
    tracker: ChangeTracker
    datapath: SwitchSync
    proxier: Proxier
    semantics: SemanticsHelpers | None  # Semantics.LIVE only


def commit_followers(
    node_ingress: NodeIngress | None, discoverer: ServiceCIDRDiscoverer | None
) -> tuple[Follower, ...]:
    """What follows each commit, in order: the node ingress's steering table, its health-check
    servers, then the route discoverer's ClusterIPs (only when an address came or went)."""
    followers: list[Follower] = []
    if node_ingress is not None:
        followers += (node_ingress, node_ingress.health_checks)
    if discoverer is not None:
        followers.append(ClusterIPFeed(discoverer))
    return tuple(followers)


def build_core(
    config: AgentConfig,
    switch: Switch,
    node: NodeFacts,
    *,
    semantics: Semantics = Semantics.LIVE,
    followers: Sequence[Follower] = (),
    tracker: ChangeTracker | None = None,
    freeze_gc: bool = True,
    sweep_interval: float = SWEEP_INTERVAL,
    max_ovs_timeout: int = pl.OVS_MAX_TIMEOUT,
) -> Core:
    """The core over ``switch`` (see the module docstring). A ``Channel`` gets the hooks: every
    (re)connection replays the datapath (after the reject meter, with ``Semantics.LIVE``) and
    packet-ins go to the semantics; the channel is not started. ``tracker``: one the sources
    already fill (the agent lists while OVS is set up); ``freeze_gc`` off for a one-shot
    process (``SwitchSync``); ``max_ovs_timeout``: OVS's idle-timeout limit, lowered by tests to
    make the affinity sweep do the expiring."""
    datapath = SwitchSync(
        switch, config.pipeline, node.generation, registry=node.registry, freeze_gc=freeze_gc
    )
    if isinstance(switch, Channel):

        async def replay() -> None:
            with memory_policy(datapath):  # a replay rewrites everything: as a sync
                await datapath.on_connected()

        switch.on_connected = replay
    wired: SemanticsHelpers | None = None
    reject_action: tuple[of.Action, ...] = ()  # (none: frontends without endpoints drop)
    if semantics is Semantics.LIVE:
        if not isinstance(switch, Channel):
            raise TypeError(f"Service semantics run over a Channel, not {type(switch).__name__}")
        wired = SemanticsHelpers.wired(switch, datapath, sweep_interval=sweep_interval)
        switch.on_packet_in = wired.handle
        reject_action = wired.rejector.reject_action
    elif semantics is Semantics.FLOWS:
        reject_action = Rejector(None).reject_action
    proxier = Proxier(
        tracker if tracker is not None else ChangeTracker(),
        datapath,
        node_name=config.node_name,
        zone=config.zone,
        pods=node.pods,
        reject_action=reject_action,
        conntrack=wired.conntrack if wired is not None else None,
        send=wired.channel.send if wired is not None else None,
        max_ovs_timeout=max_ovs_timeout,
        sweep_interval=sweep_interval,
        # NodePort flows only where the node ingress steers NodePort traffic
        node_ports=config.steers,
        node_port_ips=config.node_port_ips if config.steers else (),
        followers=followers,
        mid_stream=choose_mid_stream(
            config.mid_stream_flows, node.datapath_type, config.mode == pl.Mode.STANDALONE
        ),
    )
    if wired is not None:
        wired.rejector.forwards = proxier.forwards
    return Core(proxier.tracker, datapath, proxier, wired)
