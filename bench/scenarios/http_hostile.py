"""Hostile HTTP clients against the agent (issue 35), at full size: 10,000 Services x 10
endpoints from the fake Kubernetes API (``--quick``: 1,000), one ``ovsproxy run``.

1. ``readers``: 8 loopback clients (curl) fetching /status and /dump (4 each) back to back for a
   minute (``--quick``: 10 s) on the operator's address, while a kubelet-like prober GETs
   /healthz on the node's address every 0.5 s on a new connection with the kubelet's 1 s
   timeout, from another source address (127.0.0.2, the node's, where the slow clients below
   come from 127.0.0.1, a pod's), and, half-way, one more Service is applied to the API: the
   time until its ClusterIP's flow is in the switch (``change_installed_s``).
2. ``slow_clients``: 2,000 clients (``--quick``: 200) trickling their requests to the node's
   address (a header every 0.5 s, never the end; reconnecting when closed) for 30 s
   (``--quick``: 10 s), with the same prober: probes failed, the most descriptors the agent
   held above its idle count, the agent's log lines meanwhile.

Baseline, same run: the prober alone for 5 s against the idle agent (``idle``). Figures per
phase: probes, failed, slowest and 99th percentile probe time, and the ratio of the
phase's 99th percentile to the idle one.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from support import cluster
from support.kubelet_probe import Prober

from bench import agentrun, dp
from ovsproxy.httpserver import raise_open_files_limit
from ovsproxy.lab.ports import reserve_port

NAME = "http-hostile"
DESCRIPTION = "/healthz and a Service change under /status+/dump readers and slow clients"

ENDPOINTS = 10
PROBE_PERIOD = 0.5


def _get(url: str, timeout: float) -> tuple[int, int]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, len(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, 0


def _curl(url: str) -> tuple[int, int]:
    """(status, bytes) of one GET by curl: the readers' bytes are not parsed in this process,
    whose interpreter the prober needs."""
    done = subprocess.run(
        ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code} %{size_download}", url],
        capture_output=True,
        text=True,
        check=False,
    )
    code, _, size = done.stdout.partition(" ")
    return int(code or 0), int(size or 0)


def _figures(prober: Prober, idle_p99: float | None = None) -> dict[str, Any]:
    times = sorted(prober.times)
    p99 = times[min(len(times) - 1, int(len(times) * 0.99))] if times else 0.0
    out: dict[str, Any] = {
        "probes": len(times),
        "probes_failed": prober.failed,
        "probe_median_ms": round(statistics.median(times) * 1e3, 1) if times else None,
        "probe_p99_ms": round(p99 * 1e3, 1),
        "probe_slowest_ms": round(times[-1] * 1e3, 1) if times else None,
    }
    if idle_p99:
        out["p99_vs_idle"] = round(p99 / idle_p99, 1)
    return out


def _installed(sb: Any, ip: str) -> bool:
    return f"nw_dst={ip}" in sb.ofctl("dump-flows", "--no-stats", f"ip,nw_dst={ip}")


def _descriptors(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


async def _trickle(port: int, stop: asyncio.Event, counts: dict[str, int]) -> None:
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            counts["connect_failed"] += 1
            await asyncio.sleep(0.2)
            continue
        counts["connections"] += 1
        try:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            while not stop.is_set() and not reader.at_eof():
                await writer.drain()
                await asyncio.sleep(0.5)
                writer.write(b"X-Slow: 1\r\n")
        except OSError:
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


def _spawn(cmd: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("wb") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _wait_ready(
    sb: Any, proc: subprocess.Popen[bytes], last_ip: str, health: str, log_path: Path
) -> None:
    """Every Service installed and /healthz 200 on the node's address."""
    deadline = time.monotonic() + 900
    while not (_installed(sb, last_ip) and _get(health, 2)[0] == 200):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"agent not ready: {log_path.read_text()[-2000:]}")
        time.sleep(0.5)


def _log_lines(path: Path) -> int:
    return len(path.read_bytes().splitlines())


async def _measure(sb: Any, services: int, quick: bool, tmp: Path) -> dict[str, Any]:
    api, _ = await agentrun.serve_cluster(services, ENDPOINTS)
    health_port, metrics_port = reserve_port(), reserve_port()
    log_path = tmp / "agent.log"
    try:
        kubeconfig = str(api.kubeconfig(tmp / "kubeconfig"))
        flags = agentrun.agent_flags(sb, ["--kubeconfig", kubeconfig])
        flags += ["--health-address", f"127.0.0.1:{health_port}"]
        flags += ["--metrics-address", f"127.0.0.1:{metrics_port}"]
        proc = await asyncio.to_thread(
            _spawn, [*agentrun.ovsproxy_command(), "run", *flags], log_path
        )
        try:
            ports = (health_port, metrics_port)
            return await _phases(sb, api, services, quick, proc, ports, log_path)
        finally:
            await asyncio.to_thread(_stop, proc)
    finally:
        await api.stop()


