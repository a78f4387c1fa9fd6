"""A private OVN next to a private Open vSwitch, for the ``peer-ovn`` benchmark.

* ``OvnSandbox``: the OVS sandbox (``ovsproxy.ovs.sandbox``: ovsdb-server and ovs-vswitchd on the
  userspace datapath in a namespace of their own) plus the NB and SB ovsdb-servers, ovn-northd
  and ovn-controller, spawned in the same namespace and recorded in the same sandbox record, so
  that ``down()`` -- or the next sandbox start after a crash -- stops them all by pid and
  removes their run directory.
* ``OpenFlowTap``: ovn-controller reaches the bridge through this counting proxy (its
  ``OVS_RUNDIR`` points at the tap's directory, where it finds ``<bridge>.mgmt``): every
  OpenFlow message it sends is counted by type (the messages inside a bundle by their own type),
  messages and bytes, the way our channel counts ours (``parse_s``: the time that counting
  took, reported beside OVN's figures).
* ``Rpc``: a minimal OVSDB JSON-RPC client (RFC 7047: ``transact`` and ``monitor``) that
  records when each monitored update arrives: the clock for "NB commit -> northd -> controller".
* Pure builders of the NB transactions: our full-sync cluster as OVN load balancers with the
  options OVN-Kubernetes sets, in one load-balancer group attached to the logical switch.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import os
import select
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ovsproxy.model import Endpoint, ServicePort
from ovsproxy.ovs.sandbox import Sandbox, SandboxError

NB_SCHEMA = Path("/usr/share/ovn/ovn-nb.ovsschema")
SB_SCHEMA = Path("/usr/share/ovn/ovn-sb.ovsschema")
CHASSIS = "bench-chassis"
SWITCH = "ls0"
LB_GROUP = "clusterLBGroup"  # OVN-Kubernetes' group for cluster-wide load balancers
# What OVN-Kubernetes sets on a ClusterIP Service's load balancer (services controller:
# reject when there is no endpoint, no empty-LB events, hairpin traffic SNATed to its
# masquerade address).
LB_OPTIONS = {
    "reject": "true",
    "event": "false",
    "skip_snat": "false",
    "hairpin_snat_ip": "169.254.169.5 fd69::5",
}

Cluster = Sequence[tuple[ServicePort, Sequence[Endpoint]]]

# -- the NB content (pure) -----------------------------------------------------------------


def lb_name(port: ServicePort) -> str:
    """OVN-Kubernetes' name for a Service's cluster-IP load balancer."""
    name = port.name
    return f"Service_{name.namespace}/{name.name}_{name.protocol.name}_cluster"


def lb_vips(port: ServicePort, endpoints: Iterable[Endpoint]) -> list[list[str]]:
    """The ``vips`` map as OVSDB JSON pairs: ``"VIP:port" -> "ep:port,ep:port,..."``."""
    backends = ",".join(f"{e.ip}:{e.port}" for e in endpoints)
    return [[f"{ip}:{port.port}", backends] for ip in port.cluster_ips]


def lb_row(port: ServicePort, endpoints: Iterable[Endpoint]) -> dict[str, Any]:
    name = port.name
    return {
        "name": lb_name(port),
        "protocol": name.protocol.name.lower(),
        "vips": ["map", lb_vips(port, endpoints)],
        "options": ["map", sorted(LB_OPTIONS.items())],
        "external_ids": [
            "map",
            [
                ["k8s.ovn.org/kind", "Service"],
                ["k8s.ovn.org/owner", f"{name.namespace}/{name.name}"],
            ],
        ],
    }


def bump_nb_cfg() -> dict[str, Any]:
    """What ``ovn-nbctl --wait`` adds to its transaction: northd copies nb_cfg to the SB, each
    ovn-controller reports it back once the flows of that SB state are installed."""
    return {"op": "mutate", "table": "NB_Global", "where": [], "mutations": [["nb_cfg", "+=", 1]]}


def load_ops(cluster: Cluster, first: int, *, bump: bool) -> list[dict[str, Any]]:
    """One NB transaction: Services ``cluster`` (numbered from ``first``) as load balancers,
    added to the cluster load-balancer group; ``bump``: also ``bump_nb_cfg``."""
    ops: list[dict[str, Any]] = []
    names = []
    for index, (port, endpoints) in enumerate(cluster, first):
        uuid_name = f"lb{index}"
        names.append(["named-uuid", uuid_name])
        ops.append(
            {
                "op": "insert",
                "table": "Load_Balancer",
                "uuid-name": uuid_name,
                "row": lb_row(port, endpoints),
            }
        )
    ops.append(
        {
            "op": "mutate",
            "table": "Load_Balancer_Group",
            "where": [["name", "==", LB_GROUP]],
            "mutations": [["load_balancer", "insert", ["set", names]]],
        }
    )
    if bump:
        ops.append(bump_nb_cfg())
    return ops


def set_backends_ops(port: ServicePort, endpoints: Iterable[Endpoint]) -> list[dict[str, Any]]:
    """One Service's endpoints changed: its load balancer's ``vips`` rewritten (as
    OVN-Kubernetes does), and nb_cfg bumped."""
    return [
        {
            "op": "update",
            "table": "Load_Balancer",
            "where": [["name", "==", lb_name(port)]],
            "row": {"vips": ["map", lb_vips(port, endpoints)]},
        },
        bump_nb_cfg(),
    ]


def clear_ops() -> list[dict[str, Any]]:
    """Every load balancer out of the group and deleted."""
    return [
        {
            "op": "update",
            "table": "Load_Balancer_Group",
            "where": [["name", "==", LB_GROUP]],
            "row": {"load_balancer": ["set", []]},
        },
        {"op": "delete", "table": "Load_Balancer", "where": []},
        bump_nb_cfg(),
    ]


def topology_ops(ports: Sequence[tuple[str, str, Sequence[str]]]) -> list[dict[str, Any]]:
    """A logical switch with the cluster load-balancer group and ``ports`` (name, MAC, IPs):
    the local pods' logical ports."""
    ops: list[dict[str, Any]] = [
        {
            "op": "insert",
            "table": "Load_Balancer_Group",
            "uuid-name": "grp",
            "row": {"name": LB_GROUP},
        }
    ]
    for index, (name, mac, ips) in enumerate(ports):
        address = " ".join([mac, *ips])
        ops.append(
            {
                "op": "insert",
                "table": "Logical_Switch_Port",
                "uuid-name": f"lsp{index}",
                "row": {"name": name, "addresses": ["set", [address]]},
            }
        )
    ops.append(
        {
            "op": "insert",
            "table": "Logical_Switch",
            "row": {
                "name": SWITCH,
                "ports": ["set", [["named-uuid", f"lsp{i}"] for i in range(len(ports))]],
                "load_balancer_group": ["set", [["named-uuid", "grp"]]],
            },
        }
    )
    return ops


