"""Parsing and explaining ``ovs-appctl ofproto/trace`` output (pure).

The inputs in data/ofproto_trace/ are real traces recorded on node-1 of a 3-node lab
(``ovsproxy lab up``; Open vSwitch 3.1): pods web-1 (ofport 2, 10.244.1.10) and client-1
(ofport 3, 10.244.1.11), gw0 ofport 1; the Service lab/web (10.96.0.10, fd00:10:96::10; TCP 80
-> 8080, UDP 53 -> 5353) with one endpoint on each node, lab/empty (10.96.1.20, no endpoints)
and lab/local (10.96.1.30, internalTrafficPolicy Local, its endpoint on node-3). File names
say the source, the destination and the client port. The two affinity-*.txt files come from
the single-node sandbox (see their tests). nosvc-tcp, pod-sctp-nosvc, pod-to-pod and
midstream-endpoint-tcp (a segment without SYN, tcp_flags=ack, from web-1:8080 to client-1, as
after a vswitchd restart) were recorded again on such a lab (lab/web only) for issue 27.
These were recorded while every bucket went through EndpointDNAT; sandbox-bucket-dnat-tcp
(the single-node sandbox: demo/client, ofport 6, to demo/web 10.96.0.10:80, two endpoints,
web-1 on ofport 2) where a bucket translates itself (a Service without affinity).
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from ovsproxy.cli.trace_cmd import (
    TraceError,
    frontends_of,
    resolve_destination,
    resolve_source,
    service_context,
    source_range_block,
    traced_address,
)
from ovsproxy.datapath import pipeline as pl
from ovsproxy.diagnostics import trace as tr
from ovsproxy.model import IPFamily
from ovsproxy.model.node import PodPort

DATA = Path(__file__).parent / "data" / "ofproto_trace"
TABLES = pl.Tables.for_config(pl.PipelineConfig())
PORTS = {
    1: tr.Port(1, "gw0", "gateway"),
    2: tr.Port(2, "p-web-1", "pod", "lab/web-1"),
    3: tr.Port(3, "p-client-1", "pod", "lab/client-1"),
}


def explained(name: str) -> tr.Explanation:
    return tr.explain(tr.parse_trace((DATA / f"{name}.txt").read_text()), TABLES, ports=PORTS)


def test_parse_follows_every_recirculation() -> None:
    trace = tr.parse_trace((DATA / "node-tcp-40001.txt").read_text())
    # ConntrackZone -> EndpointDNAT -> host SNAT -> out: four passes, three resumed ones
    assert len(trace.passes) == 4
    first, *resumed = trace.passes
    assert first.ct_state == "" and all(p.ct_state == "new|trk" for p in resumed)
    assert [s.table for s in first.steps] == [0, 10]
    assert [s.table for s in trace.passes[1].steps] == [11, 12, 13, 14]
    assert trace.passes[1].resumed_table == 11
    lb = trace.passes[1].steps[2]
    assert (lb.match, lb.priority) == ("tcp,nw_dst=10.96.0.10,tp_dst=80", pl.PRIORITY_LOW)
    assert lb.cookie == pl.cookie(1, pl.Category.SERVICE)
    group = lb.actions[0]
    assert group.text == "group:1"
    assert group.notes[-1] == "using bucket 1"
    assert (
        trace.passes[-1].nat_after
        == "nw_src=10.244.1.254,tp_src=40001,nw_dst=10.244.2.10,tp_dst=8080"
    )
    assert trace.passes[-1].datapath_actions.endswith(",1")
    assert trace.passes[-1].fields["ct_zone"] == str(pl.HOST_SNAT_CT_ZONE_V4)


def test_pod_to_local_endpoint() -> None:
    ex = explained("pod-tcp-40000")
    assert ex.verdict == "forwarded"
    assert ex.frontend == "tcp,nw_dst=10.96.0.10,tp_dst=80"
    assert (ex.group_id, ex.bucket, ex.buckets) == (1, 0, 3)
    assert ex.endpoint == "10.244.1.10:8080"
    assert [(n.kind, n.before, n.after, n.zone_name) for n in ex.nat] == [
        ("DNAT", "10.96.0.10:80", "10.244.1.10:8080", "Service")
    ]
    assert ex.leaves["kind"] == "pod" and ex.leaves["pod"] == "lab/web-1"
    assert ex.reason == "out to pod lab/web-1 (port p-web-1)"
    names = [(s.table_name, s.note) for s in ex.steps]
    assert names[0] == ("Classifier", "from a local pod's port (FROM_POD)")
    assert [n for n, _ in names] == [
        "Classifier",
        "ConntrackZone",
        "ConntrackState",
        "SessionAffinity",
        "ServiceLB",
        "EndpointDNAT",
        "L3Forwarding",
    ]


def test_a_bucket_that_translates_names_its_endpoint() -> None:
    ports = {2: tr.Port(2, "p-web-1", "pod", "demo/web-1"), 6: tr.Port(6, "p-client", "pod")}
    trace = tr.parse_trace((DATA / "sandbox-bucket-dnat-tcp.txt").read_text())
    ex = tr.explain(trace, TABLES, ports=ports)
    assert ex.verdict == "forwarded"
    assert (ex.group_id, ex.bucket, ex.buckets) == (2, 0, 2)
    assert ex.endpoint == "10.244.0.11:8080"
    assert [(n.kind, n.before, n.after, n.zone_name) for n in ex.nat] == [
        ("DNAT", "10.96.0.10:80", "10.244.0.11:8080", "Service")
    ]
    assert ex.leaves["pod"] == "demo/web-1"
    lb = next(s for s in ex.steps if s.table_name == "ServiceLB")
    assert lb.note == "Service frontend -> select group, DNAT to the endpoint 10.244.0.11:8080"
    assert "EndpointDNAT" not in [s.table_name for s in ex.steps]


@pytest.mark.parametrize(
    ("name", "bucket", "endpoint"),
    [("pod-tcp-40001", 1, "10.244.2.10:8080"), ("pod-tcp-40003", 2, "10.244.3.10:8080")],
)
def test_pod_to_remote_endpoint_leaves_through_normal(
    name: str, bucket: int, endpoint: str
) -> None:
    ex = explained(name)
    assert ex.verdict == "forwarded"
    assert (ex.bucket, ex.endpoint) == (bucket, endpoint)
    assert ex.leaves["kind"] == "normal"
    assert "gateway gw0" in ex.reason and "flooded" in ex.reason  # gw0's MAC was not learned


def test_node_to_remote_endpoint_is_host_snated_back_out_the_gateway() -> None:
    ex = explained("node-tcp-40003")
    assert ex.endpoint == "10.244.3.10:8080"
    assert [(n.kind, n.before, n.after, n.zone) for n in ex.nat] == [
        ("DNAT", "10.96.0.10:80", "10.244.3.10:8080", pl.CT_ZONE_V4),
        ("SNAT", "10.244.1.1:40003", "10.244.1.254:40003", pl.HOST_SNAT_CT_ZONE_V4),
    ]
    assert ex.leaves["action"] == "IN_PORT" and ex.leaves["kind"] == "gateway"
    assert ex.steps[-1].note == "host-SNATed: back out the gateway to the node"


def test_node_to_local_endpoint_ipv6() -> None:
    ex = explained("node-tcp6-40000")
    assert ex.endpoint == "[fd00:10:244:1::a]:8080"
    assert ex.group_id == 2
    assert [(n.before, n.after) for n in ex.nat] == [
        ("[fd00:10:96::10]:80", "[fd00:10:244:1::a]:8080")
    ]
    assert ex.leaves["pod"] == "lab/web-1"


def test_hairpin_is_snated_to_the_virtual_service_ip_and_sent_back() -> None:
    ex = explained("hairpin-tcp")
    assert ex.endpoint == "10.244.1.10:8080"
    assert [(n.kind, n.after, n.zone_name) for n in ex.nat] == [
        ("DNAT", "10.244.1.10:8080", "Service"),
        ("SNAT", "169.254.0.253:40006", "hairpin"),
    ]
    assert ex.leaves["action"] == "IN_PORT" and ex.leaves["pod"] == "lab/web-1"


def test_udp_frontend() -> None:
    ex = explained("pod-udp")
    assert ex.frontend == "udp,nw_dst=10.96.0.10,tp_dst=53"
    assert ex.endpoint == "10.244.1.10:5353"


@pytest.mark.parametrize(
    ("name", "answer"), [("pod-empty-tcp", "TCP RST"), ("pod-empty-udp6", "ICMP")]
)
def test_service_without_endpoints_is_rejected(name: str, answer: str) -> None:
    ex = explained(name)
    assert ex.verdict == "rejected"
    assert answer in ex.reason
    assert ex.frontend and ex.group_id is None and not ex.endpoint and not ex.leaves


@pytest.mark.parametrize("name", ["pod-local-tcp", "pod-local-tcp6"])
def test_local_policy_without_local_endpoint_is_dropped_by_its_frontend(name: str) -> None:
    ex = explained(name)
    assert ex.verdict == "dropped"
    assert ex.frontend
    assert ex.reason.endswith(f"in ServiceLB (table 13, priority {pl.PRIORITY_LOW})")
    assert "no endpoint for this node" in ex.reason


def test_spoofed_source_is_dropped_in_the_classifier() -> None:
    ex = explained("spoof")
    assert ex.verdict == "dropped"
    assert "spoofed" in ex.reason and "Classifier (table 0" in ex.reason
    assert not ex.frontend


@pytest.mark.parametrize("name", ["nosvc-tcp", "pod-sctp-nosvc"])
def test_no_service_frontend(name: str) -> None:
    """A ct(commit) with no table prints a nested "drop": not the packet's."""
    ex = explained(name)
    assert ex.verdict == "forwarded" and not ex.frontend and ex.group_id is None
    assert "not a Service: committed to conntrack" in [s.note for s in ex.steps]
    assert ex.steps[-1].note == "not a local pod: NORMAL (toward the gateway)"


