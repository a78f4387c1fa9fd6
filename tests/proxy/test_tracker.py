"""The change tracker: what checkpoints hand out, and what they cost."""

from __future__ import annotations

import dataclasses
import ipaddress
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from ovsproxy.model import (
    Endpoint,
    EndpointSlice,
    IPFamily,
    Protocol,
    Service,
    ServicePort,
    ServicePortName,
    SlicePort,
)
from ovsproxy.model.problems import InvalidObject, SourceError, ValidationError
from ovsproxy.proxy.tracker import ChangeTracker, ServiceChange, service_states


def svc(name: str, *ports: tuple[str, int], cluster_ip: str = "", ns: str = "ns") -> Service:
    ips = tuple(ipaddress.ip_address(ip) for ip in (cluster_ip or _ip_for(name)).split(","))
    return Service(
        ns,
        name,
        tuple(
            ServicePort(ServicePortName(ns, name, port_name), ips, number)
            for port_name, number in (ports or (("", 80),))
        ),
    )


def _ip_for(name: str) -> str:
    return f"10.96.{sum(map(ord, name)) % 250}.{len(name)}"


def ep(ip: str, port: int = 8080, **kw) -> Endpoint:
    return Endpoint(ipaddress.ip_address(ip), port, **kw)


def eps(service: str, slice_name: str, *ips: str, port_name: str = "", ns: str = "ns", **kw):
    return EndpointSlice(
        ns,
        slice_name,
        service,
        (SlicePort(port_name, Protocol.TCP, tuple(ep(ip, **kw) for ip in ips)),),
    )


def names(changes) -> set[str]:
    return {str(n) for n in changes}


def endpoints(state) -> list[str]:
    return [str(e) for e in state.endpoints]


def test_service_then_slice_then_nothing() -> None:
    tracker = ChangeTracker()
    tracker.on_service_add(svc("web"))
    changes = tracker.checkpoint()
    [change] = changes.values()
    assert change.previous is None and change.current.endpoints == ()  # no slice yet: empty

    tracker.on_endpoint_slice_add(eps("web", "web-1", "10.244.0.2", "10.244.0.1"))
    [change] = tracker.checkpoint().values()
    assert endpoints(change.previous) == []
    assert endpoints(change.current) == ["10.244.0.1:8080", "10.244.0.2:8080"]  # sorted
    assert tracker.checkpoint() == {}


def test_endpoints_without_a_service_wait_for_it() -> None:
    tracker = ChangeTracker()
    tracker.on_endpoint_slice_add(eps("web", "web-1", "10.244.0.1"))
    assert tracker.checkpoint() == {} and tracker.snapshot() == {}
    tracker.on_service_add(svc("web"))
    [change] = tracker.checkpoint().values()
    assert endpoints(change.current) == ["10.244.0.1:8080"]


def test_changes_that_cancel_out_are_dropped() -> None:
    tracker = ChangeTracker()
    tracker.on_service_add(svc("web"))
    tracker.on_endpoint_slice_add(eps("web", "web-1", "10.244.0.1"))
    tracker.on_service_delete("ns", "web")
    tracker.on_endpoint_slice_delete("ns", "web-1")
    assert tracker.checkpoint() == {}

    tracker.on_service_add(svc("web"))
    tracker.on_endpoint_slice_add(eps("web", "web-1", "10.244.0.1"))
    tracker.checkpoint()
    tracker.on_endpoint_slice_update(eps("web", "web-1", "10.244.0.1", "10.244.0.9"))
    tracker.on_endpoint_slice_update(eps("web", "web-1", "10.244.0.1"))  # back again
    tracker.on_service_update(svc("web", ("", 81)))
    tracker.on_service_update(svc("web"))
    assert tracker.checkpoint() == {}


def test_no_op_updates_do_not_notify_or_dirty() -> None:
    tracker = ChangeTracker()
    calls = []
    tracker.set_notify(lambda: calls.append(1))
    tracker.on_service_add(svc("web"))
    tracker.on_endpoint_slice_add(eps("web", "web-1", "10.244.0.1"))
    assert len(calls) == 2
    tracker.checkpoint()
    tracker.on_service_update(svc("web"))
    tracker.on_endpoint_slice_update(eps("web", "web-1", "10.244.0.1"))
    tracker.on_endpoint_slice_delete("ns", "never-seen")
    assert len(calls) == 2 and tracker.pending == 0


