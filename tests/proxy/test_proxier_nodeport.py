"""NodePort and external frontends in the proxier, without a switch: what it selects and the
ServiceLB flows it stages (the lab's tests/lab/test_nodeport.py sends the traffic)."""

from __future__ import annotations

from ovsproxy.agent.core import NodeFacts, Semantics, build_core
from ovsproxy.config import AgentConfig
from ovsproxy.datapath import pipeline as pl
from ovsproxy.model import IPFamily, ServiceState, ServiceType, TrafficPolicy
from ovsproxy.model.handler import SYNC_ENDPOINT_SLICES, SYNC_SERVICES
from ovsproxy.proxy.proxier import DROP, FORWARD, Proxier, select_endpoints
from ovsproxy.proxy.tracker import ChangeTracker
from tests.proxy.test_proxier_semantics import NODE, Recorder, apply, ep, ip, port

VIP4 = pl.VIRTUAL_NODEPORT_IP[IPFamily.IPv4]
NODE_IP = ip("192.168.50.1")


def nodeport(**kw):
    kw.setdefault("type", ServiceType.NODE_PORT)
    return port("10.96.0.1", node_port=30080, **kw)


def test_a_nodeport_is_an_external_frontend_on_the_virtual_nodeport_ip() -> None:
    state = ServiceState(nodeport(), (ep("10.0.0.1"),))
    sel = select_endpoints(state, IPFamily.IPv4, NODE, None, node_ports=True)
    assert sel.node_port_frontends == (VIP4,)
    assert sel.external_endpoints == sel.endpoints and not sel.external_differs
    # without steering, no NodePort frontend
    assert select_endpoints(state, IPFamily.IPv4, NODE, None).node_port_frontends == ()


def test_etp_local_drops_outside_and_short_circuits_in_cluster_clients() -> None:
    local = nodeport(external_traffic_policy=TrafficPolicy.LOCAL)
    state = ServiceState(local, (ep("10.0.0.1"), ep("10.0.0.2", node_name=NODE)))
    sel = select_endpoints(
        state, IPFamily.IPv4, "node-c", None, node_ports=True, short_circuit=True
    )
    assert (sel.external_action, sel.external_endpoints) == (DROP, ())
    assert sel.in_cluster_endpoints == sel.endpoints and len(sel.endpoints) == 2
    assert sel.external_differs
    mine = select_endpoints(state, IPFamily.IPv4, NODE, None, node_ports=True, short_circuit=True)
    assert mine.external_action == FORWARD and [e.ip for e in mine.external_endpoints] == [
        ip("10.0.0.2")
    ]


def _rig() -> tuple[ChangeTracker, Proxier]:
    """The agent's core on a recording switch, on a node whose IP accepts NodePorts."""
    config = AgentConfig(node_name=NODE, node_ip=(str(NODE_IP),))
    core = build_core(config, Recorder(), NodeFacts(), semantics=Semantics.NONE)
    assert core.proxier.node_ports and core.proxier.node_port_ips == (NODE_IP,)
    core.tracker.on_synced(SYNC_SERVICES)
    core.tracker.on_synced(SYNC_ENDPOINT_SLICES)
    return core.tracker, core.proxier


def _service_lb(proxier: Proxier) -> list[str]:
    """ServiceLB's flows as ovs-ofctl prints them."""
    table = f"table={proxier.datapath.tables.service_lb},"
    return [line for line in proxier.datapath.dump() if table in line]


async def test_staged_flows_nodeport_short_circuit_and_node_ip_frontends() -> None:
    tracker, proxier = _rig()
    apply(
        tracker,
        nodeport(external_traffic_policy=TrafficPolicy.LOCAL),
        [ep("10.0.0.1"), ep("10.0.0.2", node_name=NODE)],
    )
    await proxier.sync()
    flows = _service_lb(proxier)
    text = "\n".join(flows)
    installed = proxier.services[next(iter(proxier.services))]
    external_gid = installed.external_group_ids[IPFamily.IPv4]
    cluster_gid = installed.group_ids[IPFamily.IPv4]
    low, short = f"priority={pl.PRIORITY_LOW},", f"priority={pl.PRIORITY_SHORT_CIRCUIT},"
    # the virtual NodePort IP + nodePort -> the local endpoints' group
    assert any(
        low in f
        and "nw_dst=169.254.0.252" in f
        and "tp_dst=30080" in f
        and f"group:{external_gid}" in f
        for f in flows
    ), text
    # in-cluster clients (from a pod, from the node) -> the cluster endpoints' group
    shorts = [f for f in flows if short in f]
    assert len(shorts) == 2 and all(f"group:{cluster_gid}" in f for f in shorts), text
    assert any("reg0=0x1/0x1" in f for f in shorts) and any("reg0=0x2/0x2" in f for f in shorts)
    # a local pod to this node's IP:nodePort -> the cluster endpoints' group
    assert any(
        "nw_dst=192.168.50.1" in f and "tp_dst=30080" in f and f"group:{cluster_gid}" in f
        for f in flows
    ), text


async def test_the_classifier_marks_the_nodes_own_ips() -> None:
    _tracker, proxier = _rig()
    await proxier.sync()
    # (ovs-ofctl leaves "table=0" out)
    marks = [line for line in proxier.datapath.dump() if "nw_src=192.168.50.1" in line]
    assert len(marks) == 1, marks
    assert "table=" not in marks[0] and "0x2->reg0" in marks[0].replace("/0x2", ""), marks
