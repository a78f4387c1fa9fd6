"""The proxier's Service semantics without a switch: endpoint selection per family and why,
the flows it stages (reject, drop, affinity validation, external groups), and the work it does
after a commit (UDP conntrack flushes, learned-flow deletes), in that order."""

from __future__ import annotations

import ipaddress
import json

import pytest

from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath.conntrack import FlushFilter
from ovsproxy.datapath.switch_sync import SwitchSync
from ovsproxy.model import (
    Endpoint,
    EndpointSlice,
    IPFamily,
    Protocol,
    Service,
    ServicePort,
    ServicePortName,
    ServiceState,
    SlicePort,
    TrafficPolicy,
)
from ovsproxy.model.handler import SYNC_ENDPOINT_SLICES, SYNC_SERVICES
from ovsproxy.openflow import protocol as of
from ovsproxy.proxy.followers import ClusterIPsFollower
from ovsproxy.proxy.proxier import (
    DROP,
    FORWARD,
    REJECT,
    FrontendEndpoints,
    InstalledService,
    Proxier,
    select_endpoints,
)
from ovsproxy.proxy.tracker import ChangeTracker
from tests.fakes.switch import FakeSwitch

NODE = "node-a"
REJECT_MARK = (of.Controller(128, userdata=b"reject!!"),)


def ip(text: str):
    return ipaddress.ip_address(text)


def ep(address: str, port: int = 8080, **kw) -> Endpoint:
    kw.setdefault("node_name", "node-b")
    return Endpoint(ip(address), port, **kw)


def port(*cluster_ips: str, protocol=Protocol.TCP, **kw) -> ServicePort:
    name = ServicePortName("ns", kw.pop("name", "svc"), "p", protocol)
    return ServicePort(name, tuple(ip(a) for a in cluster_ips), 80, protocol, **kw)


# -- selection --------------------------------------------------------------------------------


def test_dual_stack_rejects_per_family_as_kube_proxys_per_family_proxiers() -> None:
    state = ServiceState(port("10.96.0.1", "fd00::1"), (ep("10.0.0.1"),))
    v4 = select_endpoints(state, IPFamily.IPv4, NODE, None)
    v6 = select_endpoints(state, IPFamily.IPv6, NODE, None)
    assert (v4.action, v4.endpoints) == (FORWARD, (ep("10.0.0.1"),))
    assert (v6.action, v6.reason, v6.endpoints) == (REJECT, "no usable endpoints", ())


@pytest.mark.parametrize(
    ("endpoints", "action", "reason"),
    [
        ([], REJECT, "no usable endpoints"),
        ([ep("10.0.0.1", ready=False, serving=False)], REJECT, "no usable endpoint"),
        ([ep("10.0.0.1")], DROP, "internalTrafficPolicy Local: no usable endpoint on this node"),
    ],
)
def test_local_policy_drops_only_when_endpoints_exist_elsewhere(endpoints, action, reason):
    state = ServiceState(port("10.96.0.1", internal_traffic_policy=TrafficPolicy.LOCAL), endpoints)
    sel = select_endpoints(state, IPFamily.IPv4, NODE, None)
    assert (sel.action, sel.reason) == (action, reason)


def test_terminating_fallback_topology_and_reasons_are_reported() -> None:
    terminating = ServiceState(
        port("10.96.0.1"),
        (
            ep("10.0.0.1", ready=False, serving=True, terminating=True),
            ep("10.0.0.2", ready=False, serving=False, terminating=True),
        ),
    )
    sel = select_endpoints(terminating, IPFamily.IPv4, NODE, None)
    assert sel.terminating and [str(e) for e in sel.endpoints] == ["10.0.0.1:8080"]
    assert dict(sel.excluded) == {"10.0.0.2:8080": "not ready (terminating)"}

    zoned = ServiceState(
        port("10.96.0.1"),
        (
            ep("10.0.0.1", hint_zones=frozenset({"a"})),
            ep("10.0.0.2", hint_zones=frozenset({"b"})),
            ep("10.0.0.3", ready=False, serving=True, terminating=True),
        ),
    )
    sel = select_endpoints(zoned, IPFamily.IPv4, NODE, "a")
    assert sel.topology == "PreferSameZone" and not sel.terminating
    assert dict(sel.excluded) == {
        "10.0.0.2:8080": "topology: no hint for this zone (PreferSameZone)",
        "10.0.0.3:8080": "terminating (ready endpoints exist)",
    }


