"""The datapath against a real ovs-vswitchd: what reaches the switch, message by message."""

from __future__ import annotations

import asyncio
import ipaddress
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath import service_flows as svc
from ovsproxy.datapath import switch_sync
from ovsproxy.datapath.fixed_flows import pipeline_flows
from ovsproxy.datapath.flow_context import Context
from ovsproxy.datapath.switch_sync import SwitchSync
from ovsproxy.model import Endpoint, IPFamily, Protocol, ServicePort, ServicePortName
from ovsproxy.openflow import protocol as of
from ovsproxy.openflow.connection import Channel
from ovsproxy.openflow.errors import BundleError
from ovsproxy.ovs.sandbox import Sandbox

pytestmark = [pytest.mark.ovs, pytest.mark.shared_sandbox]

CONFIG = pl.PipelineConfig()


@dataclass
class Rig:
    sandbox: Sandbox
    channel: Channel
    datapath: SwitchSync
    ctx: Context

    def stage_service(
        self,
        name: str,
        ip: str,
        endpoints: list[Endpoint],
        gid: int,
        port: int = 80,
        affinity: int = 0,
    ) -> ServicePortName:
        spn = ServicePortName("ns", name, "http", Protocol.TCP)
        sp = ServicePort(spn, (ipaddress.ip_address(ip),), port, affinity_timeout=affinity)
        family = IPFamily.of(ipaddress.ip_address(ip))
        objs = svc.service_objects(self.ctx, sp, endpoints, {family: gid})
        self.datapath.stage(spn, objs.groups, objs.flows)
        return spn

    def bundled(self, kind: str) -> tuple[int, int]:
        row = self.channel.counters.bundled.get(kind, [0, 0])
        return row[0], row[1]

    def groups(self) -> list[str]:
        return [
            line.strip()
            for line in self.sandbox.ofctl("dump-groups").splitlines()
            if "group_id=" in line
        ]

    def flows(self) -> list[str]:
        """Installed flows without their statistics (counters and ages change by themselves)."""
        dump = self.sandbox.ofctl("dump-flows").splitlines()
        lines = [line for line in dump if "cookie=" in line]
        stats = re.compile(r"(duration|n_packets|n_bytes|idle_age|hard_age)=[^,]*, ?")
        return [stats.sub("", line).strip() for line in lines]


def eps(n: int, base: str = "10.244.", port: int = 8080) -> list[Endpoint]:
    if ":" in base:
        return [Endpoint(ipaddress.ip_address(f"{base}{i + 1:x}"), port) for i in range(n)]
    return [
        Endpoint(ipaddress.ip_address(f"{base}{i // 250}.{i % 250 + 1}"), port) for i in range(n)
    ]


async def make_rig(sandbox: Sandbox, generation: int = 1, *, stream: bool = True) -> Rig:
    dp: SwitchSync | None = None

    async def hook() -> None:
        assert dp is not None
        await dp.on_connected()

    channel = Channel(sandbox.openflow, on_connected=hook)
    dp = SwitchSync(channel, CONFIG, generation, stream_while_staging=stream)
    await channel.start()
    ctx = Context(dp.tables, generation)
    dp.stage(("pipeline",), (), pipeline_flows(ctx))
    return Rig(sandbox, channel, dp, ctx)


@pytest.fixture
async def rig(sandbox: Sandbox) -> AsyncIterator[Rig]:
    r = await make_rig(sandbox)
    yield r
    await r.channel.close()


async def test_update_3_to_4_endpoints_is_one_group_message_and_resync_is_zero(rig: Rig) -> None:
    rig.stage_service("web", "10.96.0.10", eps(3), gid=1)
    first = await rig.datapath.commit()
    assert first.groups_added == 1 and first.flows_added > 3
    assert "bucket_id:2" in rig.groups()[0] and "bucket_id:3" not in rig.groups()[0]

    before = rig.bundled("GROUP_MOD")
    flows_before = rig.bundled("FLOW_MOD")
    rig.stage_service("web", "10.96.0.10", eps(4), gid=1)
    stats = await rig.datapath.commit()
    after = rig.bundled("GROUP_MOD")
    assert after[0] - before[0] == 1  # exactly one group message on the wire
    assert stats.group_messages == 1 and stats.kinds.get("group_insert_bucket") == 1
    # ...and nothing else: the new bucket translates (no EndpointDNAT flow without affinity).
    assert rig.bundled("FLOW_MOD")[0] - flows_before[0] == 0
    (group,) = rig.groups()
    assert group.count("bucket=") == 4 and "bucket_id:3" in group
    assert "bucket_id:3,weight:100,actions=ct(commit,table=20,zone=65520," in group
    assert "nat(dst=10.244.0.4:8080),exec(set_field:0x10/0x10->ct_mark))" in group
    # The INSERT_BUCKET carries no selection method (OVS refuses it there); the group keeps
    # its own, 5-tuple fields included, and reads back exactly as our cache prints it.
    assert "selection_method=hash,fields(ip_src,ip_dst,ipv6_src,ipv6_dst,nw_proto," in group
    assert [line for line in rig.datapath.dump() if line.startswith("group_id")] == [group]

    sent_before = rig.channel.counters.total("sent")
    rig.stage_service("web", "10.96.0.10", eps(4), gid=1)
    noop = await rig.datapath.commit()
    assert noop.messages == 0
    assert rig.channel.counters.total("sent") == sent_before  # not even an empty bundle


