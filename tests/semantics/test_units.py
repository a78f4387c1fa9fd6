"""Pure parts: affinity timeout realisation and the sweeper's choice; conntrack filters, the
dump parser and the flusher's fallbacks."""

from __future__ import annotations

import asyncio
import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath import service_flows as svc
from ovsproxy.datapath.affinity import AffinitySweeper, delete_message, expired_flows
from ovsproxy.datapath.conntrack import (
    ConntrackFlusher,
    FlushFilter,
    parse_dump,
    vswitchd_appctl,
)
from ovsproxy.model import Protocol
from ovsproxy.openflow import protocol as of

TABLES = pl.Tables.for_config(pl.PipelineConfig())


def ip(text: str):
    return ipaddress.ip_address(text)


@given(st.integers(0, 86400), st.integers(1, 0xFFFF))
def test_timeouts_up_to_the_limit_are_ovs_idle_timeouts_above_it_agent_swept(timeout, limit):
    idle, swept = svc.affinity_timeouts(timeout, limit)
    if timeout == 0:
        assert (idle, swept) == (0, False)
    elif timeout <= limit:
        assert (idle, swept) == (timeout, False)
    else:
        assert (idle, swept) == (0, True)
    cookie = pl.learned_cookie(timeout, swept)
    assert pl.learned_cookie_timeout(cookie) == (timeout, swept)
    assert pl.cookie_generation(cookie) == pl.LEARNED_GENERATION
    assert cookie & pl.LEARNED_CATEGORY_MASK == pl.learned_cookie()


def test_kubernetes_maximum_is_not_capped() -> None:
    assert svc.affinity_timeouts(86400) == (0, True)
    assert svc.affinity_timeouts(65535) == (65535, False)
    assert svc.affinity_timeouts(10800) == (10800, False)  # the Kubernetes default


def desc(timeout: int, swept: bool, idle_age: int | None, idle_timeout: int = 0) -> of.FlowDesc:
    flow = of.FlowMod(
        table_id=TABLES.session_affinity,
        priority=200,
        match=of.Match(eth_type=0x800, ipv4_src=ip("10.0.0.1")),
        cookie=pl.learned_cookie(timeout, swept),
        idle_timeout=idle_timeout,
    )
    return of.FlowDesc(flow, idle_age=idle_age)


def test_the_sweeper_expires_only_swept_flows_idle_for_their_timeout() -> None:
    flows = [
        desc(70000, True, 70000),  # expired
        desc(70000, True, 69999),  # not yet
        desc(90000, True, 100000),  # expired
        desc(70000, False, 80000, idle_timeout=0),  # not swept: not ours to expire
        desc(60, False, 100, idle_timeout=60),  # OVS's
        desc(70000, True, None),  # no idle age reported: keep
    ]
    assert expired_flows(flows) == [flows[0], flows[2]]
    delete = delete_message(flows[0].flow)
    assert delete.command == of.FlowModCommand.DELETE_STRICT
    assert (delete.cookie, delete.cookie_mask) == (flows[0].flow.cookie, 2**64 - 1)
    assert delete.match == flows[0].flow.match


async def test_sweep_once_dumps_swept_learned_flows_and_deletes_the_expired() -> None:
    class Channel:
        sent: list = []

        async def dump_flows(self, table_id, *, cookie, cookie_mask):
            assert table_id == TABLES.session_affinity
            assert cookie & cookie_mask == pl.learned_cookie(0, swept=True)
            return [desc(70000, True, 70001), desc(70000, True, 3)]

        async def send(self, messages):
            self.sent.extend(messages)

    channel = Channel()
    sweeper = AffinitySweeper(channel, TABLES)
    assert await sweeper.sweep_once() == 1
    assert len(channel.sent) == 1 and sweeper.stats.as_dict()["flows_under_agent_expiry"] == 2


DUMP = """\
udp,orig=(src=10.244.0.2,dst=10.96.0.40,sport=41234,dport=53),reply=(src=10.244.0.3,dst=10.244.0.2,sport=5353,dport=41234),zone=65520,mark=16
udp,orig=(src=10.244.0.2,dst=10.96.0.40,sport=41235,dport=53),reply=(src=10.244.0.4,dst=10.244.0.2,sport=5353,dport=41235),zone=65520,mark=16
tcp,orig=(src=10.244.0.2,dst=10.96.0.40,sport=40000,dport=53),reply=(src=10.244.0.3,dst=10.244.0.2,sport=5353,dport=40000),zone=65520,protoinfo=(state=ESTABLISHED)
udp,orig=(src=fd00:10:244::2,dst=fd00:10:96::40,sport=1,dport=53),reply=(src=fd00:10:244::3,dst=fd00:10:244::2,sport=5353,dport=1),zone=65510
icmp,orig=(src=10.244.0.2,dst=10.244.0.1,id=1,type=8,code=0),reply=(src=10.244.0.1,dst=10.244.0.2,id=1,type=0,code=0)
"""


