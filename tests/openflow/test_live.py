"""Live tests against a private Open vSwitch (the ``sandbox`` fixture): the channel and the
codec do what ``ovs-ofctl`` sees."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator

import pytest

from ovsproxy.datapath.groups import SelectionMethod, group_mod_chunks
from ovsproxy.openflow import protocol as of
from ovsproxy.openflow.connection import Channel
from ovsproxy.openflow.errors import (
    BundleError,
    ChannelError,
    ChannelNotReady,
    ConnectionLost,
    OpenFlowError,
    VersionMismatch,
)
from ovsproxy.ovs.sandbox import Sandbox

pytestmark = [
    pytest.mark.ovs,
    pytest.mark.shared_sandbox,
    pytest.mark.skipif(os.geteuid() != 0, reason="the OVS sandbox needs root"),
]

IP = ipaddress.ip_address
ADD = of.GroupModCommand.ADD


def svc_bucket(bucket_id: int, ip: str, port: int = 80, weight: int = 100) -> of.Bucket:
    return of.Bucket(
        bucket_id,
        [of.SetField("reg3", IP(ip)), of.SetField("reg4", port, 0xFFFF), of.Resubmit(42)],
        weight=weight,
    )


def service_group(group_id: int = 5) -> of.GroupMod:
    return of.GroupMod(
        ADD,
        group_id,
        buckets=[
            svc_bucket(0, "10.0.0.1"),
            svc_bucket(1, "10.0.0.2", 8080, 50),
            svc_bucket(2, "10.0.0.3"),
        ],
        selection_method="dp_hash",
    )


def service_flows() -> list[of.FlowMod]:
    lb = of.FlowMod(
        10,
        200,
        of.Match(eth_type=0x800, ip_proto=6, ipv4_dst=IP("10.96.0.10"), tcp_dst=80),
        actions=[of.GroupAction(5)],
        cookie=0x51,
    )
    dnat = of.FlowMod(
        42,
        200,
        of.Match(eth_type=0x800, ip_proto=6, reg3=IP("10.0.0.1"), reg4=(80, 0xFFFF)),
        actions=[
            of.CT(
                commit=True,
                zone=65520,
                table=50,
                nat=of.NAT(dst=True, ip_min=IP("10.0.0.1"), port_min=80),
                actions=[of.SetField("ct_mark", 0x2, 0x2)],
            )
        ],
        cookie=0x52,
    )
    return [lb, dnat]


def ofctl_flows(sandbox: Sandbox, *args: str) -> list[str]:
    out = sandbox.ofctl("dump-flows", "--no-stats", *args)
    return sorted(line.strip() for line in out.splitlines() if line.strip())


def ofctl_groups(sandbox: Sandbox) -> list[str]:
    out = sandbox.ofctl("dump-groups")
    return [line.strip() for line in out.splitlines()[1:] if line.strip()]


async def eventually(predicate, timeout: float, what: str) -> float:  # type: ignore[no-untyped-def]
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"not within {timeout}s: {what}")
        await asyncio.sleep(0.02)
    return time.monotonic() - started


@pytest.fixture
async def channel(sandbox: Sandbox) -> AsyncIterator[Channel]:
    ch = Channel(sandbox.openflow, request_timeout=10)
    await ch.start()
    yield ch
    await ch.close()


async def test_group_and_flows_in_one_bundle_appear_exactly(
    sandbox: Sandbox, channel: Channel
) -> None:
    group = service_group()
    flows = service_flows()
    await channel.commit_bundle([group, *flows])
    assert ofctl_groups(sandbox) == [of.format_group(group)]
    assert ofctl_flows(sandbox) == sorted(of.format_flow(f) for f in flows)
    # And the same through our own dumps: decoded values equal what was sent.
    assert await channel.dump_groups() == [group]
    installed = await channel.dump_flows()
    assert sorted(d.flow.wire for d in installed) == sorted(f.wire for f in flows)
    assert {d.flow for d in installed} == set(flows)
    assert await channel.group_ids() == {5}
    assert sorted(await channel.flow_cookies(0x50, 0xF0)) == [0x51, 0x52]


async def test_a_small_bundle_is_two_writes_open_adds_close_then_commit(
    sandbox: Sandbox, channel: Channel
) -> None:
    # Each write wakes the switch: a small bundle costs two (CLOSE's reply must come back
    # before the COMMIT, so that an add refused at add time is never committed without it).
    conn = channel._conn
    assert conn is not None
    writes: list[list[str]] = []
    real_write = conn.write

    def name(msg: of.Message) -> str:
        if isinstance(msg, of.BundleCtrl):
            return of.BundleCtrlType(msg.ctrl_type).name
        return type(msg).__name__

    def write(data: bytes) -> None:
        parser = of.Parser()
        parser.feed(data)
        writes.append([name(of.decode(m)) for m in parser])
        real_write(data)

    conn.write = write  # type: ignore[method-assign]
    group = service_group()
    await channel.commit_bundle([group, *service_flows()])
    adds = ["BundleAdd"] * (1 + len(service_flows()))
    assert writes == [["OPEN_REQUEST", *adds, "CLOSE_REQUEST"], ["COMMIT_REQUEST"]]
    assert ofctl_groups(sandbox) == [of.format_group(group)]


async def test_flow_options_appear_as_ovs_ofctl_prints_them(
    sandbox: Sandbox, channel: Channel
) -> None:
    flow = of.FlowMod(
        3,
        0,
        None,
        [of.GotoTable(4)],
        cookie=0x1234,
        idle_timeout=100,
        hard_timeout=200,
        importance=3,
        flags=of.FlowModFlags.SEND_FLOW_REM | of.FlowModFlags.NO_PKT_COUNTS,
    )
    await channel.commit_bundle([flow])
    assert ofctl_flows(sandbox) == [of.format_flow(flow)]
    (desc,) = await channel.dump_flows()
    assert desc.flow == flow
    assert desc.packet_count == 0 and desc.idle_age is not None


async def test_duplicate_group_add_fails_the_whole_bundle(
    sandbox: Sandbox, channel: Channel
) -> None:
    group = service_group()
    await channel.commit_bundle([group])
    before_groups, before_flows = ofctl_groups(sandbox), ofctl_flows(sandbox)
    new_group = of.GroupMod(ADD, 9, buckets=[svc_bucket(0, "10.0.0.9")])
    marker = of.FlowMod(11, 1, of.Match(reg1=7), actions=[of.Output(1)], cookie=0x11)
    with pytest.raises(BundleError) as info:
        await channel.commit_bundle([new_group, marker, group, marker.replace(table_id=12)])
    error = info.value
    assert error.name == "OFPET_GROUP_MOD_FAILED/OFPGMFC_GROUP_EXISTS"
    assert error.code_name == "OFPGMFC_GROUP_EXISTS"
    assert len(error.failures) == 1
    assert error.request == of.to_text(group)  # the failing message, identified
    assert "group_id=5" in str(error)
    # Discarded: nothing from the bundle is installed, the old group is untouched.
    assert ofctl_groups(sandbox) == before_groups
    assert ofctl_flows(sandbox) == before_flows
    # The channel is still usable.
    await channel.commit_bundle([new_group])
    assert await channel.group_ids() == {5, 9}


async def test_an_invalid_message_is_reported_at_add_time_and_nothing_is_applied(
    sandbox: Sandbox, channel: Channel
) -> None:
    good = of.FlowMod(30, 1, of.Match(reg2=1), actions=[of.Output(2)])
    bad = of.FlowMod(20, 1, instructions=[of.GotoTable(10)])  # goto must go forward
    with pytest.raises(BundleError) as info:
        await channel.commit_bundle([good, bad])
    assert info.value.stage == "add"
    assert info.value.name == "OFPET_BAD_INSTRUCTION/OFPBIC_BAD_TABLE_ID"
    assert "goto_table:10" in (info.value.request or "")
    assert ofctl_flows(sandbox) == []
    with pytest.raises(OpenFlowError) as single:
        await channel.send([bad])
    assert single.value.name == "OFPET_BAD_INSTRUCTION/OFPBIC_BAD_TABLE_ID"


async def test_insert_and_remove_buckets(sandbox: Sandbox, channel: Channel) -> None:
    insert = of.GroupModCommand.INSERT_BUCKET
    remove = of.GroupModCommand.REMOVE_BUCKET
    await channel.commit_bundle(
        [of.GroupMod(ADD, 7, buckets=[svc_bucket(0, "10.0.0.1"), svc_bucket(1, "10.0.0.2")])]
    )
    await channel.commit_bundle([of.GroupMod(insert, 7, buckets=[svc_bucket(5, "10.0.0.5")])])
    await channel.commit_bundle(
        [of.GroupMod(insert, 7, buckets=[svc_bucket(7, "10.0.0.7")], command_bucket_id=0)]
    )
    await channel.commit_bundle(
        [
            of.GroupMod(
                insert,
                7,
                buckets=[svc_bucket(9, "10.0.0.9")],
                command_bucket_id=of.OFPG_BUCKET_FIRST,
            )
        ]
    )
    await channel.commit_bundle([of.GroupMod(remove, 7, command_bucket_id=1)])
    (group,) = await channel.dump_groups(7)
    assert [b.bucket_id for b in group.buckets] == [9, 0, 7, 5]
    assert group.buckets[2] == svc_bucket(7, "10.0.0.7")
    assert ofctl_groups(sandbox) == [of.format_group(group)]
    with pytest.raises(BundleError) as info:
        await channel.commit_bundle([of.GroupMod(remove, 7, command_bucket_id=1)])
    assert info.value.name == "OFPET_GROUP_MOD_FAILED/OFPGMFC_UNKNOWN_BUCKET"
    with pytest.raises(BundleError) as info:
        await channel.commit_bundle([of.GroupMod(insert, 7, buckets=[svc_bucket(5, "10.0.0.6")])])
    assert info.value.name == "OFPET_GROUP_MOD_FAILED/OFPGMFC_BUCKET_EXISTS"


async def test_large_groups_go_in_chunks_and_oversized_messages_are_refused(
    sandbox: Sandbox, channel: Channel
) -> None:
    buckets = [svc_bucket(i, f"10.1.{i // 250}.{i % 250 + 1}") for i in range(2500)]
    too_big = of.GroupMod(ADD, 8, buckets=buckets[:1023], selection_method="dp_hash")
    assert too_big.length > of.OFP_MAX_MESSAGE_LEN
    with pytest.raises(of.MessageTooLarge, match="split"):
        of.encode(too_big, 1)
    with pytest.raises(of.MessageTooLarge, match="split"):
        await channel.commit_bundle([too_big])
    assert await channel.group_ids() == set()
    chunks = group_mod_chunks(ADD, 8, buckets, SelectionMethod("dp_hash"))
    assert len(chunks) == 3
    await channel.commit_bundle(chunks)
    (stats,) = await channel.group_stats(8)
    assert stats.n_buckets == 2500
    # A GROUP_DESC of this group would overflow Open vSwitch's 16-bit lengths: refused.
    with pytest.raises(ChannelError, match="over 1000 buckets"):
        await channel.dump_groups()
    assert await channel.group_ids() == {8}
    # The bucket order is the requested one: check it on a group small enough to dump.
    chunks = group_mod_chunks(ADD, 9, buckets[:900], limit=20_000)
    assert len(chunks) == 3
    await channel.commit_bundle(chunks)
    (group,) = await channel.dump_groups(9)
    assert group.buckets == tuple(buckets[:900])
    await channel.barrier()


async def test_streaming_a_big_bundle_and_counters(sandbox: Sandbox, channel: Channel) -> None:
    flows = [
        of.FlowMod(
            20,
            100,
            of.Match(eth_type=0x800, ip_proto=6, ipv4_dst=IP(0x0A600000 + i), tcp_dst=80),
            actions=[of.SetField("reg3", i), of.Resubmit(30)],
            cookie=0x7000 + i,
        )
        for i in range(5000)
    ]
    sent_before = channel.counters.sent.get("BUNDLE_ADD_MESSAGE", [0, 0])[0]
    await channel.commit_bundle(flows)
    installed = await channel.dump_flows(20)
    assert len(installed) == 5000
    assert {d.flow for d in installed} == set(flows)
    counters = channel.counters.snapshot()
    assert counters["sent"]["BUNDLE_ADD_MESSAGE"]["messages"] - sent_before == 5000
    assert counters["bundled"]["FLOW_MOD"]["messages"] == 5000
    assert counters["bundled"]["FLOW_MOD"]["bytes"] == sum(f.length for f in flows)
    assert counters["received"]["MULTIPART_REPLY"]["messages"] >= 2  # the dump came in parts
    assert counters["received"]["MULTIPART_REPLY"]["bytes"] > 5000 * 100


async def test_reconnects_after_vswitchd_restart_and_runs_the_hook(sandbox: Sandbox) -> None:
    marker = of.FlowMod(60, 1, of.Match(reg9=0x99), actions=[of.Output(1)], cookie=0x99)
    calls: list[float] = []
    channel: Channel

    async def on_connected() -> None:
        # The hook may send (replay) although the channel is not yet ready for others.
        assert not channel.connected
        await channel.commit_bundle([marker])
        calls.append(time.monotonic())

    channel = Channel(sandbox.openflow, on_connected=on_connected, backoff_max=0.5)
    await channel.start()
    try:
        assert len(calls) == 1
        assert ofctl_flows(sandbox, "table=60") == [of.format_flow(marker)]
        await asyncio.to_thread(sandbox.restart_vswitchd)  # SIGKILL, then a new vswitchd
        restarted = time.monotonic()
        await eventually(
            lambda: len(calls) == 2 and channel.connected,
            5.0,
            f"reconnection (hook calls {len(calls)}, last error {channel.last_error!r})",
        )
        assert calls[1] - restarted < 5.0
        assert channel.connections == 2
        # The hook replayed the state the restart wiped out.
        assert ofctl_flows(sandbox, "table=60") == [of.format_flow(marker)]
        await channel.barrier()
    finally:
        await channel.close()


async def test_requests_are_refused_while_not_ready(sandbox: Sandbox) -> None:
    release = asyncio.Event()
    channel: Channel

    async def slow_hook() -> None:
        await release.wait()

    channel = Channel(sandbox.openflow, on_connected=slow_hook)
    await channel.start(wait=False)
    try:
        await eventually(lambda: channel.datapath_id is not None, 5.0, "handshake")
        with pytest.raises(ChannelNotReady):
            await channel.barrier()
        with pytest.raises(ChannelNotReady):
            channel.bundle()
        release.set()
        await channel.wait_ready(5)
        await channel.barrier()
    finally:
        await channel.close()


async def test_dead_peer_is_detected_and_the_channel_recovers(sandbox: Sandbox) -> None:
    assert sandbox.record is not None
    pid = sandbox.record.pids["ovs-vswitchd"]
    calls: list[float] = []

    async def on_connected() -> None:
        calls.append(time.monotonic())

    channel = Channel(
        sandbox.openflow,
        on_connected=on_connected,
        echo_interval=0.2,
        echo_timeout=1.0,
        connect_timeout=1.0,
        backoff_max=0.5,
    )
    await channel.start()
    os.kill(pid, signal.SIGSTOP)
    try:
        elapsed = await eventually(lambda: not channel.connected, 5.0, "dead peer detection")
        assert elapsed < 3.0
    finally:
        os.kill(pid, signal.SIGCONT)
    try:
        await eventually(lambda: channel.connected and len(calls) >= 2, 10.0, "recovery")
        await channel.barrier()
    finally:
        await channel.close()


async def test_a_bridge_without_openflow15_is_reported_clearly(sandbox: Sandbox) -> None:
    sandbox.vsctl("set", "bridge", sandbox.bridge, "protocols=OpenFlow13")
    channel = Channel(sandbox.openflow, connect_timeout=2)
    with pytest.raises(VersionMismatch, match="protocols=OpenFlow15"):
        await channel.start()
    await channel.close()


async def test_packet_in_carries_metadata_and_userdata(sandbox: Sandbox, channel: Channel) -> None:
    frame = bytes.fromhex("ffffffffffff02000000000108060001080006040001") + bytes(38)
    flow = of.FlowMod(
        0,
        100,
        of.Match(in_port=of.OFPP_CONTROLLER),
        actions=[of.SetField("reg5", 0x1234), of.Controller(userdata=b"\xde\xad\xbe\xef")],
        cookie=0x99,
    )
    await channel.commit_bundle([flow])
    await channel.send([of.PacketOut([of.Output(of.OFPP_TABLE)], frame)])
    packet_in = await asyncio.wait_for(channel.packet_ins.get(), 5)
    assert packet_in.userdata == b"\xde\xad\xbe\xef"
    assert packet_in.reason == of.PacketInReason.ACTION
    assert packet_in.table_id == 0 and packet_in.cookie == 0x99
    assert packet_in.in_port == of.OFPP_CONTROLLER
    assert packet_in.match.get("reg5") == 0x1234
    assert packet_in.data == frame


async def test_tcp_endpoint(sandbox: Sandbox) -> None:
    sandbox.vsctl("set-controller", sandbox.bridge, "ptcp:16653:127.0.0.1")
    script = (
        "import asyncio\n"
        "from ovsproxy.openflow.connection import Channel\n"
        "async def main():\n"
        "    async with Channel('tcp:127.0.0.1:16653') as ch:\n"
        "        await ch.barrier()\n"
        "        print(ch.datapath_id)\n"
        "asyncio.run(main())\n"
    )
    result = await asyncio.to_thread(
        subprocess.run,
        ["ip", "netns", "exec", sandbox.netns, sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert int(result.stdout.strip()) == sandbox.datapath_id


async def test_close_fails_pending_requests(sandbox: Sandbox, channel: Channel) -> None:
    task = asyncio.create_task(channel.dump_flows())
    await asyncio.sleep(0)  # the request is on its way
    await channel.close()
    with pytest.raises(ConnectionLost):
        await task
    assert not channel.connected
    with pytest.raises(ChannelNotReady):
        await channel.barrier()


def _stop_vswitchd(sandbox: Sandbox) -> None:
    """Kill ovs-vswitchd and remove its management socket: the bridge's endpoint is gone."""
    assert sandbox.record is not None
    pid = sandbox.record.pids["ovs-vswitchd"]
    os.kill(pid, signal.SIGKILL)
    proc = sandbox._procs.get("ovs-vswitchd")
    if proc is not None:
        proc.wait(timeout=10)
    (sandbox.rundir / f"{sandbox.bridge}.mgmt").unlink(missing_ok=True)


