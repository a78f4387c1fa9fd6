"""The proxier: decides *what* to install for each Service port and hands it to the datapath.

A sync consumes the tracker's changes (only the Service ports that changed), categorises each
port's endpoints as kube-proxy does (``select_endpoints``; most ports, with only ClusterIP
traffic and every endpoint ready and unhinted, return early from it), assigns the port the
group ids its selection needs (``group_uses``, ``group_ids.GroupIDs``), stages the port's
groups and flows, and commits them in one bundle. If the commit fails, the datapath keeps the
diff and the runner retries; nothing is recorded as installed until the switch has it.

Service semantics (kube-proxy's), per IP family as kube-proxy's per-family proxiers decide:

* endpoints: ``categorize_endpoints`` (ready, else serving-and-terminating; topology hints with
  fallback to the cluster; cluster and local sets). ClusterIPs use the local set with
  internalTrafficPolicy Local, else the cluster set; external and load-balancer IPs the local
  set with externalTrafficPolicy Local, else the cluster set (their own group when it differs;
  no short-circuit of in-cluster clients to the cluster set).
* no usable endpoint anywhere in the cluster: reject (TCP RST / ICMP port unreachable, via the
  agent); usable endpoints exist but none for this traffic (a Local policy, none on this node):
  drop.
* ClientIP session affinity: learned flows with an idle timeout (see
  ``service_flows.affinity_timeouts``); learned flows of a frontend are deleted after the commit
  that removes the frontend, its affinity, or changes its timeout.
* UDP: after the commit that removed an endpoint from a frontend (or the frontend), the
  conntrack entries of that pair are flushed, and flushed again once Open vSwitch has
  revalidated its datapath flows, unless the pair came back meanwhile (``datapath.conntrack``).
* any protocol: after the commit that adds a frontend, its untranslated entries (plain
  connections committed before it was one) are flushed the same way (``_frontends_new``);
  once only when the switch already served it (an agent restart, ``_post_commit``).

* two Services claiming one nodePort, healthCheckNodePort or address:port: the newer's port
  is refused before anything is staged (``proxy.claims``), and served once the claim is free.

``InstalledService`` records all of it as plain data for ``ovsproxy status``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath import service_flows as svc
from ovsproxy.datapath.affinity import SWEEP_INTERVAL
from ovsproxy.datapath.conntrack import ConntrackFlusher, FlushFilter
from ovsproxy.datapath.desired import FlowKey
from ovsproxy.datapath.fixed_flows import pipeline_flows
from ovsproxy.datapath.flow_context import Context
from ovsproxy.datapath.pod_flows import pod_forwarding_flows
from ovsproxy.datapath.switch_sync import CommitStats, DatapathError, SwitchSync
from ovsproxy.model import (
    Endpoint,
    IPAddress,
    IPFamily,
    Protocol,
    ServicePort,
    ServicePortName,
    ServiceState,
)
from ovsproxy.model.node import PodPort
from ovsproxy.model.problems import PortConflict
from ovsproxy.openflow import protocol as of
from ovsproxy.proxy.categorize import TopologyMode, categorize_endpoints, topology_mode
from ovsproxy.proxy.claims import ClaimResolver
from ovsproxy.proxy.followers import Committed, Follower
from ovsproxy.proxy.group_ids import CLUSTER_IPS, EXTERNAL, IN_CLUSTER, GroupIDs, GroupKey
from ovsproxy.proxy.mid_stream import Contribution, MidStreamChoice, MidStreamIndex, choose
from ovsproxy.proxy.mid_stream import contribution as mid_stream_contribution
from ovsproxy.proxy.tracker import ChangeTracker

log = logging.getLogger(__name__)

# Commit attempts per sync while setting refused Service ports aside.
MAX_ISOLATION_ROUNDS = 4

PIPELINE_OWNER = ("pipeline",)

# Every frontend (address, L4 port) of a Service port and the endpoints its traffic goes to
FrontendEndpoints = dict[tuple[IPAddress, int], frozenset[tuple[IPAddress, int]]]


# -- endpoint selection (pure) ------------------------------------------------------------
FORWARD, REJECT, DROP = "forward", "reject", "drop"
MAX_EXCLUDED = 32  # endpoints listed with the reason they are not used, per family
NO_ENDPOINTS = "no usable endpoints"  # (the reason to reject when the port has none at all)


@dataclass(frozen=True, slots=True)
class FamilySelection:
    """What one IP family of a Service port does, and why (plain data for the status)."""

    family: IPFamily
    frontends: tuple[IPAddress, ...]  # ClusterIPs
    endpoints: tuple[Endpoint, ...]  # for ClusterIP traffic
    action: str  # "forward", "reject" (no usable endpoint at all), "drop"
    reason: str  # why not forward ("" when forwarding)
    topology: str  # the topology filter of the cluster set: "", PreferSameZone/Node
    terminating: bool  # no endpoint is ready: serving-and-terminating ones are used
    external_frontends: tuple[IPAddress, ...] = ()  # external and load-balancer IPs
    external_endpoints: tuple[Endpoint, ...] = ()
    external_action: str = FORWARD
    external_reason: str = ""
    excluded: tuple[tuple[str, str], ...] = ()  # (endpoint, why it is not used)
    # The virtual NodePort IP of this family (matched with the nodePort), when the port has one
    node_port_frontends: tuple[IPAddress, ...] = ()
    # This node's NodePort IPs of this family (matched with the nodePort): only local pods
    # reach them through OVS, and they are in-cluster clients (the cluster endpoints)
    node_ip_frontends: tuple[IPAddress, ...] = ()
    # externalTrafficPolicy Local (standalone): in-cluster clients of the external frontends
    # use the cluster endpoints (kube-proxy's short-circuit); None: no short-circuit
    in_cluster_endpoints: tuple[Endpoint, ...] | None = None

    @property
    def has_external(self) -> bool:
        return bool(self.external_frontends or self.node_port_frontends)

    @property
    def external_differs(self) -> bool:
        return self.has_external and (
            self.external_endpoints != self.endpoints
            or self.external_action != self.action
            or self.in_cluster_endpoints is not None
        )

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "frontends": [str(ip) for ip in self.frontends],
            "endpoints": [str(ep) for ep in self.endpoints],
            "action": self.action,
            "reason": self.reason,
            "topology": self.topology or "none",
            "terminating_fallback": self.terminating,
        }
        if self.has_external:
            out["external"] = {
                "frontends": [str(ip) for ip in self.external_frontends],
                "node_port_frontends": [str(ip) for ip in self.node_port_frontends],
                "node_ip_frontends": [str(ip) for ip in self.node_ip_frontends],
                "endpoints": [str(ep) for ep in self.external_endpoints],
                "action": self.external_action,
                "reason": self.external_reason,
            }
            if self.in_cluster_endpoints is not None:
                out["external"]["in_cluster_endpoints"] = [
                    str(ep) for ep in self.in_cluster_endpoints
                ]
        if self.excluded:
            out["excluded"] = dict(self.excluded)
        return out


def _why_excluded(
    ep: Endpoint, port: ServicePort, node_name: str, mode: TopologyMode, uses_ready: bool
) -> str:
    if not ep.ready and not (ep.serving and ep.terminating):
        return "not ready" + (" (terminating)" if ep.terminating else "")
    if not ep.ready and uses_ready:
        return "terminating (ready endpoints exist)"
    if port.internal_policy_local and not ep.is_local(node_name):
        return "on another node (internalTrafficPolicy Local)"
    if mode is TopologyMode.PREFER_SAME_NODE:
        return "topology: no hint for this node (PreferSameNode)"
    if mode is TopologyMode.PREFER_SAME_ZONE:
        return "topology: no hint for this zone (PreferSameZone)"
    return "not selected"


def select_endpoints(
    state: ServiceState,
    family: IPFamily,
    node_name: str,
    zone: str | None,
    *,
    node_ports: bool = False,
    short_circuit: bool = False,
    node_port_ips: Sequence[IPAddress] = (),
) -> FamilySelection:
    """kube-proxy's choice for one family of a Service port (see the module docstring)."""
    port = state.port
    cluster_ips = port.cluster_ips
    # The tracker keeps only endpoints of the port's families: single-stack needs no filter.
    single_stack = len(cluster_ips) == 1 or len(port.families) == 1
    candidates = state.endpoints if single_stack else state.endpoints_of(family)
    if not port.externally_accessible and not port.internal_policy_local:
        # Most ports: only ClusterIP traffic, which uses the cluster set. With every endpoint
        # ready and none hinted, categorisation keeps them all (no topology, no terminating
        # fallback, nothing excluded), so it is skipped.
        for ep in candidates:
            if not ep.ready or ep.hint_zones or ep.hint_nodes:
                break
        else:
            if len(cluster_ips) != 1 or cluster_ips[0].version != family:
                cluster_ips = port.cluster_ips_of(family)
            if candidates:
                return FamilySelection(family, cluster_ips, candidates, FORWARD, "", "", False)
            return FamilySelection(family, cluster_ips, (), REJECT, NO_ENDPOINTS, "", False)
    cats = categorize_endpoints(candidates, port, node_name, zone)
    internal = cats.local if port.internal_policy_local else cats.cluster
    internal = internal if internal is not None else cats.all_reachable
    frontends = port.cluster_ips_of(family)
    external_frontends: tuple[IPAddress, ...] = ()
    if port.external_ips or port.load_balancer_ips:
        external_frontends = tuple(
            ip for ip in svc.service_frontend_ips(port, family) if ip not in frontends
        )
    node_port_frontends: tuple[IPAddress, ...] = ()
    node_ip_frontends: tuple[IPAddress, ...] = ()
    if node_ports and port.node_port and frontends:
        node_port_frontends = (pl.VIRTUAL_NODEPORT_IP[family],)
        node_ip_frontends = tuple(ip for ip in node_port_ips if ip.version == family)
    external: tuple[Endpoint, ...] = ()
    in_cluster: tuple[Endpoint, ...] | None = None
    if external_frontends or node_port_frontends:
        chosen = cats.local if port.external_policy_local else cats.cluster
        external = chosen if chosen is not None else cats.all_reachable
        if short_circuit and port.external_policy_local:
            cluster = cats.cluster if cats.cluster is not None else cats.all_reachable
            in_cluster = tuple(cluster)

    def decide(used: tuple[Endpoint, ...], policy: str) -> tuple[str, str]:
        if not cats.has_any:
            return REJECT, NO_ENDPOINTS if not candidates else "no usable endpoint"
        if not used:
            return DROP, f"{policy} Local: no usable endpoint on this node"
        return FORWARD, ""

    action, reason = decide(internal, "internalTrafficPolicy")
    ext_action, ext_reason = FORWARD, ""
    if external_frontends or node_port_frontends:
        ext_action, ext_reason = decide(external, "externalTrafficPolicy")
    mode = TopologyMode.NONE
    if port.uses_cluster_endpoints and any(ep.hint_zones or ep.hint_nodes for ep in candidates):
        mode = topology_mode(candidates, node_name, zone or "")
    uses_ready = any(ep.ready for ep in internal)
    excluded: tuple[tuple[str, str], ...] = ()
    if len(internal) < len(candidates):  # (the common case, all used, costs nothing more)
        used = {id(ep) for ep in internal}
        excluded = tuple(
            (str(ep), _why_excluded(ep, port, node_name, mode, uses_ready))
            for ep in candidates
            if id(ep) not in used
        )[:MAX_EXCLUDED]
    return FamilySelection(
        family=family,
        frontends=frontends,
        endpoints=tuple(internal),
        action=action,
        reason=reason,
        topology=str(mode.value),
        terminating=bool(internal) and not uses_ready,
        external_frontends=external_frontends,
        external_endpoints=tuple(external),
        external_action=ext_action,
        external_reason=ext_reason,
        excluded=excluded,
        node_port_frontends=node_port_frontends,
        node_ip_frontends=node_ip_frontends,
        in_cluster_endpoints=in_cluster,
    )