def test_external_ips_follow_the_external_policy() -> None:
    p = port(
        "10.96.0.1", internal_traffic_policy=TrafficPolicy.LOCAL, external_ips=(ip("192.0.2.1"),)
    )
    state = ServiceState(p, (ep("10.0.0.1", node_name=NODE), ep("10.0.0.2")))
    sel = select_endpoints(state, IPFamily.IPv4, NODE, None)
    assert [str(e) for e in sel.endpoints] == ["10.0.0.1:8080"]  # ClusterIP: local only
    assert [str(e) for e in sel.external_endpoints] == ["10.0.0.1:8080", "10.0.0.2:8080"]
    assert sel.external_differs


# -- the proxier against a recording switch ------------------------------------------------------


# the cookie of a flow an earlier agent (generation 7) left on the switch
OUR_OLDER_FLOW = (pl.COOKIE_APP << pl.COOKIE_APP_SHIFT) | (7 << pl.COOKIE_GENERATION_SHIFT)


class Recorder(FakeSwitch):
    """The shared fake switch, also standing in for the conntrack flusher: commits, sends
    and flushes all go into one log, in order."""

    async def flush(self, filters, *, again: bool = True) -> None:
        self.log.append(("flush", list(filters)))
        self.flushed_again.append(again)
        if again:  # a real flusher flushes them again after revalidation
            self.pending += len(filters)

    flushed_again: list[bool]

    pending = 0

    def restored(self, filters) -> None:
        self.log.append(("restored", list(filters)))

    published_at_settle: list[str] | None = None
    proxier: Proxier | None = None

    async def settled(self) -> None:
        # what the proxier had published when it waited for the second flushes
        if self.proxier is not None:
            self.published_at_settle = sorted(n.name for n in self.proxier.programmed)


@pytest.fixture
def rig():
    return _rig()


def _rig():
    recorder = Recorder()
    recorder.flushed_again = []
    tracker = ChangeTracker()
    tracker.on_synced(SYNC_SERVICES)
    tracker.on_synced(SYNC_ENDPOINT_SLICES)
    dp = SwitchSync(recorder, pl.PipelineConfig(), 1)
    proxier = Proxier(
        tracker,
        dp,
        node_name=NODE,
        reject_action=REJECT_MARK,
        conntrack=recorder,  # type: ignore[arg-type]
        send=recorder.send,
    )
    recorder.proxier = proxier
    return tracker, proxier, recorder


def apply(tracker: ChangeTracker, p: ServicePort, endpoints) -> None:
    tracker.on_service_update(Service("ns", p.name.name, (p,)))
    tracker.on_endpoint_slice_update(
        EndpointSlice(
            "ns", f"{p.name.name}-1", p.name.name, (SlicePort("p", p.protocol, tuple(endpoints)),)
        )
    )


def service_lb(proxier: Proxier, name: str) -> list[of.FlowMod]:
    owner = next(n for n in proxier.services if n.name == name)
    flows = proxier.datapath.owner_flows(owner)
    return [f for f in flows if f.table_id == proxier.ctx.tables.service_lb]


