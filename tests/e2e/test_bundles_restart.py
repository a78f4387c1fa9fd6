"""Antrea's bundle test, ours: thousands of OpenFlow bundles in flight through the agent's own
connection code (the sans-I/O session, the asyncio ``Channel``, the ``SwitchSync``'s streamed
bundles) while ovs-vswitchd is killed (-9) and started again, twice: once under the bundles,
once in the middle of the datapath's replay on the reconnection that follows.

Every bundle must end within 15 s, in success or in a clear, expected error (the connection
was lost, saying how; or not connected yet); the datapath's syncs likewise; and afterwards the
switch holds exactly what the datapath wants (compared through OVS's dumps, as ``ovsproxy
verify`` compares), and new bundles commit again.
"""

from __future__ import annotations

import asyncio
import collections
import ipaddress
import random
import re
import time
from dataclasses import dataclass, field

import pytest

from ovsproxy.agent.installed import read_groups
from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath import service_flows as svc
from ovsproxy.datapath.fixed_flows import pipeline_flows
from ovsproxy.datapath.flow_context import Context
from ovsproxy.datapath.switch_sync import DatapathError, SwitchSync
from ovsproxy.diagnostics import compare
from ovsproxy.model import Endpoint, IPFamily, Protocol, ServicePort, ServicePortName
from ovsproxy.openflow import protocol as of
from ovsproxy.openflow.connection import Channel
from ovsproxy.openflow.errors import ChannelNotReady, ConnectionLost
from ovsproxy.ovs.sandbox import Sandbox

pytestmark = [pytest.mark.slow, pytest.mark.ovs]  # 10-25 s (with the machine's load)

CONFIG = pl.PipelineConfig()
SERVICES = 1500  # a group and a flow each: the datapath's replay is thousands of messages
FIRST_WAVE = 4000  # bundles started at once, FLOWS_PER_BUNDLE flows each
FLOWS_PER_BUNDLE = 4
LAST_WAVE = 200  # after the restarts: every one must commit
LONGEST = 15.0  # seconds any bundle may take to end
BLAST_TABLE = 200  # outside our pipeline's tables
BLAST_COOKIE = 0xB << 60  # not our cookie's app: the comparison leaves these flows out


def stage_service(dp: SwitchSync, ctx: Context, i: int, endpoints: int = 3) -> None:
    spn = ServicePortName("bundles", f"s{i}", "http", Protocol.TCP)
    ip = ipaddress.ip_address(f"10.96.{i // 250}.{i % 250 + 1}")
    eps = [
        Endpoint(
            ipaddress.ip_address(f"10.244.{(3 * i + k) // 250 % 250}.{(3 * i + k) % 250 + 1}"), 80
        )
        for k in range(endpoints)
    ]
    objs = svc.service_objects(ctx, ServicePort(spn, (ip,), 80), eps, {IPFamily.IPv4: i + 1})
    dp.stage(spn, objs.groups, objs.flows)


def stage_all(dp: SwitchSync) -> Context:
    ctx = Context(dp.tables, dp.generation)
    dp.stage(("pipeline",), (), pipeline_flows(ctx))
    for i in range(SERVICES):
        stage_service(dp, ctx, i)
    return ctx