# -- an OVSDB JSON-RPC client --------------------------------------------------------------


class RpcError(RuntimeError):
    pass


class Rpc:
    """One OVSDB connection: ``transact``, ``monitor`` (rows kept in ``tables``; each update's
    arrival time in ``updated``), echo answered."""

    def __init__(self, path: str, database: str) -> None:
        self.database = database
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self._buffer = ""
        self._utf8 = codecs.getincrementaldecoder("utf-8")()  # a character may span two reads
        self._decoder = json.JSONDecoder()
        self._next_id = 0
        self._replies: dict[int, Any] = {}
        self.tables: dict[str, dict[str, dict[str, Any]]] = {}
        self.updated = 0.0

    def close(self) -> None:
        self.sock.close()

    def send(self, method: str, params: list[Any]) -> int:
        self._next_id += 1
        self.sock.sendall(
            json.dumps({"method": method, "params": params, "id": self._next_id}).encode()
        )
        return self._next_id

    def pump(self, timeout: float) -> None:
        """Read what arrives within ``timeout`` and dispatch it."""
        ready, _, _ = select.select([self.sock], [], [], timeout)
        if ready:
            self._receive()

    def _receive(self) -> None:
        data = self.sock.recv(1 << 20)
        arrived = time.perf_counter()
        if not data:
            raise RpcError(f"{self.database}: connection closed")
        self._buffer += self._utf8.decode(data)
        while True:
            text = self._buffer.lstrip()
            if not text:
                self._buffer = ""
                return
            try:
                message, end = self._decoder.raw_decode(text)
            except ValueError:
                self._buffer = text
                return
            self._buffer = text[end:]
            self._dispatch(message, arrived)

    def _dispatch(self, message: dict[str, Any], arrived: float) -> None:
        method = message.get("method")
        if method == "echo":
            self.sock.sendall(
                json.dumps(
                    {"result": message["params"], "error": None, "id": message["id"]}
                ).encode()
            )
        elif method == "update":
            self._apply(message["params"][1])
            self.updated = arrived
        elif "id" in message and method is None:
            self._replies[message["id"]] = message

    def _apply(self, updates: dict[str, dict[str, Any]]) -> None:
        for table, rows in updates.items():
            mine = self.tables.setdefault(table, {})
            for uuid, change in rows.items():
                new = change.get("new")
                if new is None:
                    mine.pop(uuid, None)
                else:
                    mine.setdefault(uuid, {}).update(new)

    def call(self, method: str, params: list[Any], timeout: float = 600) -> Any:
        ident = self.send(method, params)
        deadline = time.monotonic() + timeout
        while ident not in self._replies:
            if time.monotonic() > deadline:
                raise RpcError(f"{self.database}: no reply to {method} within {timeout}s")
            self.pump(1.0)
        reply = self._replies.pop(ident)
        if reply.get("error") is not None:
            raise RpcError(f"{self.database} {method}: {reply['error']}")
        return reply["result"]

    def transact(self, ops: list[dict[str, Any]], timeout: float = 600) -> list[Any]:
        results = self.call("transact", [self.database, *ops], timeout)
        for op, result in zip(ops, results, strict=False):
            if isinstance(result, dict) and "error" in result:
                raise RpcError(f"{self.database} {op['op']} {op.get('table')}: {result}")
        if len(results) > len(ops):  # the commit itself failed
            raise RpcError(f"{self.database} transaction: {results[-1]}")
        return list(results)

    def monitor(self, tables: dict[str, list[str]]) -> None:
        requests = {table: {"columns": columns} for table, columns in tables.items()}
        self._apply(self.call("monitor", [self.database, None, requests]))

    def column(self, table: str, column: str) -> list[Any]:
        return [row.get(column) for row in self.tables.get(table, {}).values()]


