"""categorize_endpoints against kube-proxy's TestCategorizeEndpoints cases, plus properties.

The table reproduces the cases of kube-proxy's pkg/proxy/topology_test.go (ready / serving /
terminating x local / cluster x topology), with the same expected endpoint sets, and adds
PreferSameNode cases for the node hints newer kube-proxy reads. A kube-proxy endpoint's
``isLocal`` flag is an endpoint on NODE here.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ovsproxy.model import (
    Endpoint,
    IPFamily,
    ServicePort,
    ServicePortName,
    ServiceType,
    TrafficPolicy,
)
from ovsproxy.proxy.categorize import (
    TopologyMode,
    categorize_endpoints,
    topology_mode,
)

NODE = "node-a"
OTHER_NODE = "node-b"


def ep(
    address: str,
    *,
    ready: bool = False,
    serving: bool = False,
    terminating: bool = False,
    local: bool = False,
    zones: tuple[str, ...] = (),
    nodes: tuple[str, ...] = (),
) -> Endpoint:
    """An endpoint as kube-proxy's test literal writes it (unset conditions are false)."""
    host, _, port = address.rpartition(":")
    return Endpoint(
        ip=ipaddress.ip_address(host),
        port=int(port),
        ready=ready,
        serving=serving,
        terminating=terminating,
        node_name=NODE if local else OTHER_NODE,
        hint_zones=frozenset(zones),
        hint_nodes=frozenset(nodes),
    )


def service_port(*, itp_local: bool = False, etp_local: bool = False, node_port: int = 0):
    return ServicePort(
        name=ServicePortName("ns", "svc"),
        cluster_ips=(ipaddress.ip_address("10.96.0.10"),),
        port=80,
        internal_traffic_policy=TrafficPolicy.LOCAL if itp_local else TrafficPolicy.CLUSTER,
        external_traffic_policy=TrafficPolicy.LOCAL if etp_local else TrafficPolicy.CLUSTER,
        type=ServiceType.NODE_PORT if node_port else ServiceType.CLUSTER_IP,
        node_port=node_port,
    )


@dataclass
class Case:
    name: str
    endpoints: list[Endpoint]
    cluster: set[str] | None
    local: set[str] | None
    all: set[str] | None = None  # defaults to whichever of cluster/local is used
    zone: str | None = None
    port: ServicePort = field(default_factory=service_port)
    only_remote: bool = False  # has_any although nothing is reachable from this node


def ready_ep(address: str, **kw) -> Endpoint:
    return ep(address, ready=True, **kw)