def blast_flow(n: int) -> of.FlowMod:
    return of.FlowMod(
        BLAST_TABLE,
        100,
        of.Match(in_port=n % 60000 + 1, reg0=n // 60000),
        actions=[],
        cookie=BLAST_COOKIE | n,
    )


@dataclass
class Outcomes:
    """How each bundle ended: "ok" or the exception, and how long it took."""

    ended: list[tuple[str, BaseException | None, float]] = field(default_factory=list)
    committed: int = 0
    enough: asyncio.Event = field(default_factory=asyncio.Event)
    enough_at: int = 0  # commits after which ``enough`` is set (0: never)

    def kinds(self) -> collections.Counter[str]:
        return collections.Counter(kind for kind, _, _ in self.ended)


async def one_bundle(channel: Channel, n: int, streamed: bool, out: Outcomes) -> None:
    """One bundle of FLOWS_PER_BUNDLE flows: added at once, or (``streamed``) one by one with
    the transport drained and the loop given a turn in between, as the datapath streams."""
    started = time.monotonic()
    try:
        async with channel.bundle() as bundle:
            for k in range(FLOWS_PER_BUNDLE):
                bundle.add(blast_flow(n * FLOWS_PER_BUNDLE + k))
                if streamed:
                    await bundle.drain()
                    await asyncio.sleep(0.002)
    except Exception as exc:
        out.ended.append((type(exc).__name__, exc, time.monotonic() - started))
    else:
        out.ended.append(("ok", None, time.monotonic() - started))
        out.committed += 1
        if out.enough_at and out.committed >= out.enough_at:
            out.enough.set()


def bundle_adds_sent(channel: Channel) -> int:
    return channel.counters.snapshot()["sent"].get("BUNDLE_ADD_MESSAGE", {}).get("messages", 0)


async def test_thousands_of_bundles_through_two_vswitchd_kills_end_and_converge(
    sandbox: Sandbox,
) -> None:
    replays: list[str] = []
    restarts: list[asyncio.Task[None]] = []
    channel: Channel
    datapath: SwitchSync

    async def on_connected() -> None:
        if len(replays) != 1:  # the first connection, and the one after the replay's kill
            await datapath.on_connected()
            replays.append("ok")
            return
        # The first reconnection: kill the switch again in the middle of the replay, once
        # its bundle is streaming (the loop is held for the kill: the bundle cannot finish).
        replay = asyncio.create_task(datapath.on_connected())
        before = bundle_adds_sent(channel)
        while bundle_adds_sent(channel) == before and not replay.done():  # noqa: ASYNC110
            await asyncio.sleep(0)  # one loop turn: the replay's first write is seen at once
        sandbox.stop_vswitchd()
        restarts.append(asyncio.create_task(asyncio.to_thread(sandbox.start_vswitchd)))
        try:
            await replay
        except DatapathError as exc:
            replays.append(f"{type(exc).__name__} ({type(exc.__cause__).__name__})")
            raise
        replays.append("ok")

    channel = Channel(sandbox.openflow, on_connected=on_connected, backoff_max=0.5)
    datapath = SwitchSync(channel, CONFIG, 1)
    desired = SwitchSync(compare.RecordingSwitch(), CONFIG, 1)
    ctx = stage_all(datapath)
    stage_all(desired)
    await desired.commit()
    await channel.start()
    try:
        await datapath.commit()

        # The agent's own syncs go on throughout: one Service changed and committed, again
        # and again; each must end (committed or refused for the connection) in time.
        syncs: collections.Counter[str] = collections.Counter()
        longest_sync = 0.0
        syncing = True

        async def sync_loop() -> None:
            nonlocal longest_sync
            rng = random.Random(17)
            while syncing:
                i = rng.randrange(SERVICES)
                stage_service(datapath, ctx, i, rng.choice((2, 4)))
                started = time.monotonic()
                try:
                    await datapath.commit()
                    syncs["ok"] += 1
                except DatapathError as exc:
                    cause = exc.__cause__
                    assert isinstance(cause, ConnectionLost | ChannelNotReady), repr(exc)
                    syncs[type(cause).__name__] += 1
                longest_sync = max(longest_sync, time.monotonic() - started)
                stage_service(datapath, ctx, i)  # back to what `desired` holds
                await asyncio.sleep(0.01)

        syncer = asyncio.create_task(sync_loop())
        out = Outcomes(enough_at=1)
        # Every fifth bundle is streamed: the kill finds some of them half-added.
        tasks = [
            asyncio.create_task(one_bundle(channel, n, n % 5 == 0, out)) for n in range(FIRST_WAVE)
        ]
        await asyncio.wait_for(out.enough.wait(), 30)  # the first commits are in
        in_flight = FIRST_WAVE - len(out.ended)
        sandbox.stop_vswitchd()  # kill -9 under the bundles (the loop is held meanwhile)
        restarts.append(asyncio.create_task(asyncio.to_thread(sandbox.start_vswitchd)))

        # Bundles keep coming while the switch is away, reconnects, is killed in the
        # middle of the replay and comes back again.
        n = FIRST_WAVE
        while len(replays) < 3:
            tasks.append(asyncio.create_task(one_bundle(channel, n, n % 5 == 0, out)))
            n += 1
            await asyncio.sleep(0.005)
            assert n < FIRST_WAVE + 20_000, f"no reconnection and replay (replays {replays})"
        await asyncio.gather(*restarts)
        await channel.wait_ready(30)
        last_wave = Outcomes()
        last = [
            asyncio.create_task(one_bundle(channel, n + i, i % 5 == 0, last_wave))
            for i in range(LAST_WAVE)
        ]
        pending = (await asyncio.wait([*tasks, *last], timeout=LONGEST + 5))[1]
        syncing = False
        await asyncio.wait_for(syncer, LONGEST + 5)

        assert not pending, f"{len(pending)} bundles never ended"
        messages = FLOWS_PER_BUNDLE * (n + LAST_WAVE)
        assert messages >= 10_000 and in_flight * FLOWS_PER_BUNDLE >= 10_000, (messages, in_flight)
        kinds = out.kinds()
        assert set(kinds) <= {"ok", "ConnectionLost", "ChannelNotReady"}, [
            f"{kind}: {exc}" for kind, exc, _ in out.ended if kind not in ("ok",)
        ][:5]
        # The kill hit bundles in flight, and each was told how its connection ended.
        assert kinds["ConnectionLost"] >= 100 and kinds["ok"] >= 1, kinds
        # (the session's account: how it ended and after how long, e.g. "connection reset by
        # the peer after 1.2s connected"; not a bare "connection closed").
        for kind, exc, _ in out.ended:
            if kind == "ConnectionLost":
                text = str(exc)
                assert sandbox.openflow in text, text
                assert re.search(r" after \d+\.\ds connected$", text), text
        longest = max(seconds for _, _, seconds in out.ended + last_wave.ended)
        assert longest <= LONGEST, f"a bundle took {longest:.1f}s"
        assert last_wave.kinds() == {"ok": LAST_WAVE}, last_wave.kinds()
        assert replays == ["ok", "DatapathError (ConnectionLost)", "ok"], replays
        assert channel.connections == 3
        assert longest_sync <= LONGEST and syncs["ConnectionLost"] + syncs["ChannelNotReady"] >= 1
        assert syncs["ok"] >= 1, syncs

        # Converged: what the switch holds is what the datapath wants.
        await datapath.commit()
        descs = await channel.dump_flows(
            cookie=pl.COOKIE_APP << pl.COOKIE_APP_SHIFT, cookie_mask=pl.COOKIE_APP_MASK
        )
        installed = compare.flows_by_key(d.flow for d in descs if not compare.is_learned(d.flow))
        want_groups = {
            gid: compare.desired_group_view(g) for gid, g in desired.installed_groups.items()
        }
        groups = await read_groups(channel, CONFIG, want_groups, None, [])
        diffs = compare.compare_switch(desired.installed_flows, want_groups, installed, groups)
        assert diffs == [], "\n".join(str(d) for d in diffs[:10])
        assert len(installed) == len(desired.installed_flows) > SERVICES
        assert len(desired.installed_groups) == SERVICES
        # The last wave's flows are all there (the kills wiped the earlier ones).
        blasted = {d.flow.cookie for d in await channel.dump_flows(BLAST_TABLE)}
        wave = range(n * FLOWS_PER_BUNDLE, (n + LAST_WAVE) * FLOWS_PER_BUNDLE)
        assert {BLAST_COOKIE | k for k in wave} <= blasted
    finally:
        await channel.close()
