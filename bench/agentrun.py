"""Running the real agent against a private OVS for the agent-level benchmarks.

* ``serve_cluster``: the fake API (``bench.kubeapi.ServingKubeApi``) holding a cluster, its
  list pages encoded before any clock starts, and a ServiceCIDR for the node's routes;
* ``run_agent``: ``ovsproxy run`` as a subprocess (what a user starts), timed from the
  spawn to its "first sync done" log line (the agent's own timestamp), then checked healthy
  on /healthz, its RSS read, and stopped;
* ``start_probe``: the same agent in ``bench.agent_probe`` (phase timers, event latency);
* ``reset``: the switch emptied and the agent's marks on the bridge and routes removed, so
  the next agent starts on a fresh OVS.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support import cluster

from bench import dp, kubeapi
from ovsproxy.ovs.ovsdb import GROUP_IDS_KEY
from ovsproxy.ovs.sandbox import Sandbox
from ovsproxy.sources.convert import PROXY_LABEL_SELECTOR

ROOT = Path(__file__).resolve().parent.parent
PAGE_SIZE = 500  # the informer's page size (its default)
GENERATION_KEY = "ovsproxy-generation"
ROUTE_PROTOCOL = "155"


def ovsproxy_command() -> list[str]:
    script = Path(sys.executable).parent / "ovsproxy"
    return [str(script)] if script.exists() else [sys.executable, "-m", "ovsproxy"]


async def serve_cluster(services: int, endpoints: int) -> tuple[kubeapi.ServingKubeApi, int]:
    """A started fake API with the cluster; returns it and the bytes of its list pages."""
    api = kubeapi.ServingKubeApi()
    await api.start()
    svcs, slices = cluster.cluster_objects(services, endpoints)
    api.load("services", svcs)
    api.load("endpointslices", slices)
    api.apply(
        "servicecidrs",
        {"metadata": {"name": "kubernetes"}, "spec": {"cidrs": [cluster.SERVICE_CIDR]}},
    )
    size = sum(
        api.prepare(plural, PROXY_LABEL_SELECTOR, PAGE_SIZE)
        for plural in ("services", "endpointslices")
    )
    return api, size


def agent_flags(sb: Sandbox, source: list[str], min_sync_interval: float = 0.0) -> list[str]:
    return [
        *source,
        "--ovsdb",
        sb.ovsdb,
        "--openflow",
        sb.openflow,
        "--netns",
        sb.netns,
        "--node-name",
        "bench-node",
        "--metrics-address",
        "127.0.0.1:0",
        "--health-address",
        "",
        "--min-sync-interval",
        str(min_sync_interval),
        "--log-format",
        "json",
        "--log-level",
        "info",
    ]


def agent_config(sb: Sandbox, source: dict[str, Any], min_sync_interval: float = 0.0) -> dict:
    """The same configuration as ``agent_flags``, as ``ovsproxy.config.load`` keywords."""
    return {
        **source,
        "ovsdb": sb.ovsdb,
        "openflow": sb.openflow,
        "netns": sb.netns,
        "node_name": "bench-node",
        "metrics_address": "127.0.0.1:0",
        "health_address": "",
        "min_sync_interval": min_sync_interval,
        "log_level": "warning",
    }


@dataclass
class AgentRun:
    ready_s: float  # spawn -> "first sync done"
    healthy: bool
    rss_kb: int
    hwm_kb: int
    cpu_s: float  # the agent's CPU time (user + system) up to ready
    log: list[dict[str, Any]] = field(default_factory=list)
    at_ready: Any = None  # what ``run_agent``'s ``on_ready`` returned

    def marks(self) -> dict[str, float]:
        """Seconds after the spawn of the agent's milestone log lines."""
        return {}


def proc_status(pid: int) -> dict[str, int]:
    out = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1])
    return out


def proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _healthz(port: int) -> bool:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /healthz HTTP/1.0\r\n\r\n")
    await writer.drain()
    status = await reader.readline()
    writer.close()
    return b" 200 " in status


