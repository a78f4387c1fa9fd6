"""The steering table's desired content (pure): kube-proxy's nodePortAddresses and source-range
semantics, and diffs proportional to the change."""

from __future__ import annotations

import dataclasses
import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ovsproxy.model import IPFamily, Protocol, ServicePort, ServicePortName, ServiceType
from ovsproxy.steering import (
    NodePortAddresses,
    SteeringSet,
    SteeringTracker,
    apply,
    desired_state,
    diff,
    render,
)

ip = ipaddress.ip_address
net = ipaddress.ip_network
V4, V6 = IPFamily.IPv4, IPFamily.IPv6
NODE_IPS = [ip("192.168.50.1"), ip("10.0.0.1"), ip("fd50::1"), ip("fd60::1"), ip("127.0.0.1")]


def port(
    n: int,
    node_port: int = 0,
    *,
    cluster_ips: tuple[str, ...] = ("10.96.0.1",),
    protocol: Protocol = Protocol.TCP,
    external: tuple[str, ...] = (),
    lb: tuple[str, ...] = (),
    ranges: tuple[str, ...] = (),
) -> ServicePort:
    return ServicePort(
        name=ServicePortName("demo", f"svc-{n}", "", protocol),
        cluster_ips=tuple(ip(a) for a in cluster_ips),
        port=80,
        protocol=protocol,
        type=ServiceType.LOAD_BALANCER if lb else ServiceType.NODE_PORT,
        node_port=node_port,
        external_ips=tuple(ip(a) for a in external),
        load_balancer_ips=tuple(ip(a) for a in lb),
        load_balancer_source_ranges=tuple(net(r) for r in ranges),
    )


@pytest.mark.parametrize(
    "setting,expected",
    [
        ([], {"192.168.50.1", "10.0.0.1", "fd50::1", "fd60::1"}),  # default: all, no loopback
        (["primary"], {"192.168.50.1", "fd50::1"}),
        (["10.0.0.0/8"], {"10.0.0.1", "fd50::1", "fd60::1"}),  # IPv6 unlisted: all of it
        (["10.0.0.0/8", "fd60::/64"], {"10.0.0.1", "fd60::1"}),
        (["172.16.0.0/12"], {"fd50::1", "fd60::1"}),  # matches none of IPv4
        (["0.0.0.0/0", "::/0"], {"192.168.50.1", "10.0.0.1", "fd50::1", "fd60::1"}),
        (["127.0.0.0/8"], {"fd50::1", "fd60::1"}),  # localhost NodePorts: not supported
    ],
)
def test_node_port_addresses_follow_kube_proxy(setting: list[str], expected: set[str]) -> None:
    chosen = NodePortAddresses.parse(setting).select(NODE_IPS)
    assert chosen == {ip(a) for a in expected}