async def test_a_missing_endpoint_at_start_is_reported_once_and_retried(
    sandbox: Sandbox, caplog: pytest.LogCaptureFixture
) -> None:
    _stop_vswitchd(sandbox)
    socket = str(sandbox.rundir / f"{sandbox.bridge}.mgmt")
    caplog.set_level("DEBUG", logger="ovsproxy.openflow.connection")
    channel = Channel(sandbox.openflow, backoff_min=0.01, backoff_max=0.2)
    await channel.start(wait=False)
    try:
        await eventually(lambda: channel.failed_attempts >= 5, 10.0, "retries")
        assert not channel.connected and channel.connections == 0
        assert isinstance(channel.last_error, FileNotFoundError)
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        # One clear warning naming the socket and the error, not one per attempt.
        assert len(warnings) == 1, warnings
        assert f"the socket {socket} does not exist" in warnings[0]
        assert "is ovs-vswitchd running" in warnings[0] and "backoff up to 0.2s" in warnings[0]
        with pytest.raises(ChannelNotReady, match="not connected"):
            await channel.barrier()
        with pytest.raises(
            ChannelNotReady, match=f"last error: .*the socket {re.escape(socket)} does not"
        ):
            await channel.wait_ready(0.1)
        await asyncio.to_thread(sandbox.restart_vswitchd)  # the switch appears
        await channel.wait_ready(10)
        await channel.barrier()
        assert channel.connections == 1 and channel.failed_attempts == 0
        infos = [r.getMessage() for r in caplog.records if r.levelname == "INFO"]
        assert any("failed attempts" in m for m in infos), infos
    finally:
        await channel.close()