async def test_one_endpoint_added_to_1000_is_a_single_small_insert_bucket(rig: Rig) -> None:
    rig.stage_service("big", "10.96.0.11", eps(1000), gid=2)
    await rig.datapath.commit()
    before = rig.bundled("GROUP_MOD")
    rig.stage_service("big", "10.96.0.11", eps(1001), gid=2)
    stats = await rig.datapath.commit()
    count, size = (a - b for a, b in zip(rig.bundled("GROUP_MOD"), before, strict=True))
    assert count == 1 and stats.kinds.get("group_insert_bucket") == 1
    assert size < 200, size
    # (over 64 KB: OpenFlow cannot describe the group; its statistics count the buckets)
    stats = rig.sandbox.ofctl("dump-group-stats", "group_id=2")
    assert "bucket1000:" in stats and "bucket1001:" not in stats


def traced_buckets(sandbox: Sandbox, flow: str) -> tuple[set[int], str]:
    """Bucket ids of the select group a packet meets, as ofproto/trace scores them, and the
    trace. OpenFlow cannot describe a group over 64 KB (GROUP_DESC entries have a 16-bit
    length; OVS overflows it and ovs-ofctl dump-groups drops the connection), so large
    groups are checked through the switch's own packet trace."""
    out = sandbox.appctl("ofproto/trace", "br0", flow)
    ids = {
        int(line.split("bucket ")[1].split(":")[0])
        for line in out.splitlines()
        if "-> bucket " in line and ": score" in line
    }
    return ids, out


async def probe_bucket_ids(channel: Channel, group_id: int, ids: range) -> str:
    """Prove every id in `ids` is a bucket of the group, without changing it: a bundle that
    removes each of them and then re-adds the (existing) group must fail on that last ADD —
    an earlier failure would name a missing bucket. Nothing of a failed bundle is applied.
    Returns the decoded error of the failing message."""
    messages = [
        of.GroupMod(of.GroupModCommand.REMOVE_BUCKET, group_id, command_bucket_id=i) for i in ids
    ]
    messages.append(of.GroupMod(of.GroupModCommand.ADD, group_id))
    with pytest.raises(BundleError) as caught:
        await channel.commit_bundle(messages)
    return f"{caught.value.name}: {caught.value.request}"


async def test_5000_ipv4_and_2000_ipv6_endpoints_install_and_dump(rig: Rig) -> None:
    rig.stage_service("v4", "10.96.0.12", eps(5000), gid=3)
    rig.stage_service("v6", "fd00:10:96::12", eps(2000, base="fd00:10:244::"), gid=4)
    stats = await rig.datapath.commit()
    assert stats.groups_added == 2
    assert stats.kinds["group_add_or_mod"] == 2 and stats.kinds["group_insert_bucket"] >= 5
    v4_ids, v4_trace = traced_buckets(
        rig.sandbox, "in_port=1,tcp,nw_src=10.244.250.1,nw_dst=10.96.0.12,tp_src=999,tp_dst=80"
    )
    assert v4_ids == set(range(5000))
    assert "nat(dst=10.244." in v4_trace and ":8080)" in v4_trace
    # Open vSwitch picks dp_hash for this one, which ofproto/trace does not follow: probe.
    failure = await probe_bucket_ids(rig.channel, 4, range(2000))
    assert failure.startswith("OFPET_GROUP_MOD_FAILED/OFPGMFC_GROUP_EXISTS: ")
    assert "ADD" in failure or "add" in failure
    beyond = await probe_bucket_ids(rig.channel, 4, range(1999, 2001))
    assert beyond.startswith("OFPET_GROUP_MOD_FAILED/OFPGMFC_UNKNOWN_BUCKET")
    v4_again = await probe_bucket_ids(rig.channel, 3, range(5000))
    assert "GROUP_EXISTS" in v4_again
    assert not [f for f in rig.flows() if "table=14" in f and "nat(dst=" in f]  # in the buckets
    # Our own dump (ovs-ofctl syntax, from the cache) has every bucket.
    ours = {line.split(",")[0]: line for line in rig.datapath.dump() if line.startswith("group_id")}
    assert ours["group_id=3"].count("bucket=") == 5000
    assert ours["group_id=4"].count("bucket=") == 2000
    assert "nat(dst=[fd00:10:244::7d0]:8080)" in ours["group_id=4"]


