"""Evidence of failed requests: what the rig saw at the moment a request failed.

The traffic clients (:mod:`ovsproxy.ovs.traffic`) report each failed request's 5-tuple, phase
and timing. An :class:`Evidence` session wraps one run of traffic: before the load it reads a
baseline of the kernel's protocol counters in the watched namespaces (the client's and the
serving pods'; cheap: a thread per namespace reads ``/proc/net``, no process is started), and
only when a request failed does it collect (:meth:`Evidence.explain`), for those requests:

* ``conntrack_ovs``: every node switch's conntrack entries of the tuple (``ovs-appctl
  dpctl/dump-conntrack``; an un-NATed SYN_SENT entry on the client's node: its SYN met the
  switch before the Service's flows; a NATed one: lost past the DNAT; none: dropped before
  conntrack);
* ``conntrack_kernel``: the node kernels' entries of the tuple (``conntrack -L`` in each node
  namespace; NodePort and routed traffic passes there);
* ``nstat``: the counters ``nstat`` shows that moved since the baseline (accept-queue overflows
  and drops, TCP timeouts and retransmissions, UDP errors) in each watched namespace;
* ``ovs_counters``: each switch's drop and upcall coverage counters (``coverage/show``, those
  with a non-zero total) and the datapath ports that counted drops or errors (``dpctl/show -s``);
* ``drop_flows``: each switch's flows whose action is to drop and that matched packets
  (``ovs-ofctl dump-flows``): a packet that died in the pipeline is counted in one of them;
* ``agents``: each agent's last sync and its OpenFlow and OVSDB connection state (/status);
* ``packets``: with ``OVSPROXY_PACKET_RING=1`` in the environment, the tuple's packets from a
  bounded ring capture (tcpdump, 4 files of 1 MB each per node namespace, all its interfaces:
  the pods' veths, the gateway and the uplink) that ran during the load.

:func:`probe` is the one path the tests, the demo and the benches send traffic through: it runs
the traffic client in a namespace inside a session, adds ``evidence`` to the client's result
when a request failed, and prints it (pytest shows it beside the failed assertion).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from ovsproxy.lab.cluster import Lab, lab_record
from ovsproxy.netns import enter_netns
from ovsproxy.ovs.sandbox import Sandbox
from ovsproxy.ovs.traffic import run_in_netns

PACKET_RING_ENV = "OVSPROXY_PACKET_RING"
RING_FILE_MB = 1
RING_FILES = 4
MAX_EXPLAINED = 10  # failed requests looked up per explain (the rest are only listed)
MAX_LINES = 40  # per node and kind of evidence
# Failures that are an answer (a TCP RST, an ICMP error): the path delivered them, nothing lost.
ANSWERED = frozenset({"refused", "unreachable"})

# The counters that tell a lost or refused connection apart (nstat's names).
NSTAT_COUNTERS = (
    "TcpExtListenOverflows",
    "TcpExtListenDrops",
    "TcpExtTCPTimeouts",
    "TcpExtTCPSynRetrans",
    "TcpRetransSegs",
    "TcpExtTCPLostRetransmit",
    "TcpAttemptFails",
    "TcpEstabResets",
    "TcpOutRsts",
    "TcpInErrs",
    "TcpExtTCPAbortOnTimeout",
    "TcpExtTCPReqQFullDrop",
    "UdpInErrors",
    "UdpNoPorts",
    "UdpRcvbufErrors",
    "Udp6InErrors",
    "Udp6NoPorts",
    "Udp6RcvbufErrors",
    "IpInDiscards",
    "IpOutNoRoutes",
    "Ip6InDiscards",
    "Ip6OutNoRoutes",
)
_COVERAGE = re.compile(r"drop|upcall|miss|lost|overflow|fail|flow_limit", re.IGNORECASE)
_PORT_TROUBLE = re.compile(r"(errors|dropped|overruns):(?!0\b)\d+")


@dataclass(frozen=True, slots=True)
class RigNode:
    """One node of a rig: its switch (the sandbox) and its agent's /status URL ("": none)."""

    name: str
    sandbox: Sandbox
    status_url: str = ""


def lab_rig(lab: Lab) -> tuple[RigNode, ...]:
    return tuple(
        RigNode(name, node.sandbox, f"http://{node.metrics_address}/status" if node.agent else "")
        for name, node in lab.nodes.items()
    )


def attached_rig(lab_name: str) -> tuple[RigNode, ...]:
    """The rig of a running lab by name (e.g. one `ovsproxy lab up` started)."""
    record = lab_record(lab_name)
    nodes = record.status.get("nodes", [])
    return tuple(
        RigNode(
            node["name"],
            Sandbox.attach(sandbox),
            f"{node['agent']['metrics']}/status" if node["agent"].get("metrics") else "",
        )
        for sandbox, node in zip(record.sandboxes, nodes, strict=False)
    )


