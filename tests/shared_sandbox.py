"""One sandbox for all tests of a module, each test leaving it as it found it.

Starting a private OVS, and the example lab's pods and servers on it, costs seconds; a module
marked ``pytest.mark.shared_sandbox`` gets one for all its tests (tests/conftest.py). Its state
is read before the first test (``SandboxState``; again when a module fixture has added pods
since); after each test everything a test may have added is removed (``reset``) and the state
is read again: any difference fails that test's teardown, so no test sees what another left,
and the next test finds the state the check has just confirmed.

The state is what a test or an agent can change: flows, groups and meters; the bridge's,
ports', interfaces' and Open_vSwitch's OVSDB rows and the conntrack zone timeout policies;
OVS conntrack; and in the node's and every pod's namespace
the links, addresses, routes, rules, permanent neighbours, nftables ruleset, kernel conntrack
and the TCP sockets that are not listening (a TIME_WAIT from one test would meet the next
test's reuse of a 5-tuple). Kernel-made details that a vswitchd restart renews (link-local
addresses and the ``proto kernel`` routes derived from addresses) are left out, and so are
sysctls and neighbour entries that are not permanent: a module whose tests set a sysctl in a
pod, or depend on what a pod's kernel remembers of a vswitchd restart, keeps a fresh sandbox
per test (tests/e2e/test_restart_time_wait.py).
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, TypeVar

from ovsproxy.ovs.sandbox import Sandbox, SandboxError

T = TypeVar("T")

# Read in the namespace, in one shell: these outputs, separated by SEPARATOR. (The TCP
# sockets and kernel conntrack entries are read from /proc, see _netns_state.)
SEPARATOR = "@@ovsproxy-state@@"
_NETNS_COMMANDS = (
    "ip -o link show",
    "ip -o addr show",
    "ip -4 route show table all",
    "ip -6 route show table all",
    "ip -4 rule show",
    "ip -6 rule show",
    "ip neigh show nud permanent",
    "nft list ruleset",
)
_BRIDGE_COLUMNS = "name,external_ids,other_config,protocols,fail_mode,controller,datapath_type"
_INTERFACE_COLUMNS = "name,type,ofport,external_ids,options"
_OPEN_VSWITCH_COLUMNS = "external_ids,other_config,datapaths,manager_options,ssl"
_ZONE_TABLES = ("Datapath", "CT_Zone", "CT_Timeout_Policy")
_OVSDB_TABLES = (
    ("Bridge", _BRIDGE_COLUMNS),
    ("Port", "name"),
    ("Interface", _INTERFACE_COLUMNS),
    ("Open_vSwitch", _OPEN_VSWITCH_COLUMNS),
    # The agent's conntrack zone timeout policies (none in a fresh sandbox).
    ("Datapath", "ct_zones,external_ids"),
    ("CT_Zone", "timeout_policy,external_ids"),
    ("CT_Timeout_Policy", "timeouts,external_ids"),
)
_TCP_LISTEN = "0A"  # the state column of /proc/net/tcp
_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def in_netns(netns: str, work: Callable[[], T]) -> T:
    """``work()`` in a thread that joined ``netns``: what it reads of /proc/thread-self/net and
    the processes it starts are that namespace's, without a `ip netns exec` per command (they
    cost most of a reset). The thread ends with the work: nothing else runs in the namespace."""
    result: list[T] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            with open(f"/run/netns/{netns}") as handle:
                if _libc.setns(handle.fileno(), _CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns into {netns}")
            result.append(work())
        except BaseException as exc:  # handed to the caller
            failed.append(exc)

    thread = threading.Thread(target=run, name=f"in {netns}")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return result[0]


@dataclass(frozen=True, slots=True)
class NetnsState:
    links: tuple[str, ...]
    addresses: tuple[str, ...]
    routes: tuple[str, ...]
    rules: tuple[str, ...]
    neighbours: tuple[str, ...]
    nftables: str
    sockets: tuple[str, ...]
    conntrack: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SandboxState:
    flows: tuple[str, ...]
    groups: tuple[str, ...]
    meters: tuple[str, ...]
    ports: tuple[str, ...]
    bridge: str  # the Bridge row (JSON)
    interfaces: str  # the Interface rows (JSON)
    open_vswitch: str  # the Open_vSwitch row (JSON)
    zones: str  # the Datapath, CT_Zone and CT_Timeout_Policy rows (JSON)
    ovs_conntrack: tuple[str, ...]
    pods: tuple[tuple[str, bool], ...]  # (name, its server runs)
    netns: tuple[tuple[str, NetnsState], ...]

    def differences(self, other: SandboxState) -> list[str]:
        """What differs, field by field (empty when equal)."""
        found = []
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if mine == theirs:
                continue
            if f.name == "netns":
                for (ns, a), (_, b) in zip(mine, theirs, strict=False):
                    for g in fields(a):
                        if getattr(a, g.name) != getattr(b, g.name):
                            found.append(
                                f"{ns} {g.name}: {getattr(a, g.name)!r} -> {getattr(b, g.name)!r}"
                            )
                if [n for n, _ in mine] != [n for n, _ in theirs]:
                    found.append(f"namespaces: {[n for n, _ in mine]} -> {[n for n, _ in theirs]}")
            else:
                found.append(f"{f.name}: {mine!r} -> {theirs!r}")
        return found


def _lines(text: str) -> tuple[str, ...]:
    return tuple(sorted(line.strip() for line in text.splitlines() if line.strip()))


def _openflow(sandbox: Sandbox, command: str) -> tuple[str, ...]:
    # Reply headers carry transaction ids; the entries are what counts.
    out = sandbox.ofctl(command, *(("--no-stats",) if command == "dump-flows" else ()))
    return tuple(line for line in _lines(out) if " reply (" not in line)


def _address(line: str) -> str | None:
    """'2: gw0    inet 10.244.0.1/24 scope global gw0 ...' -> 'gw0 10.244.0.1/24'."""
    words = line.split()
    if len(words) < 4 or words[2] not in ("inet", "inet6") or words[3].startswith("fe80:"):
        return None
    return f"{words[1]} {words[3]}"


def _route(line: str) -> str | None:
    # Derived from addresses and links (restored with those); "linkdown" is link state.
    if " proto kernel" in line or "fe80:" in line:
        return None
    return " ".join(w for w in line.split() if w not in ("linkdown", "dead"))


def _proc_lines(name: str) -> list[str]:
    path = Path("/proc/thread-self/net", name)
    return path.read_text().splitlines()[1:] if path.exists() else []


def _read_netns() -> NetnsState:
    """The state of the namespace the calling thread is in."""
    script = f"; echo {SEPARATOR}; ".join(_NETNS_COMMANDS)
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30).stdout
    parts = out.split(SEPARATOR)
    assert len(parts) == len(_NETNS_COMMANDS), out
    links, addrs, routes4, routes6, rules4, rules6, neigh, nft = parts
    sockets = [
        line.split()[1:4]
        for name in ("tcp", "tcp6")
        for line in _proc_lines(name)
        if line.split()[3] != _TCP_LISTEN
    ]
    return NetnsState(
        links=tuple(sorted(line.split(":")[1].split("@")[0].strip() for line in _lines(links))),
        addresses=tuple(sorted(a for a in map(_address, _lines(addrs)) if a)),
        routes=tuple(
            sorted(
                f"{family} {route}"
                for family, text in (("-4", routes4), ("-6", routes6))
                for route in map(_route, _lines(text))
                if route
            )
        ),
        rules=tuple(
            sorted(
                f"{family} {rule}"
                for family, text in (("-4", rules4), ("-6", rules6))
                for rule in _lines(text)
            )
        ),
        neighbours=tuple(
            " ".join(w for w in line.split() if w != "PERMANENT") for line in _lines(neigh)
        ),
        nftables=nft.strip(),
        sockets=tuple(sorted(" ".join(s) for s in sockets)),
        conntrack=_lines("\n".join(_proc_lines("nf_conntrack"))),
    )


def _netns_state(netns: str) -> NetnsState:
    return in_netns(netns, _read_netns)


def _ovsdb_rows(sandbox: Sandbox) -> dict[str, list[dict[str, Any]]] | None:
    """The rows of every table of _OVSDB_TABLES, in one transaction (None: no ovsdb-server
    answers)."""
    selects = [
        {"op": "select", "table": table, "where": [], "columns": columns.split(",")}
        for table, columns in _OVSDB_TABLES
    ]
    done = subprocess.run(
        [
            "ovsdb-client",
            "--timeout=10",
            "transact",
            sandbox.ovsdb,
            json.dumps(["Open_vSwitch", *selects]),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if done.returncode != 0:
        return None
    return {
        table: sorted(result["rows"], key=lambda r: json.dumps(r, sort_keys=True))
        for (table, _), result in zip(_OVSDB_TABLES, json.loads(done.stdout), strict=True)
    }


def namespaces(sandbox: Sandbox) -> list[str]:
    return [sandbox.netns, *(pod.netns for pod in sandbox.pods.values())]


def pod_servers(sandbox: Sandbox) -> tuple[tuple[str, bool], ...]:
    """(name, whether its server runs) of every pod."""
    return tuple(
        sorted(
            (name, pod.server is not None and pod.server.poll() is None)
            for name, pod in sandbox.pods.items()
        )
    )


def read_state(
    sandbox: Sandbox, rows: dict[str, list[dict[str, Any]]] | None = None
) -> SandboxState:
    """The sandbox's state (``rows``: its OVSDB rows, when just read)."""
    rows = rows or _ovsdb_rows(sandbox)
    assert rows, f"no ovsdb-server answers on {sandbox.ovsdb}"
    return SandboxState(
        flows=_openflow(sandbox, "dump-flows"),
        groups=_openflow(sandbox, "dump-groups"),
        meters=_openflow(sandbox, "dump-meters"),
        ports=tuple(r["name"] for r in rows["Port"]),
        bridge=json.dumps(rows["Bridge"]),
        interfaces=json.dumps(rows["Interface"]),
        open_vswitch=json.dumps(rows["Open_vSwitch"]),
        zones=json.dumps([rows[table] for table in _ZONE_TABLES]),
        ovs_conntrack=_lines(sandbox.appctl("dpctl/dump-conntrack")),
        pods=pod_servers(sandbox),
        netns=tuple((ns, _netns_state(ns)) for ns in namespaces(sandbox)),
    )


