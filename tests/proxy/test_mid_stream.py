"""The frontends per TCP endpoint behind the mid-stream flows (proxy.mid_stream)."""

from __future__ import annotations

import ipaddress
import re

from hypothesis import given
from hypothesis import strategies as st

from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath import service_flows as svc
from ovsproxy.datapath.flow_context import Context
from ovsproxy.openflow import protocol as of
from ovsproxy.proxy.mid_stream import Address, Contribution, MidStreamIndex, contribution

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


def test_contribution_inverts_and_leaves_the_virtual_nodeport_ip_out() -> None:
    got = contribution({F1: frozenset({E1}), VNP: frozenset({E1}), F6: frozenset({E6})})
    assert got == {E1: frozenset({F1}), E6: frozenset({F6})}


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


def test_index_stages_what_changed_and_removes_what_left() -> None:
    staged: dict[object, list[str]] = {}

    class Recorder:
        def stage(self, owner: object, groups: object, flows: list[object]) -> None:
            staged[owner] = [_text(of.decode_flow_mod(f[1])) for f in flows]  # encoded

    index = MidStreamIndex()
    index.update({}, {E1: frozenset({F1})})
    index.update({}, {E1: frozenset({F2})})  # a second Service with the same endpoint
    assert index.stage(Recorder(), _ctx()) == 1  # type: ignore[arg-type]
    assert staged[("mid-stream", *E1)][0].endswith("actions=drop")
    index.update({E1: frozenset({F2})}, {})  # it leaves: one frontend again
    index.stage(Recorder(), _ctx())  # type: ignore[arg-type]
    assert "nat(src=10.96.0.10:80)" in staged[("mid-stream", *E1)][0]
    index.update({E1: frozenset({F1})}, {})
    index.stage(Recorder(), _ctx())  # type: ignore[arg-type]
    assert staged[("mid-stream", *E1)] == []
    assert index.stage(Recorder(), _ctx()) == 0  # type: ignore[arg-type]


_addresses = st.sampled_from([E1, E6, F1, F2, F6])
_contributions = st.dictionaries(_addresses, st.frozensets(_addresses, min_size=1), max_size=3)


@given(st.lists(st.tuples(st.integers(0, 3), _contributions), max_size=12))
def test_index_equals_a_recount_from_scratch(changes: list[tuple[int, Contribution]]) -> None:
    """Any sequence of Service ports changing their contribution: the counts equal those
    counted afresh from what each port contributes now."""
    index = MidStreamIndex()
    current: dict[int, Contribution] = {}
    for port, new in changes:
        index.update(current.get(port, {}), new)
        current[port] = new
    expected: dict[Address, set[Address]] = {}
    for contrib in current.values():
        for endpoint, fronts in contrib.items():
            expected.setdefault(endpoint, set()).update(fronts)
    for endpoint in (E1, E6, F1, F2, F6):
        assert set(index.frontends(endpoint)) == expected.get(endpoint, set())


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
    assert svc.mid_stream_wire(_ctx(), ip, port, fronts) == (
        svc.mid_stream_flow(_ctx(), ip, port, fronts).wire
    )
