"""Which group ids are ours, and the record of them kept across restarts.

Ours: the ids in the pipeline's ``[group_id_min, group_id_max]``. Recorded: the ids of the
groups we installed, saved in a ``GroupRegistry`` (OVSDB, for the agent) after every commit
that changed them, and read back when the switch is adopted or cleaned up. Needed because
OpenFlow cannot list groups reliably: Open vSwitch 3.1 overflows the 16-bit entry length of
GROUP_DESC (over ~1,000 buckets) and GROUP_STATS (over ~4,000).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath.desired import DesiredState
from ovsproxy.datapath.plan import InstalledState

# the synchroniser's logger (as in desired.py): these warnings are about its adoption
log = logging.getLogger("ovsproxy.datapath.switch_sync")

# A GROUP_STATS entry is 40 + 16 bytes per bucket, with a 16-bit length.
STATS_SAFE_BUCKETS = (0xFFFF - 40) // 16
# A GROUP_DESC entry has a 16-bit length too: 16 bytes, the selection method (144 bytes with
# our hash fields), then the buckets, the largest of ours an IPv6 DNAT bucket (96 bytes: ct in
# the bucket; tests/datapath/test_groups.py checks it against every bucket shape).
DESCRIBE_SAFE_BUCKETS = (0xFFFF - 16 - 144) // 96


class GroupRegistry(Protocol):
    """Where the ids of the groups we installed are kept across restarts (the agent keeps them
    in OVSDB)."""

    async def load(self) -> set[int] | None: ...

    async def save(self, group_ids: set[int]) -> None: ...


class OurGroupIds:
    """Our group-id range, and the ids recorded in ``registry`` (None: none kept; the switch's
    own listing is used instead)."""

    __slots__ = ("_saved", "first", "last", "registry")

    def __init__(self, config: pl.PipelineConfig, registry: GroupRegistry | None) -> None:
        self.first, self.last = config.group_id_min, config.group_id_max
        self.registry = registry
        self._saved: set[int] | None = None  # what the registry was last given

    def ours(self, gid: int) -> bool:
        return self.first <= gid <= self.last

    async def recorded(self) -> set[int] | None:
        """The registry's ids (None: no registry, or nothing recorded)."""
        return await self.registry.load() if self.registry is not None else None

    async def record(self, installed: InstalledState) -> None:
        """After a commit: save the installed groups' ids, if they may have changed and differ
        from what was saved last."""
        if self.registry is None or not installed.group_ids_changed:
            return
        ids = set(installed.groups)
        if ids != self._saved:
            await self.registry.save(ids)
            self._saved = ids
        installed.group_ids_changed = False

    async def forget(self, recorded: set[int] | None) -> None:
        """Everything of ours was removed from the switch: record no ids (``recorded``: what
        the registry held before; an empty record is not written again)."""
        if self.registry is not None and recorded:
            await self.registry.save(set())
        self._saved = set()

    async def in_switch(
        self,
        installed: InstalledState,
        desired: DesiredState,
        list_switch: Callable[[], Awaitable[set[int]]],
    ) -> set[int]:
        """Group ids the switch may hold that are ours (a superset is fine: deleting a missing
        group is harmless, and every group we want is written with ADD_OR_MOD): the recorded
        ones if the registry has a record, else those the switch lists (``list_switch``)
        unless a desired group is too large for OpenFlow to list; with the installed ones."""
        believed = set(installed.groups) | installed.unknown_groups
        saved = await self.recorded()
        if saved is not None:
            return {gid for gid in saved | believed if self.ours(gid)}
        largest = desired.largest_group()
        if largest > STATS_SAFE_BUCKETS:
            log.warning(
                "not listing the switch's groups: a group of %d buckets would overflow "
                "OpenFlow's group statistics; older groups of ours may stay behind",
                largest,
            )
            return {gid for gid in believed if self.ours(gid)}
        listed = await list_switch()
        return {gid for gid in listed | believed if self.ours(gid)}