def test_multi_port_service_with_slices_per_port_numbers() -> None:
    tracker = ChangeTracker()
    tracker.on_service_add(svc("shop", ("http", 80), ("https", 443)))
    tracker.on_endpoint_slice_add(eps("shop", "a", "10.244.0.1", port_name="http", port=8080))
    tracker.on_endpoint_slice_add(eps("shop", "b", "10.244.0.2", port_name="http", port=8081))
    tracker.on_endpoint_slice_add(eps("shop", "c", "10.244.0.1", port_name="https", port=8443))
    snapshot = {str(n): endpoints(s) for n, s in tracker.snapshot().items()}
    assert snapshot == {
        "ns/shop:http/TCP": ["10.244.0.1:8080", "10.244.0.2:8081"],
        "ns/shop:https/TCP": ["10.244.0.1:8443"],
    }


def test_an_endpoint_in_two_slices_prefers_the_non_terminating_copy() -> None:
    tracker = ChangeTracker()
    tracker.on_service_add(svc("web"))
    tracker.on_endpoint_slice_add(eps("web", "b", "10.244.0.1"))
    tracker.on_endpoint_slice_add(eps("web", "a", "10.244.0.1", ready=False, terminating=True))
    [state] = tracker.snapshot().values()
    [endpoint] = state.endpoints
    assert endpoint.ready and not endpoint.terminating


def test_endpoints_of_a_family_without_cluster_ip_are_dropped() -> None:
    v6_slice = EndpointSlice(
        "ns", "web-v6", "web", (SlicePort("", Protocol.TCP, (ep("fd00::1"),)),)
    )
    tracker = ChangeTracker()
    tracker.on_service_add(svc("web"))  # IPv4 only
    tracker.on_endpoint_slice_add(eps("web", "web-v4", "10.244.0.1"))
    tracker.on_endpoint_slice_add(v6_slice)
    [state] = tracker.snapshot().values()
    assert endpoints(state) == ["10.244.0.1:8080"]

    tracker.on_service_update(svc("web", cluster_ip="10.96.0.1,fd00:96::1"))  # now dual-stack
    [state] = tracker.snapshot().values()
    assert endpoints(state) == ["10.244.0.1:8080", "[fd00::1]:8080"]


def test_slice_moving_to_another_service() -> None:
    tracker = ChangeTracker()
    tracker.on_service_add(svc("a"))
    tracker.on_service_add(svc("b"))
    tracker.on_endpoint_slice_add(eps("a", "s", "10.244.0.1"))
    tracker.checkpoint()
    tracker.on_endpoint_slice_update(eps("b", "s", "10.244.0.1"))
    changes = {str(n): c for n, c in tracker.checkpoint().items()}
    assert endpoints(changes["ns/a/TCP"].current) == []
    assert endpoints(changes["ns/b/TCP"].current) == ["10.244.0.1:8080"]


def test_service_becoming_ignored_removes_its_ports() -> None:
    tracker = ChangeTracker()
    tracker.on_service_add(svc("web", ("http", 80), ("https", 443)))
    tracker.checkpoint()
    tracker.on_service_update(Service("ns", "web"))  # now headless, say
    changes = tracker.checkpoint()
    assert names(changes) == {"ns/web:http/TCP", "ns/web:https/TCP"}
    assert all(c.current is None for c in changes.values())
    assert tracker.snapshot() == {} and tracker.service_count() == 0


def test_checkpoint_cost_follows_the_changes_not_the_services() -> None:
    tracker = ChangeTracker()
    for i in range(2000):
        tracker.on_service_add(svc(f"s{i}", cluster_ip=f"10.96.{i // 250}.{i % 250 + 1}"))
        tracker.on_endpoint_slice_add(eps(f"s{i}", f"s{i}-x", f"10.244.{i // 250}.{i % 250 + 1}"))
    assert tracker.pending == 2000
    assert len(tracker.checkpoint()) == 2000

    tracker.on_endpoint_slice_update(eps("s7", "s7-x", "10.244.0.8", "10.244.99.1"))
    assert tracker.pending == 1  # one Service to look at, out of 2000
    [(name, change)] = tracker.checkpoint().items()
    assert str(name) == "ns/s7/TCP"
    assert endpoints(change.current) == ["10.244.0.8:8080", "10.244.99.1:8080"]
    assert tracker.stats.checkpoints == 2 and tracker.stats.changes == 2001