async def test_reject_drop_and_forward_flows(rig) -> None:
    tracker, proxier, _ = rig
    apply(tracker, port("10.96.0.1", name="empty"), [])
    apply(
        tracker,
        port("10.96.0.2", name="local", internal_traffic_policy=TrafficPolicy.LOCAL),
        [ep("10.0.0.1")],
    )
    apply(tracker, port("10.96.0.3", name="ok"), [ep("10.0.0.1")])
    await proxier.sync()
    (empty,) = service_lb(proxier, "empty")
    assert empty.actions == REJECT_MARK and empty.priority == pl.PRIORITY_LOW
    (drop,) = service_lb(proxier, "local")
    assert drop.instructions == ()
    (ok,) = service_lb(proxier, "ok")
    assert isinstance(ok.actions[0], of.GroupAction)
    statuses = {n.name: s.status() for n, s in proxier.services.items()}
    assert json.loads(json.dumps(statuses))  # plain data
    assert (
        statuses["local"]["dropping"]
        and not proxier.services[next(n for n in proxier.services if n.name == "local")].rejecting
    )


async def test_affinity_flows_validate_each_learned_endpoint(rig) -> None:
    tracker, proxier, _ = rig
    apply(
        tracker,
        port("10.96.0.1", name="web", affinity_timeout=600),
        [ep("10.0.0.1"), ep("10.0.0.2")],
    )
    await proxier.sync()
    flows = service_lb(proxier, "web")
    low = [f for f in flows if f.priority == pl.PRIORITY_LOW]
    learn = [f for f in flows if any(isinstance(a, of.Learn) for a in f.actions)]
    valid = [f for f in flows if f.match.get("reg3") is not None]
    assert len(low) == 1 and len(learn) == 1 and len(valid) == 2
    assert {f.match.get("reg3") for f in valid} == {int(ip("10.0.0.1")), int(ip("10.0.0.2"))}
    status = next(iter(proxier.services.values())).status()
    assert status["affinity"] == "ClientIP 600s: OVS idle_timeout on learned flows"


async def test_udp_removals_are_flushed_after_the_commit_and_survive_a_failed_one(rig) -> None:
    tracker, proxier, rec = rig
    p = port("10.96.0.1", "fd00::1", protocol=Protocol.UDP, name="dns")
    apply(tracker, p, [ep("10.0.0.1"), ep("10.0.0.2"), ep("fd00:1::1")])
    await proxier.sync()
    assert rec.kinds() == ["bundle", "flush"]  # the new frontends' untranslated entries
    (flushes,) = rec.take("flush")
    assert sorted(map(str, flushes)) == [
        "UDP 10.96.0.1:80 -> itself (untranslated) (zone 65520)",
        "UDP fd00::1:80 -> itself (untranslated) (zone 65510)",
    ]
    assert flushes[0].endpoint == flushes[0].frontend and flushes[0].endpoint_port == 80
    rec.log.clear()
    rec.pending = 0  # their second flush is done

    apply(tracker, p, [ep("10.0.0.2"), ep("fd00:1::1")])
    rec.fail = RuntimeError("switch says no")
    with pytest.raises(Exception, match="switch says no"):
        await proxier.sync()
    assert rec.kinds() == []  # nothing flushed before the removal is installed
    assert rec.fail is None  # it failed that one commit only
    await proxier.sync()
    assert rec.kinds() == ["bundle", "flush"]
    (flushes,) = rec.take("flush")
    assert flushes == [FlushFilter(Protocol.UDP, ip("10.96.0.1"), 80, ip("10.0.0.1"), 8080)]

    tracker.on_service_delete("ns", "dns")
    await proxier.sync()
    (flushes,) = rec.take("flush")
    assert sorted(map(str, flushes)) == [
        "UDP 10.96.0.1:80 -> * (zone 65520)",
        "UDP fd00::1:80 -> * (zone 65510)",
    ]


