"""The frontends per TCP endpoint behind the mid-stream flows (proxy.mid_stream)."""

from __future__ import annotations

import ipaddress
import re

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath import service_flows as svc
from ovsproxy.datapath.flow_context import Context
from ovsproxy.datapath.switch_sync import SwitchSync
from ovsproxy.model import (
    Endpoint,
    EndpointSlice,
    Protocol,
    Service,
    ServicePort,
    ServicePortName,
    SlicePort,
)
from ovsproxy.model.handler import SYNC_ENDPOINT_SLICES, SYNC_SERVICES
from ovsproxy.openflow import protocol as of
from ovsproxy.proxy.mid_stream import (
    Address,
    Contribution,
    MidStreamChoice,
    MidStreamIndex,
    choose,
    contribution,
)
from ovsproxy.proxy.proxier import Proxier
from ovsproxy.proxy.tracker import ChangeTracker
from tests.fakes.switch import FakeSwitch

E1 = (ipaddress.ip_address("10.244.1.10"), 8080)
E6 = (ipaddress.ip_address("fd00:10:244:1::a"), 8080)
F1 = (ipaddress.ip_address("10.96.0.10"), 80)
F2 = (ipaddress.ip_address("10.96.0.11"), 80)
F6 = (ipaddress.ip_address("fd00:10:96::10"), 80)
VNP = (pl.VIRTUAL_NODEPORT_IP[ipaddress.ip_address("10.0.0.1").version], 30080)


def _ctx() -> Context:
    config = pl.PipelineConfig()
    return Context(pl.Tables.for_config(config), 1)


def _text(flow: object) -> str:
    return re.sub(r" cookie:0x[0-9a-f]+", "", flow.to_text()).removeprefix(" ADD ")  # type: ignore[attr-defined]


K1 = svc.endpoint_key(*E1)
K6 = svc.endpoint_key(*E6)


def test_contribution_inverts_and_leaves_the_virtual_nodeport_ip_out() -> None:
    got = contribution({F1: frozenset({E1}), VNP: frozenset({E1}), F6: frozenset({E6})})
    assert got == {K1: frozenset({F1}), K6: frozenset({F6})}
    assert contribution({F1: frozenset({E1, E6})}) == {K1: {F1}, K6: {F1}}
    assert contribution({F1: frozenset(), F2: frozenset({E1})}) == {K1: {F2}}
    assert svc.endpoint_of_key(K1) == E1 and svc.endpoint_of_key(K6) == E6


def test_one_frontend_recreates_the_translation_more_drop() -> None:
    one = _text(svc.mid_stream_flow(_ctx(), *E1, [F1]))
    assert one == (
        "table:13 priority=100,tcp,reg0=0x8/0x8,nw_src=10.244.1.10,tp_src=8080 actions="
        "ct(commit,table=20,zone=65520,nat(src=10.96.0.10:80),exec(set_field:0x10/0x10->ct_mark))"
    )
    v6 = _text(svc.mid_stream_flow(_ctx(), *E6, [F6]))
    assert "ipv6_src=fd00:10:244:1::a" in v6 and "nat(src=[fd00:10:96::10]:80)" in v6, v6
    assert "zone=65510" in v6
    two = _text(svc.mid_stream_flow(_ctx(), *E1, [F1, F2]))
    assert two.endswith("tp_src=8080 actions=drop")


class Recorder:
    """Stands in for the datapath's ``stage``: what each owner wants now, as text."""

    def __init__(self) -> None:
        self.staged: dict[object, list[str]] = {}

    def stage(self, owner: object, groups: object, flows: list[object]) -> None:
        self.staged[owner] = [_text(of.decode_flow_mod(f[1])) for f in flows]  # type: ignore[index]