async def test_the_log_says_how_an_established_connection_ended(
    sandbox: Sandbox, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="ovsproxy.openflow.connection")
    channel = Channel(sandbox.openflow, backoff_max=0.2)
    await channel.start()
    try:
        await asyncio.sleep(1.0)  # connected for a while
        caplog.clear()
        await asyncio.to_thread(sandbox.restart_vswitchd)  # SIGKILL, then a new vswitchd
        await eventually(lambda: channel.connections == 2 and channel.connected, 10.0, "reconnect")
        first = next(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
        # What happened: the peer went away after N s connected, not "during the handshake".
        assert re.search(r"(closed|reset) by the peer after \d+\.\ds connected", first), first
        assert str(sandbox.openflow) in first
    finally:
        await channel.close()


async def test_a_restarted_switch_is_tried_at_once_whatever_the_backoff(sandbox: Sandbox) -> None:
    """kill -9 leaves the bridge's socket behind (refused); the restarted ovs-vswitchd binds
    a new one, and the channel connects within SOCKET_POLL of that, not after its backoff,
    which has grown to seconds meanwhile (issue 27: the shortest gap)."""
    calls: list[float] = []

    async def on_connected() -> None:
        calls.append(time.monotonic())

    channel = Channel(
        sandbox.openflow, on_connected=on_connected, backoff_min=0.01, backoff_max=30.0
    )
    await channel.start()
    try:
        assert sandbox.record is not None
        os.kill(sandbox.record.pids["ovs-vswitchd"], signal.SIGKILL)
        proc = sandbox._procs.pop("ovs-vswitchd")
        await asyncio.to_thread(proc.wait, 10)
        assert (sandbox.rundir / f"{sandbox.bridge}.mgmt").exists()  # stale, as after a crash
        # 0.01 s doubling: after 9 failed attempts the next wait is 5 s.
        await eventually(lambda: channel.failed_attempts >= 9, 20.0, "failed attempts")
        assert isinstance(channel.last_error, ConnectionRefusedError), channel.last_error
        await asyncio.to_thread(sandbox.start_vswitchd)
        back = time.monotonic()
        await eventually(lambda: channel.connected and len(calls) == 2, 10.0, "reconnection")
        assert calls[1] - back < 0.5, calls[1] - back
    finally:
        await channel.close()
