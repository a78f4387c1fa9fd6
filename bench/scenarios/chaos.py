"""Chaos: faults on a multi-node lab under continuous traffic, each followed until
``ovsproxy verify`` is clean on every node.

``python -m bench chaos --nodes 3 --minutes N [--seed S]`` (root). A dual-stack lab
(src/ovsproxy/lab) whose agents read the fake Kubernetes API (support/k8s_fake, real HTTP
list/watch, run in a thread of this process). Traffic, all the run long: a prober
(bench/chaos_prober.py, one thread per target, a new connection or socket per request) in every
node's client pod, to a ClusterIP Service and to the ClusterIPs of a NodePort Service (TCP and
UDP, IPv4 and IPv6), and one in the external client's namespace to the NodePort on every node IP
(TCP and UDP, both families). Every request is recorded with its start, end and outcome.

Faults, in seeded random order (every kind once per round, rounds until N minutes are over;
the first round always completes), each on a random node where it has one:

* ``endpoint-churn``: one endpoint of the probed ClusterIP Service leaves, or all come back;
* ``service-add`` / ``service-delete``: a Service (both families, TCP and UDP) is created or
  the oldest such one deleted;
* ``agent-sigkill``: an agent is killed with SIGKILL and started again;
* ``vswitchd-kill``: ovs-vswitchd is killed (kill -9) and started again (flows, groups and the
  switch's conntrack are gone);
* ``vswitchd-kill-connections`` (established connections across a vswitchd kill): the
  node's client pod holds six long-lived TCP connections to a ClusterIP Service whose
  endpoints serve ``ovsproxy.ovs.streams`` on every node (the client pushes, the server
  pushes, both; IPv4 and IPv6: the group picks a local or a remote endpoint), the node's
  ovs-vswitchd is killed (kill -9) and started again under them (they run on while the fault
  converges); ``connections`` has their resets, lost records and, per direction, the silence
  around the kill (``silent_s``) and ``moved_s``: from the switch answering again to its first
  record after the silence (0: it moved before);
* ``ovsdb-restart``: ovsdb-server is killed and started again on its database;
* ``broken-object``: a Service with an invalid port (70000) appears in the API, then is fixed;
* ``watch-break``: every open watch is cut (connection dropped) or expired (the history is
  compacted and the watches end with ERROR 410, so every agent must list again), and an
  endpoint change is made while they are down.

After each fault: ``recovered`` is when what the fault broke is back (the restarted agent's
first sync done, i.e. /healthz 200 - ``healthy_after_s`` is from its spawn to then; the daemon
answering; the object written; the fix applied); from then on ``verify`` (the same code as
``ovsproxy verify``, with each agent's own flags, in one process per node; the desired state
built once after the fault, the node read and compared with it again and again) runs on every
node until it is clean; ``converge_s`` is from ``recovered`` to the end of the first clean
comparison on the last node (an upper bound: it includes that check's own time, and when the
first check is already clean - ``first_check_clean`` - the figure is that check's time,
``check_s``, building the desired state included). The final check is a whole ``verify`` of
every node. Requests overlapping the
fault's window (its start to convergence + 1 s) are
its requests; their failures are the fault's failures. ``traffic_back_s`` (vswitchd, ovsdb-server):
from the daemon answering again to the start of the first successful request after the window's
last failed one (from then on every request of the window succeeded); ``slowest_s``: the
longest request of the window; ``slow``: answered requests that took over 0.9 s (a lost packet
retransmitted, or a stall).
Each failed request is reported by its prober with its 5-tuple, phase and timing
(``ovsproxy.ovs.traffic``): its fault's ``failed_at`` names it, and the failures outside every
fault's window - the unexplained ones - are listed in ``failed_outside_fault_windows_requests``;
the first ``MAX_EXPLAINED`` of them get their evidence (``ovsproxy.lab.evidence``) when their
prober reports them, in ``failed_outside_fault_windows_evidence``.
The TCP timeout, 2.5 s, leaves room for one retransmitted SYN.

Goals (issue 17): agent SIGKILL -> 0 failed requests; ovs-vswitchd restart -> traffic back
<= 2 s after it is up again; ovsdb-server restart -> 0 failed; every fault converged <= 5 s;
0 differences at the end. Issue 27: established connections across a vswitchd kill -> 0
resets and 0 lost records, moving again <= 1.5 s after the switch is up (the median direction:
the common case; the worst is in the fault log). The result has each goal with its figure and
whether it was met, and a timeline plot (``plot``: requests/s, failures, fault windows).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import datetime as dt
import json
import logging
import multiprocessing
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NAME = "chaos"
DESCRIPTION = "faults on a 3-node lab under traffic: failed requests and time to `verify` clean"
IN_ALL = False  # minutes of its own: `python -m bench chaos --minutes 5`

RESULTS = Path(__file__).resolve().parent.parent / "results"
KINDS = (
    "endpoint-churn",
    "service-add",
    "service-delete",
    "agent-sigkill",
    "vswitchd-kill",
    "vswitchd-kill-connections",
    "ovsdb-restart",
    "broken-object",
    "watch-break",
)
GOAL_CONVERGE_S = 5.0
GOAL_TRAFFIC_BACK_S = 2.0
GOAL_CONNECTIONS_MOVED_S = 1.5
STREAM_IPS = ("10.96.7.30", "fd00:10:96::7:30")
STREAM_PORT = 9000  # ovsproxy.ovs.streams in every web pod
STREAM_BEFORE_S = 2.0  # the connections run this long before the kill
STREAM_RESTART_ALLOWANCE_S = 4.0  # ... the restart within this (else less time after it)
STREAM_AFTER_S = 6.0  # ... and this long after the switch is back
GRACE_S = 1.0  # after convergence, still the fault's window
CONVERGE_TIMEOUT_S = 60.0  # give up following a fault (the goal is far below)
TCP_TIMEOUT_S = 2.5  # a SYN lost once is retransmitted after 1 s: slow, not failed
UDP_TIMEOUT_S = 1.0
PROBE_INTERVAL_S = 0.25  # per target, between requests (30 targets: about 100 requests/s)
SLOW_S = 0.9  # a request this slow was probably retransmitted: counted apart
MAX_EXPLAINED = 20  # failures outside the faults' windows explained as they come
PLURALS = {"Service": "services", "EndpointSlice": "endpointslices"}
WEB_IPS = ("10.96.7.10", "fd00:10:96::7:10")
NODEPORT_IPS = ("10.96.7.20", "fd00:10:96::7:20")
NODE_PORT = 30700

log = logging.getLogger("bench.chaos")
# A request: start, end (CLOCK_MONOTONIC), target label, answered, pod or failure kind, and a
# failure's 5-tuple (src:sport -> dst:dport) or "".
Request = tuple[float, float, str, bool, str, str]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("chaos")
    group.add_argument("--nodes", type=int, default=3, help="chaos: lab nodes (default 3)")
    group.add_argument("--minutes", type=float, default=5.0, help="chaos: run time (default 5)")
    group.add_argument("--seed", type=int, default=None, help="chaos: the schedule's seed")


OPTIONS = ("nodes", "minutes", "seed")


@dataclass
class Fault:
    kind: str
    node: str | None
    detail: str
    start: float  # CLOCK_MONOTONIC
    recovered: float = 0.0
    converged: float | None = None
    converge_s: float | None = None
    verify_rounds: int = 0
    first_check_clean: bool = False  # every node's first check: then converge_s is its time
    check_s: float = 0.0  # the slowest node's last check
    last_difference: str = ""
    requests: int = 0
    failed: int = 0
    slow: int = 0
    slowest_s: float = 0.0  # the longest request of the window (answered or not)
    failures: dict[str, int] = field(default_factory=dict)  # target label: kind -> count
    failed_at: list[str] = field(default_factory=list)  # the first ones, from the fault's start
    traffic_back_s: float | None = None
    healthy_after_s: float | None = None  # agent-sigkill: from its spawn to /healthz 200
    # vswitchd-kill-connections: resets, lost records, moved_s per direction (see above)
    connections: dict[str, Any] = field(default_factory=dict)

    @property
    def window_end(self) -> float:
        end = self.converged if self.converged is not None else self.recovered + CONVERGE_TIMEOUT_S
        return end + GRACE_S


# -- the lab and its Services --------------------------------------------------------------


class ChaosLab:
    """The lab, the fake API, the probed Services and the faults' actions."""

    def __init__(self, nodes: int, seed: int, workdir: Path) -> None:
        from support.apiserver import FakeApiThread

        from ovsproxy.lab.cluster import Lab

        self.rng = random.Random(seed)
        self.workdir = workdir
        self.api = FakeApiThread()
        self.api.start()
        kubeconfig = self.api.kubeconfig(workdir / "kubeconfig")
        self.lab = Lab(nodes, source_args=("--kubeconfig", str(kubeconfig)))
        self.extra: list[str] = []  # added Services, oldest first
        self.counter = 0
        self.web_dropped: str | None = None
        self.probers: list[tuple[subprocess.Popen[bytes], Path, list[str]]] = []
        self.stream_servers: list[subprocess.Popen[bytes]] = []
        # vswitchd-kill-connections running: (client, its fault, killed, back, duration)
        self.streams: tuple[subprocess.Popen[str], Fault, float, float, float] | None = None
        self.configs: dict[str, Any] = {}
        # Failures outside every fault's window, explained as the probers report them: until
        # ``quiet_since`` (a fault's window end), every failure is the fault's.
        self.quiet_since = float("inf")
        self.explained: list[dict[str, Any]] = []
        self.following = threading.Event()
        self.follower: threading.Thread | None = None
        # One process per node runs `verify`: checks of three nodes in one interpreter would
        # share its GIL (and the fake API's thread), and the convergence figure is only as
        # fine as one check is quick.
        self.verifiers = concurrent.futures.ProcessPoolExecutor(
            nodes, mp_context=multiprocessing.get_context("spawn"), initializer=_quiet
        )

    # -- Services ------------------------------------------------------------------------
    def apply(self, service: Any) -> None:
        for doc in service.documents():
            self.api.apply(PLURALS[doc["kind"]], doc)

    def delete(self, service: Any) -> None:
        for doc in service.documents():
            meta = doc["metadata"]
            self.api.delete(PLURALS[doc["kind"]], meta["namespace"], meta["name"])

    def web(self, dropped: str | None = None) -> Any:
        from ovsproxy.lab.manifests import LabPort, LabService, addresses

        pods = [ep for ep in self.lab.endpoints() if ep.pod.startswith("web-")]
        return LabService(
            "chaos-web",
            addresses(*WEB_IPS),
            (LabPort("http", 80, 8080), LabPort("dns", 53, 5353, "UDP")),
            tuple(ep for ep in pods if ep.pod != dropped),
        )

    def nodeport(self) -> Any:
        from ovsproxy.lab.manifests import LabPort, LabService, addresses

        return LabService(
            "chaos-np",
            addresses(*NODEPORT_IPS),
            (
                LabPort("http", 80, 8080, node_port=NODE_PORT),
                LabPort("dns", 53, 5353, "UDP", node_port=NODE_PORT),
            ),
            self.lab.endpoints(),
            type="NodePort",
        )

    def stream_service(self) -> Any:
        from ovsproxy.lab.manifests import LabPort, LabService, addresses

        pods = [ep for ep in self.lab.endpoints() if ep.pod.startswith("web-")]
        return LabService(
            "chaos-stream", addresses(*STREAM_IPS), (LabPort("stream", 80, STREAM_PORT),), pods
        )

    def extra_service(self, index: int, port: int = 80) -> Any:
        from ovsproxy.lab.manifests import LabPort, LabService, addresses

        return LabService(
            f"chaos-extra-{index}",
            addresses(f"10.96.8.{index % 250 + 1}", f"fd00:10:96::8:{index % 250 + 1:x}"),
            (LabPort("http", port, 8080), LabPort("dns", 53, 5353, "UDP")),
            self.lab.endpoints(),
        )

    # -- start and stop ------------------------------------------------------------------
    def up(self) -> None:
        from ovsproxy.lab.manifests import endpoint_texts

        self.lab.up()
        self.apply(self.web())
        self.apply(self.nodeport())
        self.apply(self.stream_service())
        self.start_stream_servers()
        self.counter += 1
        self.extra.append(self.extra_service(self.counter).name)
        self.apply(self.extra_service(self.counter))
        for name, service in (
            ("chaos-web", self.web()),
            ("chaos-np", self.nodeport()),
            ("chaos-stream", self.stream_service()),
        ):
            for port in service.ports:
                self.lab.wait_endpoints(
                    f"lab/{name}:{port.name}/{port.protocol}",
                    endpoint_texts(service.endpoints, port.target_port),
                    60,
                )
        for node in self.lab.nodes.values():
            self.configs[node.name] = verify_config(self.lab.agent_command(node))
        # The verifier processes start and import now, not in the first fault's figure.
        start = self.final_differences()
        self.lab.wait_status(lambda *_: True)
        if not all(r["clean"] for r in start.values()):
            time.sleep(2)  # the agents were still taking the Services in

    def down(self) -> None:
        self.stop_probers()
        if self.streams is not None:
            self.streams[0].kill()
            self.streams[0].wait()
        for server in self.stream_servers:
            server.kill()
            server.wait(timeout=10)
        self.verifiers.shutdown(cancel_futures=True)
        with contextlib.suppress(Exception):
            self.lab.down()
        with contextlib.suppress(Exception):
            self.api.stop()

    # -- traffic -------------------------------------------------------------------------
    def start_stream_servers(self) -> None:
        for node in self.lab.nodes.values():
            pod = node.pods[f"web-{node.index}"]
            ready = self.workdir / f"streams-{pod.name}.ready"
            cmd = ["ip", "netns", "exec", pod.netns, sys.executable, "-m", "ovsproxy.ovs.streams"]
            cmd += ["serve", "--port", str(STREAM_PORT), "--ready-file", str(ready)]
            self.stream_servers.append(
                subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
            )
            deadline = time.monotonic() + 30
            while not ready.exists():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the stream server in {pod.name} did not start")
                time.sleep(0.05)

    def connections_across_vswitchd_kill(self, node: Any, fault: Fault) -> None:
        """Six long-lived connections from the node's client pod across a kill -9 and restart
        of its ovs-vswitchd (see the module docstring); ``collect`` takes their figures once
        the fault has converged (they run on meanwhile)."""
        targets = [
            {"name": f"IPv{6 if ':' in ip else 4} {mode}", "host": ip, "port": 80, "mode": mode}
            for ip in STREAM_IPS
            for mode in ("client", "server", "both")
        ]
        pod = node.pods[f"client-{node.index}"]
        duration = STREAM_BEFORE_S + STREAM_RESTART_ALLOWANCE_S + STREAM_AFTER_S
        cmd = ["ip", "netns", "exec", pod.netns, sys.executable, "-m", "ovsproxy.ovs.streams"]
        cmd += ["run", "--targets", json.dumps(targets), "--duration", str(duration)]
        client = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        time.sleep(STREAM_BEFORE_S)
        killed = time.time()
        node.sandbox.restart_vswitchd(kill=True)
        self.streams = (client, fault, killed, time.time(), duration)

    def collect(self, fault: Fault) -> None:
        """The figures of the connections ``fault`` ran (if it ran any)."""
        if self.streams is None or self.streams[1] is not fault:
            return
        client, _, killed, back, duration = self.streams
        self.streams = None
        out, _ = client.communicate(timeout=duration + 180)
        fault.connections = connection_figures(json.loads(out), killed, back)

    def start_probers(self) -> None:
        for node in self.lab.nodes.values():
            targets = []
            for ip in WEB_IPS:
                targets += [("tcp", ip, 80, "web"), ("udp", ip, 53, "web")]
            for ip in NODEPORT_IPS:
                targets += [("tcp", ip, 80, "np-clusterip"), ("udp", ip, 53, "np-clusterip")]
            self._prober(node.pods[f"client-{node.index}"].netns, f"client-{node.index}", targets)
        targets = []
        for node in self.lab.nodes.values():
            for ip in node.node_ips:
                for proto in ("tcp", "udp"):
                    targets.append((proto, str(ip), NODE_PORT, f"nodeport {node.name}"))
        self._prober(self.lab.external_netns, "external", targets)
        self.following.set()
        self.follower = threading.Thread(target=self._follow, daemon=True)
        self.follower.start()

    def _follow(self) -> None:
        """Read the probers' lines as they come; a failure outside every fault's window gets
        its evidence at once (up to ``MAX_EXPLAINED``), while the switches still hold it."""
        from ovsproxy.lab.evidence import Evidence, lab_rig, serving_netns

        clients = [n.pods[f"client-{n.index}"].netns for n in self.lab.nodes.values()]
        watched = clients + serving_netns(n.sandbox for n in self.lab.nodes.values())
        offsets = [0] * len(self.probers)
        with Evidence(lab_rig(self.lab), watched) as session:
            while self.following.is_set() and len(self.explained) < MAX_EXPLAINED:
                for i, (_, path, labels) in enumerate(self.probers):
                    lines, offsets[i] = _new_lines(path, offsets[i])
                    for t0, index, record in _failures(lines):
                        if t0 >= self.quiet_since and len(self.explained) < MAX_EXPLAINED:
                            evidence = session.explain([record])
                            self.explained.append(
                                {"target": labels[index], **record, "evidence": evidence}
                            )
                self.following.wait(0.2)

    def _prober(self, netns: str, client: str, targets: list[tuple[str, str, int, str]]) -> None:
        out = self.workdir / f"probe-{client}.jsonl"
        spec = json.dumps([{"proto": p, "ip": ip, "port": port} for p, ip, port, _ in targets])
        cmd = [
            *("ip", "netns", "exec", netns, sys.executable, "-m", "bench.chaos_prober", spec),
            *(str(PROBE_INTERVAL_S), str(TCP_TIMEOUT_S), str(UDP_TIMEOUT_S)),
        ]
        root = Path(__file__).resolve().parents[2]
        with open(out, "wb") as sink:
            proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.DEVNULL, cwd=root)
        labels = [
            f"{client} -> {label} {proto.upper()} {'IPv6' if ':' in ip else 'IPv4'}"
            for proto, ip, _, label in targets
        ]
        self.probers.append((proc, out, labels))

    def stop_probers(self) -> None:
        self.following.clear()
        if self.follower is not None:
            self.follower.join(timeout=60)
        for proc, _, _ in self.probers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _, _ in self.probers:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def requests(self) -> list[Request]:
        """Every request: (start, end, target label, ok, pod or failure kind, the failure's
        5-tuple as ``src:sport -> dst:dport`` or "")."""
        found = []
        for _, path, labels in self.probers:
            for line in path.read_text().splitlines():
                with contextlib.suppress(ValueError, IndexError):
                    t0, t1, index, ok, detail, *rest = json.loads(line)
                    record = rest[0] if rest and rest[0] else {}
                    found.append((t0, t1, labels[index], bool(ok), detail, _tuple(record)))
        found.sort()
        return found

    # -- faults --------------------------------------------------------------------------
    def inject(self, kind: str) -> Fault:
        """Do the fault; returns it with ``recovered`` set."""
        self.quiet_since = float("inf")  # from now on, failures are this fault's
        nodes = sorted(self.lab.nodes)
        node_name = self.rng.choice(nodes)
        node = self.lab.nodes[node_name]
        now = time.monotonic
        if kind == "endpoint-churn":
            fault = Fault(kind, None, self._churn(), now())
        elif kind == "service-add":
            self.counter += 1
            service = self.extra_service(self.counter)
            fault = Fault(kind, None, service.name, now())
            self.apply(service)
            self.extra.append(service.name)
        elif kind == "service-delete":
            if not self.extra:  # nothing left to delete: one is added first (not timed)
                self.counter += 1
                self.apply(self.extra_service(self.counter))
                self.extra.append(self.extra_service(self.counter).name)
                time.sleep(1)
            name = self.extra.pop(0)
            fault = Fault(kind, None, name, now())
            self.delete(self.extra_service(int(name.rsplit("-", 1)[1])))
        elif kind == "agent-sigkill":
            fault = Fault(kind, node_name, "SIGKILL, then started again", now())
            assert node.agent is not None
            node.agent.send_signal(signal.SIGKILL)
            node.agent.wait(timeout=10)
            node.agent = None
            spawned = now()
            self.lab.start_agent(node_name, wait=False)
            # Back when its first sync is done (/healthz 200), as the daemons are back when
            # they answer; its interpreter start is the cold-start scenario's figure.
            self.lab.wait_agent(node_name, timeout=CONVERGE_TIMEOUT_S)
            fault.healthy_after_s = round(now() - spawned, 3)
        elif kind == "vswitchd-kill":
            fault = Fault(kind, node_name, "kill -9, then started again", now())
            node.sandbox.restart_vswitchd(kill=True)
        elif kind == "vswitchd-kill-connections":
            fault = Fault(kind, node_name, "6 long-lived connections, kill -9, started", now())
            self.connections_across_vswitchd_kill(node, fault)
        elif kind == "ovsdb-restart":
            fault = Fault(kind, node_name, "SIGKILL, then started on its database", now())
            node.sandbox.restart_ovsdb_server(kill=True)
        elif kind == "broken-object":
            self.counter += 1
            broken = self.extra_service(self.counter, port=70000)
            fault = Fault(kind, None, f"{broken.name}: port 70000, then 80", now())
            self.apply(broken)
            # The broken object is in every agent's input: the rest must stay converged.
            time.sleep(1.0)
            self.apply(self.extra_service(self.counter))
            self.extra.append(broken.name)
        elif kind == "watch-break":
            mode = self.rng.choice(["abort", "gone"])
            fault = Fault(kind, None, "", now())

            def cut() -> int:
                if mode == "gone":
                    self.api.api.compact()  # the agents' resourceVersions are now too old
                return self.api.api.break_watches(mode=mode)  # type: ignore[arg-type]

            count = self.api.run(cut)
            what = "expired (ERROR 410, history compacted)" if mode == "gone" else "cut"
            fault.detail = f"{count} watches {what}; while down: {self._churn()}"
        else:
            raise ValueError(kind)
        fault.recovered = now()
        return fault

    def _churn(self) -> str:
        if self.web_dropped is None:
            self.web_dropped = self.rng.choice(
                [ep.pod for ep in self.lab.endpoints() if ep.pod.startswith("web-")]
            )
            self.apply(self.web(self.web_dropped))
            return f"chaos-web: endpoint {self.web_dropped} removed"
        back, self.web_dropped = self.web_dropped, None
        self.apply(self.web())
        return f"chaos-web: endpoint {back} back"

    # -- convergence ---------------------------------------------------------------------
    def converge(self, fault: Fault) -> None:
        names = sorted(self.lab.nodes)
        futures = [self.verifiers.submit(follow, self.configs[n]) for n in names]
        results = [f.result() for f in futures]
        fault.verify_rounds = sum(rounds for _, rounds, _, _ in results)
        fault.first_check_clean = all(rounds == 1 for _, rounds, _, _ in results)
        fault.check_s = round(max(took for _, _, _, took in results), 3)
        fault.last_difference = "\n".join(
            f"{n}: {text}"
            for n, (end, _, text, _) in zip(names, results, strict=True)
            if end is None
        )[-3000:]
        ends = [end for end, _, _, _ in results]
        if all(end is not None for end in ends):
            fault.converged = max(e for e in ends if e is not None)
            fault.converge_s = round(max(0.0, fault.converged - fault.recovered), 3)
        self.quiet_since = fault.window_end

    def final_differences(self) -> dict[str, Any]:
        names = sorted(self.lab.nodes)
        futures = [self.verifiers.submit(check_once, self.configs[n]) for n in names]
        return {
            n: {"clean": clean, "report": text[-3000:]}
            for n, (clean, text) in zip(names, (f.result() for f in futures), strict=True)
        }