def serving_netns(sandboxes: Iterable[Sandbox]) -> list[str]:
    """The namespaces of every pod that serves (the server side of any request)."""
    return [
        pod.netns for sb in sandboxes for pod in sb.pods.values() if pod.http_ports or pod.udp_ports
    ]


# -- counters ---------------------------------------------------------------------------------
def parse_proc_net(snmp: str, netstat: str, snmp6: str) -> dict[str, int]:
    """``/proc/net/snmp`` and ``netstat`` (header and value lines in pairs, ``Tcp: ...``) and
    ``snmp6`` (``name value`` lines) as nstat names them: prefix + field (``TcpRetransSegs``)."""
    out: dict[str, int] = {}
    for text in (snmp, netstat):
        lines = text.splitlines()
        for names, values in zip(lines[::2], lines[1::2], strict=False):
            prefix, _, fields = names.partition(":")
            vprefix, _, numbers = values.partition(":")
            if prefix != vprefix:
                continue
            for field, number in zip(fields.split(), numbers.split(), strict=False):
                with contextlib.suppress(ValueError):
                    out[prefix + field] = int(number)
    for line in snmp6.splitlines():
        name, _, number = line.partition(" ")
        with contextlib.suppress(ValueError):
            out[name] = int(number.strip())
    return out


def counters(netns: str) -> dict[str, int]:
    """The kernel's protocol counters of a namespace, read by a thread that joined it
    (``/proc/thread-self/net`` is the calling thread's namespace's)."""
    found: dict[str, int] = {}
    failure: list[BaseException] = []

    def read() -> None:
        try:
            enter_netns(netns)
            base = Path("/proc/thread-self/net")
            texts = [(base / n).read_text() for n in ("snmp", "netstat")]
            snmp6 = base / "snmp6"
            texts.append(snmp6.read_text() if snmp6.exists() else "")
            found.update(parse_proc_net(*texts))
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=read, name=f"counters-{netns}")  # dies in that namespace
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return found