def test_cluster_ips_follow_the_services() -> None:
    tracker = ChangeTracker()
    tracker.on_service_add(svc("a", ("x", 1), ("y", 2), cluster_ip="10.96.0.1,fd00::1"))
    tracker.on_service_add(svc("b", cluster_ip="10.96.0.2"))
    assert tracker.cluster_ips() == {
        ipaddress.ip_address(i) for i in ("10.96.0.1", "fd00::1", "10.96.0.2")
    }
    tracker.on_service_update(svc("a", cluster_ip="10.96.0.3"))
    tracker.on_service_delete("ns", "b")
    assert tracker.cluster_ips() == {ipaddress.ip_address("10.96.0.3")}


def test_synced_needs_every_awaited_kind() -> None:
    tracker = ChangeTracker()
    notified = []
    tracker.set_notify(lambda: notified.append(1))
    tracker.on_synced("Service")
    assert not tracker.synced
    tracker.on_synced("EndpointSlice")
    assert tracker.synced and notified == [1]  # becoming synced is worth a sync
    assert ChangeTracker(wait_for=["manifests"]).synced is False


def test_problems_are_counted_by_kind_and_source() -> None:
    tracker = ChangeTracker()
    bad_service = InvalidObject(
        (
            ValidationError("Service", "ns", "a", ("spec", "clusterIP"), None, "required"),
            ValidationError("Service", "ns", "a", ("spec", "ports"), None, "required"),
        )
    )
    tracker.on_error(bad_service)
    tracker.on_error(
        InvalidObject((ValidationError("EndpointSlice", "ns", "b", ("ports",), 1, "bad"),))
    )
    tracker.on_error(SourceError("kubernetes/services", "connection refused"))
    assert tracker.stats.invalid == {"Service": 1, "EndpointSlice": 1}  # objects, not fields
    assert str(bad_service) == (
        "Service ns/a: spec.clusterIP: required; Service ns/a: spec.ports: required"
    )
    assert tracker.stats.errors == {"kubernetes/services": 1}


# --- property: any sequence of events ---------------------------------------------------

SERVICES = ["a", "b", "c"]
SLICES = ["s1", "s2", "s3", "s4"]
ADDRESSES = ["10.244.0.1", "10.244.0.2", "10.244.0.3", "fd00::1"]

service_events = st.tuples(
    st.just("service"),
    st.sampled_from(SERVICES),
    st.one_of(
        st.none(),  # delete
        st.lists(st.sampled_from(["", "http"]), min_size=1, max_size=2, unique=True),
    ),
    st.sampled_from(["10.96.0.1", "10.96.0.1,fd00:96::1", "10.96.0.2"]),
)
slice_events = st.tuples(
    st.just("slice"),
    st.sampled_from(SLICES),
    st.sampled_from(SERVICES),
    st.one_of(
        st.none(),
        st.lists(
            st.tuples(st.sampled_from(ADDRESSES), st.booleans(), st.sampled_from(["", "http"])),
            max_size=4,
        ),
    ),
)
events = st.lists(st.one_of(service_events, slice_events, st.just(("checkpoint",))), max_size=40)


def apply(tracker: ChangeTracker, event) -> None:
    if event[0] == "service":
        _, name, ports, ips = event
        if ports is None:
            tracker.on_service_delete("ns", name)
        else:
            tracker.on_service_update(
                svc(name, *[(p, 80 + i) for i, p in enumerate(ports)], cluster_ip=ips)
            )
    else:
        _, slice_name, service_name, content = event
        if content is None:
            tracker.on_endpoint_slice_delete("ns", slice_name)
            return
        by_port: dict[str, list[Endpoint]] = {}
        for address, terminating, port_name in content:
            by_port.setdefault(port_name, []).append(
                ep(address, ready=not terminating, terminating=terminating)
            )
        tracker.on_endpoint_slice_update(
            EndpointSlice(
                "ns",
                slice_name,
                service_name,
                tuple(SlicePort(p, Protocol.TCP, tuple(e)) for p, e in by_port.items()),
            )
        )