def test_a_mid_stream_segment_of_an_endpoint_gets_its_translation_back() -> None:
    """After a vswitchd restart: web-1's segment (ACK, no SYN) to client-1 is new; the probe
    finds client-1 local, ServiceLB re-creates the Service's translation (issue 27)."""
    ex = explained("midstream-endpoint-tcp")
    assert ex.verdict == "forwarded" and ex.leaves["pod"] == "lab/client-1"
    notes = [s.note for s in ex.steps]
    assert "mid-stream probe: to a local pod (TO_LOCAL_POD)" in notes
    assert any("its Service translation re-created" in n for n in notes), notes
    assert any("10.96.0.10" in str(n) for n in ex.nat), ex.nat


def test_every_recording_parses_and_names_our_tables() -> None:
    names = set(tr.table_names(TABLES, pl.Mode.STANDALONE).values())
    for path in sorted(DATA.glob("*.txt")):
        ex = tr.explain(tr.parse_trace(path.read_text()), TABLES, ports=PORTS)
        assert ex.verdict in {"forwarded", "dropped", "rejected"}, path.name
        assert {s.table_name for s in ex.steps} <= names, path.name


def test_integrated_mode_names_the_cnis_table() -> None:
    tables = pl.Tables.for_config(
        pl.PipelineConfig(mode=pl.Mode.INTEGRATED, first_table=30, next_table=50)
    )
    names = tr.table_names(tables, pl.Mode.INTEGRATED)
    assert names[30] == "ConntrackZone" and names[34] == "EndpointDNAT"
    assert names[50] == "next table (the CNI's)" and 0 not in names


