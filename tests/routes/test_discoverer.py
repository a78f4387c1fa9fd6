"""The Service CIDR discoverer: golden sequence, sync semantics, precedence, threads."""

from __future__ import annotations

import ipaddress
import random
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ovsproxy.model import IPFamily
from ovsproxy.servicecidr import (
    AGGREGATION_FLOOR,
    CIDRChange,
    CIDRSource,
    ServiceCIDRDiscoverer,
    aggregate,
    covers,
    service_cidr_for,
)
from ovsproxy.sources.servicecidrs import ServiceCIDREvents
from ovsproxy.sources.servicecidrs import convert_service_cidr as sc

net = ipaddress.ip_network
V4, V6 = IPFamily.IPv4, IPFamily.IPv6


def synced(**kwargs: object) -> ServiceCIDRDiscoverer:
    d = ServiceCIDRDiscoverer(**kwargs)  # type: ignore[arg-type]
    assert d.cluster_ips_synced() == []  # nothing known, nothing to say
    return d


def news(changes: list[CIDRChange]) -> list[tuple[IPFamily, tuple[str, ...]]]:
    return [(c.family, tuple(str(n) for n in c.new)) for c in changes]


def test_antrea_golden_sequence() -> None:
    d = synced()
    seen: list[CIDRChange] = []
    d.subscribe(seen.append)
    steps = [
        ("add", "10.10.0.1", [(V4, ("10.10.0.1/32",))]),
        ("add", "10.10.0.2", [(V4, ("10.10.0.0/30",))]),
        ("add", "10.10.0.5", [(V4, ("10.10.0.0/29",))]),
        ("add", "10.10.0.4", []),
        ("delete", "10.10.0.4", []),
        ("add", "10::1", [(V6, ("10::1/128",))]),
        ("add", "10::2", [(V6, ("10::/126",))]),
        ("add", "10::5", [(V6, ("10::/125",))]),
    ]
    for op, ip, expected in steps:
        changes = d.add_cluster_ip(ip) if op == "add" else d.delete_cluster_ip(ip)
        assert news(changes) == expected, (op, ip)
    # handlers saw exactly the returned events, in order, with increasing generations
    assert [c.generation for c in seen] == [1, 2, 3, 4, 5, 6]
    assert seen[1].old == (net("10.10.0.1/32"),)
    assert all(c.grows for c in seen)
    assert d.cidrs(V4) == (net("10.10.0.0/29"),)
    assert d.cidrs(V6) == (net("10::/125"),)
    assert d.desired() == {net("10.10.0.0/29"), net("10::/125")}


def test_nothing_is_emitted_before_sync_then_one_event_per_family() -> None:
    d = ServiceCIDRDiscoverer()
    rng = random.Random(1)
    ips = [ipaddress.IPv4Address(0x0A600000 + rng.randrange(2**16)) for _ in range(5000)]
    ips += [ipaddress.IPv6Address((0xFD00 << 112) + rng.randrange(2**16)) for _ in range(5000)]
    for ip in ips:
        assert d.add_cluster_ip(ip) == []
    assert not d.ready
    assert d.desired() == frozenset()
    changes = d.cluster_ips_synced()
    expected = service_cidr_for(ips)
    assert [(c.family, c.new) for c in changes] == [(V4, (expected[V4],)), (V6, (expected[V6],))]
    assert d.ready
    assert d.cluster_ips_synced() == []  # a second sync signal changes nothing


def test_deletes_shrink_to_what_the_remaining_cluster_ips_need() -> None:
    d = synced()
    d.add_cluster_ips(["10.96.0.1", "10.96.200.1", "fd00::1"])
    assert d.cidrs(V4) == (net("10.96.0.0/16"),)
    changes = d.delete_cluster_ips(["10.96.200.1"])
    assert news(changes) == [(V4, ("10.96.0.1/32",))]  # only the family that changed
    assert changes[0].withdrawn == (net("10.96.0.0/16"),)
    assert d.delete_cluster_ips(["10.96.0.1/32", "fd00::1"]) != []
    assert d.desired() == frozenset()  # the Services that needed the routes are gone
    changes = d.add_cluster_ip("10.97.0.1")
    assert news(changes) == [(V4, ("10.97.0.1/32",))]  # IPv6 did not change: no event for it


