"""The steering table on a real kernel (nftables in namespaces the test creates): its sets,
one transaction per sync sized by the change, cleanup, other tables untouched, and real
TCP/UDP traffic steered toward gw0 from a client and from the node itself, with
loadBalancerSourceRanges enforced for IPv4 and IPv6."""

from __future__ import annotations

import ipaddress
import json
import re
import subprocess
import time

import pytest

from ovsproxy.datapath.pipeline import VIRTUAL_NODEPORT_IP
from ovsproxy.model import (
    IPFamily,
    Protocol,
    ServicePort,
    ServicePortName,
    ServiceType,
    TrafficPolicy,
)
from ovsproxy.steering import (
    NftablesError,
    NodePortAddresses,
    SteeringSet,
    SteeringTable,
    SteeringTracker,
    desired_state,
)
from ovsproxy.steering.compare import compare_table
from ovsproxy.steering.render import TABLE

from .conftest import EXT_V4, EXT_V6, LB_V4, LB_V6, Node

ip = ipaddress.ip_address
NODE_IPS = [ip("192.168.50.1"), ip("fd50::1"), ip("10.99.0.1"), ip("fd99::1")]
# only the uplink accepts NodePorts (gw0 is the node's side of OVS)
ADDRESSES = NodePortAddresses.parse(["192.168.50.0/24", "fd50::/64"])
VIP4, VIP6 = str(VIRTUAL_NODEPORT_IP[IPFamily.IPv4]), str(VIRTUAL_NODEPORT_IP[IPFamily.IPv6])

OTHER_TABLE = """
table ip filter {
    chain input {
        type filter hook input priority 0; policy accept;
        counter
    }
}
table inet someone-else {
    set s {
        type ipv4_addr
        elements = { 1.2.3.4 }
    }
}
"""


def svc(
    n: int,
    node_port: int,
    *,
    protocol: Protocol = Protocol.TCP,
    port: int = 80,
    lb: tuple[str, ...] = (),
    external: tuple[str, ...] = (),
    ranges: tuple[str, ...] = (),
    policy: TrafficPolicy = TrafficPolicy.CLUSTER,
) -> ServicePort:
    return ServicePort(
        name=ServicePortName("demo", f"svc-{n}", "", protocol),
        cluster_ips=(ip(f"10.96.0.{n}"), ip(f"fd00:10:96::{n:x}")),
        port=port,
        protocol=protocol,
        type=ServiceType.LOAD_BALANCER,
        node_port=node_port,
        external_ips=tuple(ip(a) for a in external),
        load_balancer_ips=tuple(ip(a) for a in lb),
        load_balancer_source_ranges=tuple(ipaddress.ip_network(r) for r in ranges),
        external_traffic_policy=policy,
    )


def ruleset_outside_ours(node: Node) -> str:
    listing = json.loads(node.nft("-j", "list", "ruleset"))["nftables"]
    return json.dumps([i for i in listing if _table_of(i) != ("inet", TABLE)], sort_keys=True)


def _table_of(item: dict) -> tuple[str, str] | None:
    for kind, body in item.items():
        if kind == "metainfo":
            return None
        if kind == "table":
            return (body["family"], body["name"])
        return (body["family"], body["table"])
    return None


class Monitor:
    """``nft monitor`` in the node: one "# new generation" line per committed transaction."""

    def __init__(self, node: Node) -> None:
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", node.node, "nft", "monitor"],
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(0.3)  # let it subscribe

    def stop(self) -> list[str]:
        time.sleep(0.3)
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=5)
        return out.splitlines()


def generations(lines: list[str]) -> int:
    return sum(1 for line in lines if line.startswith("# new generation"))