async def run_agent(
    flags: list[str], timeout: float = 600, on_ready: Callable[[], Any] | None = None
) -> AgentRun:
    """``ovsproxy run FLAGS`` until its first sync is done; then stopped (SIGTERM).
    ``on_ready`` is called the moment the agent says so (e.g. to read the API server's
    CPU time), its answer kept in ``AgentRun.at_ready``."""
    spawned = time.time()
    proc = await asyncio.create_subprocess_exec(
        *ovsproxy_command(),
        "run",
        *flags,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    assert proc.stderr is not None
    log: list[dict[str, Any]] = []
    port = None
    try:
        async with asyncio.timeout(timeout):
            while True:
                line = await proc.stderr.readline()
                if not line:
                    raise RuntimeError(
                        "ovsproxy run exited before its first sync: "
                        + " | ".join(str(e.get("msg", e)) for e in log[-5:])
                    )
                try:
                    entry = json.loads(line)
                except ValueError:
                    entry = {"msg": line.decode(errors="replace").strip()}
                log.append(entry)
                message = str(entry.get("msg", ""))
                if message.startswith("metrics on http://"):  # the operator's listener
                    port = int(message.split("http://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
                if message.startswith("first sync done"):
                    at_ready = on_ready() if on_ready is not None else None
                    ready_s = float(entry["ts"]) - spawned
                    break
        cpu = proc_cpu(proc.pid)
        memory = proc_status(proc.pid)
        healthy = port is not None and await _healthz(port)
        return AgentRun(
            ready_s, healthy, memory.get("VmRSS", 0), memory.get("VmHWM", 0), cpu, log, at_ready
        )
    finally:
        drain = asyncio.create_task(_drain(proc.stderr))
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 120)
        except TimeoutError:
            proc.kill()
            await proc.wait()
        drain.cancel()


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.readline():
        pass


class ProbeProcess:
    """``bench.agent_probe`` as a child: ``ready`` holds its first report."""

    def __init__(self, proc: asyncio.subprocess.Process, ready: dict[str, Any], spawned: float):
        self.proc = proc
        self.ready = ready
        self.spawned = spawned

    async def ask(self, command: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(command).encode() + b"\n")
        await self.proc.stdin.drain()
        line = await self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"agent probe exited while answering {command}")
        return json.loads(line)

    def cpu(self) -> float:
        return proc_cpu(self.proc.pid)

    async def stop(self) -> None:
        if self.proc.returncode is None:
            assert self.proc.stdin is not None
            with contextlib.suppress(ConnectionError):
                self.proc.stdin.write(b'{"cmd": "stop"}\n')
                await self.proc.stdin.drain()
                self.proc.stdin.close()
            try:
                await asyncio.wait_for(self.proc.wait(), 120)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


async def start_probe(
    config: dict[str, Any], decoder: str = "msgspec", timeout: float = 600, **options: Any
):
    spawned = time.time()
    spec = {"config": config, "decoder": decoder, "spawned_at": spawned, **options}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.agent_probe",
        json.dumps(spec),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        limit=1 << 26,
    )
    assert proc.stdout is not None and proc.stderr is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), timeout)
    except TimeoutError:
        proc.kill()
        raise
    if not line:
        error = (await proc.stderr.read()).decode(errors="replace")[-2000:]
        await proc.wait()
        raise RuntimeError(f"agent probe failed: {error}")
    asyncio.create_task(_drain(proc.stderr))  # noqa: RUF006 - ends with the process
    return ProbeProcess(proc, json.loads(line), spawned)


def reset(sb: Sandbox) -> None:
    """A fresh OVS for the next agent: no flows, groups, generation or group registry on
    the bridge, no routes of ours in the node's namespace."""
    dp.reset_switch(sb)
    for key in (GENERATION_KEY, GROUP_IDS_KEY):
        subprocess.run(
            ["ovs-vsctl", f"--db={sb.ovsdb}", "remove", "Bridge", sb.bridge, "external_ids", key],
            env=sb.env,
            check=True,
            capture_output=True,
        )
    for family in ("-4", "-6"):
        subprocess.run(
            ["ip", "-n", sb.netns, family, "route", "flush", "proto", ROUTE_PROTOCOL],
            check=False,
            capture_output=True,
        )


def baseline_of_installed(sb: Sandbox, groups_file: Path, flows_file: Path) -> tuple[int, int, str]:
    """Write what the switch holds now (an agent's install, dumped by ``ovs-ofctl``) as
    ``ovs-ofctl add-groups``/``add-flows`` input, the baseline that loads the same content;
    returns its ``switch_content``."""
    lines = dp.switch_lines(sb)
    dp.write_ofctl_input(lines, groups_file, flows_file)
    return switch_content(sb, lines)


def switch_content(sb: Sandbox, lines: dp.SwitchLines | None = None) -> tuple[int, int, str]:
    """(flows, groups, fingerprint) of the switch (of ``lines``, its ``dp.switch_lines``,
    when given). The fingerprint names each group by the ClusterIP whose ServiceLB flow
    points at it, not by its id: the proxier numbers groups in its own order, ``bench.dp``
    in the cluster's, and the content is the same."""
    import hashlib
    import re

    flow_lines, group_lines = lines if lines is not None else dp.switch_lines(sb)
    flows, groups = sorted(flow_lines), sorted(group_lines)
    names: dict[str, str] = {}
    for line in flows:
        target = re.search(r"actions=group:(\d+)", line)
        dst = re.search(r"nw_dst=([0-9.]+)", line)
        if target and dst:
            names[target.group(1)] = dst.group(1)

    def neutral(line: str) -> str:
        line = re.sub(r"group:(\d+)", lambda m: f"group:<{names.get(m.group(1), '?')}>", line)
        return re.sub(r"group_id=(\d+)", lambda m: f"group_id=<{names.get(m.group(1), '?')}>", line)

    digest = hashlib.sha256()
    for line in sorted(neutral(x) for x in (*flows, *groups)):
        digest.update(line.encode() + b"\n")
    return len(flows), len(groups), digest.hexdigest()[:16]