def test_index_stages_what_changed_and_removes_what_left() -> None:
    rec = Recorder()
    index = MidStreamIndex()
    index.update("a", {K1: frozenset({F1})})
    index.update("b", {K1: frozenset({F2})})  # a second Service with the same endpoint
    assert index.stage(rec, _ctx()) == 2  # type: ignore[arg-type]
    assert rec.staged[("mid-stream", "a")][0].endswith("actions=drop")
    assert rec.staged[("mid-stream", "b")] == rec.staged[("mid-stream", "a")]
    index.update("b", {})  # it leaves: one frontend again, and a's flow says so
    assert index.stage(rec, _ctx()) == 2  # type: ignore[arg-type]
    assert "nat(src=10.96.0.10:80)" in rec.staged[("mid-stream", "a")][0]
    assert rec.staged[("mid-stream", "b")] == []
    index.update("a", {})
    index.stage(rec, _ctx())  # type: ignore[arg-type]
    assert rec.staged[("mid-stream", "a")] == []
    assert index.stage(rec, _ctx()) == 0  # type: ignore[arg-type]


F6B = (ipaddress.ip_address("fd00:10:96::11"), 80)
# an endpoint's frontends are of its family
_entries = st.one_of(
    st.tuples(
        st.sampled_from([K1, svc.endpoint_key(*F1)]),
        st.frozensets(st.sampled_from([F1, F2, E1]), min_size=1, max_size=3),
    ),
    st.tuples(st.just(K6), st.frozensets(st.sampled_from([F6, F6B]), min_size=1)),
)
_contributions = st.lists(_entries, max_size=3).map(dict)


@given(st.lists(st.tuples(st.integers(0, 3), _contributions), min_size=1, max_size=12))
@example(  # found by hypothesis: equal content in another order, the flows listed as first
    [
        (0, {K1: frozenset({F1}), svc.endpoint_key(*F1): frozenset({E1, F1, F2})}),
        (0, {svc.endpoint_key(*F1): frozenset({E1, F1, F2}), K1: frozenset({F1})}),
    ]
)
def test_staged_flows_equal_a_recount_from_scratch(changes: list[tuple[int, Contribution]]) -> None:
    """Any sequence of Service ports changing their contribution, staged after each change or
    after several: every port's staged flows are those computed afresh from what every port
    contributes now (an endpoint's flow from all its holders' frontends)."""
    index = MidStreamIndex()
    rec = Recorder()
    current: dict[int, Contribution] = {}
    for step, (port, new) in enumerate(changes):
        index.update(port, new)
        current[port] = new
        if step % 2 or step == len(changes) - 1:
            index.stage(rec, _ctx())  # type: ignore[arg-type]
    every: dict[int, set[Address]] = {}
    for contrib in current.values():
        for key, fronts in contrib.items():
            every.setdefault(key, set()).update(fronts)
    for port, contrib in current.items():
        expected = [
            _text(
                svc.mid_stream_flow(_ctx(), *svc.endpoint_of_key(key), sorted(every[key], key=str))
            )
            for key in contrib
        ]
        # A port's flows are a set to the switch: the order they are staged in follows the
        # order its endpoints first came in, which an update with equal content keeps.
        assert sorted(rec.staged.get(("mid-stream", port), [])) == sorted(expected)
    for key, fronts in every.items():
        assert index.frontends(key) == fronts


_v4 = st.integers(1, 2**32 - 2).map(ipaddress.IPv4Address)
_v6 = st.integers(1, 2**128 - 2).map(ipaddress.IPv6Address)
_ports = st.integers(1, 0xFFFF)


@given(
    st.one_of(
        st.tuples(_v4, _ports, st.lists(st.tuples(_v4, _ports), min_size=1, max_size=3)),
        st.tuples(_v6, _ports, st.lists(st.tuples(_v6, _ports), min_size=1, max_size=3)),
    )
)
def test_the_fast_encoding_is_the_generic_one(case: tuple) -> None:  # type: ignore[type-arg]
    ip, port, frontends = case
    fronts = dict.fromkeys(frontends)
    assert svc.mid_stream_wire(_ctx(), svc.endpoint_key(ip, port), fronts) == (
        svc.mid_stream_flow(_ctx(), ip, port, fronts).wire
    )