def wait_all(
    rpcs: Sequence[Rpc], conditions: dict[str, Callable[[], bool]], timeout: float = 600
) -> dict[str, float]:
    """Read every connection's updates until each condition holds; returns when the read that
    made each one true arrived (``perf_counter``; one already true: now)."""
    now = time.perf_counter()
    met = {name: now for name, holds in conditions.items() if holds()}
    deadline = time.monotonic() + timeout
    while len(met) < len(conditions):
        if time.monotonic() > deadline:
            waiting = ", ".join(sorted(set(conditions) - set(met)))
            raise RpcError(f"timed out after {timeout}s waiting for {waiting}")
        ready, _, _ = select.select([r.sock for r in rpcs], [], [], 1.0)
        for rpc in rpcs:
            if rpc.sock not in ready:
                continue
            rpc._receive()
            for name, holds in conditions.items():
                if name not in met and holds():
                    met[name] = rpc.updated
    return met


def wait_for(
    rpcs: Sequence[Rpc], done: Callable[[], bool], what: str, timeout: float = 600
) -> float:
    """``wait_all`` for one condition."""
    return wait_all(rpcs, {what: done}, timeout)[what]


# -- the OpenFlow tap ----------------------------------------------------------------------

OFPT_BUNDLE_ADD_MESSAGE = 34
OF_TYPES = {
    0: "HELLO", 2: "ECHO_REQUEST", 3: "ECHO_REPLY", 4: "EXPERIMENTER", 5: "FEATURES_REQUEST",
    7: "GET_CONFIG_REQUEST", 9: "SET_CONFIG", 13: "PACKET_OUT", 14: "FLOW_MOD", 15: "GROUP_MOD",
    16: "PORT_MOD", 17: "TABLE_MOD", 18: "MULTIPART_REQUEST", 20: "BARRIER_REQUEST",
    24: "ROLE_REQUEST", 26: "GET_ASYNC_REQUEST", 28: "SET_ASYNC", 29: "METER_MOD",
    33: "BUNDLE_CONTROL", 34: "BUNDLE_ADD_MESSAGE",
}  # fmt: skip