def test_parse_dump_and_filters() -> None:
    entries = parse_dump(DUMP)
    assert [e.proto for e in entries] == [17, 17, 6, 17]  # icmp has no ports: skipped
    one = FlushFilter(Protocol.UDP, ip("10.96.0.40"), 53, ip("10.244.0.3"), 5353)
    every = FlushFilter(Protocol.UDP, ip("10.96.0.40"), 53)
    v6 = FlushFilter(Protocol.UDP, ip("fd00:10:96::40"), 53, ip("fd00:10:244::3"), 5353)
    assert [one.matches(e) for e in entries] == [True, False, False, False]
    assert [every.matches(e) for e in entries] == [True, True, False, False]
    assert [v6.matches(e) for e in entries] == [False, False, False, True]
    assert entries[0].flush_tuple() == (
        "ct_nw_src=10.244.0.2,ct_nw_dst=10.96.0.40,ct_nw_proto=17,ct_tp_src=41234,ct_tp_dst=53"
    )
    assert entries[3].flush_tuple().startswith("ct_ipv6_src=fd00:10:244::2,")
    msg = one.message()
    assert (msg.zone, msg.ip_proto) == (0xFFF0, 17)
    assert msg.orig == (None, ip("10.96.0.40"), 0, 53)
    assert msg.reply == (ip("10.244.0.3"), None, 5353, 0)