def _ovsdb_map(value: Any) -> dict[str, str]:
    """ovs-vsctl's JSON for a map column: ["map", [[key, value], ...]]."""
    return dict(value[1]) if isinstance(value, list) and value and value[0] == "map" else {}


def _vsctl_value(value: Any) -> str:
    """ovs-vsctl's JSON for an atom or set, written as its command line takes it."""
    if isinstance(value, list) and value and value[0] == "set":
        return "[" + ",".join(_vsctl_value(v) for v in value[1]) + "]"
    return json.dumps(value)


def _restore_row(sandbox: Sandbox, table: str, record: str, was: Any, now: Any) -> None:
    """An OVSDB row as it was: map keys added since removed, changed values written back,
    references (a controller, a manager, a datapath) added since cleared."""
    for column, value in was.items():
        if now[column] == value:
            continue
        if column in ("external_ids", "other_config"):
            before, after = _ovsdb_map(value), _ovsdb_map(now[column])
            for key in after.keys() - before.keys():
                sandbox.vsctl("remove", table, record, column, key)
            for key, text in before.items():
                if after.get(key) != text:
                    sandbox.vsctl("set", table, record, f"{column}:{key}={json.dumps(text)}")
        elif column in _REFERENCES:
            # Only an empty reference can be put back; the check names any other.
            if value in (["set", []], ["map", []]):
                sandbox.vsctl("clear", table, record, column)
        else:
            sandbox.vsctl("set", table, record, f"{column}={_vsctl_value(value)}")