class OpenFlowCount:
    """Messages and bytes per OpenFlow type, parsed from a byte stream as it passes."""

    def __init__(self) -> None:
        self.by_type: dict[str, list[int]] = {}
        self._pending = b""

    def feed(self, data: bytes) -> None:
        buffer = self._pending + data
        offset = 0
        while len(buffer) - offset >= 8:
            length = struct.unpack_from("!H", buffer, offset + 2)[0]
            if length < 8:
                raise ValueError(f"OpenFlow message of length {length}")
            if len(buffer) - offset < length:
                break
            kind = buffer[offset + 1]
            self._count(kind, length)
            if kind == OFPT_BUNDLE_ADD_MESSAGE and length >= 24:  # the bundled message's type
                self._count(
                    buffer[offset + 17],
                    struct.unpack_from("!H", buffer, offset + 18)[0],
                    "bundled ",
                )
            offset += length
        self._pending = buffer[offset:]

    def _count(self, kind: int, length: int, prefix: str = "") -> None:
        row = self.by_type.setdefault(prefix + OF_TYPES.get(kind, str(kind)), [0, 0])
        row[0] += 1
        row[1] += length

    def snapshot(self) -> dict[str, tuple[int, int]]:
        return {k: (v[0], v[1]) for k, v in self.by_type.items()}


def count_delta(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]
) -> dict[str, tuple[int, int]]:
    """What was counted between two snapshots, by type (types that did not move left out)."""
    delta = {}
    for kind, (messages, size) in after.items():
        was = before.get(kind, (0, 0))
        if messages != was[0]:
            delta[kind] = (messages - was[0], size - was[1])
    return delta