CASES = [
    Case(
        "should use topology since all endpoints have hints, node has a zone label and "
        "there are endpoints for the node's zone",
        [
            ready_ep("10.1.2.3:80", zones=("zone-a",)),
            ready_ep("10.1.2.4:80", zones=("zone-b",)),
            ready_ep("10.1.2.5:80", zones=("zone-c",)),
            ready_ep("10.1.2.6:80", zones=("zone-a",)),
        ],
        cluster={"10.1.2.3:80", "10.1.2.6:80"},
        local=None,
        zone="zone-a",
    ),
    Case(
        "externalTrafficPolicy: Local, topology ignored for Local endpoints",
        [
            ready_ep("10.1.2.3:80", zones=("zone-a",), local=True),
            ready_ep("10.1.2.4:80", zones=("zone-b",), local=True),
            ready_ep("10.1.2.5:80", zones=("zone-c",)),
            ready_ep("10.1.2.6:80", zones=("zone-a",)),
        ],
        cluster={"10.1.2.3:80", "10.1.2.6:80"},
        local={"10.1.2.3:80", "10.1.2.4:80"},
        all={"10.1.2.3:80", "10.1.2.4:80", "10.1.2.6:80"},
        zone="zone-a",
        port=service_port(etp_local=True, node_port=8080),
    ),
    Case(
        "internalTrafficPolicy: Local, topology ignored for Local endpoints",
        [
            ready_ep("10.1.2.3:80", zones=("zone-a",), local=True),
            ready_ep("10.1.2.4:80", zones=("zone-b",), local=True),
            ready_ep("10.1.2.5:80", zones=("zone-c",)),
            ready_ep("10.1.2.6:80", zones=("zone-a",)),
        ],
        cluster={"10.1.2.3:80", "10.1.2.6:80"},
        local={"10.1.2.3:80", "10.1.2.4:80"},
        all={"10.1.2.3:80", "10.1.2.4:80", "10.1.2.6:80"},
        zone="zone-a",
        port=service_port(itp_local=True, node_port=8080),
    ),
    Case(
        "empty node labels",
        [ready_ep("10.1.2.3:80", zones=("zone-a",))],
        cluster={"10.1.2.3:80"},
        local=None,
        zone=None,
    ),
    Case(
        "empty zone label",
        [ready_ep("10.1.2.3:80", zones=("zone-a",))],
        cluster={"10.1.2.3:80"},
        local=None,
        zone="",
    ),
    Case(
        "node in different zone, no endpoint filtering",
        [ready_ep("10.1.2.3:80", zones=("zone-a",))],
        cluster={"10.1.2.3:80"},
        local=None,
        zone="zone-b",
    ),
    Case(
        "unready endpoint",
        [
            ready_ep("10.1.2.3:80", zones=("zone-a",)),
            ready_ep("10.1.2.4:80", zones=("zone-b",)),
            ready_ep("10.1.2.5:80", zones=("zone-c",)),
            ep("10.1.2.6:80", zones=("zone-a",)),
        ],
        cluster={"10.1.2.3:80"},
        local=None,
        zone="zone-a",
    ),
    Case(
        "only unready endpoints in same zone (should not filter)",
        [
            ep("10.1.2.3:80", zones=("zone-a",)),
            ready_ep("10.1.2.4:80", zones=("zone-b",)),
            ready_ep("10.1.2.5:80", zones=("zone-c",)),
            ep("10.1.2.6:80", zones=("zone-a",)),
        ],
        cluster={"10.1.2.4:80", "10.1.2.5:80"},
        local=None,
        zone="zone-a",
    ),
    Case(
        "missing hints, no filtering applied",
        [
            ready_ep("10.1.2.3:80", zones=("zone-a",)),
            ready_ep("10.1.2.4:80", zones=("zone-b",)),
            ready_ep("10.1.2.5:80"),
            ready_ep("10.1.2.6:80", zones=("zone-a",)),
        ],
        cluster={"10.1.2.3:80", "10.1.2.4:80", "10.1.2.5:80", "10.1.2.6:80"},
        local=None,
        zone="zone-a",
    ),
    Case(
        "multiple hints per endpoint, filtering includes any endpoint with zone included",
        [
            ready_ep("10.1.2.3:80", zones=("zone-a", "zone-b", "zone-c")),
            ready_ep("10.1.2.4:80", zones=("zone-b", "zone-c")),
            ready_ep("10.1.2.5:80", zones=("zone-b", "zone-d")),
            ready_ep("10.1.2.6:80", zones=("zone-c",)),
        ],
        cluster={"10.1.2.3:80", "10.1.2.4:80", "10.1.2.6:80"},
        local=None,
        zone="zone-c",
    ),
    Case(
        "conflicting topology and localness require merging allEndpoints",
        [
            ready_ep("10.0.0.0:80", zones=("zone-a",), local=True),
            ready_ep("10.0.0.1:80", zones=("zone-b",), local=True),
            ready_ep("10.0.0.2:80", zones=("zone-a",)),
            ready_ep("10.0.0.3:80", zones=("zone-b",)),
        ],
        cluster={"10.0.0.0:80", "10.0.0.2:80"},
        local={"10.0.0.0:80", "10.0.0.1:80"},
        all={"10.0.0.0:80", "10.0.0.1:80", "10.0.0.2:80"},
        zone="zone-a",
        port=service_port(etp_local=True, node_port=8080),
    ),
    Case(
        "internalTrafficPolicy: Local, with empty endpoints",
        [],
        cluster=None,
        local=set(),
        port=service_port(itp_local=True),
    ),
    Case(
        "internalTrafficPolicy: Local, but all endpoints are remote",
        [ready_ep("10.0.0.0:80"), ready_ep("10.0.0.1:80")],
        cluster=None,
        local=set(),
        port=service_port(itp_local=True),
        only_remote=True,
    ),
    Case(
        "internalTrafficPolicy: Local, all endpoints are local",
        [ready_ep("10.0.0.0:80", local=True), ready_ep("10.0.0.1:80", local=True)],
        cluster=None,
        local={"10.0.0.0:80", "10.0.0.1:80"},
        port=service_port(itp_local=True),
    ),
    Case(
        "internalTrafficPolicy: Local, some endpoints are local",
        [ready_ep("10.0.0.0:80", local=True), ready_ep("10.0.0.1:80")],
        cluster=None,
        local={"10.0.0.0:80"},
        port=service_port(itp_local=True),
    ),
    Case(
        "Cluster traffic policy, endpoints not Ready",
        [ep("10.0.0.0:80"), ep("10.0.0.1:80")],
        cluster=set(),
        local=None,
    ),
    Case(
        "Cluster traffic policy, some endpoints are Ready",
        [ep("10.0.0.0:80"), ready_ep("10.0.0.1:80")],
        cluster={"10.0.0.1:80"},
        local=None,
    ),
    Case(
        "Cluster traffic policy, all endpoints are terminating",
        [
            ep("10.0.0.0:80", serving=True, terminating=True, local=True),
            ep("10.0.0.1:80", serving=True, terminating=True),
        ],
        cluster={"10.0.0.0:80", "10.0.0.1:80"},
        local=None,
    ),
    Case(
        "iTP: Local, eTP: Cluster, some endpoints local",
        [ready_ep("10.0.0.0:80", local=True), ready_ep("10.0.0.1:80")],
        cluster={"10.0.0.0:80", "10.0.0.1:80"},
        local={"10.0.0.0:80"},
        all={"10.0.0.0:80", "10.0.0.1:80"},
        port=service_port(itp_local=True, node_port=8080),
    ),
    Case(
        "iTP: Cluster, eTP: Local, some endpoints local",
        [ready_ep("10.0.0.0:80", local=True), ready_ep("10.0.0.1:80")],
        cluster={"10.0.0.0:80", "10.0.0.1:80"},
        local={"10.0.0.0:80"},
        all={"10.0.0.0:80", "10.0.0.1:80"},
        port=service_port(etp_local=True, node_port=8080),
    ),
    Case(
        "iTP: Local, eTP: Local, some endpoints local",
        [ready_ep("10.0.0.0:80", local=True), ready_ep("10.0.0.1:80")],
        cluster={"10.0.0.0:80", "10.0.0.1:80"},
        local={"10.0.0.0:80"},
        all={"10.0.0.0:80", "10.0.0.1:80"},
        port=service_port(itp_local=True, etp_local=True, node_port=8080),
    ),
    Case(
        "iTP: Local, eTP: Local, all endpoints remote",
        [ready_ep("10.0.0.0:80"), ready_ep("10.0.0.1:80")],
        cluster={"10.0.0.0:80", "10.0.0.1:80"},
        local=set(),
        all={"10.0.0.0:80", "10.0.0.1:80"},
        port=service_port(itp_local=True, etp_local=True, node_port=8080),
    ),
    Case(
        "iTP: Local, eTP: Local, all endpoints remote and terminating",
        [
            ep("10.0.0.0:80", serving=True, terminating=True),
            ep("10.0.0.1:80", serving=True, terminating=True),
        ],
        cluster={"10.0.0.0:80", "10.0.0.1:80"},
        local=set(),
        all={"10.0.0.0:80", "10.0.0.1:80"},
        port=service_port(itp_local=True, etp_local=True, node_port=8080),
        only_remote=True,
    ),
    Case(
        "iTP: Cluster, eTP: Local, with terminating endpoints",
        [
            ready_ep("10.0.0.0:80"),
            ep("10.0.0.1:80", local=True),
            ep("10.0.0.2:80", serving=True, terminating=True, local=True),
            ep("10.0.0.3:80", serving=True, terminating=True),
        ],
        cluster={"10.0.0.0:80"},
        local={"10.0.0.2:80"},
        all={"10.0.0.0:80", "10.0.0.2:80"},
        port=service_port(etp_local=True, node_port=8080),
    ),
    Case(
        "externalTrafficPolicy ignored if not externally accessible",
        [ready_ep("10.0.0.0:80"), ready_ep("10.0.0.1:80", local=True)],
        cluster={"10.0.0.0:80", "10.0.0.1:80"},
        local=None,
        all={"10.0.0.0:80", "10.0.0.1:80"},
        port=service_port(etp_local=True),
    ),
    Case(
        "no cluster endpoints for iTP:Local internal-only service",
        [ready_ep("10.0.0.0:80"), ready_ep("10.0.0.1:80", local=True)],
        cluster=None,
        local={"10.0.0.1:80"},
        all={"10.0.0.1:80"},
        port=service_port(itp_local=True),
    ),
    # PreferSameNode (trafficDistribution: PreferSameNode makes the controller write node
    # hints, and zone hints too).
    Case(
        "PreferSameNode: every endpoint has a node hint and one is for this node",
        [
            ready_ep("10.0.0.0:80", nodes=(NODE,), zones=("zone-a",), local=True),
            ready_ep("10.0.0.1:80", nodes=(OTHER_NODE,), zones=("zone-a",)),
            ready_ep("10.0.0.2:80", nodes=("node-c",), zones=("zone-b",)),
        ],
        cluster={"10.0.0.0:80"},
        local=None,
        zone="zone-a",
    ),
    Case(
        "PreferSameNode: no node hint for this node, falls back to the zone",
        [
            ready_ep("10.0.0.1:80", nodes=(OTHER_NODE,), zones=("zone-a",)),
            ready_ep("10.0.0.2:80", nodes=("node-c",), zones=("zone-b",)),
        ],
        cluster={"10.0.0.1:80"},
        local=None,
        zone="zone-a",
    ),
    Case(
        "PreferSameNode: one ready endpoint lacks a node hint, zone hints decide",
        [
            ready_ep("10.0.0.0:80", nodes=(NODE,), zones=("zone-a",), local=True),
            ready_ep("10.0.0.1:80", zones=("zone-a",)),
            ready_ep("10.0.0.2:80", nodes=("node-c",), zones=("zone-b",)),
        ],
        cluster={"10.0.0.0:80", "10.0.0.1:80"},
        local=None,
        zone="zone-a",
    ),
    Case(
        "PreferSameNode: a not-ready endpoint without hints does not disable topology",
        [
            ready_ep("10.0.0.0:80", nodes=(NODE,), zones=("zone-a",), local=True),
            ep("10.0.0.1:80"),
            ready_ep("10.0.0.2:80", nodes=("node-c",), zones=("zone-b",)),
        ],
        cluster={"10.0.0.0:80"},
        local=None,
        zone="zone-a",
    ),
    Case(
        "PreferSameNode: no node or zone hint matches, whole cluster",
        [
            ready_ep("10.0.0.1:80", nodes=(OTHER_NODE,), zones=("zone-b",)),
            ready_ep("10.0.0.2:80", nodes=("node-c",), zones=("zone-b",)),
        ],
        cluster={"10.0.0.1:80", "10.0.0.2:80"},
        local=None,
        zone="zone-a",
    ),
    Case(
        "PreferSameNode: this node's hinted endpoint is only terminating, hints ignored",
        [
            ep("10.0.0.0:80", serving=True, terminating=True, nodes=(NODE,), local=True),
            ready_ep("10.0.0.1:80", nodes=(OTHER_NODE,)),
        ],
        cluster={"10.0.0.1:80"},
        local=None,
        zone="zone-a",
    ),
    Case(
        "PreferSameNode with eTP Local merges the topology-excluded local endpoint",
        [
            ready_ep("10.0.0.0:80", nodes=(OTHER_NODE,), local=True),
            ready_ep("10.0.0.1:80", nodes=(NODE,)),
        ],
        cluster={"10.0.0.1:80"},
        local={"10.0.0.0:80"},
        all={"10.0.0.0:80", "10.0.0.1:80"},
        zone="zone-a",
        port=service_port(etp_local=True, node_port=30080),
    ),
]


