"""A private Open vSwitch: ovsdb-server + ovs-vswitchd in their own network namespace.

The namespace is the "node": the bridge's gateway internal port (``gw0``) lives there with the
node's pod-network address, the Service routes go there, and pods are further namespaces joined
to the bridge by veth pairs. ovs-vswitchd uses the userspace datapath (``datapath_type=netdev``;
no kernel module is needed), so its tap devices live and die inside the namespace and several
sandboxes can run side by side, next to a system Open vSwitch.

Every sandbox is recorded in ``/run/ovsproxy/sandboxes/<name>.json`` before anything is created.
A record whose processes died, or whose (non-persistent) owner process is gone, is a leftover of a
crashed run: the next sandbox start cleans it up (processes by pid, namespaces, run directory),
and then sweeps ``ovsp-`` namespaces no live run owns (``ovs.namespaces``). A record is removed
only once every namespace it names is gone.

Usable as a context manager, as the ``sandbox`` pytest fixture (tests/conftest.py) and from the
CLI (``ovsproxy sandbox up|status|down``).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self, TypeVar

from ovsproxy.ovs.namespaces import (
    NETNS_PREFIX,
    add_netns,
    delete_netns,
    load_record,
    netns_exists,
    save_record,
    start_time,
    sweep_orphan_netns,
)
from ovsproxy.ovs.ovsdb import (
    EXT_POD_IPS,
    EXT_POD_MAC,
    EXT_POD_NAME,
    EXT_POD_NAMESPACE,
    OVSDB,
    BridgeSpec,
)

log = logging.getLogger(__name__)

REGISTRY = Path(os.environ.get("OVSPROXY_SANDBOX_REGISTRY", "/run/ovsproxy/sandboxes"))
VSCHEMA = Path("/usr/share/openvswitch/vswitch.ovsschema")
DEFAULT_POD_CIDR_V4 = ipaddress.ip_network("10.244.0.0/24")
DEFAULT_POD_CIDR_V6 = ipaddress.ip_network("fd00:10:244::/64")


class SandboxError(RuntimeError):
    pass


def _run(
    cmd: list[str],
    *,
    netns: str | None = None,
    env: dict[str, str] | None = None,
    check: bool = True,
    timeout: float = 30,
) -> subprocess.CompletedProcess[str]:
    if netns is not None:
        cmd = ["ip", "netns", "exec", netns, *cmd]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if check and result.returncode != 0:
        raise SandboxError(f"{' '.join(cmd)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def pid_alive(pid: int, marker: str | None = None) -> bool:
    """True when pid runs and (if marker is given) its command line mentions marker."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            # A zombie leader whose other threads still exit holds the daemon's pidfile lock
            # and sockets: dead only once the whole thread group is.
            threads = Path(f"/proc/{pid}/status").read_text().split("Threads:")[1].split()[0]
            return int(threads) > 1
        if marker is not None:
            return marker in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        return True
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def stop_process(
    pid: int, marker: str | None, timeout: float = 5.0, sig: int = signal.SIGTERM
) -> None:
    """Signal ``pid`` (if it is still the process ``marker`` names) and wait for it to end;
    SIGKILL after ``timeout`` seconds."""
    if not pid_alive(pid, marker):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reap if it is our child
        if not pid_alive(pid, marker):
            return
        time.sleep(0.02)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


R = TypeVar("R")


def load_records(registry: Path, load: Callable[[Path], R | None]) -> list[R]:
    """Every record in a registry directory that loads (sandboxes', labs')."""
    if not registry.is_dir():
        return []
    records = (load(p) for p in sorted(registry.glob("*.json")))
    return [r for r in records if r is not None]


def remove_owned(
    kind: str, name: str, netns: Iterable[str], workdir: str | Path, record_path: Path
) -> None:
    """Delete the namespaces and the work directory a registry record names, then the record.
    The record is kept (with a warning) while one of its namespaces is still there: without
    it, that namespace would be nobody's to remove."""
    gone = [delete_netns(ns) for ns in netns]
    shutil.rmtree(workdir, ignore_errors=True)
    if not all(gone):
        log.warning("%s %s: a namespace is still there; its record is kept", kind, name)
        return
    with contextlib.suppress(FileNotFoundError):
        record_path.unlink()


