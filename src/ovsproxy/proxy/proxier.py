"""The proxier: decides *what* to install for each Service port and hands it to the datapath.

A sync consumes the tracker's changes (only the Service ports that changed), categorises each
port's endpoints as kube-proxy does, allocates stable group ids, stages the port's groups and
flows, and commits them in one bundle. If the commit fails, the datapath keeps the diff and the
runner retries; nothing is recorded as installed until the switch has it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath import services as svc
from ovsproxy.datapath.datapath import CommitStats, Datapath
from ovsproxy.model import Endpoint, IPAddress, IPFamily, ServicePortName, ServiceState
from ovsproxy.openflow import protocol as of
from ovsproxy.ovs.ovsdb import PodPort
from ovsproxy.proxy.categorize import categorize_endpoints
from ovsproxy.proxy.tracker import ChangeTracker

log = logging.getLogger(__name__)

PIPELINE_OWNER = ("pipeline",)


class GroupIDAllocator:
    """Stable group ids per (Service port, family); freed ids are reused lowest first."""

    def __init__(self, first: int, last: int) -> None:
        self.first, self.last = first, last
        self._ids: dict[tuple[ServicePortName, IPFamily], int] = {}
        self._free: list[int] = []
        self._next = first

    def get(self, name: ServicePortName, family: IPFamily) -> int:
        key = (name, family)
        gid = self._ids.get(key)
        if gid is None:
            if self._free:
                self._free.sort(reverse=True)
                gid = self._free.pop()
            else:
                if self._next > self.last:
                    raise RuntimeError(f"group ids {self.first}..{self.last} are used up")
                gid = self._next
                self._next += 1
            self._ids[key] = gid
        return gid

    def release(self, name: ServicePortName, family: IPFamily | None = None) -> None:
        for each in [family] if family is not None else list(IPFamily):
            gid = self._ids.pop((name, each), None)
            if gid is not None:
                self._free.append(gid)

    def ids_of(self, name: ServicePortName) -> dict[IPFamily, int]:
        return {f: gid for f in IPFamily if (gid := self._ids.get((name, f))) is not None}


@dataclass
class InstalledService:
    """What `ovsproxy status` shows for a Service port."""

    state: ServiceState
    endpoints: tuple[Endpoint, ...]  # the ones in the groups (after categorisation)
    group_ids: dict[IPFamily, int]
    rejecting: bool  # frontends answer with a reject because no endpoint is usable


@dataclass
class SyncResult:
    changed: int = 0
    full: bool = False
    commit: CommitStats = field(default_factory=CommitStats)
    seconds: float = 0.0


class Proxier:
    def __init__(
        self,
        tracker: ChangeTracker,
        datapath: Datapath,
        *,
        node_name: str,
        zone: str | None = None,
        pods: Callable[[], Awaitable[list[PodPort]]] | None = None,
        on_cluster_ips: Callable[[frozenset[IPAddress]], Awaitable[None]] | None = None,
        reject_action: tuple[of.Action, ...] = (),
    ) -> None:
        self.tracker = tracker
        self.datapath = datapath
        self.node_name = node_name
        self.zone = zone
        self._pods = pods
        self._on_cluster_ips = on_cluster_ips
        self._reject_action = reject_action
        config = datapath.config
        self.ctx = svc.Context(
            tables=datapath.tables,
            generation=datapath.generation,
            standalone=config.mode == pl.Mode.STANDALONE,
        )
        self.groups = GroupIDAllocator(config.group_id_min, config.group_id_max)
        self.services: dict[ServicePortName, InstalledService] = {}
        self._pod_owners: set[tuple[str, str]] = set()
        self._synced_once = False
        self.last_result = SyncResult()

    # -- one Service port -------------------------------------------------------------------
    def _endpoints_for(self, state: ServiceState) -> tuple[tuple[Endpoint, ...], bool]:
        """The endpoints this node sends ClusterIP traffic to; and whether to reject (no
        usable endpoint at all) rather than drop (usable ones exist, none for this node)."""
        port = state.port
        chosen: list[Endpoint] = []
        reject = True
        for family in IPFamily:
            if not port.cluster_ips_of(family) and not svc.service_frontend_ips(port, family):
                continue
            cats = categorize_endpoints(
                state.endpoints, port, self.node_name, self.zone, family=family
            )
            use = cats.local if port.internal_traffic_policy == "Local" else cats.cluster
            if use is None:
                use = cats.all_reachable
            chosen.extend(use)
            if cats.has_any:
                reject = False
        return tuple(chosen), reject

    def _stage_service(self, state: ServiceState) -> None:
        port = state.port
        families = [f for f in IPFamily if svc.service_frontend_ips(port, f)]
        if not families:  # nothing to program (e.g. a port with no ClusterIP)
            self._remove_service(port.name)
            return
        endpoints, reject = self._endpoints_for(state)
        group_ids = {f: self.groups.get(port.name, f) for f in families}
        for family in IPFamily:  # a family the Service no longer has: its group goes
            if family not in families:
                self.groups.release(port.name, family)
        reject_action = self._reject_action if reject else ()
        objects = svc.service_objects(self.ctx, port, endpoints, group_ids, reject_action)
        self.datapath.stage(port.name, objects.groups, objects.flows)
        self.services[port.name] = InstalledService(
            state, endpoints, group_ids, rejecting=reject and not endpoints
        )

    def _remove_service(self, name: ServicePortName) -> None:
        self.datapath.unstage(name)
        self.groups.release(name)
        self.services.pop(name, None)

    # -- the pipeline and local pods --------------------------------------------------------
    def _stage_pipeline(self) -> None:
        self.datapath.stage(PIPELINE_OWNER, (), svc.pipeline_flows(self.ctx))

    async def _stage_pods(self) -> None:
        if self._pods is None or not self.ctx.standalone:
            return
        pods = await self._pods()
        seen = set()
        for pod in pods:
            owner = ("pod", pod.interface)
            seen.add(owner)
            self.datapath.stage(
                owner, (), svc.pod_forwarding_flows(self.ctx, pod.ips, pod.mac, pod.ofport)
            )
        for owner in self._pod_owners - seen:
            self.datapath.unstage(owner)
        self._pod_owners = seen

    # -- sync -------------------------------------------------------------------------------
    async def sync(self, full: bool = False) -> SyncResult:
        started = time.perf_counter()
        if not self.tracker.synced:
            log.debug("sync skipped: sources have not delivered their initial lists")
            return SyncResult()
        changes = self.tracker.checkpoint()
        full = full or not self._synced_once
        if full:
            self._stage_pipeline()
            states = self.tracker.snapshot()
            for name in [n for n in self.services if n not in states]:
                self._remove_service(name)
            for state in states.values():
                self._stage_service(state)
            changed = len(states)
        else:
            for name, change in changes.items():
                if change.current is None:
                    self._remove_service(name)
                else:
                    self._stage_service(change.current)
            changed = len(changes)
        await self._stage_pods()
        commit = await self.datapath.commit()
        self._synced_once = True
        if self._on_cluster_ips is not None:
            await self._on_cluster_ips(self.tracker.cluster_ips())
        result = SyncResult(
            changed=changed, full=full, commit=commit, seconds=time.perf_counter() - started
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

    # -- status -----------------------------------------------------------------------------
    def endpoint_count(self) -> int:
        return sum(len(s.endpoints) for s in self.services.values())

    def cluster_ips(self) -> Iterable[IPAddress]:
        return self.tracker.cluster_ips()