async def test_a_udp_pair_that_comes_back_before_its_second_flush_is_kept(rig) -> None:
    tracker, proxier, rec = rig
    p = port("10.96.0.1", protocol=Protocol.UDP, name="dns")
    apply(tracker, p, [ep("10.0.0.1"), ep("10.0.0.2")])
    await proxier.sync()
    rec.log.clear()
    rec.pending = 0  # the new frontend's flush had its second flush
    apply(tracker, p, [ep("10.0.0.2")])
    await proxier.sync()
    assert rec.kinds() == ["bundle", "flush"]
    rec.log.clear()
    apply(tracker, p, [ep("10.0.0.1"), ep("10.0.0.2")])  # back before the second flush
    await proxier.sync()
    (kept,) = rec.take("restored")
    assert kept == [FlushFilter(Protocol.UDP, ip("10.96.0.1"), 80, ip("10.0.0.1"), 8080)]
    # A Service deleted and created again: its frontend-wide filter and every pair.
    tracker.on_service_delete("ns", "dns")
    await proxier.sync()
    rec.log.clear()
    apply(tracker, p, [ep("10.0.0.2")])
    await proxier.sync()
    (kept,) = rec.take("restored")
    assert sorted(map(str, kept)) == [
        "UDP 10.96.0.1:80 -> * (zone 65520)",
        "UDP 10.96.0.1:80 -> 10.0.0.2:8080 (zone 65520)",
    ]


async def test_tcp_removals_flush_nothing(rig) -> None:
    tracker, proxier, rec = rig
    p = port("10.96.0.1", name="web")
    apply(tracker, p, [ep("10.0.0.1"), ep("10.0.0.2")])
    await proxier.sync()
    (flushes,) = rec.take("flush")  # a new frontend, whatever its protocol
    assert flushes == [FlushFilter.untranslated(Protocol.TCP, ip("10.96.0.1"), 80)]
    rec.log.clear()
    rec.pending = 0
    apply(tracker, p, [ep("10.0.0.2")])
    await proxier.sync()
    assert "flush" not in rec.kinds()


async def test_learned_flows_are_deleted_when_affinity_changes_not_when_endpoints_do(rig) -> None:
    tracker, proxier, rec = rig
    p = port("10.96.0.1", name="web", affinity_timeout=600)
    apply(tracker, p, [ep("10.0.0.1"), ep("10.0.0.2")])
    await proxier.sync()
    rec.pending = 0
    apply(tracker, p, [ep("10.0.0.2")])
    await proxier.sync()
    assert "send" not in rec.kinds()  # a stale learned choice falls through to the group

    rec.log.clear()
    changed = port("10.96.0.1", name="web", affinity_timeout=100000)
    apply(tracker, changed, [ep("10.0.0.2")])
    await proxier.sync()
    assert rec.kinds() == ["bundle", "send"]
    (sent,) = rec.take("send")
    (delete,) = sent
    assert delete.command == of.FlowModCommand.DELETE
    assert delete.table_id == proxier.ctx.tables.session_affinity
    assert delete.match.get("ipv4_dst") == ip("10.96.0.1") and delete.match.get("tcp_dst") == 80
    assert "agent's sweep every 60s" in next(iter(proxier.services.values())).status()["affinity"]

    tracker.on_service_delete("ns", "web")
    await proxier.sync()
    assert len(rec.take("send")) == 1


async def test_external_group_only_when_the_sets_differ(rig) -> None:
    tracker, proxier, _ = rig
    same = port("10.96.0.1", name="same", external_ips=(ip("192.0.2.1"),))
    differ = port(
        "10.96.0.2",
        name="differ",
        internal_traffic_policy=TrafficPolicy.LOCAL,
        external_ips=(ip("192.0.2.2"),),
    )
    apply(tracker, same, [ep("10.0.0.1")])
    apply(tracker, differ, [ep("10.0.0.1", node_name=NODE), ep("10.0.0.2")])
    await proxier.sync()
    by_name = {n.name: s for n, s in proxier.services.items()}
    assert by_name["same"].external_group_ids == {}
    assert set(by_name["differ"].external_group_ids) == {IPFamily.IPv4}
    groups = {f.match.get("ipv4_dst"): f.actions[0].group_id for f in service_lb(proxier, "differ")}
    assert groups[ip("10.96.0.2")] != groups[ip("192.0.2.2")]
    assert groups[ip("192.0.2.2")] == by_name["differ"].external_group_ids[IPFamily.IPv4]