@dataclass
class SandboxRecord:
    """What a sandbox owns; written to the registry before any of it is created."""

    name: str
    rundir: str
    netns: str
    bridge: str
    gateway: str
    owner_pid: int
    persistent: bool
    pids: dict[str, int] = field(default_factory=dict)
    pod_netns: list[str] = field(default_factory=list)
    created: float = field(default_factory=time.time)
    # The owner's start time (clock ticks since boot): a recycled pid is not the owner.
    owner_started: int | None = None

    @property
    def path(self) -> Path:
        return REGISTRY / f"{self.name}.json"

    def save(self) -> None:
        save_record(self.path, self)

    @classmethod
    def load(cls, path: Path) -> SandboxRecord | None:
        return load_record(cls, path)

    def processes_alive(self) -> bool:
        return bool(self.pids) and all(pid_alive(p, self.rundir) for p in self.pids.values())

    def is_leftover(self) -> bool:
        if not self.persistent:
            # Its owner runs it (and may be starting it right now, before any pid is
            # recorded): it is a leftover only once that very process is gone.
            return start_time(self.owner_pid) != self.owner_started
        # A persistent sandbox is only fine while its daemons and namespace are all there.
        return not (self.processes_alive() and netns_exists(self.netns))


def cleanup_record(record: SandboxRecord) -> None:
    """Remove everything a record names: processes (by pid), namespaces, run directory."""
    for pid in record.pids.values():
        stop_process(pid, record.rundir)
    remove_owned(
        "sandbox", record.name, [*record.pod_netns, record.netns], record.rundir, record.path
    )


def list_records() -> list[SandboxRecord]:
    return load_records(REGISTRY, SandboxRecord.load)


def sweep_leftovers() -> list[str]:
    """Clean sandboxes left by crashed runs; returns their names."""
    cleaned = []
    for record in list_records():
        if record.is_leftover():
            log.warning(
                "cleaning up leftover OVS sandbox %s (from pid %d)", record.name, record.owner_pid
            )
            cleanup_record(record)
            cleaned.append(record.name)
    sweep_orphan_netns(record_dirs=[REGISTRY])
    return cleaned


@dataclass
class Pod:
    """A pod: a network namespace joined to the sandbox bridge by a veth pair."""

    name: str
    netns: str
    interface: str  # the bridge-side veth, in the node namespace
    mac: str
    ipv4: ipaddress.IPv4Interface | None
    ipv6: ipaddress.IPv6Interface | None
    ofport: int
    namespace: str = "default"
    http_ports: tuple[int, ...] = ()
    udp_ports: tuple[int, ...] = ()
    server: subprocess.Popen[bytes] | None = None

    @property
    def ips(self) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
        return [i.ip for i in (self.ipv4, self.ipv6) if i is not None]

    def exec(
        self, *cmd: str, check: bool = True, timeout: float = 30
    ) -> subprocess.CompletedProcess[str]:
        return _run(list(cmd), netns=self.netns, check=check, timeout=timeout)


