"""Pure Service CIDR functions: parsing, aggregation, precedence, ServiceCIDR conversion."""

from __future__ import annotations

import ipaddress
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ovsproxy.model import IPFamily
from ovsproxy.servicecidr import (
    CIDRSource,
    common_prefix,
    covers,
    grow,
    parse_cluster_ip,
    parse_configured_cidrs,
    reduce_networks,
    select_source,
    service_cidr_for,
    to_network,
)
from ovsproxy.sources.servicecidrs import convert_service_cidr

net = ipaddress.ip_network
addr = ipaddress.ip_address

ipv4s = st.integers(0, 2**32 - 1).map(ipaddress.IPv4Address)
ipv6s = st.integers(0, 2**128 - 1).map(ipaddress.IPv6Address)
# Clustered addresses exercise long common prefixes, like real Service ranges.
clustered_v4 = st.integers(0, 2**16 - 1).map(lambda n: ipaddress.IPv4Address(0x0A600000 + n))
any_ips = st.lists(st.one_of(ipv4s, ipv6s, clustered_v4), min_size=1, max_size=60)


# -- parsing -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "10.96.0.1",
        "10.96.0.1/32",
        " 10.96.0.1 ",
        addr("10.96.0.1"),
        net("10.96.0.1/32"),
        ipaddress.ip_interface("10.96.0.1/32"),
    ],
)
def test_every_spelling_of_a_cluster_ip_is_the_same_address(value: object) -> None:
    assert parse_cluster_ip(value) == addr("10.96.0.1")  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["FD00::0001", "fd00::1/128", "fd00:0:0:0:0:0:0:1"])
def test_ipv6_spellings(value: str) -> None:
    assert parse_cluster_ip(value) == addr("fd00::1")


@pytest.mark.parametrize(
    "value", [None, "", "None", "none", "10.96.0.256", "10.96.0.0/24", "fe80::1%eth0", "x", 17]
)
def test_headless_and_invalid_cluster_ips_are_skipped(value: object) -> None:
    assert parse_cluster_ip(value) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("10.96.0.1", "10.96.0.1/32"),
        ("10.96.0.1/32", "10.96.0.1/32"),
        ("10.96.0.5/24", "10.96.0.0/24"),
        ("10.96.0.0/255.255.0.0", "10.96.0.0/16"),
        ("FD00:10:96::0/112", "fd00:10:96::/112"),
        (addr("fd00::1"), "fd00::1/128"),
    ],
)
def test_to_network_is_canonical(value: object, expected: str) -> None:
    result = to_network(value)  # type: ignore[arg-type]
    assert result == net(expected)
    assert str(result) == expected


def test_to_network_rejects_garbage() -> None:
    for bad in ("nope", "10.96.0.0/33", "fe80::1%eth0"):
        with pytest.raises(ValueError):
            to_network(bad)


# -- aggregation -------------------------------------------------------------------------


def test_antrea_growth_sequence_step_by_step() -> None:
    """The sequence of Antrea's discoverer test, on the pure function."""
    cidr = grow(None, addr("10.10.0.1"))
    assert cidr == net("10.10.0.1/32")
    cidr = grow(cidr, addr("10.10.0.2"))
    assert cidr == net("10.10.0.0/30")
    cidr = grow(cidr, addr("10.10.0.5"))
    assert cidr == net("10.10.0.0/29")
    assert grow(cidr, addr("10.10.0.4")) is cidr  # inside: unchanged, same object
    v6 = grow(None, addr("10::1"))
    assert v6 == net("10::1/128")
    v6 = grow(v6, addr("10::2"))
    assert v6 == net("10::/126")
    assert grow(v6, addr("10::5")) == net("10::/125")


