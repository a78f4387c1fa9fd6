"""The Service CIDR discoverer: ClusterIP and ServiceCIDR events in, per-family CIDR changes out.

The discoverer is the one place that decides which prefixes the node routes to Services. It is fed
by the proxier (ClusterIPs, as ``ipaddress`` objects or any string spelling) and optionally by the
ServiceCIDR source (``model.ServiceCIDR`` values, converted by ``ovsproxy.sources``), and it emits
``CIDRChange`` events that the route manager applies (``RouteManager.apply``).

Rules (seed 000, and Antrea's ``pkg/agent/servicecidr``):

* Nothing is emitted until the ClusterIP source has synced (and the ServiceCIDR informer, when
  used): the first CIDR is computed once from the complete list, so a restart does not walk the
  route through /32, /31, ... while the initial list streams in.
* A family with configured or API ranges routes exactly those: a ClusterIP outside all of them
  is reported (``unrouted()``, a warning) and not routed -- a wider guess could cover the
  node's own routes.
* A family without ranges is aggregated: ClusterIPs are grouped by their ``AGGREGATION_FLOOR``
  prefix (/8, /32 for IPv6) and each group routes the longest common prefix of its members,
  so no route is ever wider than the floor (never the default route). An address outside
  grows its group's prefix; an address inside changes nothing; a delete shrinks the prefix to
  what the remaining members need, and withdraws a group left empty.
* Events carry only the families that changed, the complete new set of prefixes of that family,
  and a generation number so a consumer on another thread can drop an event that arrives after
  a newer one.

Thread-safe: every method may be called from any thread. Handlers run on the calling thread,
outside the internal lock, so a handler may call back into the discoverer.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ovsproxy.model import IPAddress, IPFamily, IPNetwork, ServiceCIDR
from ovsproxy.servicecidr.aggregate import (
    AddressLike,
    common_prefix,
    covers,
    family_of,
    floor_of,
    grow,
    parse_cluster_ip,
    reduce_networks,
    to_network,
)
from ovsproxy.servicecidr.sources import (
    CIDRSource,
    networks_by_family,
    parse_configured_cidrs,
    select_source,
)

log = logging.getLogger(__name__)

ALL_FAMILIES = (IPFamily.IPv4, IPFamily.IPv6)


@dataclass(frozen=True, slots=True)
class CIDRChange:
    """The prefixes of one family changed from ``old`` to ``new`` (both complete, sorted)."""

    family: IPFamily
    old: tuple[IPNetwork, ...]
    new: tuple[IPNetwork, ...]
    generation: int
    source: CIDRSource = CIDRSource.AGGREGATED

    @property
    def withdrawn(self) -> tuple[IPNetwork, ...]:
        """Old prefixes the new ones do not cover: the only ones a consumer may stop routing."""
        return tuple(net for net in self.old if not covers(self.new, net))

    @property
    def grows(self) -> bool:
        return not self.withdrawn


class _APIState(enum.Enum):
    UNUSED = "unused"  # no ServiceCIDR informer, or the cluster does not serve the API
    PENDING = "pending"  # informer started, initial list not complete
    SYNCED = "synced"


Handler = Callable[[CIDRChange], None]


class ServiceCIDRDiscoverer:
    """Tracks ClusterIPs and ServiceCIDR objects; computes the routed prefixes per family.

    ``configured``: ``--service-cidr`` values (strings, comma-separated allowed, or networks).
    ``use_api``: whether a ServiceCIDR informer will feed this discoverer; if so the initial
    computation also waits for ``service_cidrs_synced()`` (or ``service_cidr_api_unavailable()``,
    which the informer calls when the cluster does not serve networking.k8s.io/v1 ServiceCIDR).
    """

    def __init__(
        self,
        configured: Iterable[str | IPNetwork] = (),
        *,
        use_api: bool = False,
        families: Iterable[IPFamily] = ALL_FAMILIES,
    ) -> None:
        texts = [c for c in configured if isinstance(c, str)]
        nets = [c for c in configured if not isinstance(c, str)]
        merged = parse_configured_cidrs(texts)
        for family, extra in networks_by_family(nets).items():
            merged[family] = tuple(sorted({*merged.get(family, ()), *extra}, key=_net_key))
        self._configured: dict[IPFamily, tuple[IPNetwork, ...]] = merged
        self._families = tuple(dict.fromkeys(families))
        self._lock = threading.Lock()
        self._ips: Counter[IPAddress] = Counter()
        self._ips_synced = False
        self._api_state = _APIState.PENDING if use_api else _APIState.UNUSED
        self._api_objects: dict[str, tuple[IPNetwork, ...]] = {}
        # Aggregation, kept whatever the source (cheap, and ready when the source falls back):
        # the known ClusterIPs per AGGREGATION_FLOOR group and the smallest prefix holding them.
        self._members: dict[IPNetwork, set[IPAddress]] = {}
        self._aggregated: dict[IPNetwork, IPNetwork] = {}
        # Known ClusterIPs outside every configured or API range of their family: not routed.
        self._unrouted: dict[IPFamily, set[IPAddress]] = {f: set() for f in self._families}
        self._current: dict[IPFamily, tuple[IPNetwork, ...]] = dict.fromkeys(self._families, ())
        self._sources: dict[IPFamily, CIDRSource] = {}
        self._generation = 0
        self._handlers: list[Handler] = []
        self.skipped = 0  # ClusterIPs ignored: headless, invalid, or of an unmanaged family

    # -- consumers ---------------------------------------------------------------------------

    def subscribe(self, handler: Handler) -> None:
        """Call ``handler(change)`` for every future change (on the thread that caused it)."""
        self._handlers.append(handler)

    @property
    def ready(self) -> bool:
        """Whether the initial computation has happened (all sources synced)."""
        with self._lock:
            return self._ready()

    def cidrs(self, family: IPFamily) -> tuple[IPNetwork, ...]:
        with self._lock:
            return self._current.get(family, ())

    def desired(self) -> frozenset[IPNetwork]:
        """All prefixes to route now, every family. Empty until ``ready``."""
        with self._lock:
            return frozenset(net for nets in self._current.values() for net in nets)

    def source(self, family: IPFamily) -> CIDRSource | None:
        with self._lock:
            return self._sources.get(family)

    @property
    def generation(self) -> int:
        with self._lock:
            return self._generation

    @property
    def configured(self) -> dict[IPFamily, tuple[IPNetwork, ...]]:
        return dict(self._configured)

    def known_cluster_ips(self) -> frozenset[IPAddress]:
        with self._lock:
            return frozenset(self._ips)

    def unrouted(self) -> frozenset[IPAddress]:
        """Known ClusterIPs outside every configured or API range of their family: a problem
        (a misconfigured range, a hostile manifest), so they are not routed. Aggregation routes
        every ClusterIP, so a family it decides has none."""
        with self._lock:
            return frozenset(ip for ips in self._unrouted.values() for ip in ips)

    # -- ClusterIP events (from the proxier) -------------------------------------------------

    def add_cluster_ip(self, ip: AddressLike | None) -> list[CIDRChange]:
        return self.add_cluster_ips((ip,))

    def add_cluster_ips(self, ips: Iterable[AddressLike | None]) -> list[CIDRChange]:
        """Record ClusterIPs (each add is reference-counted against a later delete)."""
        with self._lock:
            touched: set[IPFamily] = set()
            for value in ips:
                ip = self._accept(value)
                if ip is None:
                    continue
                self._ips[ip] += 1
                if self._ips[ip] > 1:
                    continue
                family = IPFamily.of(ip)
                group = floor_of(ip)
                self._members.setdefault(group, set()).add(ip)
                prefix = self._aggregated.get(group)
                self._aggregated[group] = grown = grow(prefix, ip)
                if not self._ready():
                    continue
                if self._sources[family] is CIDRSource.AGGREGATED:
                    if grown != prefix:
                        touched.add(family)
                elif not covers(self._current[family], ip):
                    self._unrouted[family].add(ip)
                    log.debug(  # the feed warns, naming the Services
                        "servicecidr: ClusterIP %s is outside every %s Service range %s: "
                        "not routed",
                        ip,
                        self._sources[family],
                        [str(n) for n in self._current[family]],
                    )
            changes = self._recompute(touched) if touched else []
        return self._emit(changes)

    def delete_cluster_ip(self, ip: AddressLike | None) -> list[CIDRChange]:
        return self.delete_cluster_ips((ip,))

    def delete_cluster_ips(self, ips: Iterable[AddressLike | None]) -> list[CIDRChange]:
        """Forget ClusterIPs. An aggregated prefix shrinks to what the remaining ClusterIPs
        need (a group left empty is withdrawn): the event's consumer installs the narrower
        route before deleting the wider one, so no known ClusterIP is ever uncovered."""
        with self._lock:
            regroup: set[IPNetwork] = set()
            for value in ips:
                ip = parse_cluster_ip(value)
                if ip is None or ip not in self._ips:
                    continue
                self._ips[ip] -= 1
                if self._ips[ip] <= 0:
                    del self._ips[ip]
                    self._unrouted[IPFamily.of(ip)].discard(ip)
                    group = floor_of(ip)
                    self._members[group].discard(ip)
                    regroup.add(group)
            touched: set[IPFamily] = set()
            for group in regroup:
                members = self._members[group]
                before = self._aggregated.get(group)
                if members:
                    low = min(members)
                    self._aggregated[group] = common_prefix(to_network(low), max(members))
                else:
                    del self._members[group]
                    del self._aggregated[group]
                family = IPFamily.of(group)
                if (
                    self._ready()
                    and self._sources[family] is CIDRSource.AGGREGATED
                    and self._aggregated.get(group) != before
                ):
                    touched.add(family)
            changes = self._recompute(touched) if touched else []
        return self._emit(changes)

    def cluster_ips_synced(self) -> list[CIDRChange]:
        """The ClusterIP source has delivered its complete initial list."""
        with self._lock:
            self._ips_synced = True
            changes = self._maybe_initialise()
        return self._emit(changes)

    # -- ServiceCIDR events (from the informer) ----------------------------------------------

    def upsert_service_cidr(self, cidr: ServiceCIDR) -> list[CIDRChange]:
        """A ServiceCIDR object was added or updated (its whole new value)."""
        with self._lock:
            if self._api_objects.get(cidr.name) == cidr.cidrs:
                return []
            self._api_objects[cidr.name] = cidr.cidrs
            changes = self._api_changed()
        return self._emit(changes)

    def delete_service_cidr(self, name: str) -> list[CIDRChange]:
        """The ServiceCIDR object called ``name`` is gone."""
        with self._lock:
            if self._api_objects.pop(name, None) is None:
                return []
            changes = self._api_changed()
        return self._emit(changes)

    def replace_service_cidrs(self, cidrs: Iterable[ServiceCIDR]) -> list[CIDRChange]:
        """The complete current list (a re-list after a 410): replaces every object at once."""
        listed = {cidr.name: cidr.cidrs for cidr in cidrs}
        with self._lock:
            if listed == self._api_objects:
                return []
            self._api_objects = listed
            changes = self._api_changed()
        return self._emit(changes)

    def service_cidrs_synced(self) -> list[CIDRChange]:
        with self._lock:
            self._api_state = _APIState.SYNCED
            changes = self._maybe_initialise() if not self._was_ready() else self._api_changed()
        return self._emit(changes)

    def service_cidr_api_unavailable(self) -> list[CIDRChange]:
        """The cluster does not serve the ServiceCIDR API: fall back to aggregation."""
        with self._lock:
            self._api_state = _APIState.UNUSED
            self._api_objects.clear()
            changes = self._maybe_initialise() if not self._was_ready() else self._api_changed()
        return self._emit(changes)

    # -- internals (called with the lock held) -----------------------------------------------

    def _accept(self, value: AddressLike | None) -> IPAddress | None:
        ip = parse_cluster_ip(value)
        if ip is None or IPFamily.of(ip) not in self._families:
            self.skipped += 1
            log.debug("servicecidr: skipping ClusterIP %r", value)
            return None
        return ip

    def _ready(self) -> bool:
        return self._ips_synced and self._api_state is not _APIState.PENDING

    def _was_ready(self) -> bool:
        return bool(self._sources)

    def _api_view(self) -> dict[IPFamily, tuple[IPNetwork, ...]] | None:
        if self._api_state is not _APIState.SYNCED:
            return None
        return networks_by_family(n for nets in self._api_objects.values() for n in nets)

    def _maybe_initialise(self) -> list[CIDRChange]:
        if not self._ready() or self._was_ready():
            return []
        # Computed once from the complete list.
        return self._recompute(set(self._families), initial=True)

    def _api_changed(self) -> list[CIDRChange]:
        if not self._ready():
            return []
        return self._recompute(set(self._families))

    def _recompute(self, families: set[IPFamily], *, initial: bool = False) -> list[CIDRChange]:
        api = self._api_view()
        changes = []
        for family in self._families:
            if family not in families:
                continue
            source, base = select_source(family, self._configured, api)
            if base:
                new = family_of(reduce_networks(base), family)
                unrouted = {ip for ip in self._ips if ip.version == family and not covers(new, ip)}
                for ip in sort_networks_of(unrouted - self._unrouted[family]):
                    log.debug(  # the feed warns, naming the Services
                        "servicecidr: ClusterIP %s is outside every %s Service range %s: "
                        "not routed",
                        ip,
                        source,
                        [str(n) for n in new],
                    )
                self._unrouted[family] = unrouted
            else:  # aggregation routes every ClusterIP, one prefix per floor group
                new = family_of(self._aggregated.values(), family)
                self._unrouted[family] = set()
            self._sources[family] = source
            old = self._current[family]
            if new == old:
                continue
            self._current[family] = new
            self._generation += 1
            changes.append(CIDRChange(family, old, new, self._generation, source))
            log.debug(
                "servicecidr: %s %s -> %s (%s%s)",
                family.name,
                [str(n) for n in old],
                [str(n) for n in new],
                source,
                ", initial" if initial else "",
            )
        return changes

    def _emit(self, changes: list[CIDRChange]) -> list[CIDRChange]:
        for change in changes:
            for handler in self._handlers:
                handler(change)
        return changes


def sort_networks_of(ips: Iterable[IPAddress]) -> list[IPAddress]:
    """Addresses in a stable order (for logs)."""
    return sorted(ips, key=lambda ip: (ip.version, int(ip)))


def _net_key(net: IPNetwork) -> tuple[int, int, int]:
    return (net.version, int(net.network_address), net.prefixlen)


def as_networks(values: Iterable[AddressLike]) -> frozenset[IPNetwork]:
    """Canonical networks for any spellings (a convenience for callers building desired sets)."""
    return frozenset(to_network(v) for v in values)