class GroupUse(NamedTuple):
    """One select group a family of a Service port needs, and what uses it."""

    role: str  # its key in ``GroupIDs`` (with the family)
    frontends: tuple[IPAddress, ...]  # matched with the Service's port
    endpoints: tuple[Endpoint, ...]
    rejects: bool  # without endpoints its frontends reject (else drop)
    node_port_frontends: tuple[IPAddress, ...] = ()  # matched with the nodePort
    group_only: bool = False  # no frontends: another group's short-circuit
    # externalTrafficPolicy Local: the group of the in-cluster clients (kube-proxy's
    # short-circuit), by role; None: no short-circuit
    in_cluster_role: str | None = None
    in_cluster_endpoints: tuple[Endpoint, ...] = ()
    in_cluster_rejects: bool = False


def group_uses(sel: FamilySelection) -> tuple[GroupUse, ...]:
    """The groups one family of a Service port needs (in ``group_ids.ROLES`` order): one for
    all its frontends while the external ones use the ClusterIPs' endpoints, else the
    ClusterIPs', the short-circuit's (unless it is the ClusterIPs') and the external one."""
    rejects = sel.action == REJECT
    node_ips = sel.node_ip_frontends  # local pods to this node's IP:nodePort: in-cluster clients
    if not sel.external_differs:
        frontends = sel.frontends + sel.external_frontends
        node_ports = sel.node_port_frontends + node_ips
        if not frontends and not node_ports:
            return ()
        return (GroupUse(CLUSTER_IPS, frontends, sel.endpoints, rejects, node_ports),)
    uses: list[GroupUse] = []
    in_cluster = sel.in_cluster_endpoints
    shared = in_cluster is not None and bool(sel.frontends) and in_cluster == sel.endpoints
    if sel.frontends:
        uses.append(
            GroupUse(CLUSTER_IPS, sel.frontends, sel.endpoints, rejects, node_ips if shared else ())
        )
    in_cluster_role = None
    if shared:
        in_cluster_role = CLUSTER_IPS  # the ClusterIPs' group has the same endpoints
    elif in_cluster is not None:
        in_cluster_role = IN_CLUSTER
        uses.append(GroupUse(IN_CLUSTER, (), in_cluster, rejects, node_ips, group_only=True))
    external_node_ports = sel.node_port_frontends
    if in_cluster is None:
        external_node_ports += node_ips  # eTP Cluster: the external set is the cluster's
    uses.append(
        GroupUse(
            EXTERNAL,
            sel.external_frontends,
            sel.external_endpoints,
            sel.external_action == REJECT,
            external_node_ports,
            in_cluster_role=in_cluster_role,
            in_cluster_endpoints=in_cluster or (),
            in_cluster_rejects=rejects,
        )
    )
    return tuple(uses)