@settings(max_examples=300)
@given(events)
def test_checkpoints_replay_to_the_snapshot_and_to_a_fresh_tracker(sequence) -> None:
    tracker = ChangeTracker()
    view: dict[ServicePortName, object] = {}  # what a proxier builds from checkpoints
    final_services: dict[str, tuple] = {}
    final_slices: dict[str, tuple] = {}
    for event in sequence:
        if event[0] == "checkpoint":
            for name, change in tracker.checkpoint().items():
                assert isinstance(change, ServiceChange)
                assert change.previous != change.current
                assert view.get(name) == change.previous
                if change.current is None:
                    view.pop(name)
                else:
                    view[name] = change.current
            assert tracker.pending == 0
            continue
        apply(tracker, event)
        if event[0] == "service":
            final_services[event[1]] = event
        else:
            final_slices[event[1]] = event
    snapshot = tracker.snapshot()
    for name, change in tracker.checkpoint().items():
        if change.current is None:
            view.pop(name)
        else:
            view[name] = change.current
    assert view == snapshot == tracker.snapshot()

    fresh = ChangeTracker()  # only the final objects, in one go
    for event in [*final_services.values(), *final_slices.values()]:
        apply(fresh, event)
    assert fresh.snapshot() == snapshot
    for state in snapshot.values():
        keys = [e.sort_key for e in state.endpoints]
        assert keys == sorted(set(keys))  # sorted, one per address:port


def test_service_states_is_independent_of_slice_order() -> None:
    ports = svc("web").ports
    a = eps("web", "a", "10.244.0.1", ready=False, terminating=True)
    b = eps("web", "b", "10.244.0.1")
    assert service_states(ports, [a, b]) == service_states(ports, [b, a])


def test_cluster_ips_version_moves_only_when_an_address_comes_or_goes() -> None:
    tracker = ChangeTracker()
    start = tracker.cluster_ips_version
    tracker.on_service_add(svc("a", cluster_ip="10.96.0.1"))
    added = tracker.cluster_ips_version
    assert added != start
    tracker.on_service_add(svc("b", cluster_ip="10.96.0.1"))  # shared: no new address
    tracker.on_endpoint_slice_update(eps("a", "a-1", "10.244.0.8"))
    assert tracker.cluster_ips_version == added
    tracker.on_service_delete("ns", "b")  # still used by a
    assert tracker.cluster_ips_version == added
    tracker.on_service_delete("ns", "a")
    assert tracker.cluster_ips_version != added and tracker.cluster_ips() == frozenset()


# --- trigger times (network programming latency, kube-proxy's semantics) ------------------


def _triggered(endpoint_slice: EndpointSlice, at: float) -> EndpointSlice:
    return dataclasses.replace(endpoint_slice, trigger_time=at)


def test_trigger_times_of_changes_are_handed_out_once() -> None:
    tracker = ChangeTracker()
    now = time.time()
    tracker.on_service_add(svc("a"))
    tracker.on_endpoint_slice_add(_triggered(eps("a", "a-1", "10.0.0.1"), now + 1))
    tracker.on_endpoint_slice_update(_triggered(eps("a", "a-1", "10.0.0.2"), now + 2))
    tracker.on_endpoint_slice_add(_triggered(eps("b", "b-1", "10.0.0.3"), now + 3))
    tracker.checkpoint()
    V4 = IPFamily.IPv4
    assert sorted(tracker.take_trigger_times()) == [(V4, now + 1), (V4, now + 2), (V4, now + 3)]
    assert tracker.take_trigger_times() == []


def test_trigger_times_not_recorded_for_no_change_or_times_before_the_tracker() -> None:
    before = time.time() - 60
    tracker = ChangeTracker()
    now = time.time()
    # From before the tracker existed (an initial list of old slices): not a latency of ours.
    tracker.on_endpoint_slice_add(_triggered(eps("a", "a-1", "10.0.0.1"), before))
    assert tracker.take_trigger_times() == []
    # Only the annotation moved: nothing to program, nothing to measure (kube-proxy alike).
    tracker.on_endpoint_slice_update(_triggered(eps("a", "a-1", "10.0.0.1"), now + 1))
    assert tracker.take_trigger_times() == []
    assert tracker.stats.events["EndpointSlice/update"] == 1  # still counted as a change seen