async def test_delete_service_keeps_shared_endpoint_flows(rig: Rig) -> None:
    # ClientIP affinity: the Services translate in shared EndpointDNAT flows
    shared = eps(2)
    a = rig.stage_service("a", "10.96.0.21", shared, gid=5, affinity=60)
    rig.stage_service("b", "10.96.0.22", [*shared, *eps(1, base="10.245.")], gid=6, affinity=60)
    await rig.datapath.commit()
    assert len([f for f in rig.flows() if "nat(dst=" in f]) == 3
    rig.datapath.unstage(a)
    stats = await rig.datapath.commit()
    # a's ServiceLB flows only: to the group, learn, accept each of its two endpoints
    assert stats.groups_deleted == 1 and stats.flows_deleted == 4
    assert [g.split(",")[0] for g in rig.groups()] == ["group_id=6"]
    flows = rig.flows()
    assert not any("10.96.0.21" in f for f in flows)
    assert any("10.96.0.22" in f for f in flows)
    assert len([f for f in flows if "nat(dst=" in f]) == 3  # still used by b


async def test_drift_check_sees_flows_deleted_behind_our_back(rig: Rig) -> None:
    """The periodic full sync's check: the switch holds fewer flows of our generation than the
    cache says -> drifted; a resync puts them back."""
    rig.stage_service("web", "10.96.0.10", eps(2), gid=1)
    await rig.datapath.commit()
    assert not await rig.datapath.drifted()
    rig.sandbox.ofctl("del-flows", "ip,nw_dst=10.96.0.10")  # someone else's hand
    assert not any("10.96.0.10" in f for f in rig.flows())
    assert await rig.datapath.drifted()
    await rig.datapath.resync_switch()
    assert any("10.96.0.10" in f for f in rig.flows())
    assert not await rig.datapath.drifted()


async def test_drift_check_sees_a_bucket_changed_or_removed_behind_our_back(rig: Rig) -> None:
    """Same flow count, but a group's bucket rewritten (or one removed) by hand -> drifted;
    a resync writes the group back whole."""
    rig.stage_service("web", "10.96.0.10", eps(3), gid=1)
    await rig.datapath.commit()
    assert not await rig.datapath.drifted()
    (group,) = rig.groups()
    first_ip = group.split("nat(dst=")[1].split(":")[0]
    changed = group.replace(f"nat(dst={first_ip}:", "nat(dst=10.244.255.99:", 1)
    rig.sandbox.ofctl("mod-group", changed.strip())
    assert rig.groups() != [group]
    assert await rig.datapath.drifted()
    await rig.datapath.resync_switch()
    assert [g.split(",bucket=")[1:] for g in rig.groups()] == [group.split(",bucket=")[1:]]
    assert not await rig.datapath.drifted()
    rig.sandbox.ofctl("remove-buckets", "group_id=1,command_bucket_id=2")
    assert await rig.datapath.drifted()
    await rig.datapath.resync_switch()
    assert not await rig.datapath.drifted()


async def restart_vswitchd_and_replay(rig: Rig) -> None:
    """kill -9 and restart ovs-vswitchd; returns once the channel reconnected (its hook has
    replayed)."""
    connections = rig.channel.connections
    await asyncio.to_thread(rig.sandbox.restart_vswitchd)
    for _ in range(100):
        await asyncio.sleep(0.05)
        if rig.channel.connections > connections and rig.channel.connected:
            break
    assert rig.channel.connections > connections


async def test_vswitchd_restart_replays_everything_without_an_event(rig: Rig) -> None:
    rig.stage_service("web", "10.96.0.10", eps(3), gid=1)
    rig.stage_service("v6", "fd00:10:96::12", eps(2, base="fd00:10:244::"), gid=2)
    await rig.datapath.commit()
    flows, groups = sorted(rig.flows()), rig.groups()
    await restart_vswitchd_and_replay(rig)
    assert sorted(rig.flows()) == flows
    assert sorted(rig.groups()) == sorted(groups)