def test_far_apart_cluster_ips_are_never_routed_wider_than_the_floor() -> None:
    """Finding (issue 35): 10.96.0.1 beside 172.30.0.1 grew the route to 0.0.0.0/0, the
    node's default route; IPv6 fd00::1 beside 2001:db8::1 to ::/2."""
    d = synced()
    d.add_cluster_ips(["10.96.0.1", "10.96.0.9", "fd00:10:96::1"])
    d.add_cluster_ips(["172.30.0.1", "2001:db8::1"])
    assert d.cidrs(V4) == (net("10.96.0.0/28"), net("172.30.0.1/32"))
    assert d.cidrs(V6) == (net("2001:db8::1/128"), net("fd00:10:96::1/128"))
    # the aggregation fallback of a cluster with two ServiceCIDRs: the same
    d2 = ServiceCIDRDiscoverer(use_api=True)
    d2.add_cluster_ips(["10.96.0.1", "172.30.0.1"])
    d2.cluster_ips_synced()
    assert news(d2.service_cidr_api_unavailable()) == [(V4, ("10.96.0.1/32", "172.30.0.1/32"))]


v4_anywhere = st.integers(0, 2**32 - 1).map(ipaddress.IPv4Address)
v6_anywhere = st.integers(0, 2**128 - 1).map(ipaddress.IPv6Address)


