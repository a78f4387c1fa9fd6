"""Live traffic per Service port and per endpoint, read from the switch's group statistics.

Only a connection's first packet crosses a Service port's select group (the ones after it
follow its conntrack entry), so a bucket's packet count is the new connections sent to that
bucket's endpoint, and a group's packet count the Service port's new connections through that
group. ``CounterPoller.poll`` reads every group's statistics in one GROUP_STATS dump (on a
bounded schedule, ``run``, and on demand) and folds them into totals that only grow:

* each (group, endpoint) adds what its bucket counted since the last poll; a bucket whose
  count went down (a new bucket for a returning endpoint, the group rewritten, ovs-vswitchd
  restarted and our groups replayed) adds its new count, and what it counted between the last
  poll and the reset is lost: ``exact`` turns False and stays so (the figure says so);
* a Service port gone from the proxier is dropped from the totals (its series end).

Buckets are listed in the switch's order, without ids. A group written whole has its buckets
in id order, 0..n-1 (``InstalledGroup.specs``); a group changed bucket by bucket is described
once (GROUP_DESC of that group) to learn its order, kept until the group changes again.

``series`` caps what is exported at ``max_series`` per metric: the ports (endpoints) with the
most new connections, the rest summed into one series labelled ``(other)``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from ovsproxy.datapath.groups import InstalledGroup
from ovsproxy.datapath.service_flows import endpoint_key
from ovsproxy.model import ServicePortName
from ovsproxy.openflow import protocol as of
from ovsproxy.proxy.proxier import InstalledService

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 15.0
DEFAULT_MAX_SERIES = 1000
OTHER = "(other)"

# (namespace, service, port, protocol)
PortLabels = tuple[str, str, str, str]
# (namespace, service, port, protocol, endpoint, node)
EndpointLabels = tuple[str, str, str, str, str, str]
Labels = TypeVar("Labels", bound=tuple[str, ...])


def port_labels(name: ServicePortName, installed: InstalledService) -> PortLabels:
    return (name.namespace, name.name, name.port, str(installed.state.port.protocol))


def group_ids_of(installed: InstalledService) -> list[int]:
    """Every select group of a Service port (ClusterIPs', external, per family)."""
    return sorted({*installed.group_ids.values(), *installed.external_group_ids.values()})


def bucket_keys(
    group: InstalledGroup, described: of.GroupMod | None, *, force: bool = False
) -> tuple[Hashable, ...]:
    """The endpoint keys of a group's buckets in the switch's order: from the specs of a group
    written whole (unless ``force``), else from its description's bucket ids (``described``;
    a bucket id we did not install has the key None)."""
    specs = group.specs
    if specs is not None and not force:
        return tuple(spec.key for spec in specs)
    if described is None:
        return ()
    by_id = {bucket_id: key for key, bucket_id in group.ids.items()}
    return tuple(by_id.get(bucket.bucket_id) for bucket in described.buckets)


@dataclass(frozen=True, slots=True)
class Reading:
    """One poll's view: new connections per Service port and per endpoint, as totals."""

    ports: dict[PortLabels, int]
    endpoints: dict[EndpointLabels, int]
    exact: bool
    at: float  # Unix time of the poll


@dataclass
class Totals:
    """Monotonic totals folded from successive GROUP_STATS dumps (see the module docstring)."""

    # (group id, endpoint key) -> (last bucket count seen, total)
    buckets: dict[tuple[int, Hashable], tuple[int, int]] = field(default_factory=dict)
    exact: bool = True
    resets: int = 0  # buckets seen counting down

    def fold(self, group_id: int, keys: Iterable[Hashable], counts: Iterable[int]) -> None:
        for key, count in zip(keys, counts, strict=True):
            last, total = self.buckets.get((group_id, key), (0, 0))
            if count < last:  # a new bucket, or the switch lost its counters
                self.resets += 1
                self.exact = False
                total += count
            else:
                total += count - last
            self.buckets[group_id, key] = (count, total)

    def total(self, group_id: int, key: Hashable) -> int:
        return self.buckets.get((group_id, key), (0, 0))[1]

    def keep(self, group_ids: set[int]) -> None:
        """Forget the groups no Service port has any more."""
        for entry in [e for e in self.buckets if e[0] not in group_ids]:
            del self.buckets[entry]


def reading(
    services: Mapping[ServicePortName, InstalledService], totals: Totals, at: float
) -> Reading:
    """Per Service port and per endpoint, the new connections the totals hold."""
    ports: dict[PortLabels, int] = {}
    endpoints: dict[EndpointLabels, int] = {}
    for name, installed in services.items():
        labels = port_labels(name, installed)
        groups = group_ids_of(installed)
        nodes = {
            endpoint_key(ep.ip, ep.port): (f"{ep.ip}:{ep.port}", ep.node_name or "")
            for ep in installed.state.endpoints
        }
        in_groups = {endpoint_key(ep.ip, ep.port) for ep in installed.endpoints}
        port_total = 0
        for key, (address, node) in nodes.items():
            count = sum(totals.total(g, key) for g in groups)
            port_total += count
            if count or key in in_groups:
                endpoints[(*labels, address, node)] = count
        ports[labels] = port_total
    return Reading(ports, endpoints, totals.exact, at)


def capped(series: Mapping[Labels, int], max_series: int) -> dict[Labels, int]:
    """At most ``max_series`` series: the largest ``max_series - 1``, and the rest summed into
    one whose labels are all ``(other)``."""
    if len(series) <= max_series:
        return dict(series)
    ranked = sorted(series.items(), key=lambda kv: (-kv[1], kv[0]))
    kept = dict(ranked[: max_series - 1])
    other = cast(Labels, (OTHER,) * len(ranked[0][0]))
    kept[other] = sum(v for _, v in ranked[max_series - 1 :])
    return kept


def skew(reading: Reading, weights: Mapping[EndpointLabels, float]) -> dict[PortLabels, float]:
    """Per Service port: the largest difference between an endpoint's share of the port's new
    connections and its share of the weights (0: as weighted; 1: all to one that should get
    none). ``weights`` are the endpoints' bucket weights (equal weights when absent)."""
    by_port: dict[PortLabels, list[tuple[EndpointLabels, int]]] = {}
    for labels, count in reading.endpoints.items():
        by_port.setdefault(labels[:4], []).append((labels, count))
    out: dict[PortLabels, float] = {}
    for port, members in by_port.items():
        total = sum(count for _, count in members)
        weight_sum = sum(weights.get(labels, 1.0) for labels, _ in members)
        if not total or not weight_sum:
            continue
        out[port] = max(
            abs(count / total - weights.get(labels, 1.0) / weight_sum) for labels, count in members
        )
    return out


class CounterPoller:
    """Polls the switch's group statistics for ``services`` (the proxier's installed ports)
    and ``groups`` (the datapath's installed groups); ``last`` is the newest ``Reading``.

    ``channel`` needs ``group_stats()`` and ``dump_groups(group_id)`` (``openflow.Channel``)."""

    def __init__(
        self,
        channel: Any,
        services: Callable[[], Mapping[ServicePortName, InstalledService]],
        groups: Callable[[], Mapping[int, InstalledGroup]],
        *,
        interval: float = DEFAULT_INTERVAL,
        max_series: int = DEFAULT_MAX_SERIES,
    ) -> None:
        self.channel = channel
        self.services = services
        self.groups = groups
        self.interval = interval
        self.max_series = max_series
        self.totals = Totals()
        self.last: Reading | None = None
        self.polls = 0
        self.failures = 0
        self.last_seconds = 0.0
        # group id -> (its bucket ids when described, its keys in the switch's order)
        self._orders: dict[int, tuple[tuple[tuple[Hashable, int], ...], tuple[Hashable, ...]]] = {}
        self._lock = asyncio.Lock()

    async def poll(self) -> Reading:
        """Read every group's statistics now and fold them in (one poll at a time)."""
        async with self._lock:
            started = time.perf_counter()
            stats = {s.group_id: s for s in await self.channel.group_stats()}
            services = self.services()
            installed = self.groups()
            wanted = {g for inst in services.values() for g in group_ids_of(inst)}
            for group_id in sorted(wanted):
                group, stat = installed.get(group_id), stats.get(group_id)
                if group is None or stat is None:
                    continue
                keys = await self._keys(group)
                if len(keys) != stat.n_buckets:
                    # The switch's group is not what we installed (changed by hand, or
                    # between the dump and now): its description says which bucket is which.
                    keys = await self._described(group)
                if len(keys) != stat.n_buckets:
                    continue  # changed again meanwhile: the next poll counts it
                self.totals.fold(group_id, keys, (p for p, _ in stat.bucket_stats))
            self.totals.keep(wanted)
            for group_id in [g for g in self._orders if g not in wanted]:
                del self._orders[group_id]
            self.last = reading(services, self.totals, time.time())
            self.polls += 1
            self.last_seconds = time.perf_counter() - started
            return self.last

    async def _keys(self, group: InstalledGroup) -> tuple[Hashable, ...]:
        if group.specs is not None:
            return bucket_keys(group, None)
        ids = tuple(sorted(group.ids.items(), key=lambda kv: kv[1]))
        cached = self._orders.get(group.group_id)
        if cached is not None and cached[0] == ids:
            return cached[1]
        keys = await self._described(group)
        self._orders[group.group_id] = (ids, keys)
        return keys

    async def _described(self, group: InstalledGroup) -> tuple[Hashable, ...]:
        described = await self.channel.dump_groups(group.group_id)
        return bucket_keys(group, described[0] if described else None, force=True)

    async def run(self) -> None:
        """Poll every ``interval`` seconds until cancelled; a failed poll is logged and
        counted, the next one tries again."""
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.poll()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.failures += 1
                log.warning("counters: reading the group statistics failed: %s", exc)

    # -- what /metrics shows --------------------------------------------------------------
    def port_series(self) -> dict[tuple[str, ...], float]:
        if self.last is None:
            return {}
        return {k: float(v) for k, v in capped(self.last.ports, self.max_series).items()}

    def endpoint_series(self) -> dict[tuple[str, ...], float]:
        if self.last is None:
            return {}
        return {k: float(v) for k, v in capped(self.last.endpoints, self.max_series).items()}
