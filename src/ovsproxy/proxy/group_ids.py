"""Select-group ids per Service port, assigned declaratively (pure).

Each Service port has a group per (IP family, role) it needs. ``GroupIDs.assign`` is given the
whole set a port wants: an id it already has for a wanted key is kept (a live group keeps its
id while the port's endpoints change), the ids of keys it no longer wants are released, and
the wanted keys without one get ids in key order, the lowest free id first. No caller has to
ask and release in any particular order for the ids to come out the same.

A fresh allocator assigning the same ports in the same order hands out the same ids, so an
agent restarted on an unchanged cluster numbers its groups as the one before it did (the
adopting commit then only rewrites them; see ``switch_sync.SwitchSync.resync_switch``).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from ovsproxy.model import IPFamily, ServicePortName

# The roles of a family's groups, in allocation order: "" the ClusterIPs' (internal traffic
# policy); IN_CLUSTER the cluster endpoints of kube-proxy's short-circuit, when no other
# group has them; EXTERNAL the external/load-balancer IPs' and the NodePort's, when their
# endpoints differ from the ClusterIPs'.
CLUSTER_IPS = ""
IN_CLUSTER = "in-cluster"
EXTERNAL = "external"
ROLES = (CLUSTER_IPS, IN_CLUSTER, EXTERNAL)

GroupKey = tuple[IPFamily, str]  # (family, role), per Service port


class GroupIDs:
    """Stable group ids in ``first..last`` per Service port and ``GroupKey``."""

    __slots__ = ("_free", "_next", "_ports", "first", "last")

    def __init__(self, first: int, last: int) -> None:
        self.first, self.last = first, last
        # Each port's ids, keys in the order they were wanted.
        self._ports: dict[ServicePortName, dict[GroupKey, int]] = {}
        self._free: list[int] = []  # a heap: freed ids, reused lowest first
        self._next = first

    def assign(self, name: ServicePortName, wanted: Sequence[GroupKey]) -> dict[GroupKey, int]:
        """The ids of ``name``'s groups, exactly the ``wanted`` keys (listed in key order)."""
        current = self._ports.get(name)
        if current is not None and len(current) == len(wanted):
            # (the common case, a port keeping its groups: one comparison per key)
            for key in wanted:
                if key not in current:
                    break
            else:
                return current
        if not wanted:
            self.release(name)
            return {}
        if current is None:
            current = {}
        unwanted = [gid for key, gid in current.items() if key not in wanted] if current else []
        missing = len(wanted) - (len(current) - len(unwanted))  # (wanted has no duplicates)
        spare = len(self._free) + len(unwanted)
        if missing > spare and missing - spare > self.last - self._next + 1:
            # (checked first: a refused port keeps the ids it had)
            raise RuntimeError(f"group ids {self.first}..{self.last} are used up")
        for gid in unwanted:
            heapq.heappush(self._free, gid)
        ids: dict[GroupKey, int] = {}
        for key in wanted:
            had = current.get(key)
            ids[key] = self._allocate() if had is None else had
        self._ports[name] = ids
        return ids

    def release(self, name: ServicePortName) -> None:
        """Every id of ``name`` becomes free."""
        for gid in self._ports.pop(name, {}).values():
            heapq.heappush(self._free, gid)

    def ids_of(self, name: ServicePortName, role: str = CLUSTER_IPS) -> dict[IPFamily, int]:
        """``name``'s group per family in one role."""
        ids = self._ports.get(name, {})
        return {key[0]: gid for key, gid in ids.items() if key[1] == role}

    def assigned(self) -> dict[ServicePortName, dict[GroupKey, int]]:
        """Every port's ids (a copy)."""
        return {name: dict(ids) for name, ids in self._ports.items()}

    def _allocate(self) -> int:
        if self._free:
            return heapq.heappop(self._free)
        gid = self._next
        self._next += 1
        return gid