@pytest.mark.parametrize(
    ("endpoints", "expected", "terminating"),
    [
        # iTP Local: no ready local endpoint, a local one still serving while terminating
        # is used (kube-proxy decides the local fallback separately from the cluster's).
        (
            [
                ep("10.0.0.1", node_name=NODE, ready=False, serving=True, terminating=True),
                ep("10.0.0.2"),
            ],
            ["10.0.0.1:8080"],
            True,
        ),
        # a ready local endpoint wins over a terminating local one
        (
            [
                ep("10.0.0.1", node_name=NODE, ready=False, serving=True, terminating=True),
                ep("10.0.0.3", node_name=NODE),
            ],
            ["10.0.0.3:8080"],
            False,
        ),
        # terminating but not serving: never used
        ([ep("10.0.0.1", node_name=NODE, ready=False, serving=False, terminating=True)], [], False),
    ],
)
def test_local_sets_fall_back_to_serving_terminating_endpoints(endpoints, expected, terminating):
    state = ServiceState(port("10.96.0.1", internal_traffic_policy=TrafficPolicy.LOCAL), endpoints)
    sel = select_endpoints(state, IPFamily.IPv4, NODE, None)
    assert [str(e) for e in sel.endpoints] == expected
    assert sel.terminating == terminating


async def test_cluster_ips_are_handed_on_only_when_they_change() -> None:
    recorder = Recorder()
    recorder.flushed_again = []
    tracker = ChangeTracker()
    tracker.on_synced(SYNC_SERVICES)
    tracker.on_synced(SYNC_ENDPOINT_SLICES)
    seen: list[frozenset] = []

    async def on_cluster_ips(ips: frozenset) -> None:
        seen.append(ips)

    proxier = Proxier(
        tracker,
        SwitchSync(recorder, pl.PipelineConfig(), 1),
        node_name=NODE,
        followers=[ClusterIPsFollower(on_cluster_ips)],
        conntrack=recorder,  # type: ignore[arg-type]
        send=recorder.send,
    )
    web = port("10.96.0.1")
    apply(tracker, web, [ep("10.244.0.2")])
    await proxier.sync()
    assert seen == [frozenset({ip("10.96.0.1")})]
    apply(tracker, web, [ep("10.244.0.2"), ep("10.244.0.3")])  # endpoints only
    await proxier.sync()
    await proxier.sync(full=True)
    assert len(seen) == 1
    apply(tracker, port("10.96.0.1", "fd00::1"), [ep("10.244.0.2")])  # a new address
    await proxier.sync()
    assert seen[-1] == frozenset({ip("10.96.0.1"), ip("fd00::1")})


async def test_pod_forwarding_is_staged_only_for_pods_that_changed() -> None:
    from ovsproxy.model.node import PodPort

    recorder = Recorder()
    recorder.flushed_again = []
    tracker = ChangeTracker()
    tracker.on_synced(SYNC_SERVICES)
    tracker.on_synced(SYNC_ENDPOINT_SLICES)
    pods = [PodPort("p-a", 2, "a", "ns", (ip("10.244.0.2"),), "0a:58:00:00:00:02")]

    async def current() -> list[PodPort]:
        return list(pods)

    dp = SwitchSync(recorder, pl.PipelineConfig(), 1)
    proxier = Proxier(
        tracker, dp, node_name=NODE, pods=current, conntrack=recorder, send=recorder.send
    )  # type: ignore[arg-type]
    await proxier.sync()
    staged = dict(dp.desired.owners[("pod", "p-a")].flows)
    apply(tracker, port("10.96.0.1"), [ep("10.244.0.2")])
    await proxier.sync()
    # An unchanged pod keeps the very flow values it had: nothing was rebuilt for it.
    assert all(dp.desired.owners[("pod", "p-a")].flows[k] is f for k, f in staged.items())
    pods.append(PodPort("p-b", 3, "b", "ns", (ip("10.244.0.3"),), "0a:58:00:00:00:03"))
    await proxier.sync()
    assert ("pod", "p-b") in dp.desired.owners
    pods.pop(0)
    await proxier.sync()
    assert ("pod", "p-a") not in dp.desired.owners
    assert not any(
        "10.244.0.2" in of.format_flow(f)
        for f in dp.installed_flows.values()
        if f.table_id == dp.tables.forwarding
    )