def addresses(endpoints) -> set[str] | None:
    return None if endpoints is None else {str(e) for e in endpoints}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_categorize_endpoints_matches_kube_proxy(case: Case) -> None:
    result = categorize_endpoints(case.endpoints, case.port, NODE, case.zone)

    assert addresses(result.cluster) == case.cluster
    assert addresses(result.local) == case.local
    if case.all is not None:
        expected_all = case.all
    else:
        expected_all = case.cluster if case.local is None else case.local
    assert addresses(result.all_reachable) == expected_all
    assert result.has_any == (bool(expected_all) or case.only_remote)


def test_topology_mode_names_the_chosen_filter() -> None:
    node_hinted = [ready_ep("10.0.0.0:80", nodes=(NODE,), zones=("zone-a",))]
    zone_hinted = [ready_ep("10.0.0.0:80", zones=("zone-a",))]
    assert topology_mode(node_hinted, NODE, "zone-a") is TopologyMode.PREFER_SAME_NODE
    assert topology_mode(zone_hinted, NODE, "zone-a") is TopologyMode.PREFER_SAME_ZONE
    assert topology_mode(zone_hinted, NODE, "zone-b") is TopologyMode.NONE
    assert topology_mode([ep("10.0.0.0:80", zones=("zone-a",))], NODE, "zone-a") == ""