@settings(max_examples=300)
@given(st.lists(st.one_of(v4_anywhere, v6_anywhere), min_size=1, max_size=30), st.randoms())
def test_aggregation_covers_every_cluster_ip_never_wider_than_the_floor(
    ips: list, rng: random.Random
) -> None:
    """Whatever the addresses and the order of adds and deletes: every known ClusterIP is
    covered, no prefix is shorter than the floor (so never a default route), and the result is
    ``aggregate`` of the addresses known now (a delete shrinks as far as the rest allows)."""
    d = synced()
    order = ips[:]
    rng.shuffle(order)
    for ip in order:
        d.add_cluster_ip(ip)
    for ip in order[: len(order) // 2]:
        d.delete_cluster_ip(ip)
    known = d.known_cluster_ips()
    desired = d.desired()
    assert all(covers(desired, ip) for ip in known)
    assert all(n.prefixlen >= AGGREGATION_FLOOR[IPFamily.of(n)] for n in desired)
    expected = aggregate(known)
    assert desired == {n for nets in expected.values() for n in nets}
    assert d.unrouted() == frozenset()


def test_one_event_per_family_for_a_dual_stack_service() -> None:
    d = synced()
    d.add_cluster_ips(["10.96.0.1", "fd00::1"])
    changes = d.add_cluster_ips(["10.96.0.9", "10.96.0.200", "fd00::9"])
    assert news(changes) == [(V4, ("10.96.0.0/24",)), (V6, ("fd00::/124",))]


def test_headless_invalid_and_unmanaged_are_skipped() -> None:
    d = synced(families=[V4])
    assert d.add_cluster_ips(["None", "", None, "garbage", "fd00::1"]) == []
    assert d.skipped == 5
    assert d.desired() == frozenset()
    assert d.add_cluster_ip("10.96.0.1/32") != []  # the /32 spelling is the address


def test_both_spellings_are_one_ip() -> None:
    d = synced()
    d.add_cluster_ip("10.96.0.1")
    assert d.add_cluster_ip("10.96.0.1/32") == []
    assert d.known_cluster_ips() == {ipaddress.ip_address("10.96.0.1")}
    # reference-counted: one delete per add
    d.delete_cluster_ip("10.96.0.1/32")
    assert d.known_cluster_ips() == {ipaddress.ip_address("10.96.0.1")}
    d.delete_cluster_ip("10.96.0.1")
    assert d.known_cluster_ips() == frozenset()


def test_configured_cidrs_win_and_a_cluster_ip_outside_is_reported_not_routed() -> None:
    """Finding (issue 35): a ClusterIP in 172.30.0.0/16 beside a configured 10.96.0.0/12 was
    routed by a spill-over prefix; far apart, that covers the node's own routes."""
    d = ServiceCIDRDiscoverer(["10.96.0.0/12"])
    d.add_cluster_ips(["10.96.0.1", "10.100.3.4", "172.30.0.1"])
    assert news(d.cluster_ips_synced()) == [(V4, ("10.96.0.0/12",))]
    assert d.unrouted() == {ipaddress.ip_address("172.30.0.1")}
    assert d.source(V4) is CIDRSource.CONFIGURED
    assert d.add_cluster_ip("10.111.0.1") == []  # inside the configured range
    assert d.add_cluster_ip("192.168.7.7") == []  # outside: reported, not routed
    assert d.desired() == {net("10.96.0.0/12")}
    assert d.unrouted() == {ipaddress.ip_address("172.30.0.1"), ipaddress.ip_address("192.168.7.7")}
    d.delete_cluster_ips(["192.168.7.7", "172.30.0.1"])
    assert d.unrouted() == frozenset()


def test_service_cidr_api_takes_over_from_aggregation_and_waits_for_its_sync() -> None:
    d = ServiceCIDRDiscoverer(use_api=True)
    d.add_cluster_ips(["10.96.0.1", "10.96.0.10", "fd00:10:96::a"])
    assert d.cluster_ips_synced() == []  # waits for the ServiceCIDR informer too
    d.upsert_service_cidr(
        sc(
            {
                "metadata": {"name": "kubernetes"},
                "spec": {"cidrs": ["10.96.0.0/16", "fd00:10:96::/112"]},
            }
        )
    )
    changes = d.service_cidrs_synced()
    assert news(changes) == [(V4, ("10.96.0.0/16",)), (V6, ("fd00:10:96::/112",))]
    assert {c.source for c in changes} == {CIDRSource.API}
    # a second ServiceCIDR adds a range (several per family)
    changes = d.upsert_service_cidr(
        sc({"metadata": {"name": "extra"}, "spec": {"cidrs": ["10.200.0.0/16"]}})
    )
    assert news(changes) == [(V4, ("10.96.0.0/16", "10.200.0.0/16"))]
    # and its deletion withdraws it, since no known ClusterIP is in it
    changes = d.delete_service_cidr("extra")
    assert news(changes) == [(V4, ("10.96.0.0/16",))]
    assert changes[0].withdrawn == (net("10.200.0.0/16"),)


def test_api_range_arriving_late_routes_what_was_unrouted() -> None:
    d = ServiceCIDRDiscoverer(use_api=True)
    d.upsert_service_cidr(
        sc({"metadata": {"name": "kubernetes"}, "spec": {"cidrs": ["10.96.0.0/16"]}})
    )
    d.service_cidrs_synced()
    d.cluster_ips_synced()
    # a Service from a new ServiceCIDR whose object we have not seen yet
    assert d.add_cluster_ip("10.200.0.5") == []
    assert d.unrouted() == {ipaddress.ip_address("10.200.0.5")}
    changes = d.upsert_service_cidr(
        sc({"metadata": {"name": "new"}, "spec": {"cidrs": ["10.200.0.0/24"]}})
    )
    assert news(changes) == [(V4, ("10.96.0.0/16", "10.200.0.0/24"))]
    assert changes[0].grows
    assert d.unrouted() == frozenset()


def test_deleting_a_service_cidr_leaves_its_stray_cluster_ips_unrouted() -> None:
    # The API server deletes a ServiceCIDR only once no ClusterIP is allocated from it (a
    # finalizer): a ClusterIP still in it is stale or did not come from the API server.
    d = ServiceCIDRDiscoverer(use_api=True)
    d.upsert_service_cidr(sc({"metadata": {"name": "a"}, "spec": {"cidrs": ["10.96.0.0/16"]}}))
    d.upsert_service_cidr(sc({"metadata": {"name": "b"}, "spec": {"cidrs": ["10.200.0.0/16"]}}))
    d.add_cluster_ips(["10.96.0.1", "10.200.0.7"])
    d.service_cidrs_synced()
    d.cluster_ips_synced()
    changes = d.delete_service_cidr("b")
    assert news(changes) == [(V4, ("10.96.0.0/16",))]
    assert d.unrouted() == {ipaddress.ip_address("10.200.0.7")}


def test_api_unavailable_falls_back_to_aggregation() -> None:
    d = ServiceCIDRDiscoverer(use_api=True)
    d.add_cluster_ips(["10.96.0.1", "10.96.0.2"])
    d.cluster_ips_synced()
    changes = d.service_cidr_api_unavailable()
    assert news(changes) == [(V4, ("10.96.0.0/30",))]
    assert changes[0].source is CIDRSource.AGGREGATED


def test_configured_beats_api() -> None:
    d = ServiceCIDRDiscoverer(["10.96.0.0/12"], use_api=True)
    d.upsert_service_cidr(
        sc({"metadata": {"name": "k"}, "spec": {"cidrs": ["10.96.0.0/16", "fd00::/112"]}})
    )
    d.service_cidrs_synced()
    changes = d.cluster_ips_synced()
    assert news(changes) == [(V4, ("10.96.0.0/12",)), (V6, ("fd00::/112",))]
    assert d.source(V4) is CIDRSource.CONFIGURED
    assert d.source(V6) is CIDRSource.API


def test_relist_replaces_all_objects() -> None:
    d = ServiceCIDRDiscoverer(use_api=True)
    d.upsert_service_cidr(sc({"metadata": {"name": "a"}, "spec": {"cidrs": ["10.96.0.0/16"]}}))
    d.service_cidrs_synced()
    d.cluster_ips_synced()
    changes = d.replace_service_cidrs(
        map(sc, [{"metadata": {"name": "a"}, "spec": {"cidrs": ["10.96.0.0/15"]}}])
    )
    assert news(changes) == [(V4, ("10.96.0.0/15",))]
    assert (
        d.replace_service_cidrs(
            map(sc, [{"metadata": {"name": "a"}, "spec": {"cidrs": ["10.96.0.0/15"]}}])
        )
        == []
    )


ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 40)),
        st.tuples(st.just("delete"), st.integers(0, 40)),
        st.tuples(
            st.just("cidr"), st.sampled_from(["a", "b"]), st.sampled_from([None, 22, 24, 28])
        ),
        st.tuples(st.just("sync"), st.sampled_from(["ips", "api"])),
    ),
    max_size=40,
)