async def test_sets_one_transaction_per_change_cleanup_and_others_untouched(node: Node) -> None:
    node.load_nft(OTHER_TABLE)
    before = ruleset_outside_ours(node)
    table = SteeringTable(node.node)
    try:
        base = [svc(n, 30000 + n) for n in range(1, 51)]
        base.append(svc(60, 30060, lb=(LB_V4, LB_V6), ranges=("192.168.50.100/32",)))
        first = await table.sync(desired_state(base, NODE_IPS, ADDRESSES))
        assert first.kind == "rebuild"
        state = await table.read()
        assert state == desired_state(base, NODE_IPS, ADDRESSES)
        assert state is not None
        assert state.elements(SteeringSet.NODEPORT_IPS, IPFamily.IPv4) == {(ip("192.168.50.1"),)}
        assert (Protocol.TCP, 30007) in state.elements(SteeringSet.NODEPORTS, IPFamily.IPv6)
        listing = node.nft("list", "table", "inet", TABLE)
        assert "tcp . 30050" in listing and "192.168.50.100" in listing

        # One more Service: one transaction, the Service's own elements only.
        monitor = Monitor(node)
        added = await table.sync(desired_state([*base, svc(99, 30099)], NODE_IPS, ADDRESSES))
        lines = monitor.stop()
        assert added.kind == "patch"
        # tcp . 30099 for each family, and its virtual NodePort frontend to masquerade
        # (externalTrafficPolicy Cluster)
        assert added.elements == 4
        assert generations(lines) == 1
        assert sorted(line for line in lines if line.startswith("add element")) == [
            "add element inet ovsproxy masquerade-v4 { 169.254.0.252 . tcp . 30099 }",
            "add element inet ovsproxy masquerade-v6 { fc01::aabb:ccdd:eefe . tcp . 30099 }",
            "add element inet ovsproxy nodeports-v4 { tcp . 30099 }",
            "add element inet ovsproxy nodeports-v6 { tcp . 30099 }",
        ]
        # Nothing changed: no transaction at all.
        assert (
            await table.sync(desired_state([*base, svc(99, 30099)], NODE_IPS, ADDRESSES))
        ).kind == "none"
        assert await table.verify()
        assert ruleset_outside_ours(node) == before

        await table.cleanup()
        assert TABLE not in node.nft("list", "tables")
        assert ruleset_outside_ours(node) == before
    finally:
        await table.close()


async def test_drift_is_repaired_by_one_full_rebuild(node: Node) -> None:
    table = SteeringTable(node.node)
    try:
        desired = desired_state([svc(1, 30001), svc(2, 30002)], NODE_IPS, ADDRESSES)
        await table.sync(desired)
        # Someone deletes one of our elements: the next patch (deleting it) is rejected.
        node.nft("delete", "element", "inet", TABLE, "nodeports-v4", "{ tcp . 30002 }")
        monitor = Monitor(node)
        result = await table.sync(desired_state([svc(1, 30001)], NODE_IPS, ADDRESSES))
        lines = monitor.stop()
        assert result.kind == "rebuild" and result.error
        assert generations(lines) == 1  # the rejected patch committed nothing
        assert await table.read() == desired_state([svc(1, 30001)], NODE_IPS, ADDRESSES)
        # Someone deletes the whole table: rebuilt on the next change.
        node.nft("delete", "table", "inet", TABLE)
        result = await table.sync(desired)
        assert result.kind == "rebuild"
        assert await table.read() == desired
        # Someone adds an element: verify notices, the next sync rebuilds.
        node.nft("add", "element", "inet", TABLE, "nodeports-v4", "{ udp . 31111 }")
        assert not await table.verify()
        assert (await table.sync(desired)).kind == "rebuild"
        assert await table.verify()
    finally:
        await table.cleanup()
        await table.close()