def delta(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    """The watched counters that moved (``NSTAT_COUNTERS``), by how much."""
    return {
        name: after[name] - before.get(name, 0)
        for name in NSTAT_COUNTERS
        if name in after and after[name] != before.get(name, 0)
    }


# -- what the switches and kernels hold -----------------------------------------------------
def _port_pattern(ports: Iterable[int]) -> re.Pattern[str] | None:
    wanted = sorted({p for p in ports if p})
    if not wanted:
        return None
    return re.compile(r"[sd]port=(?:" + "|".join(map(str, wanted)) + r")\b")


def matching(text: str, pattern: re.Pattern[str] | None) -> list[str]:
    if pattern is None:
        return []
    return [line.strip() for line in text.splitlines() if pattern.search(line)][:MAX_LINES]


def coverage_lines(text: str) -> list[str]:
    """``coverage/show`` lines of drop, upcall and miss counters with a non-zero total."""
    out = []
    for line in text.splitlines():
        name, _, rest = line.strip().partition(" ")
        total = rest.rpartition("total:")[2].strip()
        if _COVERAGE.search(name) and total.isdigit() and int(total):
            out.append(f"{name} total:{total}")
    return out


def port_trouble(text: str) -> list[str]:
    """The ``dpctl/show -s`` ports whose stats count errors, drops or overruns."""
    out, port = [], ""
    for line in text.splitlines():
        if line.lstrip().startswith("port "):
            port = line.strip()
        elif _PORT_TROUBLE.search(line):
            out.append(f"{port}: {line.strip()}")
    return out


def counted_flows(sandbox: Sandbox) -> str:
    """``dump-flows`` once the revalidators have finished a round: OpenFlow flow counters are
    pulled from the datapath's flows by the revalidators, so a packet of the last half second
    may not be counted yet (a SYN retransmitted 0.5 s before the read was missing, CI)."""
    sandbox.appctl("revalidator/wait")
    return sandbox.ofctl("dump-flows")


def drop_flows(text: str) -> list[str]:
    """Flows of a ``dump-flows`` whose action is to drop and that matched a packet."""
    out = []
    for line in text.splitlines():
        if re.search(r"actions=drop\s*$", line) and not re.search(r"n_packets=0\b", line):
            out.append(re.sub(r"\s*(duration|idle_age|hard_age)=[^,]*,", "", line.strip()))
    return out[:MAX_LINES]


def _attempt(what: str, call: Any) -> Any:
    try:
        return call()
    except Exception as exc:  # evidence only: never hide the real failure behind this one
        return f"{what} failed: {type(exc).__name__}: {exc}"


def agent_state(status_url: str) -> dict[str, Any] | str:
    if not status_url:
        return "no agent"
    with urllib.request.urlopen(status_url, timeout=5) as resp:
        status: dict[str, Any] = json.loads(resp.read())
    return {
        "healthy": status.get("healthy"),
        "last_sync": status.get("last_sync"),
        "generation": status.get("generation"),
        "openflow": status.get("openflow"),
        "ovsdb": {k: v for k, v in (status.get("ovsdb") or {}).items() if k != "group_ids"},
        # What the agent flushed from conntrack lately (a stale entry's story starts here)
        "conntrack_flush": (status.get("semantics") or {}).get("conntrack_flush"),
    }


# -- the packet ring --------------------------------------------------------------------------
class PacketRing:
    """tcpdump in each node namespace on all its interfaces, into a ring of ``RING_FILES``
    files of ``RING_FILE_MB`` MB (bounded however long the load runs); :meth:`packets` reads
    the ring back for given ports."""

    def __init__(self, netns: Sequence[str]) -> None:
        self.netns = tuple(netns)
        self.workdir: Path | None = None  # made by start, removed by stop
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self) -> None:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        tcpdump = shutil.which("tcpdump")
        if tcpdump is None:
            raise FileNotFoundError(
                f"{PACKET_RING_ENV} asks for a packet ring: tcpdump not found (Debian tcpdump)"
            )
        self.workdir = Path(tempfile.mkdtemp(prefix="ovsproxy-ring-"))
        for ns in self.netns:
            cmd = [
                *(
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    tcpdump,
                    "-Z",
                    "root",
                    "-i",
                    "any",
                    "-n",
                    "-U",
                    "-s",
                    "160",
                ),
                *("-C", str(RING_FILE_MB), "-W", str(RING_FILES), "-w", str(self.file(ns))),
                *("tcp", "or", "udp"),
            ]
            self.procs[ns] = subprocess.Popen(
                cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
        # Capturing once its first file exists: a load started before would go unseen.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not all(self.files(ns) for ns in self.netns):
            time.sleep(0.02)

    def file(self, netns: str) -> Path:
        assert self.workdir is not None, "the ring is not started"
        return self.workdir / f"{netns}.pcap"

    def files(self, netns: str) -> list[Path]:
        """The ring's files of one namespace, oldest first."""
        if self.workdir is None:
            return []

        def age(path: Path) -> float:
            try:
                return path.stat().st_mtime
            except FileNotFoundError:  # the ring just dropped its oldest file
                return 0.0

        return sorted(self.workdir.glob(f"{netns}.pcap*"), key=age)

    def packets(self, ports: Iterable[int]) -> dict[str, list[str]]:
        wanted = sorted({p for p in ports if p})
        if not wanted:
            return {}
        expression = " or ".join(f"port {p}" for p in wanted)
        out: dict[str, list[str]] = {}
        for ns in self.netns:
            lines: list[str] = []
            for path in self.files(ns):
                done = subprocess.run(
                    ["tcpdump", "-r", str(path), "-n", "-tt", "-e", expression],
                    capture_output=True,
                    text=True,
                    timeout=30,
                )
                lines += done.stdout.splitlines()
            out[ns] = lines[-MAX_LINES:]
        return out

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None


def packet_ring_asked(environ: Mapping[str, str] = os.environ) -> bool:
    return environ.get(PACKET_RING_ENV, "") not in ("", "0")


# -- the session ------------------------------------------------------------------------------
class Evidence:
    """One run of traffic's evidence: a baseline at :meth:`start`, collection by
    :meth:`explain` (only called for failures), the packet ring (when asked) stopped at
    :meth:`stop`. ``watched``: the namespaces whose counters are compared (the client's and
    the serving pods')."""

    def __init__(
        self, nodes: Sequence[RigNode], watched: Iterable[str], *, ring: bool | None = None
    ) -> None:
        self.nodes = tuple(nodes)
        self.watched = tuple(dict.fromkeys(watched))
        self.baseline: dict[str, dict[str, int]] = {}
        self.ring = (
            PacketRing([n.sandbox.netns for n in self.nodes])
            if (packet_ring_asked() if ring is None else ring)
            else None
        )

    def start(self) -> Self:
        self.baseline = self._counters()
        if self.ring is not None:
            self.ring.start()
        return self

    def stop(self) -> None:
        if self.ring is not None:
            self.ring.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _counters(self) -> dict[str, dict[str, int]]:
        def read(ns: str) -> dict[str, int] | None:
            try:
                return counters(ns)
            except OSError:  # a pod may be gone; its counters with it
                return None

        if not self.watched:
            return {}
        # At once: each read is a thread of its own (it joins the namespace and ends there).
        with concurrent.futures.ThreadPoolExecutor(min(8, len(self.watched))) as pool:
            found = dict(zip(self.watched, pool.map(read, self.watched), strict=True))
        return {ns: values for ns, values in found.items() if values is not None}

    def explain(self, failed: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The evidence for these failed requests (the traffic client's ``failed_requests``)."""
        looked_up = list(failed)[:MAX_EXPLAINED]
        pattern = _port_pattern(int(f.get("source_port") or 0) for f in looked_up)
        with concurrent.futures.ThreadPoolExecutor(max(1, len(self.nodes))) as pool:
            per_node = dict(
                zip(
                    [n.name for n in self.nodes],
                    pool.map(lambda node: self._node(node, pattern), self.nodes),
                    strict=True,
                )
            )
        now = self._counters()
        evidence: dict[str, Any] = {
            "failed_requests": list(failed),
            "conntrack_ovs": {n: e["conntrack_ovs"] for n, e in per_node.items()},
            "conntrack_kernel": {n: e["conntrack_kernel"] for n, e in per_node.items()},
            "nstat": {
                ns: delta(self.baseline.get(ns, {}), after) for ns, after in sorted(now.items())
            },
            "ovs_counters": {n: e["ovs_counters"] for n, e in per_node.items()},
            "drop_flows": {n: e["drop_flows"] for n, e in per_node.items()},
            "agents": {n: e["agent"] for n, e in per_node.items()},
        }
        ring = self.ring
        if ring is not None:
            ports = [int(f.get("source_port") or 0) for f in looked_up]
            evidence["packets"] = _attempt("packet ring", lambda: ring.packets(ports))
        return evidence

    def _node(self, node: RigNode, pattern: re.Pattern[str] | None) -> dict[str, Any]:
        sandbox = node.sandbox

        def kernel() -> list[str]:
            if shutil.which("conntrack") is None:
                return ["conntrack not installed (Debian package conntrack)"]
            done = sandbox.exec("conntrack", "-L", check=False)
            return matching(done.stdout, pattern)

        return {
            "conntrack_ovs": _attempt(
                "dump-conntrack", lambda: matching(sandbox.appctl("dpctl/dump-conntrack"), pattern)
            ),
            "conntrack_kernel": _attempt("conntrack -L", kernel),
            "ovs_counters": _attempt(
                "coverage/show",
                lambda: (
                    coverage_lines(sandbox.appctl("coverage/show"))
                    + port_trouble(sandbox.appctl("dpctl/show", "-s", "netdev@ovs-netdev"))
                ),
            ),
            "drop_flows": _attempt("dump-flows", lambda: drop_flows(counted_flows(sandbox))),
            "agent": _attempt("/status", lambda: agent_state(node.status_url)),
        }


def render(evidence: Mapping[str, Any]) -> str:
    """The evidence as text, one section per kind and node, for a test's output."""
    lines = ["evidence of the failed requests:"]
    for request in evidence.get("failed_requests", []):
        lines.append(f"  failed: {json.dumps(request, sort_keys=True)}")
    for kind, value in evidence.items():
        if kind == "failed_requests":
            continue
        lines.append(f"{kind}:")
        items = value.items() if isinstance(value, Mapping) else [("", value)]
        for where, found in items:
            if isinstance(found, list):
                lines.append(f"  {where}: {'(none)' if not found else ''}")
                lines.extend(f"    {line}" for line in found)
            else:
                lines.append(f"  {where}: {json.dumps(found, sort_keys=True, default=str)}")
    return "\n".join(lines)


def probe(
    nodes: Sequence[RigNode],
    netns: str | None,
    *args: str,
    watched: Iterable[str] = (),
    explain: bool = True,
    echo: bool = True,
    timeout: float = 120,
) -> dict[str, Any]:
    """``python -m ovsproxy.ovs.traffic ARGS`` in ``netns`` inside an :class:`Evidence`
    session watching the client's namespace and ``watched`` (default: every serving pod of
    the rig). A result with lost requests (failures other than an answer that refused them,
    ``ANSWERED``) gets ``evidence``, printed too unless ``echo=False`` (a caller whose stdout is
    its own report); ``explain=False`` when failures are what the caller expects (a probe that
    no answer comes)."""
    watch = [*([netns] if netns else []), *(watched or serving_netns(n.sandbox for n in nodes))]
    with Evidence(nodes, watch if explain else ()) as session:
        out = run_in_netns(netns, *args, timeout=timeout)
        lost = [f for f in out.get("failed_requests", []) if f.get("kind") not in ANSWERED]
        if lost and explain:
            out["evidence"] = session.explain(lost)
        if lost and explain and echo:
            print(f"traffic from {netns or 'this namespace'} {' '.join(args)}")
            print(render(out["evidence"]))
    return out