def connection_figures(results: list[dict[str, Any]], killed: float, back: float) -> dict[str, Any]:
    """Resets, lost records and per direction the silence around ``killed`` (``silent_s``)
    and how long after ``back`` (the switch answering; wall time) its first record after the
    silence came (``moved_s``; 0 when it moved before: ``ovsproxy.ovs.streams`` results)."""
    resets, lost, moved, silent = 0, 0, [], []
    errors = []
    for r in results:
        if r["error"]:
            resets += 1
            errors.append(f"{r['name']}: {r['error']}")
        for name in ("to_server", "to_client"):
            d = r[name]
            if d is None:
                continue
            sent, received = d.get("sent") or 0, d.get("received") or 0
            lost += max(0, sent - received) + (0 if d.get("in_order") else 1)
            gaps = [(start, end) for start, end in d.get("gaps") or () if end >= killed]
            first = gaps[0] if gaps and gaps[0][0] <= back + 0.5 else None
            silent.append(round(first[1] - first[0], 3) if first else 0.0)
            moved.append(round(max(0.0, first[1] - back), 3) if first else 0.0)
    return {
        "connections": len(results),
        "resets": resets,
        "lost_records": lost,
        "moved_s": moved,
        "moved_median_s": round(statistics.median(moved), 3) if moved else None,
        "moved_worst_s": max(moved, default=None),
        "silent_s": silent,
        "errors": errors,
    }