def test_family_filter_keeps_only_that_family() -> None:
    v4 = ready_ep("10.0.0.1:80")
    v6 = Endpoint(ipaddress.ip_address("fd00::1"), 80)
    result = categorize_endpoints([v4, v6], service_port(), NODE, family=IPFamily.IPv6)
    assert result.cluster == (v6,)
    assert categorize_endpoints([v4, v6], service_port(), NODE).cluster == (v4, v6)


# --- properties ---------------------------------------------------------------------------

endpoint_strategy = st.builds(
    Endpoint,
    ip=st.integers(1, 12).map(lambda i: ipaddress.ip_address(f"10.0.0.{i}")),
    port=st.just(80),
    ready=st.booleans(),
    serving=st.booleans(),
    terminating=st.booleans(),
    node_name=st.sampled_from([NODE, OTHER_NODE, None]),
    zone=st.none(),
    hint_zones=st.frozensets(st.sampled_from(["zone-a", "zone-b"])),
    hint_nodes=st.frozensets(st.sampled_from([NODE, OTHER_NODE])),
)
endpoint_lists = st.lists(endpoint_strategy, max_size=8, unique_by=lambda e: e.ip)
port_strategy = st.builds(
    service_port,
    itp_local=st.booleans(),
    etp_local=st.booleans(),
    node_port=st.sampled_from([0, 30080]),
)
zone_strategy = st.sampled_from([None, "", "zone-a", "zone-b"])


