"""The installed-state cache: desired groups and flows by owner, diffed and committed to OVS
as one ordered, atomic bundle.

Owners (a Service port, the fixed pipeline, a local pod) ``stage`` the complete set of groups and
flows they want; nothing is sent until ``commit``. ``commit`` looks only at what staged owners
touched (its cost follows the size of the change, not the number of Services), builds the
messages in a safe order — group adds/changes, then flow adds, then flow deletes, then group
deletes — and sends them as one bundle. The cache records the new state only when the bundle
committed; a failed commit leaves everything dirty, so the next commit retries the same diff.

Flows are identified as OpenFlow identifies them: (table, priority, match). A flow several owners
want (an EndpointDNAT flow shared by two Services) is installed while any of them wants it.

On (re)connection, :meth:`Datapath.resync_switch` adopts whatever the switch holds: every group id
it has in our range is rewritten (MODIFY) or deleted, every flow is re-added with the current
generation's cookie, and the flows of older generations are deleted, all in one bundle. This is
replay after an ovs-vswitchd restart and the hitless hand-over after an agent restart.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath.groups import GroupPlan, GroupSpec, InstalledGroup, delete_group, plan_group
from ovsproxy.openflow import protocol as of

log = logging.getLogger(__name__)

FlowKey = tuple[int, int, of.Match]  # table, priority, match


def flow_key(flow: of.FlowMod) -> FlowKey:
    return (flow.table_id, flow.priority, flow.match)


class Switch(Protocol):
    """What the datapath needs from an OpenFlow connection."""

    @property
    def connected(self) -> bool: ...

    async def commit_bundle(self, messages: Sequence[of.Message]) -> None:
        """Send the messages as one atomic, ordered bundle; raise on any error."""

    async def group_ids(self) -> set[int]:
        """Ids of every group the switch holds."""

    async def flow_cookies(self, cookie: int, mask: int) -> list[int]:
        """Cookies of the flows whose cookie matches cookie/mask."""


@dataclass
class CommitStats:
    messages: int = 0
    group_messages: int = 0
    flow_messages: int = 0
    groups_added: int = 0
    groups_modified: int = 0
    groups_incremental: int = 0
    groups_deleted: int = 0
    flows_added: int = 0
    flows_deleted: int = 0
    seconds: float = 0.0
    kinds: dict[str, int] = field(default_factory=dict)


@dataclass
class _Owner:
    groups: dict[int, GroupSpec] = field(default_factory=dict)
    flows: dict[FlowKey, of.FlowMod] = field(default_factory=dict)


class DatapathError(RuntimeError):
    pass


class Datapath:
    def __init__(self, switch: Switch, config: pl.PipelineConfig, generation: int) -> None:
        self.switch = switch
        self.config = config
        self.tables = pl.Tables.for_config(config)
        self.generation = generation
        self._owners: dict[Hashable, _Owner] = {}
        # desired state, merged over owners
        self._flow_refs: dict[FlowKey, dict[Hashable, of.FlowMod]] = {}
        self._group_owner: dict[int, Hashable] = {}
        # installed state (what the switch holds once the last commit succeeded)
        self.installed_flows: dict[FlowKey, of.FlowMod] = {}
        self.installed_groups: dict[int, InstalledGroup] = {}
        # groups the switch may hold with content we do not know (agent restart, uncertain
        # commit): rewritten whole, or deleted, before their id is trusted
        self._unknown_groups: set[int] = set()
        # old-generation cookies to delete with the next commit
        self._stale_generations: set[int] = set()
        self._dirty_flows: set[FlowKey] = set()
        self._dirty_groups: set[int] = set()
        self._lock = asyncio.Lock()
        # The first commit adopts what the switch holds (an older agent's state): it must carry
        # the complete desired state, so adoption waits for it instead of wiping the switch.
        self._adopt = True
        self.last_commit = CommitStats()
        self.commits = 0

    # -- staging ----------------------------------------------------------------------------
    def stage(
        self, owner: Hashable, groups: Iterable[GroupSpec], flows: Iterable[of.FlowMod]
    ) -> None:
        """Replace everything `owner` wants. Cost: the size of the owner's old + new sets."""
        new = _Owner({g.group_id: g for g in groups}, {flow_key(f): f for f in flows})
        old = self._owners.get(owner)
        for gid in new.groups:
            holder = self._group_owner.get(gid)
            if holder is not None and holder != owner:
                raise DatapathError(f"group {gid} is already owned by {holder}, not {owner}")
        if old is not None:
            for key, flow in old.flows.items():
                if new.flows.get(key) != flow:
                    self._unref_flow(key, owner)
            for gid, spec in old.groups.items():
                if new.groups.get(gid) != spec:
                    self._dirty_groups.add(gid)
                    if gid not in new.groups:
                        self._group_owner.pop(gid, None)
        for key, flow in new.flows.items():
            if old is None or old.flows.get(key) != flow:
                self._flow_refs.setdefault(key, {})[owner] = flow
                self._dirty_flows.add(key)
        for gid, spec in new.groups.items():
            self._group_owner[gid] = owner
            if old is None or old.groups.get(gid) != spec:
                self._dirty_groups.add(gid)
        if new.groups or new.flows:
            self._owners[owner] = new
        else:
            self._owners.pop(owner, None)

    def unstage(self, owner: Hashable) -> None:
        self.stage(owner, (), ())

    def _unref_flow(self, key: FlowKey, owner: Hashable) -> None:
        refs = self._flow_refs.get(key)
        if refs is not None:
            refs.pop(owner, None)
            if not refs:
                del self._flow_refs[key]
        self._dirty_flows.add(key)

    def owners(self) -> list[Hashable]:
        return list(self._owners)

    def desired_flow(self, key: FlowKey) -> of.FlowMod | None:
        refs = self._flow_refs.get(key)
        if not refs:
            return None
        # Owners that share a flow want the same one; if not, the newest wins (and we say so).
        flows = list(refs.values())
        if len(flows) > 1 and any(f != flows[0] for f in flows[1:]):
            log.warning("owners %s want different flows for %s", list(refs), key)
        return flows[-1]

    def desired_group(self, gid: int) -> GroupSpec | None:
        owner = self._group_owner.get(gid)
        if owner is None:
            return None
        return self._owners[owner].groups.get(gid)

    @property
    def pending(self) -> bool:
        return bool(self._dirty_flows or self._dirty_groups or self._stale_generations)

    # -- committing -------------------------------------------------------------------------
    def _plan(
        self,
    ) -> tuple[
        list[of.Message], dict[int, GroupPlan], dict[FlowKey, of.FlowMod | None], CommitStats
    ]:
        stats = CommitStats()
        group_msgs: list[of.Message] = []
        group_deletes: list[of.Message] = []
        plans: dict[int, GroupPlan] = {}
        for gid in sorted(self._dirty_groups):
            desired = self.desired_group(gid)
            installed = self.installed_groups.get(gid)
            unknown = gid in self._unknown_groups
            if desired is None:
                if installed is not None or unknown:
                    group_deletes.append(delete_group(gid))
                    stats.groups_deleted += 1
                plans[gid] = GroupPlan((), None, "delete")
                continue
            plan = plan_group(desired, installed, present_unknown=unknown)
            plans[gid] = plan
            group_msgs.extend(plan.messages)
            if plan.kind == "add":
                stats.groups_added += 1
            elif plan.kind == "modify":
                stats.groups_modified += 1
            elif plan.kind == "incremental":
                stats.groups_incremental += 1
        flow_adds: list[of.Message] = []
        flow_deletes: list[of.Message] = []
        flow_result: dict[FlowKey, of.FlowMod | None] = {}
        for key in self._dirty_flows:
            want = self.desired_flow(key)
            have = self.installed_flows.get(key)
            flow_result[key] = want
            if want == have:
                continue
            if want is None:
                assert have is not None
                flow_deletes.append(
                    of.FlowMod(
                        table_id=have.table_id,
                        priority=have.priority,
                        match=have.match,
                        command=of.FlowModCommand.DELETE_STRICT,
                        out_port=of.OFPP_ANY,
                        out_group=of.OFPG_ANY,
                    )
                )
                stats.flows_deleted += 1
            else:
                flow_adds.append(want)  # ADD replaces a flow with the same match and priority
                stats.flows_added += 1
        stale: list[of.Message] = [
            of.FlowMod(
                table_id=of.OFPTT_ALL,
                priority=0,
                match=of.Match(),
                command=of.FlowModCommand.DELETE,
                out_port=of.OFPP_ANY,
                out_group=of.OFPG_ANY,
                cookie=(pl.COOKIE_APP << pl.COOKIE_APP_SHIFT) | (gen << pl.COOKIE_GENERATION_SHIFT),
                cookie_mask=pl.COOKIE_APP_GENERATION_MASK,
            )
            for gen in sorted(self._stale_generations)
        ]
        stats.flows_deleted += len(stale)
        # Groups before the flows that use them; flows before the groups they used.
        messages = [*group_msgs, *flow_adds, *flow_deletes, *stale, *group_deletes]
        stats.group_messages = len(group_msgs) + len(group_deletes)
        stats.flow_messages = len(flow_adds) + len(flow_deletes) + len(stale)
        stats.messages = len(messages)
        for m in messages:
            kind = type(m).__name__
            if isinstance(m, of.GroupMod):
                kind = f"group_{of.GroupModCommand(m.command).name.lower()}"
            elif isinstance(m, of.FlowMod):
                kind = f"flow_{of.FlowModCommand(m.command).name.lower()}"
            stats.kinds[kind] = stats.kinds.get(kind, 0) + 1
        return messages, plans, flow_result, stats

    async def commit(self) -> CommitStats:
        """Send what changed since the last successful commit as one bundle (nothing at all
        when nothing changed). Raises on failure; the same diff is retried by the next call."""
        async with self._lock:
            if self._adopt:
                return await self._resync_locked()
            return await self._commit_locked()

    async def on_connected(self) -> None:
        """The channel's (re)connection hook: replay before any new change is sent."""
        async with self._lock:
            if not self._adopt:  # we have installed state: the switch may have lost it
                await self._resync_locked()

    async def _commit_locked(self) -> CommitStats:
        started = time.perf_counter()
        messages, plans, flow_result, stats = self._plan()
        if messages:
            try:
                await self.switch.commit_bundle(messages)
            except asyncio.CancelledError:
                self._mark_uncertain(plans)
                raise
            except Exception as exc:
                # A timeout may hide a commit that succeeded: groups this bundle added are of
                # unknown content now, and are rewritten (not re-added) next time.
                self._mark_uncertain(plans)
                raise DatapathError(f"bundle of {len(messages)} messages failed: {exc}") from exc
        for gid, plan in plans.items():
            if plan.result is None:
                self.installed_groups.pop(gid, None)
            else:
                self.installed_groups[gid] = plan.result
            self._unknown_groups.discard(gid)
        for key, flow in flow_result.items():
            if flow is None:
                self.installed_flows.pop(key, None)
            else:
                self.installed_flows[key] = flow
        self._dirty_flows.clear()
        self._dirty_groups.clear()
        self._stale_generations.clear()
        stats.seconds = time.perf_counter() - started
        self.last_commit = stats
        self.commits += 1
        return stats

    def _mark_uncertain(self, plans: dict[int, GroupPlan]) -> None:
        for gid, plan in plans.items():
            if plan.kind in ("add", "modify", "incremental"):
                self._unknown_groups.add(gid)
                self.installed_groups.pop(gid, None)

    # -- the switch's own state -------------------------------------------------------------
    def _ours(self, gid: int) -> bool:
        return self.config.group_id_min <= gid <= self.config.group_id_max

    async def resync_switch(self) -> CommitStats:
        """Make the switch hold exactly our desired state, whatever it holds now. Called on
        every (re)connection before any other change is sent."""
        async with self._lock:
            return await self._resync_locked()

    async def _resync_locked(self) -> CommitStats:
        present = {gid for gid in await self.switch.group_ids() if self._ours(gid)}
        cookies = await self.switch.flow_cookies(
            pl.COOKIE_APP << pl.COOKIE_APP_SHIFT, pl.COOKIE_APP_MASK
        )
        generations = {pl.cookie_generation(c) for c in cookies}
        self._stale_generations = {
            g
            for g in generations
            if g is not None and g not in (self.generation, pl.LEARNED_GENERATION)
        }
        # Forget what we thought was installed: rewrite everything we want.
        self.installed_flows.clear()
        self.installed_groups.clear()
        self._unknown_groups = set(present)
        self._dirty_groups = set(present) | set(self._group_owner)
        self._dirty_flows = set(self._flow_refs)
        stats = await self._commit_locked()
        self._adopt = False
        return stats

    # -- introspection ----------------------------------------------------------------------
    def dump(self) -> list[str]:
        """Installed groups and flows in ovs-ofctl syntax."""
        lines = []
        for gid in sorted(self.installed_groups):
            group = self.installed_groups[gid]
            # Text is built per bucket: a large group is no single OpenFlow message.
            text = f"group_id={gid},type=select"
            if group.selection_method:
                text += f",selection_method={group.selection_method}"
            for key, spec in sorted(group.buckets.items(), key=lambda kv: group.ids[kv[0]]):
                bucket = of.Bucket(group.ids[key], spec.actions, spec.weight)
                text += "," + bucket.to_text(of.GroupType.SELECT)
            lines.append(text)
        flows = sorted(
            self.installed_flows.values(),
            key=lambda f: (f.table_id, -f.priority, of.format_flow(f)),
        )
        lines.extend(of.format_flow(f) for f in flows)
        return lines