def test_common_prefix_examples() -> None:
    assert common_prefix(net("10.96.0.0/16"), addr("10.97.0.1")) == net("10.96.0.0/15")
    assert common_prefix(net("10.96.0.0/16"), addr("192.168.0.1")) == net("0.0.0.0/0")
    assert common_prefix(net("10.96.0.0/16"), net("10.96.3.0/24")) == net("10.96.0.0/16")
    # 128 bits for IPv6, and a small address stays IPv6 (no int -> IPv4 confusion)
    assert common_prefix(net("::1/128"), addr("::2")) == net("::/126")
    with pytest.raises(ValueError):
        common_prefix(net("10.0.0.0/8"), addr("::1"))


def test_service_cidr_for_skips_invalid_and_splits_families() -> None:
    result = service_cidr_for(
        ["10.96.0.1", "None", "", "10.96.255.3/32", "bogus", "fd00::1", None, "fd00::1:0"]
    )
    assert result == {IPFamily.IPv4: net("10.96.0.0/16"), IPFamily.IPv6: net("fd00::/111")}
    assert service_cidr_for([]) == {}
    assert service_cidr_for(["None"]) == {}


def test_ten_thousand_ips_of_a_slash_16_aggregate_to_at_most_the_slash_16() -> None:
    rng = random.Random(7)
    ips = [ipaddress.IPv4Address(0x0A600000 + rng.randrange(2**16)) for _ in range(10_000)]
    (cidr,) = service_cidr_for(ips).values()
    assert cidr.subnet_of(net("10.96.0.0/16"))
    assert all(ip in cidr for ip in ips)


@given(any_ips)
def test_the_cidr_contains_every_ip_seen(ips: list) -> None:
    result = service_cidr_for(ips)
    for ip in ips:
        assert ip in result[IPFamily.of(ip)]


@given(any_ips)
def test_the_cidr_is_the_smallest_such_prefix(ips: list) -> None:
    for family, cidr in service_cidr_for(ips).items():
        members = [ip for ip in ips if IPFamily.of(ip) == family]
        if cidr.prefixlen < cidr.max_prefixlen:
            low, high = cidr.subnets(1)
            # minimal: neither half holds them all, so both halves hold one
            assert any(ip in low for ip in members)
            assert any(ip in high for ip in members)


@given(any_ips, st.randoms(use_true_random=False))
def test_the_full_list_result_is_order_independent(ips: list, rnd: random.Random) -> None:
    shuffled = list(ips)
    rnd.shuffle(shuffled)
    assert service_cidr_for(shuffled) == service_cidr_for(ips)


@given(any_ips)
def test_growing_never_shrinks_and_ends_where_the_full_list_does(ips: list) -> None:
    current: dict[IPFamily, ipaddress.IPv4Network | ipaddress.IPv6Network] = {}
    for ip in ips:
        family = IPFamily.of(ip)
        before = current.get(family)
        after = grow(before, ip)
        if before is not None:
            assert before.subnet_of(after)  # type: ignore[arg-type]
        assert ip in after
        current[family] = after
    assert current == service_cidr_for(ips)


@given(any_ips)
def test_aggregation_is_idempotent(ips: list) -> None:
    once = service_cidr_for(ips)
    assert service_cidr_for(ips + ips) == once
    # feeding the result's own network address back changes nothing
    for family, cidr in once.items():
        assert grow(cidr, cidr.network_address) is cidr
        assert service_cidr_for([*ips, cidr.network_address])[family] == cidr


networks = st.one_of(
    st.tuples(ipv4s, st.integers(0, 32)).map(lambda t: net((int(t[0]), t[1]), strict=False)),
    st.tuples(ipv6s, st.integers(0, 128)).map(
        lambda t: ipaddress.IPv6Network((int(t[0]), t[1]), strict=False)
    ),
)


@settings(max_examples=200)
@given(st.lists(networks, max_size=20))
def test_reduce_keeps_coverage_and_drops_only_contained(nets: list) -> None:
    kept = reduce_networks(nets)
    assert kept <= set(nets)
    for n in nets:
        assert covers(kept, n)
    for a in kept:
        assert not any(a != b and a.version == b.version and a.subnet_of(b) for b in kept)


