"""Change tracking in kube-proxy's manner (ServiceChangeTracker + EndpointSliceCache).

Event handlers only record: the new ports of a Service, the new content of a slice, and
which Services became dirty. Nothing is merged or compared across Services there, so an
event costs in proportion to the object it carries.

``checkpoint()`` consumes the recorded changes: for each dirty Service it merges that
Service's slices, joins them to its ports and compares with what the previous checkpoint
handed out. It returns ``{ServicePortName: ServiceChange(previous, current)}`` for the ports
whose state really changed, so changes that cancel out (added then deleted, updated back)
vanish. Its cost follows the number of changed Services, not the number of Services.

Model values only: the sources convert Kubernetes objects before they get here.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ovsproxy.model import (
    Endpoint,
    EndpointSlice,
    IPAddress,
    IPFamily,
    Protocol,
    Service,
    ServicePort,
    ServicePortName,
    ServiceState,
)
from ovsproxy.model.handler import SYNC_ENDPOINT_SLICES, SYNC_SERVICES
from ovsproxy.model.problems import InvalidObject, SourceProblem

log = logging.getLogger(__name__)

ServiceKey = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True, slots=True)
class ServiceChange:
    """One Service port before and after a batch of events (None: absent)."""

    previous: ServiceState | None
    current: ServiceState | None


@dataclass(slots=True)
class TrackerStats:
    """Plain counters, for the metrics the agent exports."""

    events: Counter[str] = field(default_factory=Counter)  # "Service/add", "EndpointSlice/delete"
    invalid: Counter[str] = field(default_factory=Counter)  # rejected objects, by kind
    errors: Counter[str] = field(default_factory=Counter)  # source problems, by source
    checkpoints: int = 0
    changes: int = 0  # ServicePortNames handed out by checkpoints


# An endpoint's place in a port's endpoints: (IP version, address as an int, port), which is
# ``Endpoint.sort_key``, built without its Python-level calls (an ipaddress hashes and converts
# in Python; this runs per endpoint of every changed Service).
EndpointOrder = tuple[int, int, int]
_IPV4 = ipaddress.IPv4Address


def merge_endpoint_slices(
    slices: Iterable[EndpointSlice],
) -> dict[tuple[str, Protocol], dict[EndpointOrder, Endpoint]]:
    """All endpoints of a Service's slices, per (port name, protocol), one per address:port
    (keyed by ``Endpoint.sort_key``).

    An endpoint seen in two slices (it is moving between them, or a new pod reuses a
    terminating pod's IP) resolves as kube-proxy does: a non-terminating copy wins.
    """
    merged: dict[tuple[str, Protocol], dict[EndpointOrder, Endpoint]] = {}
    for endpoint_slice in slices:
        for slice_port in endpoint_slice.ports:
            by_address = merged.setdefault((slice_port.name, slice_port.protocol), {})
            for endpoint in slice_port.endpoints:
                ip = endpoint.ip
                key = (4 if type(ip) is _IPV4 else 6, ip._ip, endpoint.port)  # type: ignore[union-attr]
                if key not in by_address or not endpoint.terminating:
                    by_address[key] = endpoint
    return merged


def service_states(
    ports: Iterable[ServicePort], slices: Iterable[EndpointSlice]
) -> dict[ServicePortName, ServiceState]:
    """The states of one Service's ports from its ports and all its slices.

    A port without endpoints still has a state (empty endpoints): the datapath must reject
    its traffic. Endpoints of a family the Service has no ClusterIP of are dropped, as
    kube-proxy's per-family proxiers never see them.
    """
    # Slice order must not decide which duplicate wins; sort by slice name.
    merged = merge_endpoint_slices(sorted(slices, key=lambda s: s.name))
    states = {}
    for port in ports:
        by_address = merged.get((port.name.port, port.protocol), {})
        families = {ip.version for ip in port.cluster_ips}
        # in sort_key order (the keys are unique: the endpoints are never compared)
        endpoints = tuple(ep for key, ep in sorted(by_address.items()) if key[0] in families)
        states[port.name] = ServiceState(port, endpoints)
    return states


class ChangeTracker:
    """Implements ``SourceHandler``; the proxier reads it with ``checkpoint``/``snapshot``.

    ``wait_for`` names the ``on_synced`` kinds that must all arrive before ``synced`` is
    true; by default one full list of Services and one of EndpointSlices.
    """

    def __init__(self, *, wait_for: Iterable[str] = (SYNC_SERVICES, SYNC_ENDPOINT_SLICES)) -> None:
        self._ports: dict[ServiceKey, tuple[ServicePort, ...]] = {}
        self._slices: dict[ServiceKey, dict[str, EndpointSlice]] = {}
        self._slice_owner: dict[tuple[str, str], ServiceKey] = {}  # (ns, slice) -> Service
        # What the last checkpoint handed out, per Service, to diff the next one against.
        self._applied: dict[ServiceKey, dict[ServicePortName, ServiceState]] = {}
        self._dirty: set[ServiceKey] = set()
        self._cluster_ip_refs: Counter[IPAddress] = Counter()
        self._cluster_ips_version = 0
        self._notify: Callable[[], None] | None = None
        self._wait_for = frozenset(wait_for)
        self._synced_kinds: set[str] = set()
        self.stats = TrackerStats()
        # The trigger times of slice changes not yet handed out, per Service (kube-proxy's
        # lastChangeTriggerTimes); times from before the tracker existed are not ours.
        # Each with the IP family of the slice's addresses (kube-proxy's per-family trackers).
        self._trigger_times: dict[ServiceKey, list[tuple[IPFamily, float]]] = {}
        # kube-proxy's pending change gauges: slice changes recorded since the last
        # checkpoint, and the Services whose ports differ from theirs at the last checkpoint
        # (with those ports, so that a change undone is no longer pending).
        self._endpoint_changes_pending = 0
        self._service_changes: dict[ServiceKey, tuple[ServicePort, ...]] = {}
        self._started = time.time()

    # --- the handler interface -------------------------------------------------------

    def on_service_add(self, service: Service) -> None:
        self.stats.events["Service/add"] += 1
        self._set_service(service)

    def on_service_update(self, service: Service) -> None:
        self.stats.events["Service/update"] += 1
        self._set_service(service)

    def on_service_delete(self, namespace: str, name: str) -> None:
        self.stats.events["Service/delete"] += 1
        self._set_ports((namespace, name), ())

    def on_endpoint_slice_add(self, endpoint_slice: EndpointSlice) -> None:
        self.stats.events["EndpointSlice/add"] += 1
        self._set_slice(endpoint_slice)

    def on_endpoint_slice_update(self, endpoint_slice: EndpointSlice) -> None:
        self.stats.events["EndpointSlice/update"] += 1
        self._set_slice(endpoint_slice)

    def on_endpoint_slice_delete(self, namespace: str, name: str) -> None:
        self.stats.events["EndpointSlice/delete"] += 1
        owner = self._slice_owner.pop((namespace, name), None)
        if owner is not None:
            self._remove_slice(owner, name)
            # A deleted slice's annotation dates from its last update, not from what caused
            # the deletion: kube-proxy drops the Service's pending trigger times instead.
            self._trigger_times.pop(owner, None)
            self._endpoint_changes_pending += 1
            self._mark(owner)

    def on_synced(self, kind: str) -> None:
        was = self.synced
        self._synced_kinds.add(kind)
        if self.synced and not was:
            log.info("all sources synced: %s", ", ".join(sorted(self._synced_kinds)))
            self._fire()

    def on_error(self, problem: SourceProblem) -> None:
        if isinstance(problem, InvalidObject):
            self.stats.invalid[problem.kind] += 1
        else:
            self.stats.errors[problem.source] += 1

    # --- what the proxier reads ------------------------------------------------------

    def set_notify(self, callback: Callable[[], None] | None) -> None:
        """Called synchronously after every recorded change; keep it cheap (schedule a sync)."""
        self._notify = callback

    @property
    def synced(self) -> bool:
        """Every awaited source has delivered its initial list."""
        return self._wait_for <= self._synced_kinds

    @property
    def pending(self) -> int:
        """How many Services have changes the next checkpoint will look at."""
        return len(self._dirty)

    @property
    def endpoint_changes_pending(self) -> int:
        """EndpointSlice changes recorded since the last checkpoint (kube-proxy's
        sync_proxy_rules_endpoint_changes_pending)."""
        return self._endpoint_changes_pending

    @property
    def service_changes_pending(self) -> int:
        """Services whose ports differ from what the last checkpoint saw (kube-proxy's
        sync_proxy_rules_service_changes_pending)."""
        return len(self._service_changes)

    def checkpoint(self) -> dict[ServicePortName, ServiceChange]:
        """Consume the recorded changes; only ports whose state differs are returned."""
        changes: dict[ServicePortName, ServiceChange] = {}
        for key in self._dirty:
            current = self._compute(key)
            previous = self._applied.get(key)
            if previous is None:  # a new Service (every one, at the first checkpoint)
                for name, state in current.items():
                    changes[name] = ServiceChange(None, state)
            else:
                for name in previous.keys() | current.keys():
                    before, after = previous.get(name), current.get(name)
                    if before != after:
                        changes[name] = ServiceChange(before, after)
            if current:
                self._applied[key] = current
            else:
                self._applied.pop(key, None)
        self._dirty.clear()
        self._endpoint_changes_pending = 0
        self._service_changes.clear()
        self.stats.checkpoints += 1
        self.stats.changes += len(changes)
        return changes

    def take_trigger_times(self) -> list[tuple[IPFamily, float]]:
        """The trigger times (Unix seconds) of the slice changes recorded since the last call,
        each with its slice's IP family, consumed; the proxier takes them with the checkpoint
        and reports them once the commit carrying those changes has succeeded."""
        times = [t for per_service in self._trigger_times.values() for t in per_service]
        self._trigger_times.clear()
        return times

    def snapshot(self) -> dict[ServicePortName, ServiceState]:
        """The full current state, recorded changes included; consumes nothing."""
        result: dict[ServicePortName, ServiceState] = {}
        for key, states in self._applied.items():
            if key not in self._dirty:
                result.update(states)
        for key in self._dirty:
            result.update(self._compute(key))
        return result

    def state_of(self, name: ServicePortName) -> ServiceState | None:
        """One port's state as the last checkpoint handed it out (None: absent)."""
        return self._applied.get((name.namespace, name.name), {}).get(name)

    def cluster_ips(self) -> frozenset[IPAddress]:
        """The ClusterIPs of every Service the tracker holds now."""
        return frozenset(self._cluster_ip_refs)

    @property
    def cluster_ips_version(self) -> int:
        """Changes whenever an address joins or leaves ``cluster_ips()``: readers need not
        rebuild the set when nothing changed."""
        return self._cluster_ips_version

    def service_count(self) -> int:
        return len(self._ports)

    # --- internals -------------------------------------------------------------------

    def _set_service(self, service: Service) -> None:
        self._set_ports((service.namespace, service.name), service.ports)

    def _set_ports(self, key: ServiceKey, ports: tuple[ServicePort, ...]) -> None:
        old = self._ports.get(key, ())
        if old == ports:
            return  # a no-op update (say, a status change we do not use)
        before = self._service_changes.setdefault(key, old)
        if before == ports:
            del self._service_changes[key]  # back to what the last checkpoint saw
        self._count_cluster_ips(old, -1)
        self._count_cluster_ips(ports, +1)
        if ports:
            self._ports[key] = ports
        else:
            self._ports.pop(key, None)
        self._mark(key)

    def _count_cluster_ips(self, ports: tuple[ServicePort, ...], delta: int) -> None:
        if not ports:
            return
        # All ports of a Service share its ClusterIPs; count them once per Service.
        refs = self._cluster_ip_refs
        for ip in ports[0].cluster_ips:
            if ip not in refs:
                self._cluster_ips_version += 1
            refs[ip] += delta
            if refs[ip] <= 0:
                del refs[ip]
                self._cluster_ips_version += 1

    def _set_slice(self, endpoint_slice: EndpointSlice) -> None:
        slice_id = (endpoint_slice.namespace, endpoint_slice.name)
        owner = (endpoint_slice.namespace, endpoint_slice.service)
        previous_owner = self._slice_owner.get(slice_id)
        if previous_owner is not None and previous_owner != owner:
            # The slice's service label changed: it leaves the old Service.
            self._remove_slice(previous_owner, endpoint_slice.name)
            self._mark(previous_owner)
        slices = self._slices.setdefault(owner, {})
        if slices.get(endpoint_slice.name) == endpoint_slice:
            return
        slices[endpoint_slice.name] = endpoint_slice
        self._slice_owner[slice_id] = owner
        trigger = endpoint_slice.trigger_time
        if trigger is not None and trigger > self._started:
            family = self._slice_family(endpoint_slice, owner)
            self._trigger_times.setdefault(owner, []).append((family, trigger))
        self._endpoint_changes_pending += 1
        self._mark(owner)

    def _slice_family(self, endpoint_slice: EndpointSlice, owner: ServiceKey) -> IPFamily:
        """The family of a slice's addresses (its addressType); an empty slice's is taken
        from its Service's first ClusterIP."""
        for slice_port in endpoint_slice.ports:
            for endpoint in slice_port.endpoints:
                return IPFamily.of(endpoint.ip)
        ports = self._ports.get(owner, ())
        if ports and ports[0].cluster_ips:
            return IPFamily.of(ports[0].cluster_ips[0])
        return IPFamily.IPv4

    def _remove_slice(self, owner: ServiceKey, slice_name: str) -> None:
        slices = self._slices.get(owner)
        if slices is not None:
            slices.pop(slice_name, None)
            if not slices:
                del self._slices[owner]

    def _mark(self, key: ServiceKey) -> None:
        self._dirty.add(key)
        self._fire()

    def _fire(self) -> None:
        if self._notify is not None:
            self._notify()

    def _compute(self, key: ServiceKey) -> dict[ServicePortName, ServiceState]:
        ports = self._ports.get(key)
        if not ports:
            return {}  # endpoints without a Service produce nothing until it arrives
        return service_states(ports, self._slices.get(key, {}).values())