@pytest.mark.parametrize(
    "setting,message",
    [
        (["10.0.0.0/33"], "nodePortAddresses[0]: '10.0.0.0/33' is not a CIDR"),
        (["10.0.0.0/8", "nope"], "nodePortAddresses[1]: 'nope'"),
        (["10.0.0.1"], "nodePortAddresses[0]: '10.0.0.1' needs a prefix length"),
        (["primary", "10.0.0.0/8"], "nodePortAddresses[0]: 'primary' must be the only entry"),
    ],
)
def test_bad_node_port_addresses_are_named(setting: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        NodePortAddresses.parse(setting)


def test_sets_are_keyed_by_address_protocol_and_port() -> None:
    state = desired_state(
        [
            port(1, 30001, cluster_ips=("10.96.0.1", "fd00::1")),
            port(2, 30002, protocol=Protocol.UDP, external=("192.0.2.1", "2001:db8::9")),
            port(3, 0, lb=("203.0.113.1",)),
        ],
        NODE_IPS,
        NodePortAddresses.parse(["192.168.0.0/16"]),
    )
    assert state.elements(SteeringSet.NODEPORT_IPS, V4) == {(ip("192.168.50.1"),)}
    assert state.elements(SteeringSet.NODEPORT_IPS, V6) == {(ip("fd50::1"),), (ip("fd60::1"),)}
    assert state.elements(SteeringSet.NODEPORTS, V4) == {
        (Protocol.TCP, 30001),
        (Protocol.UDP, 30002),
    }
    # svc-2 is single-stack IPv4: no IPv6 NodePort (kube-proxy's IPv6 proxier never sees it)
    assert state.elements(SteeringSet.NODEPORTS, V6) == {(Protocol.TCP, 30001)}
    assert state.elements(SteeringSet.EXTERNAL, V4) == {
        (ip("192.0.2.1"), Protocol.UDP, 80),
        (ip("203.0.113.1"), Protocol.TCP, 80),
    }
    assert state.elements(SteeringSet.EXTERNAL, V6) == {(ip("2001:db8::9"), Protocol.UDP, 80)}
    assert state.elements(SteeringSet.FIREWALL, V4) == frozenset()


def test_source_ranges_restrict_only_load_balancer_ips() -> None:
    svc = port(
        1,
        30001,
        cluster_ips=("10.96.0.1", "fd00::1"),
        external=("192.0.2.1",),
        lb=("203.0.113.1", "2001:db8::1"),
        ranges=("198.51.100.0/24", "2001:db8:1::/48"),
    )
    state = desired_state([svc], NODE_IPS)
    lb4 = (ip("203.0.113.1"), Protocol.TCP, 80)
    lb6 = (ip("2001:db8::1"), Protocol.TCP, 80)
    assert state.elements(SteeringSet.FIREWALL, V4) == {lb4}  # not the external IP
    assert state.elements(SteeringSet.FIREWALL, V6) == {lb6}
    assert state.elements(SteeringSet.FIREWALL_ALLOW, V4) == {(*lb4, net("198.51.100.0/24"))}
    assert state.elements(SteeringSet.FIREWALL_ALLOW, V6) == {(*lb6, net("2001:db8:1::/48"))}
    # the NodePort is steered from everywhere, as in kube-proxy
    assert state.elements(SteeringSet.NODEPORTS, V4) == {(Protocol.TCP, 30001)}
    # ranges of one family only: the other family's LB IP is not restricted (kube-proxy
    # filters the ranges by family)
    only_v4 = dataclasses.replace(svc, load_balancer_source_ranges=(net("198.51.100.0/24"),))
    state = desired_state([only_v4], NODE_IPS)
    assert state.elements(SteeringSet.FIREWALL, V4) == {lb4}
    assert state.elements(SteeringSet.FIREWALL, V6) == frozenset()


def test_a_range_holding_the_node_ip_allows_the_lb_ip_as_source() -> None:
    svc = port(1, lb=("203.0.113.1", "203.0.113.2"), ranges=("192.168.0.0/16",))
    allow = desired_state([svc], NODE_IPS).elements(SteeringSet.FIREWALL_ALLOW, V4)
    dst = (ip("203.0.113.1"), Protocol.TCP, 80)
    assert (*dst, net("203.0.113.1/32")) in allow
    assert (*dst, net("203.0.113.2/32")) in allow
    # the primary node IP (192.168.50.1) decides; a range around a secondary one does not
    svc = port(1, lb=("203.0.113.1",), ranges=("10.0.0.0/8",))
    allow = desired_state([svc], NODE_IPS).elements(SteeringSet.FIREWALL_ALLOW, V4)
    assert allow == {(*dst, net("10.0.0.0/8"))}


def test_no_rule_per_service_the_skeleton_is_fixed() -> None:
    # an empty state: table swap + skeleton + only the node IPs
    empty = render.full_rebuild(desired_state([], NODE_IPS))
    assert empty[: 2 + len(render.skeleton())] == render.delete_table() + render.skeleton()
    assert len(empty) == 2 + len(render.skeleton()) + 2  # nodeport-ips-v4 and -v6
    many = desired_state([port(n, 30000 + n) for n in range(200)], NODE_IPS)
    commands = render.full_rebuild(many)
    rules = [c for c in commands if "rule" in c.get("add", {})]
    assert len(rules) == len([c for c in render.skeleton() if "rule" in c.get("add", {})])
    elements = [c for c in commands if "element" in c.get("add", {})]
    assert sum(len(c["add"]["element"]["elem"]) for c in elements) == many.size


# -- diffs -----------------------------------------------------------------------------------

_addresses = st.sampled_from(["192.0.2.1", "192.0.2.2", "2001:db8::1", "2001:db8::2"])
_ports = st.builds(
    port,
    st.integers(0, 30),
    st.sampled_from([0, 30001, 30002, 30003]),
    cluster_ips=st.sampled_from([("10.96.0.1",), ("fd00::1",), ("10.96.0.1", "fd00::1")]),
    protocol=st.sampled_from(list(Protocol)),
    external=st.lists(_addresses, max_size=2, unique=True).map(tuple),
    lb=st.lists(_addresses, max_size=2, unique=True).map(tuple),
    ranges=st.lists(
        st.sampled_from(["10.0.0.0/8", "192.168.0.0/16", "fd00::/8", "fd50::/16"]),
        max_size=2,
        unique=True,
    ).map(tuple),
)
_node_ips = st.lists(st.sampled_from(NODE_IPS), max_size=4, unique=True)


@settings(max_examples=200, deadline=None)
@given(st.lists(_ports, max_size=8), st.lists(_ports, max_size=8), _node_ips, _node_ips)
def test_applying_the_diff_gives_the_new_state(a, b, ips_a, ips_b) -> None:
    old, new = desired_state(a, ips_a), desired_state(b, ips_b)
    change = diff(old, new)
    assert apply(old, change) == new
    # minimal: exactly the elements that differ, nothing else
    differing = sum(
        len(old.elements(*k) ^ new.elements(*k)) for k in old.sets.keys() | new.sets.keys()
    )
    assert change.size == differing
    assert not diff(new, new)


@settings(max_examples=50, deadline=None)
@given(st.lists(_ports, max_size=30), _ports)
def test_one_more_service_costs_its_own_elements_only(base, extra) -> None:
    old = desired_state(base, NODE_IPS)
    new = desired_state([*base, extra], NODE_IPS)
    node_only = desired_state([], NODE_IPS)
    alone = desired_state([extra], NODE_IPS).size - node_only.size  # its own elements
    change = diff(old, new)
    assert not change.deletes
    assert change.size <= alone
    commands = render.patch(change)
    assert sum(len(c["add"]["element"]["elem"]) for c in commands) == change.size


# -- the incremental tracker -----------------------------------------------------------------

_op = st.tuples(st.integers(0, 6), st.one_of(st.none(), _ports))


@settings(max_examples=200, deadline=None)
@given(st.lists(_op, max_size=25), _node_ips, st.lists(st.tuples(st.integers(0, 25), _node_ips)))
def test_tracker_equals_recomputing_and_its_changes_apply(ops, ips, ip_changes) -> None:
    """After any sequence of Service updates and node IP changes, the tracker's state is the
    from-scratch desired state, and the changes it hands out turn one into the next."""
    tracker = SteeringTracker(ips)
    current: dict[int, ServicePort] = {}
    installed = tracker.state()
    assert installed == desired_state([], ips)
    tracker.take_changes()
    node_ips = ips
    changes_at = dict(ip_changes)
    for step, (slot, value) in enumerate(ops):
        name = ServicePortName("demo", f"slot-{slot}")
        if value is None:
            current.pop(slot, None)
            tracker.update(None, name=name)
        else:
            value = dataclasses.replace(value, name=name)
            current[slot] = value
            tracker.update(value)
        if step in changes_at:
            node_ips = changes_at[step]
            tracker.set_node_ips(node_ips)
        expected = desired_state(current.values(), node_ips)
        assert tracker.state() == expected
        change = tracker.take_changes()
        assert apply(installed, change) == expected
        assert change.size == diff(installed, expected).size  # minimal
        installed = expected