class Sandbox:
    """A private OVS (ovsdb-server + ovs-vswitchd) in its own network namespace."""

    # Namespaces this process created (node and pods): tests check none outlives them.
    created_netns: set[str] = set()
    # Seconds each daemon (and the bridge) gets to answer at start-up.
    start_timeout: float = 20.0

    def __init__(
        self,
        name: str | None = None,
        *,
        bridge: str = "br0",
        gateway: str = "gw0",
        gateway_ipv4: str | None = "10.244.0.1/24",
        gateway_ipv6: str | None = "fd00:10:244::1/64",
        datapath_id: int = 0x1,
        persistent: bool = False,
    ) -> None:
        self.name = name or f"sb{secrets.token_hex(3)}"
        if not self.name.replace("-", "").isalnum() or len(self.name) > 24:
            raise SandboxError(f"sandbox name {self.name!r}: use up to 24 letters, digits and '-'")
        self.bridge = bridge
        self.gateway = gateway
        self.gateway_ipv4 = ipaddress.ip_interface(gateway_ipv4) if gateway_ipv4 else None
        self.gateway_ipv6 = ipaddress.ip_interface(gateway_ipv6) if gateway_ipv6 else None
        self.datapath_id = datapath_id
        self.persistent = persistent
        self.netns = NETNS_PREFIX + self.name
        self.rundir = Path()
        self.pods: dict[str, Pod] = {}
        self.record: SandboxRecord | None = None
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    # -- endpoints ------------------------------------------------------------------------
    @property
    def ovsdb(self) -> str:
        return f"unix:{self.rundir / 'db.sock'}"

    @property
    def openflow(self) -> str:
        return f"unix:{self.rundir / (self.bridge + '.mgmt')}"

    @property
    def env(self) -> dict[str, str]:
        rundir = str(self.rundir)
        return {
            **os.environ,
            "OVS_RUNDIR": rundir,
            "OVS_LOGDIR": rundir,
            "OVS_DBDIR": rundir,
            "OVS_SYSCONFDIR": rundir,
            "OVS_PKGDATADIR": "/usr/share/openvswitch",
        }

    # -- lifecycle ------------------------------------------------------------------------
    @classmethod
    def attach(cls, name: str) -> Sandbox:
        """A handle on a running (persistent) sandbox, e.g. one started by `sandbox up`."""
        record = SandboxRecord.load(REGISTRY / f"{name}.json")
        if record is None:
            raise SandboxError(f"no sandbox named {name!r} (see `ovsproxy sandbox status`)")
        sandbox = cls(name, bridge=record.bridge, gateway=record.gateway, persistent=True)
        sandbox.rundir = Path(record.rundir)
        sandbox.record = record
        return sandbox

    def up(self) -> Self:
        for tool in ("ovsdb-server", "ovs-vswitchd", "ovsdb-tool", "ovs-ofctl", "ip"):
            if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
                raise SandboxError(
                    f"{tool} not found: install openvswitch-switch and iproute2 "
                    "(scripts/setup.sh does)"
                )
        if os.geteuid() != 0:
            raise SandboxError("the OVS sandbox needs root (network namespaces, tap devices)")
        sweep_leftovers()
        existing = SandboxRecord.load(REGISTRY / f"{self.name}.json")
        if existing is not None:
            raise SandboxError(
                f"sandbox {self.name!r} is already up (rundir {existing.rundir}); "
                "`ovsproxy sandbox down` removes it"
            )
        self.rundir = Path(tempfile.mkdtemp(prefix=f"ovsproxy-{self.name}-"))
        self.record = SandboxRecord(
            name=self.name,
            rundir=str(self.rundir),
            netns=self.netns,
            bridge=self.bridge,
            gateway=self.gateway,
            owner_pid=os.getpid(),
            persistent=self.persistent,
            owner_started=start_time(os.getpid()),
        )
        self.record.save()
        try:
            self._start()
        except BaseException:
            self.down()
            raise
        return self

    def _start(self) -> None:
        Sandbox.created_netns.add(self.netns)
        add_netns(self.netns)
        _run(["ovsdb-tool", "create", str(self.rundir / "conf.db"), str(VSCHEMA)])
        self._start_ovsdb_server()
        _run(["ovs-vsctl", f"--db={self.ovsdb}", "--no-wait", "init"], env=self.env)
        self._start_vswitchd()
        with OVSDB(self.ovsdb) as db:
            db.ensure_bridge(
                BridgeSpec(
                    name=self.bridge, datapath_id=self.datapath_id, internal_ports=(self.gateway,)
                )
            )
        self._wait_for_bridge()
        self._configure_gateway()

    def _spawn(self, key: str, cmd: list[str]) -> None:
        log_path = self.rundir / f"{key}.out"
        with open(log_path, "ab") as out:
            # Our own child, in its own session: Ctrl-C on the CLI does not kill a persistent
            # sandbox, and down() can reap it.
            proc = subprocess.Popen(
                ["ip", "netns", "exec", self.netns, *cmd],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,
            )
        self._procs[key] = proc
        assert self.record is not None
        self.record.pids[key] = proc.pid  # `ip netns exec` execs the daemon: same pid
        self.record.save()

    def _start_ovsdb_server(self) -> None:
        self._spawn(
            "ovsdb-server",
            [
                "ovsdb-server",
                str(self.rundir / "conf.db"),
                f"--remote=punix:{self.rundir / 'db.sock'}",
                f"--pidfile={self.rundir / 'ovsdb-server.pid'}",
                f"--unixctl={self.rundir / 'ovsdb-server.ctl'}",
                f"--log-file={self.rundir / 'ovsdb-server.log'}",
                "--no-chdir",
            ],
        )
        self._wait_answering(
            ["ovsdb-client", "--timeout=5", "list-dbs", self.ovsdb], f"ovsdb-server on {self.ovsdb}"
        )

    def stop_ovsdb_server(self, *, kill: bool = True) -> None:
        """Kill (SIGKILL by default: a crash) ovsdb-server; its database file stays, so
        ``start_ovsdb_server`` brings the same content back (as an OVS upgrade does)."""
        assert self.record is not None
        pid = self.record.pids.pop("ovsdb-server", None)
        if pid:
            stop_process(pid, str(self.rundir), sig=signal.SIGKILL if kill else signal.SIGTERM)
        proc = self._procs.pop("ovsdb-server", None)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        self.record.save()
        for leftover in ("db.sock", "ovsdb-server.ctl", "ovsdb-server.pid"):
            with contextlib.suppress(FileNotFoundError):
                (self.rundir / leftover).unlink()

    def start_ovsdb_server(self) -> None:
        """Start ovsdb-server again on the sandbox's database (after ``stop_ovsdb_server``)."""
        self._start_ovsdb_server()

    def restart_ovsdb_server(self, *, kill: bool = True) -> None:
        self.stop_ovsdb_server(kill=kill)
        self.start_ovsdb_server()

    def _start_vswitchd(self) -> None:
        self._spawn(
            "ovs-vswitchd",
            [
                "ovs-vswitchd",
                self.ovsdb,
                f"--pidfile={self.rundir / 'ovs-vswitchd.pid'}",
                f"--unixctl={self.rundir / 'ovs-vswitchd.ctl'}",
                f"--log-file={self.rundir / 'ovs-vswitchd.log'}",
                "--no-chdir",
            ],
        )
        ctl = self.rundir / "ovs-vswitchd.ctl"
        self._wait_answering(
            ["ovs-appctl", "--timeout=5", "-t", str(ctl), "version"], f"ovs-vswitchd on {ctl}"
        )

    def _wait_for_bridge(self) -> None:
        timeout = self.start_timeout
        self._wait_answering(
            ["ovs-ofctl", "--timeout=5", "-O", "OpenFlow15", "probe", self.openflow],
            f"bridge {self.bridge} on {self.openflow}",
            timeout,
        )

        def gateway_up() -> bool:
            return (
                _run(["ip", "link", "show", self.gateway], netns=self.netns, check=False).returncode
                == 0
            )

        self._wait_for(gateway_up, f"port {self.gateway} of bridge {self.bridge}", timeout)

    def _wait_answering(self, probe: list[str], what: str, timeout: float | None = None) -> None:
        """Wait until probe, a cheap request to a daemon, succeeds. A socket file exists
        before its server listens on it (bind, then listen), so existence is not readiness:
        a client connecting in between gets "Connection refused"."""
        timeout = self.start_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        last_error = "not tried"
        while True:
            try:
                result = _run(probe, env=self.env, check=False, timeout=10)
            except subprocess.TimeoutExpired:
                last_error = "no answer within 10s"
            else:
                if result.returncode == 0:
                    return
                last_error = (result.stderr or result.stdout).strip() or f"exit {result.returncode}"
            self._raise_if_exited(what)
            if time.monotonic() >= deadline:
                raise SandboxError(
                    f"{what} did not answer within {timeout}s; last `{' '.join(probe)}`: "
                    f"{last_error}"
                )
            time.sleep(0.05)

    def _wait_for(self, predicate: Any, what: str, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            self._raise_if_exited(what)
            time.sleep(0.02)
        raise SandboxError(f"timed out after {timeout}s waiting for {what} in {self.rundir}")

    def _raise_if_exited(self, what: str) -> None:
        for key, proc in self._procs.items():
            if proc.poll() is not None:
                logfile = self.rundir / f"{key}.out"
                tail = logfile.read_text()[-2000:] if logfile.exists() else ""
                raise SandboxError(f"{key} exited ({proc.returncode}) waiting for {what}:\n{tail}")

    def _configure_gateway(self) -> None:
        ns, gw = self.netns, self.gateway
        # The userspace datapath's tap gets no checksum offload help: without this the
        # conntrack in ovs-vswitchd sees bad TCP checksums on node-originated packets.
        _run(["ethtool", "-K", gw, "tx", "off"], netns=ns, check=False)
        _run(["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=0"], netns=ns, check=False)
        if self.gateway_ipv4:
            _run(["ip", "addr", "replace", str(self.gateway_ipv4), "dev", gw], netns=ns)
        if self.gateway_ipv6:
            _run(["ip", "addr", "replace", str(self.gateway_ipv6), "dev", gw, "nodad"], netns=ns)
        _run(["ip", "link", "set", gw, "up"], netns=ns)

    def restart_vswitchd(self, *, kill: bool = True) -> None:
        """Kill (SIGKILL by default: a crash) and restart ovs-vswitchd. Flows and groups are
        gone afterwards; the gateway port is recreated with the node's addresses."""
        self.stop_vswitchd(kill=kill)
        self.start_vswitchd()

    def stop_vswitchd(self, *, kill: bool = True) -> None:
        """Kill (SIGKILL by default: a crash) ovs-vswitchd; ``start_vswitchd`` brings it back."""
        assert self.record is not None
        pid = self.record.pids.get("ovs-vswitchd")
        if pid:
            stop_process(pid, str(self.rundir), sig=signal.SIGKILL if kill else signal.SIGTERM)
        proc = self._procs.pop("ovs-vswitchd", None)
        if proc is not None:  # our child: reaped only once every thread has exited
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        with contextlib.suppress(FileNotFoundError):
            (self.rundir / f"{self.bridge}.mgmt").unlink()
        with contextlib.suppress(FileNotFoundError):
            (self.rundir / "ovs-vswitchd.ctl").unlink()

    def start_vswitchd(self) -> None:
        """Start ovs-vswitchd again (after ``stop_vswitchd``): an empty bridge, the gateway
        port recreated with the node's addresses, the pods' ports up."""
        self._start_vswitchd()
        self._wait_for_bridge()
        self._configure_gateway()
        for pod in self.pods.values():
            _run(["ip", "link", "set", pod.interface, "up"], netns=self.netns, check=False)

    def down(self) -> None:
        """Stop our processes by pid, delete our namespaces, veths and run directory."""
        for pod in list(self.pods.values()):
            self._stop_pod_server(pod)
        record = self.record or SandboxRecord.load(REGISTRY / f"{self.name}.json")
        if record is not None:
            cleanup_record(record)
        for proc in self._procs.values():
            with contextlib.suppress(Exception):
                proc.wait(timeout=5)
        self._procs.clear()
        self.pods.clear()
        self.record = None

    def __enter__(self) -> Self:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    # -- commands in the sandbox ----------------------------------------------------------
    def exec(
        self, *cmd: str, check: bool = True, timeout: float = 30
    ) -> subprocess.CompletedProcess[str]:
        """Run a command in the node namespace."""
        return _run(list(cmd), netns=self.netns, check=check, timeout=timeout)

    def ofctl(self, *args: str, check: bool = True) -> str:
        """`ovs-ofctl -O OpenFlow15 ARGS...` against this sandbox's bridge."""
        args_list = list(args)
        # ovs-ofctl takes the switch as the argument after the command name.
        cmd = ["ovs-ofctl", "-O", "OpenFlow15", *args_list[:1], self.openflow, *args_list[1:]]
        return _run(cmd, env=self.env, check=check).stdout

    def vsctl(self, *args: str) -> str:
        return _run(["ovs-vsctl", f"--db={self.ovsdb}", *args], env=self.env).stdout

    def appctl(self, *args: str, target: str = "ovs-vswitchd") -> str:
        ctl = self.rundir / f"{target}.ctl"
        return _run(["ovs-appctl", "-t", str(ctl), *args], env=self.env).stdout

    def ovsdb_client(self) -> OVSDB:
        return OVSDB(self.ovsdb)

    def status(self) -> dict[str, Any]:
        record = self.record or SandboxRecord.load(REGISTRY / f"{self.name}.json")
        alive = record.processes_alive() if record else False
        ports = []
        if alive:
            ports = [
                line for line in self.ofctl("show").splitlines() if "(" in line and "addr:" in line
            ]
        return {
            "name": self.name,
            "netns": self.netns,
            "rundir": str(self.rundir),
            "bridge": self.bridge,
            "gateway": self.gateway,
            "openflow": self.openflow,
            "ovsdb": self.ovsdb,
            "processes": dict(record.pids) if record else {},
            "running": alive,
            "ports": [p.strip() for p in ports],
            "pods": sorted(record.pod_netns) if record else [],
        }

    # -- pods -----------------------------------------------------------------------------
    def add_pod(
        self,
        name: str,
        *,
        ipv4: str | None = None,
        ipv6: str | None = None,
        mac: str | None = None,
        namespace: str = "default",
        http_ports: tuple[int, ...] = (),
        udp_ports: tuple[int, ...] = (),
    ) -> Pod:
        """Join a new pod namespace to the bridge, record it in OVSDB as a CNI would, and
        optionally serve HTTP (and UDP) answering the pod's name."""
        if name in self.pods:
            raise SandboxError(f"pod {name!r} already exists in sandbox {self.name}")
        index = len(self.pods) + 2
        v4 = (
            ipaddress.IPv4Interface(ipv4)
            if ipv4
            else ipaddress.IPv4Interface(
                f"{DEFAULT_POD_CIDR_V4[index]}/{DEFAULT_POD_CIDR_V4.prefixlen}"
            )
        )
        v6 = ipaddress.IPv6Interface(ipv6) if ipv6 else None
        mac = mac or f"0a:58:{secrets.token_hex(1)}:{secrets.token_hex(1)}:00:{index:02x}"
        pod_ns = f"{self.netns}-{name}"
        host_if = f"p-{name}"[:15]
        assert self.record is not None
        self.record.pod_netns.append(pod_ns)
        self.record.save()
        Sandbox.created_netns.add(pod_ns)
        add_netns(pod_ns)
        _run(
            ["ip", "link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", pod_ns],
            netns=self.netns,
        )
        _run(["ip", "link", "set", "eth0", "address", mac], netns=pod_ns)
        _run(["ethtool", "-K", "eth0", "tx", "off"], netns=pod_ns)
        _run(["ethtool", "-K", host_if, "tx", "off"], netns=self.netns, check=False)
        _run(["ip", "addr", "add", str(v4), "dev", "eth0"], netns=pod_ns)
        if v6 is not None:
            _run(["ip", "addr", "add", str(v6), "dev", "eth0", "nodad"], netns=pod_ns)
        _run(["ip", "link", "set", "eth0", "up"], netns=pod_ns)
        # The bridge-side veth lives in the node namespace, whose kernel also sees its frames
        # (the userspace datapath reads them with AF_PACKET). Keep that kernel out: it would
        # answer the pod's ARP for the gateway address with this veth's MAC (Linux answers
        # for any local address on any interface) and NDP likewise, and the pod's replies
        # would then bypass OVS and its conntrack.
        _run(["ip", "link", "set", host_if, "arp", "off"], netns=self.netns)
        _run(
            ["sysctl", "-qw", f"net.ipv6.conf.{host_if}.disable_ipv6=1"],
            netns=self.netns,
            check=False,
        )
        _run(["ip", "link", "set", host_if, "up"], netns=self.netns)
        if self.gateway_ipv4 and v4.ip in self.gateway_ipv4.network:
            _run(["ip", "route", "add", "default", "via", str(self.gateway_ipv4.ip)], netns=pod_ns)
        if v6 is not None and self.gateway_ipv6 and v6.ip in self.gateway_ipv6.network:
            _run(
                ["ip", "-6", "route", "add", "default", "via", str(self.gateway_ipv6.ip)],
                netns=pod_ns,
            )
        ips = ",".join(str(i.ip) for i in (v4, v6) if i is not None)
        with OVSDB(self.ovsdb) as db:
            db.add_port(
                self.bridge,
                host_if,
                {
                    EXT_POD_NAME: name,
                    EXT_POD_NAMESPACE: namespace,
                    EXT_POD_IPS: ips,
                    EXT_POD_MAC: mac,
                },
            )
            ofport = self._wait_ofport(db, host_if)
        pod = Pod(
            name=name,
            netns=pod_ns,
            interface=host_if,
            mac=mac,
            ipv4=v4,
            ipv6=v6,
            ofport=ofport,
            namespace=namespace,
            http_ports=tuple(http_ports),
            udp_ports=tuple(udp_ports),
        )
        if http_ports or udp_ports:
            self._start_pod_server(pod)
        self.pods[name] = pod
        return pod

    def _wait_ofport(self, db: OVSDB, interface: str) -> int:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            ofport = db.ofport(interface)
            if ofport > 0:
                return ofport
            time.sleep(0.02)
        raise SandboxError(f"port {interface} got no OpenFlow port number")

    def _start_pod_server(self, pod: Pod) -> None:
        cmd = [
            "ip",
            "netns",
            "exec",
            pod.netns,
            sys.executable,
            "-m",
            "ovsproxy.ovs.podserver",
            "--name",
            pod.name,
        ]
        for port in pod.http_ports:
            cmd += ["--http", str(port)]
        for port in pod.udp_ports:
            cmd += ["--udp", str(port)]
        ready = self.rundir / f"pod-{pod.name}.ready"
        # A pod of this name removed before left its file: the new server is not ready yet.
        ready.unlink(missing_ok=True)
        cmd += ["--ready-file", str(ready)]
        # Its output goes to a file: an inherited stdout would keep a caller's pipe open for
        # as long as a persistent sandbox lives (`ovsproxy lab up --json | ...` would hang).
        with open(self.rundir / f"pod-{pod.name}.out", "ab") as out:
            pod.server = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        assert self.record is not None
        self.record.pids[f"pod-{pod.name}"] = pod.server.pid
        self.record.save()
        self._wait_for(ready.exists, f"pod {pod.name} server")

    def _stop_pod_server(self, pod: Pod) -> None:
        if pod.server is None:
            return
        stop_process(pod.server.pid, None, timeout=3)
        with contextlib.suppress(Exception):
            pod.server.wait(timeout=3)
        pod.server = None
        if self.record is not None:
            self.record.pids.pop(f"pod-{pod.name}", None)
            self.record.save()

    def remove_pod(self, name: str) -> None:
        """Take pod ``name`` away again: its server, its OVSDB port, its namespace and veth
        (a test's pod on a sandbox its module shares, tests/shared_sandbox.py)."""
        pod = self.pods.pop(name)
        self._stop_pod_server(pod)
        with OVSDB(self.ovsdb) as db:
            db.del_port(self.bridge, pod.interface)
        gone = delete_netns(pod.netns)
        _run(["ip", "link", "del", pod.interface], netns=self.netns, check=False)
        # A namespace that could not be deleted stays in the record: the next start's sweep
        # is to find it.
        if gone and self.record is not None and pod.netns in self.record.pod_netns:
            self.record.pod_netns.remove(pod.netns)
            self.record.save()