def verify_config(agent_command: list[str]) -> Any:
    """The agent's configuration from its `ovsproxy run` flags, as `ovsproxy verify` reads them."""
    from ovsproxy.cli.verify_cmd import verify as verify_command
    from ovsproxy.config import load

    args = agent_command[agent_command.index("run") + 1 :]
    params = verify_command.make_context("verify", args).params
    params.pop("timeout", None)
    return load(params.pop("config_file", None), **params)


def follow(config: Any) -> tuple[float | None, int, str, float]:
    """In a verifier process: what ``verify`` does, until clean. The desired state is built
    once (from the input after the fault; again if the cookie generation changed), then the
    node is read and compared with it until they agree, so each check is quick. Returns when
    the clean comparison ended (CLOCK_MONOTONIC; None: not within CONVERGE_TIMEOUT_S), the
    comparisons made, the last report and how long the last check took (the figure's
    resolution: when the first check is already clean, the node converged no later)."""
    return asyncio.run(_follow(config))


async def _follow(config: Any) -> tuple[float | None, int, str, float]:
    from ovsproxy.agent.verify import compare_node, desired_for, read_ovsdb

    deadline = time.monotonic() + CONVERGE_TIMEOUT_S
    rounds, text = 0, ""
    desired, built_for = None, None
    while time.monotonic() < deadline:
        rounds += 1
        started = time.monotonic()
        try:
            held = await asyncio.wait_for(read_ovsdb(config), 10)
            if desired is None or held.generation != built_for:
                desired = await desired_for(config, held, timeout=10)
                built_for = held.generation
            report = await asyncio.wait_for(compare_node(config, desired, held, timeout=10), 20)
        except Exception as exc:  # a daemon still coming up: not converged yet
            text = f"cannot verify: {type(exc).__name__}: {exc}"
        else:
            text = report.text()
            if report.clean:
                return time.monotonic(), rounds, text, time.monotonic() - started
        await asyncio.sleep(0.05)
    return None, rounds, text, time.monotonic() - started