@settings(max_examples=300)
@given(ops)
def test_every_known_cluster_ip_is_always_covered(sequence: list) -> None:
    """Whatever the order of ClusterIP, ServiceCIDR and sync events, once ready every known
    ClusterIP is inside the desired prefixes or reported unrouted (outside every API range),
    and each event's ``new`` is the current state."""
    d = ServiceCIDRDiscoverer(use_api=True)
    bases = {"a": 0x0A600000, "b": 0x0A600100}
    for step in sequence:
        if step[0] == "add":
            changes = d.add_cluster_ip(ipaddress.IPv4Address(0x0A600000 + step[1] * 37))
        elif step[0] == "delete":
            changes = d.delete_cluster_ip(ipaddress.IPv4Address(0x0A600000 + step[1] * 37))
        elif step[0] == "cidr":
            _, name, length = step
            if length is None:
                changes = d.delete_service_cidr(name)
            else:
                cidr = ipaddress.IPv4Network((bases[name], length), strict=False)
                changes = d.upsert_service_cidr(
                    sc({"metadata": {"name": name}, "spec": {"cidrs": [str(cidr)]}})
                )
        elif step[1] == "ips":
            changes = d.cluster_ips_synced()
        else:
            changes = d.service_cidrs_synced()
        for change in changes:
            assert change.new == d.cidrs(change.family)
        if d.ready:
            desired = d.desired()
            unrouted = d.unrouted()
            for ip in d.known_cluster_ips():
                assert covers(desired, ip) != (ip in unrouted), (ip, desired)