def test_reduce_does_not_merge_adjacent_prefixes() -> None:
    kept = reduce_networks([net("10.0.0.0/25"), net("10.0.0.128/25"), net("10.0.0.7/32")])
    assert kept == {net("10.0.0.0/25"), net("10.0.0.128/25")}


# -- sources and precedence --------------------------------------------------------------


def test_networks_from_service_cidr_object() -> None:
    obj = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "ServiceCIDR",
        "metadata": {"name": "kubernetes"},
        "spec": {"cidrs": ["10.96.0.0/28", "2001:db8::/64", "not-a-cidr", "10.96.0.0/28"]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    cidr = convert_service_cidr(obj)
    assert cidr.name == "kubernetes"
    assert cidr.cidrs == (net("10.96.0.0/28"), net("2001:db8::/64"))
    assert convert_service_cidr({"metadata": {"name": "empty"}}).cidrs == ()


def test_service_cidr_being_deleted_still_counts() -> None:
    obj = {
        "metadata": {"name": "extra", "deletionTimestamp": "2025-01-01T00:00:00Z"},
        "spec": {"cidrs": ["10.100.0.0/16"]},
        "status": {"conditions": [{"type": "Ready", "status": "False", "reason": "Terminating"}]},
    }
    assert convert_service_cidr(obj).cidrs == (net("10.100.0.0/16"),)


def test_parse_configured_cidrs() -> None:
    got = parse_configured_cidrs(
        ["10.96.0.0/12,fd00:10:96::/112", " 10.100.0.0/16 ", "10.96.0.0/12"]
    )
    assert got == {
        IPFamily.IPv4: (net("10.96.0.0/12"), net("10.100.0.0/16")),
        IPFamily.IPv6: (net("fd00:10:96::/112"),),
    }
    with pytest.raises(ValueError, match=r"did you mean 10\.96\.0\.0/12"):
        parse_configured_cidrs(["10.96.0.1/12"])
    with pytest.raises(ValueError, match="needs a length"):
        parse_configured_cidrs(["10.96.0.0"])
    with pytest.raises(ValueError):
        parse_configured_cidrs(["banana/12"])


def test_precedence_configured_then_api_then_aggregation() -> None:
    v4 = IPFamily.IPv4
    configured = {v4: (net("10.96.0.0/12"),)}
    api = {v4: (net("10.100.0.0/16"),), IPFamily.IPv6: (net("fd00::/108"),)}
    assert select_source(v4, configured, api) == (CIDRSource.CONFIGURED, configured[v4])
    assert select_source(v4, {}, api) == (CIDRSource.API, api[v4])
    assert select_source(IPFamily.IPv6, configured, api) == (CIDRSource.API, api[IPFamily.IPv6])
    assert select_source(v4, {}, None) == (CIDRSource.AGGREGATED, ())  # API not synced
    assert select_source(v4, {}, {}) == (CIDRSource.AGGREGATED, ())  # API names nothing


def cluster_ips_of_service(obj: dict) -> tuple:
    """A Service object's ClusterIPs as parse_cluster_ip reads each spelling (test helper: the
    sources convert Services themselves)."""
    spec = obj.get("spec") or {}
    ips: list = []
    for value in spec.get("clusterIPs") or [spec.get("clusterIP")]:
        ip = parse_cluster_ip(value)
        if ip is not None and ip not in ips:
            ips.append(ip)
    return tuple(ips)


def test_cluster_ips_of_service() -> None:
    assert cluster_ips_of_service(
        {"spec": {"clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10", "fd00::a"]}}
    ) == (addr("10.96.0.10"), addr("fd00::a"))
    assert cluster_ips_of_service({"spec": {"clusterIP": "None", "clusterIPs": ["None"]}}) == ()
    assert cluster_ips_of_service({"spec": {"clusterIP": "10.96.0.1"}}) == (addr("10.96.0.1"),)
    assert cluster_ips_of_service({"spec": {"type": "ExternalName"}}) == ()