def test_slice_delete_drops_the_services_pending_trigger_times() -> None:
    tracker = ChangeTracker()
    now = time.time()
    tracker.on_endpoint_slice_add(_triggered(eps("a", "a-1", "10.0.0.1"), now + 1))
    tracker.on_endpoint_slice_add(_triggered(eps("b", "b-1", "10.0.0.2"), now + 2))
    # A deleted slice's annotation dates from its last update, not from the deletion.
    tracker.on_endpoint_slice_delete("ns", "a-1")
    assert tracker.take_trigger_times() == [(IPFamily.IPv4, now + 2)]


def _merged_reference(ports, slices):  # the definition: merge, drop other families, sort
    from ovsproxy.proxy.tracker import merge_endpoint_slices

    merged = merge_endpoint_slices(sorted(slices, key=lambda s: s.name))
    out = {}
    for port in ports:
        families = {ip.version for ip in port.cluster_ips}
        found = merged.get((port.name.port, port.protocol), {}).values()
        kept = sorted((e for e in found if e.ip.version in families), key=lambda e: e.sort_key)
        out[port.name] = tuple(kept)
    return out


slice_endpoints = st.lists(
    st.builds(
        Endpoint,
        st.sampled_from(["10.244.0.1", "10.244.0.2", "10.244.0.3", "fd00::1", "fd00::2"]).map(
            ipaddress.ip_address
        ),
        st.sampled_from([8080, 8443]),
        ready=st.booleans(),
        terminating=st.booleans(),
        node_name=st.sampled_from([None, "n1", "n2"]),
    ),
    max_size=6,
)


@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(["", "http"]), slice_endpoints),
        max_size=4,
    ),
    st.sampled_from(["10.96.0.1", "fd00:96::1", "10.96.0.1,fd00:96::1"]),
)
def test_service_states_resolve_duplicates_as_merge_endpoint_slices(parts, cluster_ip) -> None:
    ports = svc("web", ("", 80), ("http", 81), cluster_ip=cluster_ip).ports
    slices = {}
    for name, port_name, endpoints in parts:  # one slice per name, the last one wins
        slices[name] = EndpointSlice(
            "ns", name, "web", (SlicePort(port_name, Protocol.TCP, tuple(endpoints)),)
        )
    states = service_states(ports, slices.values())
    assert {n: s.endpoints for n, s in states.items()} == _merged_reference(ports, slices.values())


# --- pending changes (kube-proxy's *_changes_pending gauges) -------------------------------


def test_pending_changes_count_as_kube_proxys_and_a_checkpoint_clears_them() -> None:
    tracker = ChangeTracker()
    assert (tracker.service_changes_pending, tracker.endpoint_changes_pending) == (0, 0)
    tracker.on_service_add(svc("a"))
    tracker.on_service_add(svc("b"))
    tracker.on_endpoint_slice_add(eps("a", "a-1", "10.0.0.1"))
    tracker.on_endpoint_slice_update(eps("a", "a-1", "10.0.0.2"))
    tracker.on_endpoint_slice_update(eps("a", "a-1", "10.0.0.2"))  # no change: not pending
    assert (tracker.service_changes_pending, tracker.endpoint_changes_pending) == (2, 2)
    tracker.on_service_delete("ns", "b")  # added then deleted: back to what it was
    assert tracker.service_changes_pending == 1
    tracker.checkpoint()
    assert (tracker.service_changes_pending, tracker.endpoint_changes_pending) == (0, 0)
    tracker.on_service_update(svc("a", ("http", 8080)))
    tracker.on_endpoint_slice_delete("ns", "a-1")
    tracker.on_endpoint_slice_delete("ns", "unknown")  # not ours: no change
    assert (tracker.service_changes_pending, tracker.endpoint_changes_pending) == (1, 1)


def test_trigger_times_carry_the_slices_family() -> None:
    tracker = ChangeTracker()
    now = time.time()
    tracker.on_service_add(svc("a", cluster_ip="fd00::1"))
    tracker.on_endpoint_slice_add(_triggered(eps("a", "a-1", "fd00:10::1"), now + 1))
    tracker.on_endpoint_slice_add(_triggered(eps("a", "a-2"), now + 2))  # empty: the Service's
    tracker.on_endpoint_slice_add(_triggered(eps("b", "b-1", "10.0.0.1"), now + 3))
    assert sorted(tracker.take_trigger_times(), key=lambda x: x[1]) == [
        (IPFamily.IPv6, now + 1),
        (IPFamily.IPv6, now + 2),
        (IPFamily.IPv4, now + 3),
    ]