async def test_forwards_names_the_frontends_with_endpoints_once_the_switch_has_them(rig) -> None:
    """What the rejector asks of a reject packet-in: only committed state counts (a packet
    re-injected before the commit would meet the reject flow again)."""
    tracker, proxier, rec = rig
    p = port("10.96.0.1", "fd00::1", name="web")
    tcp, v4, v6 = Protocol.TCP.ip_proto, ip("10.96.0.1"), ip("fd00::1")
    apply(tracker, p, [])
    await proxier.sync()
    assert not proxier.forwards(tcp, v4, 80)  # rejecting
    apply(tracker, p, [ep("10.0.0.1")])
    rec.fail = RuntimeError("switch says no")
    with pytest.raises(Exception, match="switch says no"):
        await proxier.sync()
    assert not proxier.forwards(tcp, v4, 80)  # staged, not installed
    await proxier.sync()
    assert proxier.forwards(tcp, v4, 80)
    assert not proxier.forwards(tcp, v6, 80)  # no IPv6 endpoint: that family still rejects
    assert not proxier.forwards(Protocol.UDP.ip_proto, v4, 80)
    tracker.on_service_delete("ns", "web")
    await proxier.sync()
    assert not proxier.forwards(tcp, v4, 80)


async def test_each_side_frontend_map_is_built_once_per_changed_port(rig, monkeypatch) -> None:
    """A changed UDP port with affinity, rejects on, standalone (mid-stream), a flush pending:
    every use after the change (untranslated flushes, pairs back, forwarding, UDP flushes,
    learned deletes) reads the old and the new map built once each."""
    tracker, proxier, rec = rig
    built: list[str] = []
    original = InstalledService.frontend_endpoints

    def counted(self: InstalledService) -> FrontendEndpoints:
        built.append(str(self.state.port.name))
        return original(self)

    monkeypatch.setattr(InstalledService, "frontend_endpoints", counted)
    rec.cookies = [OUR_OLDER_FLOW]  # a restart: the first flushes are done again (pending)
    p = port("10.96.0.1", protocol=Protocol.UDP, name="dns", affinity_timeout=60)
    apply(tracker, p, [ep("10.0.0.1"), ep("10.0.0.2")])
    await proxier.sync()
    assert built == ["ns/dns:p/UDP"]  # new only: nothing was there before
    assert proxier.mid_stream is not None and rec.pending  # every consumer is on
    built.clear()
    rec.log.clear()
    apply(tracker, port("10.96.0.1", protocol=Protocol.UDP, name="dns"), [ep("10.0.0.2")])
    await proxier.sync()
    assert built == ["ns/dns:p/UDP"] * 2  # old and new, once each
    assert proxier.forwards(17, ip("10.96.0.1"), 80)
    assert rec.kinds() == ["restored", "bundle", "send", "flush"]  # send: learned flows
    (flushes,) = rec.take("flush")
    assert FlushFilter(Protocol.UDP, ip("10.96.0.1"), 80, ip("10.0.0.1"), 8080) in flushes