_REFERENCES = ("controller", "datapaths", "manager_options", "ssl")


def _restore_ovsdb(sandbox: Sandbox, found: SandboxState, rows: dict[str, Any]) -> None:
    """Ports added since deleted; the Bridge and Open_vSwitch rows as they were (what they
    refer to goes with them: controllers, and the Datapath records holding conntrack zone
    timeout policies)."""
    for row in rows["Port"]:
        if row["name"] not in found.ports:
            sandbox.vsctl("--if-exists", "del-port", sandbox.bridge, row["name"])
    (was,), (now,) = json.loads(found.bridge), rows["Bridge"]
    _restore_row(sandbox, "Bridge", sandbox.bridge, was, now)
    (was,), (now,) = json.loads(found.open_vswitch), rows["Open_vSwitch"]
    _restore_row(sandbox, "Open_vSwitch", ".", was, now)


def _reset_netns(netns: str, found: NetnsState, now: NetnsState) -> None:
    commands = []
    for table in now.nftables.splitlines():
        if table.startswith("table ") and table not in found.nftables.splitlines():
            commands.append(f"nft delete {table.removesuffix(' {')}")
    for route in sorted(set(now.routes) - set(found.routes)):
        family, _, selector = route.partition(" ")
        commands.append(f"ip {family} route del {selector}")
    for rule in sorted(set(now.rules) - set(found.rules)):
        family, priority, selector = rule.split(maxsplit=2)
        commands.append(f"ip {family} rule del pref {priority.rstrip(':')} {selector}")
    for neighbour in sorted(set(now.neighbours) - set(found.neighbours)):
        address, _, rest = neighbour.partition(" dev ")
        commands.append(f"ip neigh del {address} dev {rest.split()[0]}")
    for address in sorted(set(now.addresses) - set(found.addresses)):
        dev, ip = address.split()
        commands.append(f"ip addr del {ip} dev {dev}")
    for link in sorted(set(now.links) - set(found.links)):
        commands.append(f"ip link del {link}")
    if now.sockets:
        commands.append("ss -K -t state connected >/dev/null")
    if now.conntrack:
        commands.append("conntrack -F 2>/dev/null")
    if commands:
        script = "; ".join(commands)
        in_netns(
            netns, lambda: subprocess.run(["sh", "-c", script], capture_output=True, timeout=30)
        )


