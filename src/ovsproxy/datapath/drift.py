"""The drift check: does the switch still hold what the synchroniser last committed?

For the agent's periodic full resync (which repairs a drift by adopting the switch again):
the flows of this generation are counted against the committed ones, and our groups are read
where the switch offers it (``group_stats``/``dump_groups``, the OpenFlow channel does): ids
and bucket counts from group statistics, and each bucket (id, weight, actions) from the group
descriptions when no group is too large for OpenFlow to describe (GROUP_DESC over 64 KB);
above the size statistics can carry, groups are not read. The comparisons are pure
(``group_counts_differ``, ``group_differs``); ``DriftCheck`` reads the switch for them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath.groups import InstalledGroup, SelectionMethod
from ovsproxy.datapath.our_group_ids import DESCRIBE_SAFE_BUCKETS, STATS_SAFE_BUCKETS
from ovsproxy.datapath.plan import InstalledState
from ovsproxy.openflow import protocol as of


class FlowCookies(Protocol):
    """What the drift check needs of every switch (``switch_sync.Switch`` has it)."""

    async def flow_cookies(self, cookie: int, mask: int) -> list[int]:
        """Cookies of the flows whose cookie matches cookie/mask."""


def group_counts_differ(counts: Mapping[int, int], installed: Mapping[int, InstalledGroup]) -> bool:
    """``counts`` (bucket counts by group id, of our groups on the switch) against the
    installed groups: another set of ids, or another number of buckets in one."""
    return counts.keys() != installed.keys() or any(
        counts[gid] != group.endpoint_count for gid, group in installed.items()
    )


def group_differs(described: of.GroupMod, have: InstalledGroup) -> bool:
    """One group as the switch describes it against the installed one: another selection
    method, or another set of buckets (id, weight, actions)."""
    method = (
        SelectionMethod(described.selection_method, tuple(f.name for f in described.fields))
        if described.selection_method
        else None
    )
    if method != have.selection_method:
        return True
    ids = have.ids
    want = {(ids[k], spec.weight, spec.actions) for k, spec in have.buckets.items()}
    return {(b.bucket_id, b.weight, b.actions) for b in described.buckets} != want


class DriftCheck:
    """Checks ``switch`` against ``installed`` (the synchroniser's record of its last
    commits, read at each check) for the flows of ``generation`` and our groups (``ours``)."""

    __slots__ = ("_cookie", "_installed", "_ours", "_switch")

    def __init__(
        self,
        switch: FlowCookies,
        installed: InstalledState,
        generation: int,
        ours: Callable[[int], bool],
    ) -> None:
        self._switch = switch
        self._installed = installed
        self._cookie = (pl.COOKIE_APP << pl.COOKIE_APP_SHIFT) | (
            generation << pl.COOKIE_GENERATION_SHIFT
        )
        self._ours = ours

    async def drifted(self) -> bool:
        """Does the switch still hold as many flows of this generation as were committed, and
        our groups with their buckets? False where the switch cannot be read for it."""
        cookies = await self._switch.flow_cookies(self._cookie, pl.COOKIE_APP_GENERATION_MASK)
        if len(cookies) != len(self._installed.flows):
            return True
        return await self._groups_drifted()

    async def _groups_drifted(self) -> bool:
        group_stats = getattr(self._switch, "group_stats", None)
        dump_groups = getattr(self._switch, "dump_groups", None)
        installed = self._installed.groups
        if group_stats is None or dump_groups is None or self._installed.unknown_groups:
            return False
        largest = max((g.endpoint_count for g in installed.values()), default=0)
        if largest > STATS_SAFE_BUCKETS:
            return False  # the statistics reply itself would overflow
        counts = {s.group_id: s.n_buckets for s in await group_stats() if self._ours(s.group_id)}
        if group_counts_differ(counts, installed):
            return True
        if largest > DESCRIBE_SAFE_BUCKETS:
            return False
        for group in await dump_groups(max_buckets=DESCRIBE_SAFE_BUCKETS):
            have = installed.get(group.group_id)
            if have is not None and group_differs(group, have):
                return True
        return False