async def _phases(
    sb: Any,
    api: Any,
    services: int,
    quick: bool,
    proc: subprocess.Popen[bytes],
    ports: tuple[int, int],
    log_path: Path,
) -> dict[str, Any]:
    health_port, metrics_port = ports
    health = f"http://127.0.0.1:{health_port}/healthz"
    operator = f"http://127.0.0.1:{metrics_port}"
    last_ip = str(ipaddress.IPv4Address(cluster.CLUSTER_IP_BASE + services))
    await asyncio.to_thread(_wait_ready, sb, proc, last_ip, health, log_path)

    with Prober(health_port, PROBE_PERIOD) as idle:
        await asyncio.sleep(5)
    idle_p99 = _figures(idle)["probe_p99_ms"] / 1e3
    report: dict[str, Any] = {"services": services, "endpoints": ENDPOINTS}
    report["idle"] = _figures(idle)

    # 1. readers
    duration = 10.0 if quick else 60.0
    stop = threading.Event()
    reads: dict[str, list[float]] = {"/status": [], "/dump": []}
    sizes: dict[str, int] = {}

    def reader(path: str) -> None:
        while not stop.is_set():
            start = time.monotonic()
            code, size = _curl(operator + path)
            if code == 200:
                reads[path].append(time.monotonic() - start)
                sizes[path] = size

    threads = [
        threading.Thread(target=reader, args=(path,), daemon=True)
        for path in ["/status", "/dump"] * 4
    ]
    new_svcs, new_slices = cluster.cluster_objects(services + 1, ENDPOINTS)
    change_ip = str(ipaddress.IPv4Address(cluster.CLUSTER_IP_BASE + services + 1))
    with Prober(health_port, PROBE_PERIOD) as prober:
        for thread in threads:
            thread.start()
        await asyncio.sleep(duration / 2)
        api.apply("services", new_svcs[services])
        api.apply("endpointslices", new_slices[services])
        applied = time.monotonic()
        while not (await asyncio.to_thread(_installed, sb, change_ip)):
            if time.monotonic() - applied > 120:
                break
            await asyncio.sleep(0.02)
        change_s = time.monotonic() - applied
        await asyncio.sleep(max(0.0, duration / 2 - change_s))
        stop.set()
        for thread in threads:
            await asyncio.to_thread(thread.join, 600)
    report["readers"] = {
        "clients": len(threads),
        "seconds": duration,
        **_figures(prober, idle_p99),
        "change_installed_s": round(change_s, 3),
        **{
            f"{path[1:]}_reads": len(times)
            for path, times in reads.items()  # completed, with 200
        },
        **{
            f"{path[1:]}_median_s": round(statistics.median(times), 2)
            for path, times in reads.items()
            if times
        },
        **{f"{path[1:]}_bytes": size for path, size in sizes.items()},
    }

    # 2. slow clients
    clients = 200 if quick else 2000
    seconds = 10.0 if quick else 30.0
    before = _descriptors(proc.pid)
    lines_before = await asyncio.to_thread(_log_lines, log_path)
    counts = {"connections": 0, "connect_failed": 0}
    most = 0
    with Prober(health_port, PROBE_PERIOD) as prober:
        halt = asyncio.Event()
        tasks = [asyncio.create_task(_trickle(health_port, halt, counts)) for _ in range(clients)]
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            most = max(most, _descriptors(proc.pid) - before)
            await asyncio.sleep(0.2)
        halt.set()
        await asyncio.gather(*tasks)
    report["slow_clients"] = {
        "clients": clients,
        "seconds": seconds,
        **_figures(prober, idle_p99),
        "connections": counts["connections"],
        "connect_failed": counts["connect_failed"],
        "most_descriptors_held": most,
        "log_lines": await asyncio.to_thread(_log_lines, log_path) - lines_before,
    }
    return report


def run(quick: bool = False) -> dict[str, Any]:
    services = 1000 if quick else 10_000
    raise_open_files_limit()  # the slow clients' sockets are ours too
    with tempfile.TemporaryDirectory(prefix="ovsproxy-bench-http-") as tmp, dp.sandbox() as sb:
        report = asyncio.run(_measure(sb, services, quick, Path(tmp)))
    readers, slow = report["readers"], report["slow_clients"]
    report["probes_failed"] = readers["probes_failed"] + slow["probes_failed"]
    report["goal_met"] = report["probes_failed"] == 0 and readers["change_installed_s"] < 1.0
    return report