def check_once(config: Any) -> tuple[bool, str]:
    return asyncio.run(check(config))


def _quiet() -> None:
    logging.getLogger("ovsproxy").setLevel(logging.ERROR)


async def check(config: Any) -> tuple[bool, str]:
    """One `verify` of a node: (clean, its report or why it could not check)."""
    from ovsproxy.agent.verify import verify

    try:
        report = await asyncio.wait_for(verify(config, timeout=10), 20)
    except Exception as exc:  # a daemon still coming up: not converged yet
        return False, f"cannot verify: {type(exc).__name__}: {exc}"
    return report.clean, report.text()


# -- the run -------------------------------------------------------------------------------


def schedule(rng: random.Random) -> list[str]:
    order = list(KINDS)
    rng.shuffle(order)
    return order


def _new_lines(path: Path, offset: int) -> tuple[list[str], int]:
    """The complete lines written to ``path`` after ``offset``, and the offset after them."""
    with open(path, "rb") as stream:
        stream.seek(offset)
        chunk = stream.read()
    complete = chunk[: chunk.rfind(b"\n") + 1]
    return complete.decode().splitlines(), offset + len(complete)


def _failures(lines: list[str]) -> list[tuple[float, int, dict[str, Any]]]:
    """(start, target index, record) of the prober lines that are failures with a record."""
    found = []
    for line in lines:
        with contextlib.suppress(ValueError, IndexError):
            t0, _, index, ok, _, *rest = json.loads(line)
            if not ok and rest and rest[0]:
                found.append((float(t0), int(index), rest[0]))
    return found