def usable(e: Endpoint) -> bool:
    return e.ready or (e.serving and e.terminating)


@given(endpoint_lists, port_strategy, zone_strategy)
def test_all_reachable_is_the_union_in_input_order(endpoints, port, zone) -> None:
    result = categorize_endpoints(endpoints, port, NODE, zone)
    union = set(result.cluster or ()) | set(result.local or ())
    assert set(result.all_reachable) == union
    assert list(result.all_reachable) == [e for e in endpoints if e in union]


@given(endpoint_lists, port_strategy, zone_strategy)
def test_sets_used_follow_the_traffic_policies(endpoints, port, zone) -> None:
    result = categorize_endpoints(endpoints, port, NODE, zone)
    assert (result.cluster is not None) == port.uses_cluster_endpoints
    assert (result.local is not None) == port.uses_local_endpoints
    assert all(e.is_local(NODE) for e in result.local or ())


@given(endpoint_lists, port_strategy, zone_strategy)
def test_has_any_means_some_endpoint_is_usable(endpoints, port, zone) -> None:
    result = categorize_endpoints(endpoints, port, NODE, zone)
    assert result.has_any == any(usable(e) for e in endpoints)


@given(endpoint_lists, port_strategy, zone_strategy)
def test_ready_endpoints_win_over_terminating_ones(endpoints, port, zone) -> None:
    result = categorize_endpoints(endpoints, port, NODE, zone)
    if result.cluster is not None:
        if any(e.ready for e in endpoints):
            # topology may narrow the set, never empty it nor admit a non-ready endpoint
            assert result.cluster and all(e.ready for e in result.cluster)
        else:
            assert set(result.cluster) == {e for e in endpoints if e.serving and e.terminating}
    if result.local is not None:
        local = [e for e in endpoints if e.is_local(NODE)]
        if any(e.ready for e in local):
            assert set(result.local) == {e for e in local if e.ready}
        else:
            assert set(result.local) == {e for e in local if e.serving and e.terminating}


@given(endpoint_lists, zone_strategy)
def test_without_hints_cluster_policy_uses_every_ready_endpoint(endpoints, zone) -> None:
    endpoints = [
        Endpoint(e.ip, e.port, e.ready, e.serving, e.terminating, e.node_name) for e in endpoints
    ]
    result = categorize_endpoints(endpoints, service_port(), NODE, zone)
    ready = [e for e in endpoints if e.ready]
    expected = ready or [e for e in endpoints if e.serving and e.terminating]
    assert list(result.cluster) == expected