_FAMILIES = tuple(IPFamily)  # (iterating the enum class itself is slow: a full sync does it)
_ONE_FAMILY = {int(f): (f,) for f in IPFamily}


def frontend_families(port: ServicePort) -> tuple[IPFamily, ...]:
    """The families a Service port has frontends in (ClusterIPs, external or LB IPs)."""
    cluster_ips = port.cluster_ips
    if not port.external_ips and not port.load_balancer_ips and len(cluster_ips) == 1:
        return _ONE_FAMILY[cluster_ips[0].version]  # (most ports)
    versions = {ip.version for ip in (*cluster_ips, *port.external_ips, *port.load_balancer_ips)}
    return tuple(f for f in _FAMILIES if f in versions)


def _unique_endpoints(sets: list[tuple[Endpoint, ...]]) -> tuple[Endpoint, ...]:
    """The endpoints of these sets, one per address:port, first seen first. Each set holds
    an address:port once (the tracker's), so a single set is the answer as it is: the common
    case (one family, every endpoint used), without hashing every address."""
    if len(sets) == 1:
        return sets[0]
    used: dict[tuple[IPAddress, int], Endpoint] = {}
    for endpoints in sets:
        for ep in endpoints:
            used.setdefault((ep.ip, ep.port), ep)
    return tuple(used.values())