@pytest.mark.parametrize("ours_on_the_switch", [False, True], ids=["empty", "restart"])
async def test_no_second_flush_after_a_commit_onto_a_switch_without_our_flows(
    rig, ours_on_the_switch: bool
) -> None:
    """The first commit onto a switch that held no flow of ours (a cold start) flushes the new
    frontends' untranslated entries once: no datapath flow cached before it came from our
    pipeline, so none can commit one again. Onto a switch with our flows (an agent restart),
    and in every later commit, they are flushed again after revalidation."""
    tracker, proxier, rec = rig
    if ours_on_the_switch:
        rec.cookies = [OUR_OLDER_FLOW]
    apply(tracker, port("10.96.0.1", protocol=Protocol.UDP, name="a"), [ep("10.0.0.1")])
    await proxier.sync()
    assert rec.flushed_again == [ours_on_the_switch]
    assert bool(rec.pending) == ours_on_the_switch
    apply(tracker, port("10.96.0.2", protocol=Protocol.UDP, name="b"), [ep("10.0.0.2")])
    await proxier.sync()
    assert rec.flushed_again == [ours_on_the_switch, True]


async def test_a_restart_flushes_a_frontend_the_switch_already_served_once(rig) -> None:
    """An agent restarted onto a switch that already serves a frontend (the older agent's
    ServiceLB flow for it: any action, any generation) flushes its untranslated entries once
    and publishes it without waiting for a second flush: no packet to it was committed
    untranslated. A frontend the switch did not serve is flushed again, as always."""
    # what an older agent (generation 7) left on the switch: its flows for "kept"
    older = FakeSwitch()
    older_tracker = ChangeTracker()
    older_tracker.on_synced(SYNC_SERVICES)
    older_tracker.on_synced(SYNC_ENDPOINT_SLICES)
    older_dp = SwitchSync(older, pl.PipelineConfig(), 7)
    older_proxier = Proxier(older_tracker, older_dp, node_name=NODE, reject_action=REJECT_MARK)
    kept = port("10.96.0.1", protocol=Protocol.UDP, name="kept")
    apply(older_tracker, kept, [ep("10.0.0.9")])  # other endpoints than now: same frontend
    await older_proxier.sync()
    tracker, proxier, rec = rig
    rec.held_flows = [(OUR_OLDER_FLOW, key) for key in older_dp.installed.flows]
    apply(tracker, kept, [ep("10.0.0.1")])
    apply(tracker, port("10.96.0.2", protocol=Protocol.UDP, name="new"), [ep("10.0.0.2")])
    await proxier.sync()
    flushes = rec.take("flush")
    assert [sorted(str(f.frontend) for f in filters) for filters in flushes] == [
        ["10.96.0.1"],
        ["10.96.0.2"],
    ]
    assert rec.flushed_again == [False, True]
    assert rec.published_at_settle is not None  # "new" waited for its second flush
    # only the frontend the switch already served: nothing to wait for
    rec2_tracker, rec2_proxier, rec2 = _rig()
    rec2.held_flows = [(OUR_OLDER_FLOW, key) for key in older_dp.installed.flows]
    apply(rec2_tracker, kept, [ep("10.0.0.1")])
    await rec2_proxier.sync()
    assert rec2.flushed_again == [False] and rec2.published_at_settle is None


async def test_a_new_frontend_is_published_only_once_its_flushes_settled(rig) -> None:
    """Its untranslated entries are flushed at once and again after revalidation; until the
    second, a connection can meet a datapath flow cached before the commit (bench soak lost
    requests begun right after /status showed the Service). An endpoint change of a known
    frontend does not wait."""
    tracker, proxier, rec = rig
    p = port("10.96.0.1", protocol=Protocol.UDP, name="web")
    apply(tracker, p, [ep("10.0.0.1")])
    await proxier.sync()
    assert rec.published_at_settle == []  # waited before publishing web
    assert [n.name for n in proxier.programmed] == ["web"]
    rec.published_at_settle = None
    apply(tracker, p, [ep("10.0.0.1"), ep("10.0.0.2")])
    await proxier.sync()
    assert rec.published_at_settle is None  # no new frontend: no wait