def test_not_a_trace_is_an_error() -> None:
    text = (
        "Bad openflow flow syntax: in_port=p-client-1,udp,tp_src=1: prerequisites not met "
        "for setting tp_src\novs-appctl: br0.ctl: server returned an error\n"
    )
    with pytest.raises(tr.TraceParseError, match="Bad openflow flow syntax"):
        tr.parse_trace(text)
    with pytest.raises(tr.TraceParseError, match="empty"):
        tr.parse_trace("")


def test_trace_flow_uses_per_protocol_port_fields() -> None:
    flow = tr.trace_flow(
        in_port="p-client-1",
        protocol="udp",
        src_mac="0a:58:00:00:00:01",
        dst_mac="0a:58:00:00:00:02",
        src_ip="fd00::1",
        dst_ip="fd00::2",
        src_port=40000,
        dst_port=53,
    )
    # tp_src/tp_dst are TCP's names in ofproto/trace's parser: UDP needs udp_src/udp_dst
    assert flow.startswith("udp6,in_port=p-client-1,")
    assert "ipv6_src=fd00::1" in flow and "udp_src=40000" in flow and "udp_dst=53" in flow
    assert "tcp_flags" not in flow
    tcp = tr.trace_flow(
        in_port="gw0",
        protocol="tcp",
        src_mac="a",
        dst_mac="b",
        src_ip="10.0.0.1",
        dst_ip="10.0.0.2",
        src_port=1,
        dst_port=2,
    )
    assert tcp.endswith("tcp_src=1,tcp_dst=2,tcp_flags=syn")
    with pytest.raises(ValueError, match="different families"):
        tr.trace_flow(
            in_port="gw0",
            protocol="tcp",
            src_mac="a",
            dst_mac="b",
            src_ip="10.0.0.1",
            dst_ip="fd00::2",
            src_port=1,
            dst_port=2,
        )
    args = tr.trace_args("br0", tcp)
    assert args[:3] == ["ofproto/trace", "br0", tcp]
    assert args.count("--ct-next") == tr.CT_PASSES