async def test_vswitchd_restart_replays_groups_with_their_bucket_ids_and_order(rig: Rig) -> None:
    """After bucket-by-bucket changes a group's ids have holes and its order is not theirs
    (INSERT_BUCKET appends); the replay must write exactly that again, or OVS's hash (by
    bucket id and weight, ties to the later bucket) sends connections conntrack picks up
    mid-stream to other endpoints (issue 27). Written 0..n-1 in the endpoints' order, it
    would read back differently."""
    four = eps(4)
    rig.stage_service("web", "10.96.0.10", four, gid=1)
    await rig.datapath.commit()
    extra = Endpoint(ipaddress.ip_address("10.244.0.99"), 8080)
    rig.stage_service("web", "10.96.0.10", [four[0], four[2], four[3], extra], gid=1)
    stats = await rig.datapath.commit()
    assert stats.kinds.get("group_remove_bucket") == 1, stats.kinds
    assert stats.kinds.get("group_insert_bucket") == 1, stats.kinds
    (before,) = rig.groups()
    ids = [int(m) for m in re.findall(r"bucket_id:(\d+)", before)]
    assert ids == [0, 2, 3, 1], before  # the new endpoint took the free id 1, appended
    picks = {
        port: traced_buckets(
            rig.sandbox, f"tcp,nw_src=10.244.9.1,nw_dst=10.96.0.10,tp_src={port},tp_dst=80"
        )
        for port in range(40000, 40040, 4)
    }
    await restart_vswitchd_and_replay(rig)
    assert rig.groups() == [before]
    assert [line for line in rig.datapath.dump() if line.startswith("group_id")] == [before]
    for port, (scored, _) in picks.items():
        again, trace = traced_buckets(
            rig.sandbox, f"tcp,nw_src=10.244.9.1,nw_dst=10.96.0.10,tp_src={port},tp_dst=80"
        )
        assert again == scored, trace


async def test_agent_restart_adopts_switch_state_and_removes_older_generation(
    sandbox: Sandbox,
) -> None:
    old = await make_rig(sandbox, generation=1)
    old.stage_service("keep", "10.96.0.31", eps(2), gid=1)
    old.stage_service("gone", "10.96.0.32", eps(2, base="10.245."), gid=2)
    await old.datapath.commit()
    await old.channel.close()

    new = await make_rig(sandbox, generation=2)
    try:
        # The new agent numbers groups its own way; "keep" now uses group 7.
        new.stage_service("keep", "10.96.0.31", eps(2), gid=7)
        stats = await new.datapath.commit()
        assert stats.flows_deleted >= 1  # the generation-1 cookie delete
        flows = new.flows()
        assert all("cookie=0x5e710002" in f for f in flows), flows
        assert not any("10.96.0.32" in f for f in flows)
        assert [g.split(",")[0] for g in new.groups()] == ["group_id=7"]
    finally:
        await new.channel.close()


async def test_a_restart_streamed_while_staging_adopts_the_switch_as_an_unstreamed_one_does(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new agent's first commit written while its Services are staged (from the first
    one on): the same switch as without streaming -- its own groups only, every flow of its
    generation, the older one's gone -- and what it wrote for a Service it then changed or
    dropped is taken back in the same bundle."""
    monkeypatch.setattr(switch_sync, "STREAM_WHILE_STAGING_AFTER", 1)
    monkeypatch.setattr(switch_sync, "_STREAM_OWNERS_EVERY", 1)
    dumps = []
    for stream in (False, True):
        old = await make_rig(sandbox, generation=1, stream=False)
        old.stage_service("keep", "10.96.0.31", eps(2), gid=1)
        old.stage_service("gone", "10.96.0.32", eps(2, base="10.245."), gid=2)
        await old.datapath.commit()
        await old.channel.close()
        # (stages the pipeline: streamed or not)
        new = await make_rig(sandbox, generation=2, stream=stream)
        try:
            new.stage_service("keep", "10.96.0.31", eps(3), gid=7)
            changed = new.stage_service("changed", "10.96.0.33", eps(2, base="10.246."), gid=8)
            dropped = new.stage_service("dropped", "10.96.0.34", eps(2, base="10.247."), gid=9)
            new.stage_service("changed", "10.96.0.33", eps(1, base="10.248."), gid=8)
            new.datapath.unstage(dropped)
            assert changed and (new.datapath._streaming is not None) == stream
            written = new.channel.counters.total("sent")[0]
            await new.datapath.commit()
            flows, groups = new.flows(), sorted(new.groups())
            assert all("cookie=0x5e710002" in f for f in flows), flows
            assert not any(ip in f for f in flows for ip in ("10.96.0.32", "10.96.0.34", "10.246."))
            assert [g.split(",")[0] for g in groups] == ["group_id=7", "group_id=8"]
            dumps.append((sorted(flows), groups, written))
        finally:
            await new.channel.close()
        sandbox.ofctl("del-flows")
        sandbox.ofctl("del-groups")
    (plain_flows, plain_groups, _), (streamed_flows, streamed_groups, _) = dumps
    assert streamed_flows == plain_flows and streamed_groups == plain_groups