class Refusing:
    """A switch that refuses NXT_CT_FLUSH like OVS < 3.1."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls = 0

    async def send(self, messages):
        self.calls += 1
        error = RuntimeError("refused")
        error.name = self.name  # type: ignore[attr-defined]
        raise error


@pytest.mark.parametrize("with_appctl", [False, True])
async def test_flusher_falls_back_when_the_switch_does_not_know_ct_flush(with_appctl) -> None:
    calls: list[list[str]] = []

    async def appctl(args):
        calls.append(list(args))
        return DUMP if args[0] == "dpctl/dump-conntrack" else ""

    channel = Refusing("OFPET_BAD_REQUEST/OFPBRC_BAD_SUBTYPE")
    flusher = ConntrackFlusher(channel, appctl=appctl if with_appctl else None)
    filt = FlushFilter(Protocol.UDP, ip("10.96.0.40"), 53)
    await flusher.flush([filt])
    await flusher.flush([filt])
    await flusher.settled()
    assert channel.calls == 1  # detected once
    if with_appctl:
        # Two flushes, then the second flush of both (one filter) after revalidation: three
        # dumps with two matching entries each.
        assert flusher.stats.mode == "appctl" and flusher.stats.appctl_entries == 6
        flushed = [c[2] for c in calls if c[0] == "dpctl/flush-conntrack"]
        assert len(flushed) == 6 and all("ct_tp_dst=53" in t for t in flushed)
        assert [c[0] for c in calls].count("revalidator/wait") == 2
    else:
        assert flusher.stats.mode == "unsupported" and calls == []
        assert flusher.stats.settle_flushes == 0


class Switch:
    """Records what the flusher does, in order; ``gate`` holds each revalidator/wait."""

    def __init__(self) -> None:
        self.log: list[object] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail_wait = False

    async def send(self, messages) -> None:
        self.log.append(("flush", sorted(str(m.orig[1]) + str(m.reply[0]) for m in messages)))

    async def appctl(self, args):
        self.log.append(args[0])
        await self.gate.wait()
        if self.fail_wait:
            raise RuntimeError("ovs-appctl: cannot connect")
        return ""


def pair(frontend: str, backend: str) -> FlushFilter:
    return FlushFilter(Protocol.UDP, ip(frontend), 53, ip(backend), 5353)


async def test_every_filter_is_flushed_again_after_two_revalidator_waits() -> None:
    switch = Switch()
    flusher = ConntrackFlusher(switch, appctl=switch.appctl)
    await flusher.flush([pair("10.96.0.40", "10.244.0.3")])
    assert switch.log == [("flush", ["10.96.0.4010.244.0.3"])] and flusher.pending == 1
    await flusher.settled()
    assert switch.log[1:] == [
        "revalidator/wait",
        "revalidator/wait",
        ("flush", ["10.96.0.4010.244.0.3"]),
    ]
    stats = flusher.stats
    assert (stats.messages, stats.settle_flushes, stats.revalidation) == (2, 1, "appctl")
    assert flusher.pending == 0


async def test_filters_queued_during_a_wait_wait_for_the_next_round_and_kept_pairs_skip() -> None:
    switch = Switch()
    switch.gate.clear()
    flusher = ConntrackFlusher(switch, appctl=switch.appctl)
    first, second, back = (pair("10.96.0.40", f"10.244.0.{i}") for i in (3, 4, 5))
    await flusher.flush([first, back])
    await asyncio.sleep(0)  # the settle task is waiting for revalidation now
    await flusher.flush([second])  # its commit came after that wait began
    flusher.restored([back])  # and this pair is an endpoint again
    switch.gate.set()
    await flusher.settled()
    flushes = [entry for entry in switch.log if isinstance(entry, tuple)]
    assert flushes == [
        ("flush", ["10.96.0.4010.244.0.3", "10.96.0.4010.244.0.5"]),
        ("flush", ["10.96.0.4010.244.0.4"]),
        ("flush", ["10.96.0.4010.244.0.3"]),  # after the first two waits: not `second`
        ("flush", ["10.96.0.4010.244.0.4"]),  # after two more
    ]
    assert switch.log.count("revalidator/wait") == 4
    assert (flusher.stats.settle_flushes, flusher.stats.settle_restored) == (2, 1)


@pytest.mark.parametrize("appctl", ["none", "failing"])
async def test_without_revalidator_wait_the_second_flush_is_timed(appctl: str) -> None:
    switch = Switch()
    switch.fail_wait = True
    flusher = ConntrackFlusher(
        switch, appctl=switch.appctl if appctl == "failing" else None, revalidation_grace=0.05
    )
    started = asyncio.get_running_loop().time()
    await flusher.flush([pair("10.96.0.40", "10.244.0.3")])
    await flusher.settled()
    assert asyncio.get_running_loop().time() - started >= 0.05
    assert flusher.stats.revalidation == "timed" and flusher.stats.settle_flushes == 1
    await flusher.flush([pair("10.96.0.40", "10.244.0.4")])
    await flusher.settled()
    # A failing revalidator/wait is tried once, not per batch.
    assert switch.log.count("revalidator/wait") == (1 if appctl == "failing" else 0)
    assert len([e for e in switch.log if isinstance(e, tuple)]) == 4


async def test_close_stops_a_pending_second_flush() -> None:
    switch = Switch()
    switch.gate.clear()
    flusher = ConntrackFlusher(switch, appctl=switch.appctl)
    await flusher.flush([pair("10.96.0.40", "10.244.0.3")])
    await asyncio.sleep(0)
    await flusher.close()
    await flusher.settled()
    assert len([e for e in switch.log if isinstance(e, tuple)]) == 1


def test_the_vswitchd_control_socket_is_found_next_to_a_unix_openflow_socket(tmp_path) -> None:
    assert vswitchd_appctl("tcp:127.0.0.1:6653") is None
    assert vswitchd_appctl(f"unix:{tmp_path}/br0.mgmt") is None  # no daemon there
    (tmp_path / "ovs-vswitchd.pid").write_text("4242\n")
    (tmp_path / "ovs-vswitchd.4242.ctl").touch()  # OVS's default name
    assert vswitchd_appctl(f"unix:{tmp_path}/br0.mgmt") is not None
    (tmp_path / "ovs-vswitchd.4242.ctl").unlink()
    (tmp_path / "ovs-vswitchd.ctl").touch()  # --unixctl, as the sandbox names it
    assert vswitchd_appctl(f"unix:{tmp_path}/br0.mgmt") is not None


async def test_flusher_keeps_openflow_after_an_ordinary_error() -> None:
    channel = Refusing("OFPET_BAD_REQUEST/OFPBRC_EPERM")
    flusher = ConntrackFlusher(channel)
    await flusher.flush([FlushFilter(Protocol.UDP, ip("10.96.0.40"), 53)])
    assert flusher.stats.mode == "openflow" and flusher.stats.failures == 1
    await flusher.close()


async def test_wired_semantics_install_the_meter_before_the_replay() -> None:
    from ovsproxy.datapath.semantics import SemanticsHelpers

    order: list[str] = []

    class Channel:
        async def replay(self) -> None:
            order.append("replay")

        def __init__(self) -> None:
            self.on_connected = self.replay
            self.connected = True

        async def send(self, messages) -> None:
            order.append(type(messages[0]).__name__)

    class SwitchSync:
        tables = TABLES

    channel = Channel()
    semantics = SemanticsHelpers.wired(channel, SwitchSync())
    await channel.on_connected()
    assert order == ["MeterMod", "replay"]
    assert semantics.status()["reject"]["meter"] == "installed"
    semantics.handle(
        of.PacketIn(of.PacketInReason.ACTION, 13, 0, of.Match(in_port=1), b"", userdata=b"x")
    )
    assert semantics.rejector.stats.foreign == 1
    await semantics.close()