@pytest.mark.parametrize("policy", [TrafficPolicy.CLUSTER, TrafficPolicy.LOCAL])
async def test_nodeport_traffic_reaches_the_gateway_with_its_port(
    node: Node, policy: TrafficPolicy
) -> None:
    """DNATed to the virtual NodePort address, the port kept; externalTrafficPolicy Cluster
    masquerades (the source is the gateway's address, as kube-proxy shows the node's), Local
    keeps the client's."""
    node.serve(30080)
    table = SteeringTable(node.node)
    cluster = policy is TrafficPolicy.CLUSTER
    try:
        tcp, udp = svc(1, 30080, policy=policy), svc(2, 30080, protocol=Protocol.UDP, policy=policy)
        # before steering: nothing listens on the node's own 30080
        assert node.connect(node.client, "192.168.50.1", 30080).startswith("error")
        await table.sync(desired_state([tcp, udp], NODE_IPS, ADDRESSES))
        for dst, client, gateway in (
            ("192.168.50.1", "192.168.50.100", "10.99.0.1"),
            ("fd50::1", "fd50::100", "fd99::1"),
        ):
            seen = gateway if cluster else client
            vip = VIP4 if ":" not in dst else VIP6
            for udp_ in (False, True):
                got = node.connect(node.client, dst, 30080, client, udp=udp_)
                assert got == f"{seen}|{vip}|30080", (dst, udp_, got)
            # from the node itself (output hook)
            own = gateway if cluster else dst
            assert node.connect(node.node, dst, 30080) == f"{own}|{vip}|30080"
        # gw0's own address is not in nodePortAddresses: not steered
        assert node.connect(node.node, "10.99.0.1", 30080).startswith("error")
        # the Service removed: no longer steered
        await table.sync(desired_state([], NODE_IPS, ADDRESSES))
        assert node.connect(node.client, "192.168.50.1", 30080).startswith("error")
    finally:
        await table.cleanup()
        await table.close()


@pytest.mark.parametrize(
    "dst,allowed,denied",
    [(LB_V4, "192.168.50.100", "192.168.50.200"), (LB_V6, "fd50::100", "fd50::200")],
    ids=["ipv4", "ipv6"],
)
async def test_load_balancer_source_ranges(node: Node, dst: str, allowed: str, denied: str) -> None:
    node.serve(80)
    node.serve(30081)
    table = SteeringTable(node.node)
    try:
        ranges = ("192.168.50.100/32", "fd50::100/128")
        # externalTrafficPolicy Local: the answers show the client's own address (Cluster
        # would masquerade it: test_nodeport_traffic_reaches_the_gateway_with_its_port)
        lb = svc(
            1,
            30081,
            lb=(LB_V4, LB_V6),
            external=(EXT_V4, EXT_V6),
            ranges=ranges,
            policy=TrafficPolicy.LOCAL,
        )
        # without steering the LB IP is not routed to gw0: no answer
        assert "|" not in node.connect(node.client, dst, 80, allowed)  # unreachable, no answer
        await table.sync(desired_state([lb], NODE_IPS, ADDRESSES))
        assert node.connect(node.client, dst, 80, allowed) == f"{allowed}|{dst}|80"
        assert node.connect(node.client, dst, 80, denied) == "timeout"  # dropped
        # external IPs and the NodePort are not restricted (kube-proxy's semantics)
        ext = EXT_V4 if ":" not in dst else EXT_V6
        assert node.connect(node.client, ext, 80, denied) == f"{denied}|{ext}|80"
        node_ip = "192.168.50.1" if ":" not in dst else "fd50::1"
        vip = VIP4 if ":" not in dst else VIP6
        assert node.connect(node.client, node_ip, 30081, denied) == f"{denied}|{vip}|30081"
        # the range lifted: the denied client gets through, in one patch
        result = await table.sync(
            desired_state(
                [svc(1, 30081, lb=(LB_V4, LB_V6), policy=TrafficPolicy.LOCAL)],
                NODE_IPS,
                ADDRESSES,
            )
        )
        assert result.kind == "patch"
        assert node.connect(node.client, dst, 80, denied) == f"{denied}|{dst}|80"
    finally:
        await table.cleanup()
        await table.close()