def affinity_realisation(timeout: int, max_ovs: int, sweep_interval: float | None = None) -> str:
    if timeout <= 0:
        return "none"
    _idle, swept = svc.affinity_timeouts(timeout, max_ovs)
    if not swept:
        return f"ClientIP {timeout}s: OVS idle_timeout on learned flows"
    every = f" every {sweep_interval:g}s" if sweep_interval else ""
    return (
        f"ClientIP {timeout}s: above OVS's {max_ovs}s limit, learned flows expired by the "
        f"agent's sweep{every}"
    )


@dataclass
class InstalledService:
    """What `ovsproxy status` shows for a Service port (plain data)."""

    state: ServiceState
    endpoints: tuple[Endpoint, ...]  # every endpoint in its groups (after categorisation)
    group_ids: dict[IPFamily, int]  # the ClusterIPs' group per family
    rejecting: bool  # some frontends answer with a reject: no endpoint is usable
    families: dict[IPFamily, FamilySelection] = field(default_factory=dict)
    external_group_ids: dict[IPFamily, int] = field(default_factory=dict)
    affinity: str = "none"  # how session affinity is realised
    conntrack_flushes: int = 0  # UDP conntrack flush filters sent for this port so far

    @property
    def dropping(self) -> bool:
        return any(
            DROP in (f.action, f.external_action if f.has_external else FORWARD)
            for f in self.families.values()
        )

    def frontend_endpoints(self) -> FrontendEndpoints:
        """Every frontend (address, L4 port) and the endpoints its traffic goes to."""
        out: FrontendEndpoints = {}
        port = self.state.port
        for sel in self.families.values():
            internal = frozenset((ep.ip, ep.port) for ep in sel.endpoints)
            external = frozenset((ep.ip, ep.port) for ep in sel.external_endpoints)
            if sel.in_cluster_endpoints is not None:
                external |= {(ep.ip, ep.port) for ep in sel.in_cluster_endpoints}
            for ip in sel.frontends:
                out[ip, port.port] = internal
            for ip in sel.external_frontends:
                out[ip, port.port] = external
            for ip in sel.node_port_frontends:
                out[ip, port.node_port] = external
            in_cluster = sel.in_cluster_endpoints
            for ip in sel.node_ip_frontends:
                out[ip, port.node_port] = (
                    external
                    if in_cluster is None
                    else frozenset((ep.ip, ep.port) for ep in in_cluster)
                )
        return out

    def status(self) -> dict[str, Any]:
        port = self.state.port
        return {
            "affinity": self.affinity,
            "affinity_timeout_s": port.affinity_timeout,
            "internal_traffic_policy": str(port.internal_traffic_policy),
            "external_traffic_policy": str(port.external_traffic_policy),
            "traffic_distribution": str(port.traffic_distribution or ""),
            "dropping": self.dropping,
            "families": {f"IPv{int(f)}": sel.as_dict() for f, sel in self.families.items()},
            "external_group_ids": {str(int(f)): g for f, g in self.external_group_ids.items()},
            "conntrack_flushes": self.conntrack_flushes,
        }


@dataclass
class SyncResult:
    changed: int = 0
    full: bool = False
    commit: CommitStats = field(default_factory=CommitStats)
    seconds: float = 0.0
    # Seconds from each slice change's trigger time to the commit that carried it (the
    # network programming latency; kube-proxy's network_programming_duration_seconds).
    # Each with the IP family of the slice.
    programming_latencies: tuple[tuple[IPFamily, float], ...] = ()


def _udp_pairs_back(
    protocol: Protocol, before: FrontendEndpoints, after: FrontendEndpoints
) -> list[FlushFilter]:
    """The flush filters of (frontend, endpoint) pairs of a UDP port that ``after`` has and
    ``before`` had not (a frontend new to it: its frontend-wide filter too)."""
    if protocol != Protocol.UDP:
        return []
    back = []
    for (ip, l4_port), endpoints in after.items():
        had = before.get((ip, l4_port))
        if had is None:
            back.append(FlushFilter(protocol, ip, l4_port))
            had = frozenset()
        back += [FlushFilter(protocol, ip, l4_port, *ep) for ep in endpoints - had]
    return back


def _frontends_new(
    protocol: Protocol, before: FrontendEndpoints, after: FrontendEndpoints
) -> list[FlushFilter]:
    """The untranslated-entry filters of the frontends ``after`` has and ``before`` had not.

    Before its Service port existed, a packet to a frontend was committed as a plain
    connection (ServiceLB COMMIT) and forwarded as it was. A client that sends again on the
    same 5-tuple meets that entry. UDP (one socket, or a new one given the same ephemeral
    port): the second datagram of the tuple is still "new", so the group picks an endpoint,
    but conntrack does not NAT a connection it already has; later ones are established and
    skip the Service. TCP: the SYN that connect() retransmits is established (SYN_SENT) and
    never translated either; each retransmission keeps the entry alive, so the connect waits
    about a minute. Only entries whose reply comes from the frontend itself go: nothing a
    Service translated. (kube-proxy flushes UDP entries of Service IPs that gain endpoints.)"""
    return [
        FlushFilter.untranslated(protocol, ip, l4_port)
        for ip, l4_port in after
        if (ip, l4_port) not in before
    ]


def _mid_stream_contribution(
    installed: InstalledService | None, frontend_endpoints: FrontendEndpoints
) -> Contribution:
    if installed is None or installed.state.port.protocol != Protocol.TCP:
        return {}
    return mid_stream_contribution(frontend_endpoints)