def _tuple(record: dict[str, Any]) -> str:
    """A failed request's 5-tuple as the traffic client reported it ("" when it had none)."""
    if not record.get("source_port"):
        return ""
    return (
        f"{record.get('proto', '')} {record.get('src', '')}:{record['source_port']} -> "
        f"{record.get('dst', '')}:{record.get('dport', '')} ({record.get('phase', '')})"
    )


def attribute(faults: list[Fault], requests: list[Request], outside: list[str]) -> int:
    """Each fault's requests, failures and (vswitchd) traffic_back_s; returns the failures
    outside every fault's window, and lists the first ones in ``outside`` (with their
    5-tuples: those are the unexplained ones)."""
    count = 0
    windows = sorted(faults, key=lambda f: f.start)
    for t0, t1, label, ok, detail, tuple_ in requests:
        owner = next((f for f in windows if t1 >= f.start and t0 <= f.window_end), None)
        if owner is None and not ok:
            count += 1
            if len(outside) < 50:
                outside.append(f"{t0:.3f} ({t1 - t0:.3f} s): {label}: {detail} {tuple_}")
        if owner is None:
            continue
        owner.requests += 1
        owner.slowest_s = max(owner.slowest_s, round(t1 - t0, 3))
        if not ok:
            owner.failed += 1
            key = f"{label}: {detail}"
            owner.failures[key] = owner.failures.get(key, 0) + 1
            if len(owner.failed_at) < 20:
                owner.failed_at.append(
                    f"{t0 - owner.start:+.3f} s ({t1 - t0:.3f} s): {key} {tuple_}".rstrip()
                )
        elif t1 - t0 >= SLOW_S:
            owner.slow += 1
    for fault in faults:
        if fault.kind not in ("vswitchd-kill", "vswitchd-kill-connections", "ovsdb-restart"):
            continue
        mine = [r for r in requests if r[1] >= fault.start and r[0] <= fault.window_end]
        failed = [r[0] for r in mine if not r[3]]
        if not failed:
            fault.traffic_back_s = 0.0
            continue
        last = max(failed)
        later = [r[0] for r in mine if r[3] and r[0] > last]
        if later:
            fault.traffic_back_s = round(max(0.0, min(later) - fault.recovered), 3)
    return count