def test_zone_names_cover_both_families() -> None:
    zones = tr.zone_names()
    for family in IPFamily:
        assert zones[pl.ct_zone(family)] == "Service"
        assert zones[pl.hairpin_ct_zone(family)] == "hairpin"
        assert zones[pl.host_snat_ct_zone(family)] == "host SNAT"


# -- resolving SRC and DST (cli/trace_cmd, pure) ------------------------------------------
POD = PodPort(
    "p-client-1",
    3,
    "client-1",
    "lab",
    (ipaddress.ip_address("10.244.1.11"),),
    "0a:58:00:00:00:03",
)
SERVICES = [
    {"name": "lab/web:dns/UDP", "cluster_ips": ["10.96.0.10", "fd00:10:96::10"], "port": 53},
    {"name": "lab/web:http/TCP", "cluster_ips": ["10.96.0.10", "fd00:10:96::10"], "port": 80},
]


def test_resolve_source() -> None:
    assert resolve_source("node", [POD], "gw0", "ee:ee").interface == "gw0"
    for text in ("client-1", "lab/client-1", "10.244.1.11"):
        src = resolve_source(text, [POD], "gw0", "ee:ee")
        assert (src.kind, src.interface, src.mac) == ("pod", "p-client-1", POD.mac)
    other = resolve_source("192.168.50.100", [POD], "gw0", "ee:ee")
    assert (other.kind, other.interface, other.mac) == ("address", "gw0", "ee:ee")
    with pytest.raises(TraceError, match="pods here: lab/client-1"):
        resolve_source("web-9", [POD], "gw0", "ee:ee")


def test_resolve_destination() -> None:
    d = resolve_destination("lab/web:http", SERVICES, None, [4])
    assert (str(d.ip), d.port, d.protocol) == ("10.96.0.10", 80, "tcp")
    assert resolve_destination("lab/web:53", SERVICES, None, [6]).ip.version == 6
    assert resolve_destination("lab/web", SERVICES, "udp", [4]).port == 53
    assert resolve_destination("[fd00:10:96::10]:80", SERVICES, None, [6]).protocol == "tcp"
    assert resolve_destination("10.96.0.10:53", SERVICES, None, [4]).service is SERVICES[0]
    plain = resolve_destination("10.244.2.10:8080", SERVICES, None, [4])
    assert plain.service is None and plain.kind == "address"
    with pytest.raises(TraceError, match="several ports"):
        resolve_destination("lab/web", SERVICES, None, [4])
    with pytest.raises(TraceError, match="no such port of lab/web"):
        resolve_destination("lab/web:8080", SERVICES, None, [4])
    with pytest.raises(TraceError, match="known: lab/web"):
        resolve_destination("lab/nope:80", SERVICES, None, [4])
    with pytest.raises(TraceError, match="give a port number"):
        resolve_destination("10.244.2.10", SERVICES, None, [4])


# External, load-balancer and NodePort frontends, in /status's format (``families.*.external``;
# ``type``, ``node_port``, ``load_balancer_ips``, ``load_balancer_source_ranges`` per port and
# ``node_ports.node_port_ips`` once the NodePort wiring reports them).
LB = {
    "name": "lab/lb:http/TCP",
    "cluster_ips": ["10.96.0.60"],
    "port": 80,
    "node_port": 30080,
    "external_ips": ["192.0.2.7"],
    "load_balancer_ips": ["198.51.100.5"],
    "load_balancer_source_ranges": ["203.0.113.0/24"],
    "external_traffic_policy": "Local",
    "families": {
        "IPv4": {
            "frontends": ["10.96.0.60"],
            "endpoints": ["10.244.1.10:8080"],
            "action": "forward",
            "reason": "",
            "external": {
                "frontends": ["192.0.2.7", "198.51.100.5"],
                "endpoints": [],
                "action": "drop",
                "reason": "externalTrafficPolicy Local: no usable endpoint on this node",
            },
        }
    },
}
OUTSIDE = resolve_source("203.0.113.9", [POD], "gw0", "ee:ee")
STRANGER = resolve_source("192.168.50.100", [POD], "gw0", "ee:ee")