def test_concurrent_threads_end_with_the_full_list_result() -> None:
    d = synced()
    rng = random.Random(3)
    ips = [ipaddress.IPv4Address(0x0A600000 + rng.randrange(2**16)) for _ in range(4000)]
    ips += [ipaddress.IPv6Address((0xFD00 << 112) + rng.randrange(2**16)) for _ in range(4000)]
    rng.shuffle(ips)
    events: list[CIDRChange] = []
    lock = threading.Lock()

    def worker(chunk: list) -> None:
        for ip in chunk:
            for change in d.add_cluster_ip(ip):
                with lock:
                    events.append(change)

    threads = [threading.Thread(target=worker, args=(ips[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    expected = service_cidr_for(ips)
    assert d.cidrs(V4) == (expected[V4],)
    assert d.cidrs(V6) == (expected[V6],)
    generations = sorted(c.generation for c in events)
    assert generations == list(range(1, len(events) + 1))  # unique, no gaps
    # the newest event of each family is the final state
    for family in (V4, V6):
        last = max((c for c in events if c.family == family), key=lambda c: c.generation)
        assert last.new == d.cidrs(family)
    # growth from nothing to within a /16 takes at most 17 steps per family
    assert len(events) <= 2 * 17


def test_informer_handler_falls_back_then_hands_over_to_the_api() -> None:
    from ovsproxy.servicecidr import ServiceCIDRHandler

    d = ServiceCIDRDiscoverer(use_api=True)
    seen: list[CIDRChange] = []
    d.subscribe(seen.append)
    # raw informer objects, converted by the source, into the discoverer's handler
    handler = ServiceCIDREvents(ServiceCIDRHandler(d))
    d.add_cluster_ips(["10.96.0.1", "10.96.0.2"])
    d.cluster_ips_synced()
    assert seen == []  # waiting for the ServiceCIDR informer
    handler.on_error("ApiStatusError: 404 the server could not find the requested resource")
    assert news(seen) == [(V4, ("10.96.0.0/30",))]  # aggregation meanwhile
    handler.on_error("again")  # retries do not flap anything
    obj = {"metadata": {"name": "kubernetes"}, "spec": {"cidrs": ["10.96.0.0/16"]}}
    handler.on_add(obj)
    handler.on_synced()
    assert news(seen[1:]) == [(V4, ("10.96.0.0/16",))]
    handler.on_update({**obj, "spec": {"cidrs": ["10.96.0.0/15"]}})
    assert d.cidrs(V4) == (net("10.96.0.0/15"),)
    handler.on_delete(("", "kubernetes"))
    # the range is gone: aggregation again
    assert d.cidrs(V4) == (net("10.96.0.0/30"),)


async def test_the_feed_names_the_service_of_an_unrouted_cluster_ip(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from ovsproxy.model import ServicePort, ServicePortName, ServiceState
    from ovsproxy.proxy.followers import Committed
    from ovsproxy.servicecidr import ClusterIPFeed

    d = ServiceCIDRDiscoverer(["10.96.0.0/16"])
    feed = ClusterIPFeed(d)
    ips = {"ns/ok": "10.96.0.1", "evil/far": "172.30.0.1"}
    touched = {}
    for key, address in ips.items():
        namespace, name = key.split("/")
        port_name = ServicePortName(namespace, name)
        address_ = ipaddress.ip_address(address)
        touched[port_name] = ServiceState(ServicePort(port_name, (address_,), 80))
    everything = frozenset(ipaddress.ip_address(a) for a in ips.values())
    with caplog.at_level("WARNING", logger="ovsproxy.servicecidr.feed"):
        await feed.after_commit(Committed(touched, True, 1, lambda: everything))
    assert d.desired() == {net("10.96.0.0/16")}
    assert d.unrouted() == {ipaddress.ip_address("172.30.0.1")}
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "Service evil/far: ClusterIP 172.30.0.1 is outside every Service range" in warnings[0]