def goals(faults: list[Fault], final: dict[str, Any]) -> list[dict[str, Any]]:
    def of(kind: str) -> list[Fault]:
        return [f for f in faults if f.kind == kind]

    def worst(values: list[float | None]) -> float | None:
        if any(v is None for v in values):
            return None
        return max((v for v in values if v is not None), default=None)

    out = []
    kills = of("agent-sigkill")
    out.append(
        {
            "goal": "agent SIGKILL: failed requests",
            "target": "0",
            "value": sum(f.failed for f in kills),
            "faults": len(kills),
            "met": bool(kills) and all(f.failed == 0 for f in kills),
        }
    )
    restarts = of("vswitchd-kill")
    back = worst([f.traffic_back_s for f in restarts])
    out.append(
        {
            "goal": "ovs-vswitchd kill -9 + restart: traffic back after it is up (s, worst)",
            "target": f"<= {GOAL_TRAFFIC_BACK_S:g}",
            "value": back,
            "faults": len(restarts),
            "met": bool(restarts) and back is not None and back <= GOAL_TRAFFIC_BACK_S,
        }
    )
    held = of("vswitchd-kill-connections")
    figures = [f.connections for f in held]
    broken = sum(c.get("resets", 0) + c.get("lost_records", 0) for c in figures)
    out.append(
        {
            "goal": "established connections across a vswitchd kill: resets + lost records",
            "target": "0",
            "value": broken,
            "faults": len(held),
            "met": bool(held) and broken == 0,
        }
    )
    moved = [m for c in figures for m in c.get("moved_s", [])]
    median = round(statistics.median(moved), 3) if moved else None
    out.append(
        {
            "goal": "established connections across a vswitchd kill: moving again after it "
            "is up (s, median direction)",
            "target": f"<= {GOAL_CONNECTIONS_MOVED_S:g}",
            "value": median,
            "faults": len(held),
            "met": median is not None and median <= GOAL_CONNECTIONS_MOVED_S,
        }
    )
    ovsdb = of("ovsdb-restart")
    out.append(
        {
            "goal": "ovsdb-server restart: failed requests",
            "target": "0",
            "value": sum(f.failed for f in ovsdb),
            "faults": len(ovsdb),
            "met": bool(ovsdb) and all(f.failed == 0 for f in ovsdb),
        }
    )
    slowest = worst([f.converge_s for f in faults])
    out.append(
        {
            "goal": "every fault: converged (verify clean on every node, s, worst)",
            "target": f"<= {GOAL_CONVERGE_S:g}",
            "value": slowest,
            "faults": len(faults),
            "met": bool(faults) and slowest is not None and slowest <= GOAL_CONVERGE_S,
        }
    )
    unclean = sorted(n for n, r in final.items() if not r["clean"])
    out.append(
        {
            "goal": "at the end: nodes with differences",
            "target": "0",
            "value": len(unclean),
            "faults": None,
            "met": not unclean,
        }
    )
    return out