class Proxier:
    """Builds and commits the datapath state of every Service port.

    Service-semantics hooks (all optional; ``datapath.semantics.SemanticsHelpers`` provides
    them): ``reject_action`` for frontends without any usable endpoint (empty: drop),
    ``conntrack`` to flush UDP entries of removed endpoints, ``send`` to send messages outside
    the bundle (deleting learned affinity flows) after a commit. ``followers`` see each commit
    after that (``proxy.followers``). ``agent.core.build_core`` builds it with all of them.
    """

    def __init__(
        self,
        tracker: ChangeTracker,
        datapath: SwitchSync,
        *,
        node_name: str,
        zone: str | None = None,
        pods: Callable[[], Awaitable[list[PodPort]]] | None = None,
        reject_action: tuple[of.Action, ...] = (),
        conntrack: ConntrackFlusher | None = None,
        send: Callable[[Sequence[of.Message]], Awaitable[None]] | None = None,
        max_ovs_timeout: int = pl.OVS_MAX_TIMEOUT,
        sweep_interval: float | None = SWEEP_INTERVAL,
        node_ports: bool = False,
        node_port_ips: Sequence[IPAddress] = (),
        followers: Sequence[Follower] = (),
        mid_stream: MidStreamChoice | None = None,
    ) -> None:
        self.tracker = tracker
        self.datapath = datapath
        self.node_name = node_name
        self.zone = zone
        self._pods = pods
        self._reject_action = reject_action
        self.conntrack = conntrack
        self._send = send
        self.sweep_interval = sweep_interval
        # NodePort frontends (the node steers NodePort traffic to the virtual NodePort IP)
        self.node_ports = node_ports
        self.node_port_ips = tuple(node_port_ips)  # this node's IPs that accept NodePorts
        # What follows each commit, in this order (``proxy.followers``)
        self.followers = tuple(followers)
        config = datapath.config
        standalone = config.mode == pl.Mode.STANDALONE
        # Mid-stream flows (``proxy.mid_stream``): decided by the agent from the bridge's
        # datapath type; without that, on (standalone), as "auto" does for an unknown type.
        self.mid_stream_choice = mid_stream or choose("auto", None, standalone)
        self.ctx = Context(
            tables=datapath.tables,
            generation=datapath.generation,
            standalone=standalone,
            with_mid_stream=self.mid_stream_choice.on,
            max_ovs_timeout=max_ovs_timeout,
            host_snat=config.host_snat_ips,
            node_ips=config.node_ips if config.mode == pl.Mode.STANDALONE else (),
        )
        self.groups = GroupIDs(config.group_id_min, config.group_id_max)
        # Standalone: the frontends of every TCP endpoint, for the mid-stream flows that
        # re-create a Service connection's translation after a vswitchd restart.
        self.mid_stream = MidStreamIndex() if self.ctx.mid_stream else None
        # What each Service port is being programmed to (staged; ahead of the switch while a
        # commit is in flight) ...
        self.services: dict[ServicePortName, InstalledService] = {}
        # len(endpoints) summed over services, kept as they change (a sum per sync would
        # cost the cluster's size on every endpoint change)
        self._endpoint_total = 0
        # ... and what it is programmed to: published once the sync that carried it is done
        # (the commit acknowledged, routes and node ingress updated). /status shows this, so a
        # client that waits for it never sends before the flows exist (such a SYN leaves an
        # un-NATed conntrack entry that its retransmissions keep meeting).
        self.programmed: dict[ServicePortName, InstalledService] = {}
        self._unpublished: dict[ServicePortName, None] = {}  # touched, not yet in programmed
        self._pod_owners: dict[tuple[str, str], PodPort] = {}  # what is staged, by owner
        self._synced_once = False
        self.last_result = SyncResult()
        # The last state of each Service port the switch accepted, and the ports it refused
        # (with OVS's error), which keep that last good state until they change.
        self._good: dict[ServicePortName, ServiceState] = {}
        self.refused: dict[ServicePortName, str] = {}
        # Which port owns each nodePort, healthCheckNodePort and address:port: a port that
        # claims one an older Service holds is refused whole (never staged).
        self.claims = ClaimResolver()
        # ... and, published with the sync that applied them as ``programmed`` is: every claim
        # lost to an older Service (by refused port), and how many ports that refuses
        self.conflicts: tuple[PortConflict, ...] = ()
        self.conflicts_refused = 0
        self._claims_unpublished = False
        # Work that must follow the commit that makes it safe (kept across failed commits).
        self._flushes: dict[FlushFilter, None] = {}
        # The untranslated-entry filters of the frontends added since the last commit (a new
        # frontend is published only once its flushes have settled), and (when an adopting
        # commit found flows of ours: ``_watch``) each one's ServiceLB flow key: a frontend
        # whose flow the switch already held (an agent restart) needs no second flush
        # (nothing committed its entries untranslated), and no wait for one
        self._added_frontends: dict[FlushFilter, None] = {}
        self._frontend_keys: dict[FlushFilter, FlowKey] = {}
        # (IP protocol, frontend address, L4 port) of every frontend with usable endpoints,
        # kept when frontends reject (``forwards``)
        self._forwarding: set[tuple[int, IPAddress, int]] = set()
        self._forwarding_pending: list[tuple[bool, tuple[int, IPAddress, int]]] = []
        self._learned_deletes: dict[tuple[Any, ...], of.FlowMod] = {}
        self.post_commit_errors = 0
        # Trigger times of slice changes taken from the tracker, until a commit carries them
        # (a failed commit keeps them: its changes are retried, and land later).
        self._trigger_times: list[tuple[IPFamily, float]] = []

    # -- one Service port -------------------------------------------------------------------
    def _stage_service(self, state: ServiceState) -> None:
        port = state.port
        name = port.name
        families = frontend_families(port)
        if not families:  # nothing to program (e.g. a port with no ClusterIP)
            self._remove_service(name)
            return
        selections: dict[IPFamily, FamilySelection] = {}
        uses: list[tuple[IPFamily, GroupUse]] = []
        wanted: list[GroupKey] = []
        used_sets: list[tuple[Endpoint, ...]] = []  # the endpoints of every set, in order
        rejecting = False  # some frontends reject: no endpoint is usable
        node_port_ips = self.node_port_ips if self.ctx.standalone else ()
        for f in families:
            sel = selections[f] = select_endpoints(
                state,
                f,
                self.node_name,
                self.zone,
                node_ports=self.node_ports,
                short_circuit=self.ctx.standalone,
                node_port_ips=node_port_ips,
            )
            for use in group_uses(sel):
                uses.append((f, use))
                wanted.append((f, use.role))
            for used in (sel.endpoints, sel.external_endpoints, sel.in_cluster_endpoints):
                if used:
                    used_sets.append(used)
            rejecting = rejecting or sel.action == REJECT
            rejecting = rejecting or (sel.external_action == REJECT and sel.has_external)
        ids = self.groups.assign(name, wanted)
        reject = self._reject_action
        sets: list[svc.FrontendSet] = []
        group_ids: dict[IPFamily, int] = {}
        external_ids: dict[IPFamily, int] = {}
        for f, use in uses:
            gid = ids[f, use.role]
            if use.role == CLUSTER_IPS:
                group_ids[f] = gid
            elif use.role == EXTERNAL:
                external_ids[f] = gid
            in_cluster = use.in_cluster_role
            sets.append(
                svc.FrontendSet(
                    use.frontends,
                    gid,
                    use.endpoints,
                    reject if use.rejects else (),
                    use.node_port_frontends,
                    0 if in_cluster is None else ids[f, in_cluster],
                    use.in_cluster_endpoints,
                    reject if use.in_cluster_rejects else (),
                    use.group_only,
                )
            )
        objects = self._objects_for(port, sets)
        self.datapath.stage(name, objects.groups, objects.staged)
        previous = self.services.get(name)
        installed = InstalledService(
            state,
            _unique_endpoints(used_sets),
            group_ids,
            rejecting=rejecting,
            families=selections,
            external_group_ids=external_ids,
            affinity=affinity_realisation(
                port.affinity_timeout, self.ctx.max_ovs_timeout, self.sweep_interval
            ),
            conntrack_flushes=previous.conntrack_flushes if previous else 0,
        )
        self._after_change(name, previous, installed)
        self.services[name] = installed
        self._endpoint_total += len(installed.endpoints) - (
            len(previous.endpoints) if previous is not None else 0
        )

    def _objects_for(self, port: ServicePort, sets: list[svc.FrontendSet]) -> svc.ServiceObjects:
        """The groups and flows of one Service port (a seam for tests of refused ports)."""
        return svc.frontend_objects(self.ctx, port, sets)

    def _remove_service(self, name: ServicePortName) -> None:
        self.datapath.unstage(name)
        self.groups.release(name)
        previous = self.services.pop(name, None)
        if previous is not None:
            self._endpoint_total -= len(previous.endpoints)
            self._after_change(name, previous, None)

    def _update_forwarding(
        self,
        old: InstalledService | None,
        old_map: FrontendEndpoints,
        new: InstalledService | None,
        new_map: FrontendEndpoints,
    ) -> None:
        """Queue the change of the frontends with usable endpoints (``forwards``); applied
        after the commit, so that ``forwards`` says what the switch has."""
        pending = self._forwarding_pending
        if old is not None:
            proto = old.state.port.protocol.ip_proto
            pending += [(False, (proto, ip, p)) for ip, p in old_map]
        if new is not None:
            proto = new.state.port.protocol.ip_proto
            pending += [(True, (proto, ip, p)) for (ip, p), eps in new_map.items() if eps]

    def forwards(self, ip_proto: int, address: IPAddress, port: int) -> bool:
        """Whether traffic to that frontend goes to an endpoint now (installed state); the
        rejector asks it of a reject packet-in (``datapath.reject.Rejector.forwards``)."""
        return (ip_proto, address, port) in self._forwarding

    def _after_change(
        self, name: ServicePortName, old: InstalledService | None, new: InstalledService | None
    ) -> None:
        """Queue what must follow the commit: UDP conntrack flushes for (frontend, endpoint)
        pairs that went away, and deletes of learned affinity flows that no longer apply;
        update the frontends per TCP endpoint (the mid-stream flows, standalone).

        Each side's frontend -> endpoints map is built once here, for every use below."""
        old_map = old.frontend_endpoints() if old is not None else {}
        new_map = new.frontend_endpoints() if new is not None else {}
        # What the other side had of the same L4 protocol (a protocol change shares nothing)
        same_l4 = (
            old is not None
            and new is not None
            and old.state.port.protocol == new.state.port.protocol
        )
        if self.mid_stream is not None:
            self.mid_stream.update(name, _mid_stream_contribution(new, new_map))
        if new is not None:
            protocol = new.state.port.protocol
            before = old_map if same_l4 else {}
            if self.conntrack is not None and self.conntrack.pending:
                self.conntrack.restored(_udp_pairs_back(protocol, before, new_map))
            added = _frontends_new(protocol, before, new_map)
            if added:
                self._flushes.update(dict.fromkeys(added))
                self._added_frontends.update(dict.fromkeys(added))
        if self._reject_action:
            self._update_forwarding(old, old_map, new, new_map)
        if old is None:
            return
        old_port = old.state.port
        if old_port.protocol != Protocol.UDP and not old_port.session_affinity:
            return  # (most ports: nothing more to do)
        new_port = new.state.port if new is not None else None
        after = new_map if same_l4 else {}  # what the old frontends still have
        if old_port.protocol == Protocol.UDP:
            count = 0
            for (ip, l4_port), endpoints in old_map.items():
                if (ip, l4_port) not in after:
                    self._flushes[FlushFilter(old_port.protocol, ip, l4_port)] = None
                    count += 1
                    continue
                for ep_ip, ep_port in sorted(endpoints - after[ip, l4_port], key=str):
                    f = FlushFilter(old_port.protocol, ip, l4_port, ep_ip, ep_port)
                    self._flushes[f] = None
                    count += 1
            if new is not None:
                new.conntrack_flushes += count
        if old_port.session_affinity:
            keep = (
                new_port is not None
                and same_l4
                and new_port.affinity_timeout == old_port.affinity_timeout
            )
            for ip, l4_port in old_map:
                if not keep or (ip, l4_port) not in after:
                    key = (old_port.protocol, l4_port, ip)
                    self._learned_deletes[key] = svc.learned_flows_delete(
                        self.ctx, old_port, ip, l4_port
                    )

    async def _post_commit(self, commit: CommitStats) -> bool:
        """Work that follows a successful commit; True when a frontend it added waits for
        the second flush of its untranslated entries."""
        for add, key in self._forwarding_pending:
            if add:
                self._forwarding.add(key)
            else:
                self._forwarding.discard(key)
        self._forwarding_pending.clear()
        if self._learned_deletes and self._send is not None:
            deletes = list(self._learned_deletes.values())
            try:
                await self._send(deletes)
                self._learned_deletes.clear()
            except Exception as exc:
                self.post_commit_errors += 1
                log.warning("deleting %d learned flow set(s) failed: %s", len(deletes), exc)
        elif self._send is None:
            self._learned_deletes.clear()
        held = commit.held_before
        served = {f for f, key in self._frontend_keys.items() if key in held}
        # an older agent's frontends are flushed once: nothing of theirs to wait for
        unserved_added = any(f not in served for f in self._added_frontends)
        self._frontend_keys.clear()
        self._added_frontends.clear()
        if self._flushes:
            flushes = sorted(self._flushes, key=str)
            self._flushes.clear()
            if self.conntrack is not None:
                # (no second flush after a commit onto an empty switch, nor for a frontend
                # the switch already served: see conntrack)
                once = [f for f in flushes if f in served]
                if once:
                    await self.conntrack.flush(once, again=False)
                rest = [f for f in flushes if f not in served]
                if rest:
                    await self.conntrack.flush(rest, again=not commit.onto_empty_switch)
            else:
                log.debug("no conntrack flusher: %d UDP flush(es) skipped", len(flushes))
        return unserved_added

    def set_node_ips(
        self, node_ips: Sequence[IPAddress], node_port_ips: Sequence[IPAddress]
    ) -> None:
        """The node's IPs changed (the Node object's addresses): the next full sync rewrites
        the Classifier's node-IP flows (standalone) and every NodePort frontend on them."""
        self.node_port_ips = tuple(node_port_ips)
        if self.ctx.standalone:
            self.ctx = dataclasses.replace(self.ctx, node_ips=tuple(node_ips))

    # -- the pipeline and local pods --------------------------------------------------------
    def _stage_pipeline(self) -> None:
        self.datapath.stage(PIPELINE_OWNER, (), pipeline_flows(self.ctx))

    async def _stage_pods(self) -> None:
        if self._pods is None or not self.ctx.standalone:
            return
        pods = {("pod", pod.interface): pod for pod in await self._pods()}
        # Only pods that came, went or changed: building their flows on every Service sync
        # would make each sync cost the number of pods.
        for owner, pod in pods.items():
            if self._pod_owners.get(owner) != pod:
                self.datapath.stage(
                    owner, (), pod_forwarding_flows(self.ctx, pod.ips, pod.mac, pod.ofport)
                )
        for owner in self._pod_owners.keys() - pods.keys():
            self.datapath.unstage(owner)
        self._pod_owners = pods

    # -- sync -------------------------------------------------------------------------------
    async def sync(self, full: bool = False) -> SyncResult:
        started = time.perf_counter()
        if not self.tracker.synced:
            log.debug("sync skipped: sources have not delivered their initial lists")
            return SyncResult()
        changes = self.tracker.checkpoint()
        self._trigger_times += self.tracker.take_trigger_times()
        full = full or not self._synced_once
        touched: dict[ServicePortName, ServiceState | None] = {}
        if full:
            self._stage_pipeline()
            states = self.tracker.snapshot()
            self._log_claims(self.claims.reset(states))
            refusals = self.claims.refusals  # (of ports in states only, after the reset)
            served = states
            if refusals:
                served = {n: s for n, s in states.items() if n not in refusals}
            for name in [n for n in self.services if n not in served]:
                self._remove_service(name)
                touched[name] = None
            for name in [n for n in self.refused if n not in served]:
                touched[name] = None
            for name in refusals:
                touched[name] = None  # refused: a claim of theirs is an older Service's
            for name, state in served.items():
                self._stage_service(state)
                touched[name] = state
            changed = len(states)
        else:
            currents = {name: change.current for name, change in changes.items()}
            flipped = self.claims.update(
                (name, state.port if state else None) for name, state in currents.items()
            )
            self._log_claims(flipped)
            for name in flipped - currents.keys():
                # an older Service took a claim of this port, or gave one back
                currents[name] = self.tracker.state_of(name)
            for name in self.refused.keys() - currents.keys():
                # Refused by the switch: tried again at every sync (a refusal may pass: a full
                # table, a late commit), which the runner schedules with backoff while any
                # port is refused (``agent.sync.Syncer``).
                currents[name] = self.tracker.state_of(name)
            for name, current in currents.items():
                if current is None or self.claims.refused(name):
                    self._remove_service(name)
                    current = None
                else:
                    self._stage_service(current)
                touched[name] = current
            changed = len(changes)
        await self._stage_pods()
        self._unpublished.update(dict.fromkeys(touched))  # kept if this sync fails
        commit = await self._commit_isolating(touched)
        committed = time.time()
        latencies = tuple((family, committed - t) for family, t in self._trigger_times)
        self._trigger_times.clear()
        self._synced_once = True
        waits = await self._post_commit(commit)
        # A new frontend is not published (``programmed``, /status) until the switch has
        # revalidated its cached datapath flows and the second flush of the frontend's
        # untranslated entries is done: a connection begun in between can meet a datapath
        # flow cached before the commit, and the second flush then cuts it (bench soak: a
        # phase begun as soon as /status showed its Services lost requests in its first
        # 0.4 s; none with 2 s between). After a commit onto a switch without our flows,
        # or for frontends the switch already served, there is no second flush, so
        # nothing to wait for.
        if waits and self.conntrack is not None:
            await self.conntrack.settled()
        if self.followers:
            commit_view = Committed(
                touched, full, self.tracker.cluster_ips_version, self.tracker.cluster_ips
            )
            for follower in self.followers:
                await follower.after_commit(commit_view)
        self._publish()
        result = SyncResult(
            changed=changed,
            full=full,
            commit=commit,
            seconds=time.perf_counter() - started,
            programming_latencies=latencies,
        )
        self.last_result = result
        if commit.messages:
            log.info(
                "sync: %d Service port(s) changed, %d OpenFlow message(s) in %.3fs%s",
                changed,
                commit.messages,
                result.seconds,
                " (full)" if full else "",
            )
        return result

    def _log_claims(self, flipped: set[ServicePortName]) -> None:
        self._claims_unpublished = self._claims_unpublished or bool(flipped)
        for name in sorted(flipped):
            conflicts = self.claims.refusals.get(name)
            if conflicts is None:
                if self.tracker.state_of(name) is not None:
                    log.info("Service port %s: no longer in conflict, served", name)
                continue
            for conflict in conflicts:
                log.warning("%s", conflict)

    def _publish(self) -> None:
        """The touched ports' installed state becomes what they are programmed to."""
        if self._claims_unpublished:
            refusals = self.claims.refusals
            self.conflicts = tuple(c for name in sorted(refusals) for c in refusals[name])
            self.conflicts_refused = len(refusals)
            self._claims_unpublished = False
        for name in self._unpublished:
            installed = self.services.get(name)
            if installed is None:
                self.programmed.pop(name, None)
            else:
                self.programmed[name] = installed
        self._unpublished.clear()

    async def _commit_isolating(
        self, touched: dict[ServicePortName, ServiceState | None]
    ) -> CommitStats:
        """Commit; if the switch refuses the messages of some Service ports, set those aside
        (each keeps its last good state, or none) and commit the rest: one broken Service
        never holds back the others."""
        set_aside: set[ServicePortName] = set()
        for _ in range(MAX_ISOLATION_ROUNDS):
            if self.mid_stream is not None:
                self.mid_stream.stage(self.datapath, self.ctx)
            try:
                commit = await self.datapath.commit(watch=self._watch)
                break
            except DatapathError as exc:
                culprits = [
                    o for o in exc.owners if isinstance(o, ServicePortName) and o not in set_aside
                ]
                if not culprits:
                    raise
                for name in culprits:
                    self._set_aside(name, str(exc.__cause__ or exc))
                    set_aside.add(name)
        else:
            raise DatapathError(
                f"the switch kept refusing after setting aside {len(set_aside)} Service port(s)"
            )
        for name, state in touched.items():
            if name in set_aside:
                continue
            self.refused.pop(name, None)
            if state is None:
                self._good.pop(name, None)
            else:
                self._good[name] = state
        return commit

    def _watch(self) -> set[FlowKey]:
        """For an adopting commit onto a switch with flows of ours: the ServiceLB flow keys
        of the frontends added (computed then only, not at every cold start)."""
        keys = self._frontend_keys
        for f in self._added_frontends:
            keys[f] = svc.frontend_flow_key(self.ctx, f.frontend, f.port, f.protocol)
        return set(keys.values())

    def _set_aside(self, name: ServicePortName, reason: str) -> None:
        good = self._good.get(name)
        log.error(
            "Service port %s: Open vSwitch refused its flows or groups (%s); %s",
            name,
            reason,
            "keeping its last good state" if good else "not installing it",
        )
        self.refused[name] = reason
        if good is not None:
            self._stage_service(good)
        else:
            self._remove_service(name)

    # -- status -----------------------------------------------------------------------------
    def endpoint_count(self) -> int:
        """Endpoints programmed, summed over Service ports (O(1))."""
        return self._endpoint_total