@pytest.mark.parametrize(
    ("setting", "datapath_type", "standalone", "on"),
    [
        ("auto", "netdev", True, True),  # userspace: conntrack goes with ovs-vswitchd
        ("auto", "system", True, False),  # the kernel's conntrack outlives it
        ("auto", "dpdk-like", True, True),  # a type not known to keep conntrack: on
        ("auto", None, True, True),  # not read: on, to be safe
        ("off", "netdev", True, False),
        ("on", "system", True, True),
        ("on", "netdev", False, False),  # integrated: never (the CNI forwards)
    ],
)
def test_mid_stream_flows_are_chosen_by_datapath_type_unless_configured(
    setting: str, datapath_type: str | None, standalone: bool, on: bool
) -> None:
    choice = choose(setting, datapath_type, standalone)
    assert choice.on is on
    assert choice.status() == {
        "on": on,
        "setting": setting,
        "datapath_type": datapath_type,
        "reason": choice.reason,
    }
    with pytest.raises(ValueError, match="mid_stream_flows: 'yes'"):
        choose("yes", datapath_type)


def _web_sync(choice: MidStreamChoice | None) -> tuple[Proxier, FakeSwitch]:
    tracker = ChangeTracker()
    tracker.on_synced(SYNC_SERVICES)
    tracker.on_synced(SYNC_ENDPOINT_SLICES)
    switch = FakeSwitch()
    dp = SwitchSync(switch, pl.PipelineConfig(), 1)
    proxier = Proxier(tracker, dp, node_name="node-a", mid_stream=choice)
    name = ServicePortName("ns", "web", "http", Protocol.TCP)
    tracker.on_service_update(
        Service("ns", "web", (ServicePort(name, (ipaddress.ip_address("10.96.0.10"),), 80),))
    )
    endpoints = tuple(Endpoint(ipaddress.ip_address(f"10.244.1.{i}"), 8080) for i in (10, 11))
    tracker.on_endpoint_slice_update(
        EndpointSlice("ns", "web-1", "web", (SlicePort("http", Protocol.TCP, endpoints),))
    )
    return proxier, switch


def _probe_or_mid_stream(flows: list[of.FlowMod]) -> list[of.FlowMod]:
    return [
        f
        for f in flows
        if f.priority
        in (pl.PRIORITY_MID_STREAM, pl.PRIORITY_PROBE_END, pl.PRIORITY_LOCAL_POD_PROBE)
    ]


async def test_without_mid_stream_flows_neither_they_nor_their_probe_are_installed() -> None:
    proxier, switch = _web_sync(choose("auto", "system"))
    await proxier.sync()
    flows = [of.decode(m) if isinstance(m, bytes) else m for b in switch.bundles for m in b]
    flow_mods = [m for m in flows if isinstance(m, of.FlowMod)]
    assert flow_mods and not _probe_or_mid_stream(flow_mods)
    assert proxier.mid_stream is None and not proxier.mid_stream_choice.on
    # the userspace datapath: one flow per TCP endpoint, and the probe
    proxier, switch = _web_sync(choose("auto", "netdev"))
    await proxier.sync()
    flows = [of.decode(m) if isinstance(m, bytes) else m for b in switch.bundles for m in b]
    found = _probe_or_mid_stream([m for m in flows if isinstance(m, of.FlowMod)])
    service_lb = [f for f in found if f.table_id == proxier.ctx.tables.service_lb]
    assert len(service_lb) == 2  # one per endpoint
    assert {f.table_id for f in found} == {
        proxier.ctx.tables.conntrack_state,
        proxier.ctx.tables.service_lb,
        proxier.ctx.tables.forwarding,
    }