def _restored(found: SandboxState) -> dict[str, Any]:
    """The rows _restore_ovsdb puts back, as ``found`` has them."""
    return {
        "Port": [{"name": name} for name in found.ports],
        "Bridge": json.loads(found.bridge),
        "Open_vSwitch": json.loads(found.open_vswitch),
    }


def reset(sandbox: Sandbox, found: SandboxState) -> SandboxState:
    """Remove what was added since ``found`` was read: pods, ports, flows, groups, meters,
    bridge keys, conntrack entries, and in every namespace links, addresses, routes,
    neighbours, nftables tables, sockets and kernel conntrack entries. A daemon the test
    stopped is started again (its database file is kept). Returns the state read afterwards."""
    rows = _ovsdb_rows(sandbox)
    if rows is None:
        sandbox.stop_ovsdb_server()
        sandbox.start_ovsdb_server()
        rows = _ovsdb_rows(sandbox)
        assert rows is not None, f"ovsdb-server on {sandbox.ovsdb} did not come back"
    known = {name for name, _ in found.pods}
    added = [name for name in sandbox.pods if name not in known]
    for name in added:
        sandbox.remove_pod(name)
    if added:
        rows = _ovsdb_rows(sandbox)
        assert rows is not None
    try:
        sandbox.appctl("version")
    except SandboxError:  # no ovs-vswitchd answers (ovs-vsctl would wait for one)
        sandbox.stop_vswitchd()
        sandbox.start_vswitchd()
        rows = _ovsdb_rows(sandbox)  # the new one rewrote the interfaces' rows
        assert rows is not None
    _restore_ovsdb(sandbox, found, rows)  # first: the bridge may have lost OpenFlow 1.5
    sandbox.ofctl("del-flows")
    sandbox.ofctl("del-groups")
    sandbox.ofctl("del-meters")
    # Datapath flows cached from the deleted OpenFlow flows go now, not at the next
    # revalidation: a packet of the next test must meet its own flows.
    sandbox.appctl("revalidator/purge")
    sandbox.appctl("dpctl/flush-conntrack")
    if any(rows.get(table) != was for table, was in _restored(found).items()):
        rows = {}  # changed by the restore: read again
    now = read_state(sandbox, rows)
    was = dict(found.netns)
    changed = [ns for ns, state in now.netns if ns in was and state != was[ns]]
    if not changed:
        return now
    for ns in changed:
        _reset_netns(ns, was[ns], dict(now.netns)[ns])
    return replace(now, netns=tuple((ns, _netns_state(ns)) for ns, _ in now.netns))


def leave_as_found(sandbox: Sandbox, found: SandboxState) -> None:
    """Reset the sandbox to ``found``; fails (naming every difference) when it is not."""
    differences = found.differences(reset(sandbox, found))
    assert not differences, "the shared sandbox is not as the test found it:\n" + "\n".join(
        differences
    )
