"""A group-id registry in memory: what the synchroniser saves and loads (the agent's is
``ovs.ovsdb.OVSDBGroupRegistry``, tested in ``tests/sandbox/test_ovsdb_registry.py``)."""

from __future__ import annotations


class MemoryRegistry:
    """Holds ``ids`` (None: nothing recorded yet) and keeps every save, in order."""

    def __init__(self, ids: set[int] | None = None) -> None:
        self.ids = ids
        self.saves: list[set[int]] = []

    async def load(self) -> set[int] | None:
        return None if self.ids is None else set(self.ids)

    async def save(self, group_ids: set[int]) -> None:
        self.saves.append(set(group_ids))
        self.ids = set(group_ids)
