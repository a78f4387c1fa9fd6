"""Shared pieces of the datapath benchmarks (``full-sync``, ``incremental``, ``memory``).

* a synthetic cluster as model values (ServicePorts and their endpoints, IPv4, unique
  endpoint addresses; without affinity, so every endpoint is a bucket that translates);
* our full sync: model values -> ``service_objects`` -> ``SwitchSync.stage`` -> ``commit`` (one
  bundle streamed through the ``Channel``), timed to the commit reply;
* the content that full sync sends, captured from the same ``SwitchSync`` with a recording
  switch, as messages (for the floor) and as ``ovs-ofctl`` text (for the baseline);
* the baseline: ``ovs-ofctl --bundle add-groups`` + ``add-flows`` loading those files;
* the floor: the same messages pre-encoded as BUNDLE_ADDs and written by the channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import ipaddress
import os
import resource
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from support.cluster import CLUSTER_IP_BASE, ENDPOINT_BASE, ENDPOINT_PORT

from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath import service_flows as svc
from ovsproxy.datapath.fixed_flows import pipeline_flows
from ovsproxy.datapath.flow_context import Context
from ovsproxy.datapath.memory import memory_policy
from ovsproxy.datapath.switch_sync import SwitchSync
from ovsproxy.diagnostics.compare import RecordingSwitch
from ovsproxy.model import Endpoint, IPFamily, Protocol, ServicePort, ServicePortName
from ovsproxy.openflow import protocol as of
from ovsproxy.openflow.connection import Channel
from ovsproxy.ovs.sandbox import Sandbox, SandboxError

if TYPE_CHECKING:
    from ovsproxy.agent.core import Core

CONFIG = pl.PipelineConfig()
GENERATION = 1
PIPELINE_OWNER = ("pipeline",)

Cluster = list[tuple[ServicePort, tuple[Endpoint, ...]]]


def cluster(services: int, endpoints: int, *, namespace: str = "bench") -> Cluster:
    """``services`` ClusterIP Services (TCP 80) with ``endpoints`` endpoints each (:8080)."""
    result: Cluster = []
    for i in range(services):
        name = ServicePortName(namespace, f"svc-{i}", "http", Protocol.TCP)
        port = ServicePort(name, (ipaddress.IPv4Address(CLUSTER_IP_BASE + 1 + i),), 80)
        eps = tuple(
            Endpoint(ipaddress.IPv4Address(ENDPOINT_BASE + i * endpoints + j), ENDPOINT_PORT)
            for j in range(endpoints)
        )
        result.append((port, eps))
    return result


def group_ids(index: int) -> dict[IPFamily, int]:
    return {IPFamily.IPv4: CONFIG.group_id_min + index}


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


# -- the sandbox ---------------------------------------------------------------------------


@contextlib.contextmanager
def sandbox(attempts: int = 3) -> Iterator[Sandbox]:
    """A private OVS; retried, because concurrent sandbox start-ups on a shared machine can
    trip over each other (the registry sweep)."""
    last: Exception | None = None
    for _ in range(attempts):
        sb = Sandbox()
        try:
            sb.up()
        except SandboxError as exc:
            last = exc
            time.sleep(0.5)
            continue
        try:
            yield sb
        finally:
            sb.down()
        return
    raise SandboxError(f"no sandbox after {attempts} attempts: {last}")


def ofctl(sb: Sandbox, command: str, *args: str, options: Sequence[str] = ()) -> str:
    cmd = ["ovs-ofctl", "-O", "OpenFlow15", *options, command, sb.openflow, *args]
    return subprocess.run(cmd, env=sb.env, capture_output=True, text=True, check=True).stdout


def reset_switch(sb: Sandbox) -> None:
    ofctl(sb, "del-flows")
    ofctl(sb, "del-groups")


def flow_count(sb: Sandbox) -> int:
    text = ofctl(sb, "dump-aggregate")
    return int(text.split("flow_count=")[1].split()[0])


SwitchLines = tuple[list[str], list[str]]  # (flows, groups) as ovs-ofctl prints them


def switch_lines(sb: Sandbox, groups: bool = True) -> SwitchLines:
    """The switch's flows (no counters) and groups, one a line as ``ovs-ofctl`` dumps them
    (``groups=False``: no groups, for groups too big for OVS to describe)."""
    flows = [
        line.strip()
        for line in ofctl(sb, "dump-flows", options=["--no-stats"]).splitlines()
        if "actions=" in line
    ]
    group_lines = (
        [line.strip() for line in ofctl(sb, "dump-groups").splitlines() if "group_id=" in line]
        if groups
        else []
    )
    return flows, group_lines


def fingerprint(sb: Sandbox, groups: bool = True) -> str:
    """A hash of the switch's flows (no counters) and groups, to show two loads are equal
    (``groups=False``: flows only, for groups too big for OVS to describe)."""
    flows, group_lines = switch_lines(sb, groups)
    digest = hashlib.sha256()
    for line in (*sorted(flows), *sorted(group_lines)):
        digest.update(line.encode() + b"\n")
    return digest.hexdigest()[:16]


async def connect(sb: Sandbox) -> tuple[Channel, Core]:
    """A channel to the sandbox's switch, started, and the agent's core over it
    (``agent.core.build_core``) without Service semantics: the benches measure the datapath
    and the proxier alone. (Imported here: the memory probe's baseline imports this module.)"""
    from ovsproxy.agent.core import NodeFacts, Semantics, build_core
    from ovsproxy.config import AgentConfig

    config = AgentConfig(node_name="bench-node", node_ports=False)
    assert config.pipeline == CONFIG  # what the recorded baselines are built with
    channel = Channel(sb.openflow, bundle_timeout=600)
    core = build_core(config, channel, NodeFacts(GENERATION), semantics=Semantics.NONE)
    await channel.start()
    return channel, core


# -- our full sync -------------------------------------------------------------------------


class GcTimer:
    """Time spent in cyclic garbage collections while active."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = 0
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started
            self.collections += 1

    def __enter__(self) -> GcTimer:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


@dataclass
class SyncRun:
    build_s: float = 0.0
    stage_s: float = 0.0
    commit_s: float = 0.0
    total_s: float = 0.0
    gc_s: float = 0.0
    cpu_s: float = 0.0  # our process's CPU time over total_s
    tail_s: float = 0.0  # from the bundle's last message to the commit reply: OVS alone
    ovs_cpu_s: float | None = None  # ovs-vswitchd's CPU time over total_s
    messages: int = 0
    bytes: int = 0  # everything written to the switch for the sync (framing included)
    inner_bytes: int = 0  # the FLOW_MODs and GROUP_MODs themselves
    kinds: dict[str, int] = field(default_factory=dict)


def stage_cluster(dp: SwitchSync, ports: Cluster, ctx: Context) -> tuple[float, float]:
    """What the proxier does for every changed Service port: build its values, stage them.
    Returns (build seconds, stage seconds)."""
    clock = time.perf_counter
    started = clock()
    staging = 0.0
    dp.stage(PIPELINE_OWNER, (), pipeline_flows(ctx))
    service_objects, stage = svc.service_objects, dp.stage
    for index, (port, endpoints) in enumerate(ports):
        objects = service_objects(ctx, port, endpoints, group_ids(index))
        before = clock()
        stage(port.name, objects.groups, objects.staged)
        staging += clock() - before
    return clock() - started - staging, staging


async def our_full_sync(sb: Sandbox, ports: Cluster) -> SyncRun:
    """Model values -> groups and flows in a fresh switch, timed to the commit reply."""
    channel, core = await connect(sb)
    dp = core.datapath
    try:
        # A new context: its encoders start empty, so the sync is measured cold (agent start).
        ctx = Context(dp.tables, GENERATION)
        gc.collect()
        sent_before = channel.counters.total("sent")[1]
        committing = _time_bundle_commits(channel)
        ovs_before = ovs_cpu(sb)
        # As the agent's sync runs it (agent.sync): under the memory policy (the collector
        # paused around it; then the new state frozen, the heap's free pages given back).
        with GcTimer() as gct:
            cpu = time.process_time()
            started = time.perf_counter()
            with memory_policy(dp):
                build_s, stage_s = stage_cluster(dp, ports, ctx)
                staged = time.perf_counter()
                stats = await dp.commit()
            done = time.perf_counter()
            cpu = time.process_time() - cpu
        ovs_after = ovs_cpu(sb)
        inner = sum(row[1] for row in channel.counters.bundled.values())
        return SyncRun(
            build_s=build_s,
            stage_s=stage_s,
            commit_s=done - staged,
            total_s=done - started,
            gc_s=gct.seconds,
            cpu_s=cpu,
            tail_s=done - committing[-1] if committing else 0.0,
            ovs_cpu_s=None if ovs_before is None else ovs_after - ovs_before,  # type: ignore[operator]
            messages=stats.messages,
            bytes=channel.counters.total("sent")[1] - sent_before,
            inner_bytes=inner,
            kinds=dict(stats.kinds),
        )
    finally:
        await channel.close()


def _time_bundle_commits(channel: Channel) -> list[float]:
    """Record when each streamed bundle of the channel is told to commit (its last message
    has been written by then)."""
    marks: list[float] = []
    open_bundle = channel.bundle

    def bundle(*args: Any, **kwargs: Any) -> Any:
        opened = open_bundle(*args, **kwargs)
        commit = opened.commit

        async def timed_commit(*a: Any, **k: Any) -> None:
            marks.append(time.perf_counter())
            await commit(*a, **k)

        opened.commit = timed_commit  # type: ignore[method-assign]
        return opened

    channel.bundle = bundle  # type: ignore[method-assign]
    return marks


def ovs_cpu(sb: Sandbox) -> float | None:
    """CPU time (user + system) ovs-vswitchd has used so far; None if it cannot be read."""
    pid = sb.record.pids.get("ovs-vswitchd") if sb.record is not None else None
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- the same content, for the baselines ---------------------------------------------------


def full_sync_messages(ports: Cluster) -> list[of.Message]:
    """Exactly what our full sync sends, in the same order."""
    switch = RecordingSwitch(keep=True)  # accepts every bundle, keeps its messages
    dp = SwitchSync(switch, CONFIG, GENERATION)
    ctx = Context(dp.tables, GENERATION)

    async def sync() -> None:  # in a loop, as ours: the bundle is streamed while staging
        stage_cluster(dp, ports, ctx)
        await dp.commit()

    asyncio.run(sync())
    (messages,) = switch.bundles
    return messages


def ofctl_text(messages: Sequence[of.Message]) -> tuple[list[str], list[str]]:
    """The messages as ``ovs-ofctl add-groups`` and ``add-flows`` lines (our values' own text
    form; a group over the message limit is an add plus insert_bucket lines)."""
    groups: list[str] = []
    flows: list[str] = []
    for msg in messages:
        if type(msg) in (of.EncodedFlowMod, of.EncodedGroupMod):
            msg = msg.decoded()  # staged as its encoding: its value for the text
        if isinstance(msg, of.GroupMod):
            if msg.command in _GROUP_WRITES:  # ADD (or ADD_OR_MOD, the same on a fresh switch)
                groups.append(of.format_group(msg))
            elif msg.command == of.GroupModCommand.INSERT_BUCKET:
                buckets = ",".join(b.to_text(msg.group_type) for b in msg.buckets)
                groups.append(
                    f"insert_bucket group_id={msg.group_id},command_bucket_id=last,{buckets}"
                )
            else:
                raise ValueError(f"unexpected group mod in a full sync: {of.to_text(msg)}")
        elif isinstance(msg, of.FlowMod):
            if msg.command != of.FlowModCommand.ADD:
                raise ValueError(f"unexpected flow mod in a full sync: {of.to_text(msg)}")
            flows.append(of.format_flow(msg))
        else:
            raise ValueError(f"unexpected message {msg!r}")
    return groups, flows


_GROUP_WRITES = {int(c) for c in of.GroupModCommand if c.name in ("ADD", "ADD_OR_MOD")}


def write_ofctl_input(lines: SwitchLines, groups_file: Path, flows_file: Path) -> None:
    """A switch's ``switch_lines`` as ``ovs-ofctl add-groups``/``add-flows`` input: a
    baseline that loads exactly what an agent installed (``ovs-ofctl``'s own dump)."""
    flows, groups = lines
    groups_file.write_text("\n".join(groups) + "\n")
    flows_file.write_text("\n".join(flows) + "\n")


@dataclass
class OfctlRun:
    groups_s: float
    flows_s: float
    total_s: float
    cpu_s: float  # ovs-ofctl's own user + system time


def run_ofctl(sb: Sandbox, groups_file: Path, flows_file: Path) -> OfctlRun:
    """``ovs-ofctl --bundle add-groups`` then ``--bundle add-flows``: process start to exit."""

    def child_cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    base = ["ovs-ofctl", "-O", "OpenFlow15", "--bundle"]
    cpu = child_cpu()
    started = time.perf_counter()
    subprocess.run([*base, "add-groups", sb.openflow, str(groups_file)], env=sb.env, check=True)
    middle = time.perf_counter()
    subprocess.run([*base, "add-flows", sb.openflow, str(flows_file)], env=sb.env, check=True)
    done = time.perf_counter()
    return OfctlRun(middle - started, done - middle, done - started, child_cpu() - cpu)


async def floor(sb: Sandbox, messages: Sequence[of.Message], chunk: int = 256 * 1024) -> float:
    """The same messages, encoded as BUNDLE_ADDs before the clock starts, written by the
    channel as one bundle: what Open vSwitch itself needs to take them in and commit."""
    channel = Channel(sb.openflow, bundle_timeout=600)
    await channel.start()
    try:
        bundle = channel.bundle()
        blobs: list[bytes] = []
        parts: list[bytes] = []
        size = 0
        xid = 0x40000000
        for msg in messages:
            xid += 1
            data = of.encode_bundle_add(bundle.bundle_id, msg, xid, bundle.flags)
            parts.append(data)
            size += len(data)
            if size >= chunk:
                blobs.append(b"".join(parts))
                parts, size = [], 0
        if parts:
            blobs.append(b"".join(parts))
        conn = bundle.conn
        await bundle.drain()  # the OPEN goes out with the first write now: before ours
        gc.collect()
        started = time.perf_counter()
        for blob in blobs:
            conn.write(blob)
            await conn.drain()
            await asyncio.sleep(0)
        await bundle.commit()
        return time.perf_counter() - started
    finally:
        await channel.close()


def alternate(runners: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[Any]]:
    """Run each runner ``rounds`` times, rotating the order every round (drift spreads
    evenly over the contenders)."""
    names = list(runners)
    results: dict[str, list[Any]] = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            results[name].append(runners[name]())
    return results