def _plot(
    faults: list[Fault],
    requests: list[Request],
    origin: float,
    path: Path,
    title: str,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok_per_s: collections.Counter[int] = collections.Counter()
    failed_per_s: collections.Counter[int] = collections.Counter()
    for t0, _, _, ok, _, _ in requests:
        (ok_per_s if ok else failed_per_s)[int(t0 - origin)] += 1
    end = int(max((r[0] for r in requests), default=origin) - origin) + 1
    x = list(range(end))
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(12, 5.5), dpi=110, sharex=True, gridspec_kw={"height_ratios": [3, 2]}
    )
    top.step(
        x,
        [ok_per_s[s] for s in x],
        where="post",
        color="tab:blue",
        lw=1,
        label="answered requests/s",
    )
    top.set_ylabel("requests/s")
    top.set_ylim(bottom=0)
    bottom.bar(
        x, [failed_per_s[s] for s in x], width=1.0, align="edge", color="tab:red", label="failed/s"
    )
    bottom.set_ylabel("failed/s")
    bottom.set_xlabel("seconds since the traffic started")
    colours = dict(zip(KINDS, plt.get_cmap("tab10").colors, strict=False))
    seen: set[str] = set()
    for fault in faults:
        start = fault.start - origin
        end_s = (fault.converged or fault.recovered) - origin
        for ax in (top, bottom):
            ax.axvspan(start, max(end_s, start + 0.3), color=colours[fault.kind], alpha=0.25)
        top.axvline(
            start,
            color=colours[fault.kind],
            lw=1,
            label=None if fault.kind in seen else fault.kind,
        )
        seen.add(fault.kind)
    top.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    bottom.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def chaos(
    nodes: int = 3, minutes: float = 5.0, seed: int | None = None, results: Path = RESULTS
) -> dict[str, Any]:
    if os.geteuid() != 0:
        raise PermissionError("the chaos run needs root (namespaces, OVS sandboxes)")
    seed = seed if seed is not None else random.SystemRandom().randrange(1 << 31)
    logging.getLogger("ovsproxy").setLevel(logging.WARNING)
    load_start = os.getloadavg()
    faults: list[Fault] = []
    with tempfile.TemporaryDirectory(prefix="ovsproxy-chaos-") as tmp:
        world = ChaosLab(nodes, seed, Path(tmp))
        try:
            world.up()
            world.start_probers()
            time.sleep(3.0)  # a baseline before the first fault
            origin = time.monotonic() - 3.0
            deadline = origin + minutes * 60
            rounds = 0
            while rounds == 0 or time.monotonic() < deadline:
                for kind in schedule(world.rng):
                    if rounds > 0 and time.monotonic() >= deadline:
                        break
                    fault = world.inject(kind)
                    world.converge(fault)
                    world.collect(fault)
                    faults.append(fault)
                    print(
                        f"chaos: {fault.kind:15} {fault.node or '':7} converged "
                        f"{fault.converge_s}s  {fault.detail}",
                        file=sys.stderr,
                        flush=True,
                    )
                    time.sleep(world.rng.uniform(1.0, 2.5))  # quiet: traffic only
                rounds += 1
            time.sleep(GRACE_S)
            world.stop_probers()
            final = world.final_differences()
            requests = world.requests()
            explained = world.explained
            agent_logs = {n: world.lab.agent_log(n)[-4000:] for n in world.lab.nodes}
        finally:
            world.down()
    outside_failures: list[str] = []
    outside = attribute(faults, requests, outside_failures)
    met = goals(faults, final)
    results.mkdir(parents=True, exist_ok=True)
    stem = f"{dt.date.today().isoformat()}-chaos"
    plot = results / f"{stem}.png"
    _plot(
        faults,
        requests,
        origin,
        plot,
        f"chaos: {nodes} nodes, {minutes:g} min, seed {seed} "
        f"({len(faults)} faults, {len(requests):,} requests)",
    )
    by_kind: dict[str, dict[str, Any]] = {}
    for fault in faults:
        row = by_kind.setdefault(
            fault.kind, {"faults": 0, "failed": 0, "requests": 0, "worst_converge_s": 0.0}
        )
        row["faults"] += 1
        row["failed"] += fault.failed
        row["requests"] += fault.requests
        if fault.converge_s is None or row["worst_converge_s"] is None:
            row["worst_converge_s"] = None
        else:
            row["worst_converge_s"] = max(row["worst_converge_s"], fault.converge_s)
    try:
        shown = str(plot.relative_to(RESULTS.parent.parent))
    except ValueError:
        shown = str(plot)
    return {
        "nodes": nodes,
        "minutes": minutes,
        "seed": seed,
        "goals": met,
        "all_goals_met": all(g["met"] for g in met),
        "faults": len(faults),
        "requests": len(requests),
        "failed": sum(1 for r in requests if not r[3]),
        "failed_outside_fault_windows": outside,
        "failed_outside_fault_windows_requests": outside_failures,
        "failed_outside_fault_windows_evidence": explained,
        "faults_clean_at_first_check": sum(f.first_check_clean for f in faults),
        "median_check_s": (
            round(statistics.median(f.check_s for f in faults), 3) if faults else None
        ),
        "by_kind": by_kind,
        "fault_log": [
            {
                **{
                    k: v
                    for k, v in dataclasses.asdict(f).items()
                    if k not in ("start", "recovered", "converged", "last_difference")
                },
                "at_s": round(f.start - origin, 3),
                "recovered_after_s": round(f.recovered - f.start, 3),
                **({"not_converged": f.last_difference} if f.converged is None else {}),
            }
            for f in faults
        ],
        "final_verify": {n: r["clean"] for n, r in final.items()},
        "final_differences": {n: r["report"] for n, r in final.items() if not r["clean"]},
        "agent_logs_tail": agent_logs if not all(g["met"] for g in met) else {},
        "load_average_start": [round(x, 2) for x in load_start],
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "plot": shown,
    }


def goal_lines(result: dict[str, Any]) -> list[str]:
    lines = []
    for g in result["goals"]:
        mark = "met" if g["met"] else "NOT MET"
        count = f" ({g['faults']} faults)" if g["faults"] is not None else ""
        lines.append(f"  {g['goal']}: {g['value']}  goal {g['target']}  {mark}{count}")
    return lines


def run(
    quick: bool = False, nodes: int = 3, minutes: float | None = None, seed: int | None = None
) -> dict[str, Any]:
    result = chaos(nodes, minutes if minutes is not None else (1.0 if quick else 5.0), seed)
    print("chaos goals:\n" + "\n".join(goal_lines(result)), file=sys.stderr, flush=True)
    return result