class OpenFlowTap:
    """A unix-socket proxy in front of a bridge's management socket, in a thread of its own,
    counting what its clients send (``sent``) to the switch."""

    def __init__(self, listen: Path, target: Path) -> None:
        self.listen, self.target = listen, target
        self._counts: list[OpenFlowCount] = []  # one per connection (its own message boundaries)
        self.parse_s = 0.0  # the tap's own time spent counting (CPU beside the daemons')
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="openflow-tap", daemon=True
        )
        self._server: asyncio.AbstractServer | None = None

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)

    async def _start(self) -> None:
        self._server = await asyncio.start_unix_server(self._client, path=str(self.listen))

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(str(self.target))
        except OSError:
            writer.close()
            return

        sent = OpenFlowCount()
        with self._lock:
            self._counts.append(sent)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, count: bool) -> None:
            try:
                while data := await src.read(1 << 16):
                    if count:
                        with self._lock:
                            started = time.perf_counter()
                            sent.feed(data)
                            self.parse_s += time.perf_counter() - started
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        try:
            await asyncio.gather(pipe(reader, up_writer, True), pipe(up_reader, writer, False))
        except asyncio.CancelledError:
            pass  # stop(): a handler that ends cancelled would be logged by asyncio's streams

    def snapshot(self) -> dict[str, tuple[int, int]]:
        total: dict[str, tuple[int, int]] = {}
        with self._lock:
            for count in self._counts:
                for kind, (messages, size) in count.snapshot().items():
                    was = total.get(kind, (0, 0))
                    total[kind] = (was[0] + messages, was[1] + size)
        return total

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(close(), self._loop).result(5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
        with contextlib.suppress(FileNotFoundError):
            self.listen.unlink()


# -- the sandbox ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DaemonUsage:
    rss_mb: float
    hwm_mb: float
    cpu_s: float


def daemon_usage(pid: int) -> DaemonUsage:
    status = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            status[line.split(":")[0]] = int(line.split()[1])
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return DaemonUsage(round(status["VmRSS"] / 1024, 1), round(status["VmHWM"] / 1024, 1), cpu)


OVN_DAEMONS = ("ovsdb-server-nb", "ovsdb-server-sb", "ovn-northd", "ovn-controller")


class OvnSandbox(Sandbox):
    """The OVS sandbox plus a private OVN (NB, SB, northd, controller) in its namespace; the
    bridge is ovn-controller's integration bridge."""

    def __init__(self) -> None:
        super().__init__()
        self.tap: OpenFlowTap | None = None

    @property
    def env(self) -> dict[str, str]:
        rundir = str(self.rundir)
        return {**super().env, "OVN_RUNDIR": rundir, "OVN_LOGDIR": rundir, "OVN_DBDIR": rundir}

    @property
    def nb(self) -> str:
        return str(self.rundir / "nb.sock")

    @property
    def sb(self) -> str:
        return str(self.rundir / "sb.sock")

    def _start(self) -> None:
        for tool in ("ovn-northd", "ovn-controller"):
            if not Path("/usr/bin", tool).exists():
                raise SandboxError(
                    f"{tool} not found: install ovn-central and ovn-host (scripts/setup.sh does)"
                )
        super()._start()
        for key, schema, sock in (("nb", NB_SCHEMA, self.nb), ("sb", SB_SCHEMA, self.sb)):
            db = self.rundir / f"{key}.db"
            self.exec("ovsdb-tool", "create", str(db), str(schema))
            self._spawn(
                f"ovsdb-server-{key}",
                [
                    "ovsdb-server",
                    str(db),
                    f"--remote=punix:{sock}",
                    f"--pidfile={self.rundir / f'ovsdb-server-{key}.pid'}",
                    f"--unixctl={self.rundir / f'ovsdb-server-{key}.ctl'}",
                    f"--log-file={self.rundir / f'ovsdb-server-{key}.log'}",
                    "--no-chdir",
                ],
            )
            self._wait_answering(
                ["ovsdb-client", "--timeout=5", "list-dbs", f"unix:{sock}"], f"{key} ovsdb-server"
            )
        self._spawn(
            "ovn-northd",
            [
                "ovn-northd",
                f"--ovnnb-db=unix:{self.nb}",
                f"--ovnsb-db=unix:{self.sb}",
                f"--pidfile={self.rundir / 'ovn-northd.pid'}",
                f"--unixctl={self.rundir / 'ovn-northd.ctl'}",
                f"--log-file={self.rundir / 'ovn-northd.log'}",
                "--no-chdir",
            ],
        )
        self.vsctl(
            "set",
            "Open_vSwitch",
            ".",
            f"external_ids:system-id={CHASSIS}",
            f"external_ids:ovn-remote=unix:{self.sb}",
            "external_ids:ovn-encap-type=geneve",
            "external_ids:ovn-encap-ip=127.0.0.1",
            f"external_ids:ovn-bridge={self.bridge}",
            "external_ids:ovn-bridge-datapath-type=netdev",
        )
        self.exec("ovn-nbctl", f"--db=unix:{self.nb}", "init")
        tap_dir = self.rundir / "tap"
        tap_dir.mkdir()
        self.tap = OpenFlowTap(tap_dir / f"{self.bridge}.mgmt", self.rundir / f"{self.bridge}.mgmt")
        self.tap.start()
        self.start_controller()

    def start_controller(self) -> None:
        # ovn-controller finds the bridge at $OVS_RUNDIR/<bridge>.mgmt: there it meets the tap.
        self._spawn(
            "ovn-controller",
            [
                "env",
                f"OVS_RUNDIR={self.rundir / 'tap'}",
                "ovn-controller",
                self.ovsdb,
                f"--pidfile={self.rundir / 'ovn-controller.pid'}",
                f"--log-file={self.rundir / 'ovn-controller.log'}",
                "--no-chdir",
            ],
        )

    def stop_controller(self) -> None:
        """SIGTERM to ovn-controller (our child: ``ip netns exec`` execs it), reaped."""
        assert self.record is not None
        proc = self._procs.pop("ovn-controller")
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        del self.record.pids["ovn-controller"]
        self.record.save()

    def pid(self, key: str) -> int:
        assert self.record is not None
        return self.record.pids[key]

    def usage(self) -> dict[str, DaemonUsage]:
        return {
            key: daemon_usage(self.pid(key))
            for key in (*OVN_DAEMONS, "ovsdb-server", "ovs-vswitchd")
        }

    def down(self) -> None:
        if self.tap is not None:
            self.tap.stop()
            self.tap = None
        super().down()