def test_external_and_load_balancer_frontends() -> None:
    assert [(str(a), k) for a, k in frontends_of(LB)] == [
        ("10.96.0.60", "ClusterIP"),
        ("192.0.2.7", "external IP"),
        ("198.51.100.5", "LoadBalancer IP"),
    ]
    lb = resolve_destination("198.51.100.5:80", [LB], None, [4])
    assert (lb.kind, lb.port) == ("LoadBalancer IP", 80)
    context = service_context(lb)  # the external selection, not the ClusterIPs'
    assert context["action"] == "drop" and context["reason"].startswith("externalTrafficPolicy")
    assert service_context(resolve_destination("lab/lb", [LB], None, [4]))["action"] == "forward"


def test_load_balancer_source_ranges() -> None:
    lb = resolve_destination("198.51.100.5:80", [LB], None, [4])
    assert source_range_block(OUTSIDE.ips[0], lb) == ""
    blocked = source_range_block(STRANGER.ips[0], lb)
    assert "192.168.50.100 is in none of 203.0.113.0/24" in blocked
    # only load-balancer IPs are restricted (kube-proxy's semantics, steering.desired)
    external = resolve_destination("192.0.2.7:80", [LB], None, [4])
    assert source_range_block(STRANGER.ips[0], external) == ""
    # ranges of the other family do not restrict this one
    v6_only = {**LB, "load_balancer_source_ranges": ["2001:db8::/32"]}
    assert (
        source_range_block(
            STRANGER.ips[0], resolve_destination("198.51.100.5:80", [v6_only], None, [4])
        )
        == ""
    )


def test_node_port() -> None:
    node_ips = ["192.168.50.1"]
    by_ip = resolve_destination("192.168.50.1:30080", [LB], None, [4], node_ips)
    assert (by_ip.kind, str(by_ip.ip), by_ip.port, by_ip.service) == (
        "NodePort",
        "192.168.50.1",
        30080,
        LB,
    )
    assert resolve_destination("node:30080", [LB], None, [4], node_ips).ip == by_ip.ip
    # from outside OVS it arrives DNATed to the virtual NodePort IP; a pod's as sent
    ip, note = traced_address(by_ip, STRANGER)
    assert ip == pl.VIRTUAL_NODEPORT_IP[IPFamily.IPv4] and "capture table DNATs" in note
    assert traced_address(by_ip, resolve_source("client-1", [POD], "gw0", "ee:ee")) == (
        by_ip.ip,
        "",
    )
    with pytest.raises(TraceError, match="no Service has nodePort 30999"):
        resolve_destination("node:30999", [LB], None, [4], node_ips)
    with pytest.raises(TraceError, match="needs a nodePort"):
        resolve_destination("node", [LB], None, [4], node_ips)


def test_session_affinity_first_connection_learns() -> None:
    """Recorded on the single-node sandbox (demo/sticky, 10.96.0.60, ClientIP 60 s; pods
    web-1 10.244.0.11 and web-2 10.244.0.12), from api-1 before it had used the Service."""
    trace = tr.parse_trace((DATA / "affinity-new.txt").read_text())
    learn = next(
        a for p in trace.passes for s in p.steps for a in s.actions if a.text.startswith("learn(")
    )
    assert learn.notes == ("suppressing side effects, so learn action ignored",)
    ex = tr.explain(trace, TABLES)
    assert ex.frontend == "tcp,nw_dst=10.96.0.60,tp_dst=80"  # the frontend, not the learn flow
    assert ex.group_id is not None
    assert (ex.bucket, ex.endpoint) == (1, "10.244.0.12:8080")
    assert any(s.note.startswith("ClientIP affinity: this choice is learned") for s in ex.steps)


def test_session_affinity_learned_choice() -> None:
    """The client had reached web-2 (10.244.0.12): its learned flow decides, not the group."""
    ex = explained("affinity-learned")
    assert ex.endpoint == "10.244.0.12:8080" and ex.group_id is None
    notes = [s.note for s in ex.steps]
    assert "learned affinity: the endpoint this client used last" in notes
    assert "ClientIP affinity: the learned endpoint is still valid, EndpointDNAT" in notes