async def test_tracker_changes_are_patched_and_drift_rebuilds(node: Node) -> None:
    tracker = SteeringTracker(NODE_IPS, ADDRESSES)
    table = SteeringTable(node.node)
    try:
        for n in range(1, 21):
            tracker.update(svc(n, 30000 + n))
        first = await table.sync_changes(tracker.take_changes(), tracker.state)
        assert first.kind == "rebuild" and await table.read() == tracker.state()
        tracker.update(svc(21, 30021))
        tracker.update(None, name=svc(3, 0).name)
        monitor = Monitor(node)
        result = await table.sync_changes(tracker.take_changes(), tracker.state)
        lines = monitor.stop()
        # two NodePorts, each in two families: its nodeports and its masquerade elements
        assert (result.kind, result.elements, generations(lines)) == ("patch", 8, 1)
        assert await table.read() == tracker.state()
        # no change (an endpoint change of a ClusterIP Service): no transaction at all
        monitor = Monitor(node)
        result = await table.sync_changes(tracker.take_changes(), tracker.state)
        assert (result.kind, result.elements, generations(monitor.stop())) == ("none", 0, 0)
        # drift: our table deleted behind our back; the next change rebuilds it whole
        node.nft("delete", "table", "inet", TABLE)
        tracker.update(svc(22, 30022))
        result = await table.sync_changes(tracker.take_changes(), tracker.state)
        assert result.kind == "rebuild" and result.error
        assert await table.read() == tracker.state()
    finally:
        await table.cleanup()
        await table.close()


async def test_a_missing_namespace_is_a_clear_error() -> None:
    table = SteeringTable("ovsp-cap-no-such-namespace")
    try:
        with pytest.raises(OSError, match="ovsp-cap-no-such-namespace"):
            await table.sync(desired_state([], NODE_IPS))
    finally:
        await table.close()


async def test_a_rejected_transaction_names_what_failed(node: Node) -> None:
    table = SteeringTable(node.node)
    try:
        # a port the kernel cannot hold: libnftables refuses the whole batch
        bad = svc(1, 70000)
        with pytest.raises(NftablesError, match=r"nftables rebuild \(\d+ commands\) failed: .+"):
            await table.sync(desired_state([bad], NODE_IPS, ADDRESSES))
        assert TABLE not in node.nft("list", "tables")  # nothing half-applied
        assert table.installed is None
        good = desired_state([svc(1, 30001)], NODE_IPS, ADDRESSES)
        assert (await table.sync(good)).kind == "rebuild"
    finally:
        await table.cleanup()
        await table.close()


async def test_compare_table_names_each_difference_in_nft_syntax(node: Node) -> None:
    """What ``ovsproxy verify`` prints for the steering table: nothing when it holds the
    desired state; else each missing or unexpected element, a chain whose rules changed,
    and a missing table. The agent's own check (``verify``) sees the same drift."""
    table = SteeringTable(node.node)
    desired = desired_state(
        [svc(1, 30001), svc(2, 30002, external=("192.0.2.7",))], NODE_IPS, ADDRESSES
    )
    try:
        await table.sync(desired)
        assert compare_table(await table.listing(), desired) == []
        node.nft("delete", "element", "inet", TABLE, "nodeports-v4", "{ tcp . 30002 }")
        node.nft("add", "element", "inet", TABLE, "external-v4", "{ 192.0.2.9 . udp . 53 }")
        diffs = compare_table(await table.listing(), desired)
        assert [(d.kind, d.what, d.text) for d in diffs] == [
            (
                "unexpected",
                "nftables element",
                "element inet ovsproxy external-v4 { 192.0.2.9 . udp . 53 }",
            ),
            ("missing", "nftables element", "element inet ovsproxy nodeports-v4 { tcp . 30002 }"),
        ]
        assert not await table.verify()
        await table.sync(desired)  # rebuilt
        assert compare_table(await table.listing(), desired) == []

        node.nft("flush", "chain", "inet", TABLE, "capture-mark")
        (chain,) = compare_table(await table.listing(), desired)
        assert (chain.kind, chain.what, chain.text) == (
            "differs",
            "nftables chain",
            "chain inet ovsproxy capture-mark",
        )
        assert re.fullmatch(r"0 rule\(s\), wanted \d+", chain.detail), chain.detail
        # The agent's periodic check notices a changed chain too, so its next sync rebuilds.
        assert not await table.verify()
        assert (await table.sync(desired)).kind == "rebuild"
        assert compare_table(await table.listing(), desired) == []

        node.nft("delete", "table", "inet", TABLE)
        assert await table.listing() is None
        (gone,) = compare_table(None, desired)
        assert (gone.kind, gone.text) == ("missing", "table inet ovsproxy")
    finally:
        await table.cleanup()
        await table.close()
