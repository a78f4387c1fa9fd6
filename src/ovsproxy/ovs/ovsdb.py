"""OVSDB access through ovsdbapp: bridge bootstrap and reading pod ports.

ovsdbapp is blocking and runs one background thread per connection; asyncio callers go through
``asyncio.to_thread``. Always ``close()`` (or use as a context manager): the IDL thread would
otherwise outlive the caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import sys
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Self

from ovsproxy.model.node import NotAPod, PodPort

log = logging.getLogger(__name__)

# external_ids keys a CNI writes on a pod's OVS Interface (the names Antrea uses).
EXT_POD_NAME = "pod-name"
EXT_POD_NAMESPACE = "pod-namespace"
EXT_POD_IPS = "ip"  # comma-separated
EXT_POD_MAC = "attached-mac"
# Bridge external_ids key holding the last agent run's cookie generation.
GENERATION_KEY = "ovsproxy-generation"
# external_ids key marking the CT_Zone rows (and their timeout policies) the agent made.
ZONE_OWNER_KEY = "ovsproxy"


class OVSDBError(RuntimeError):
    pass


def _import_ovsdbapp() -> tuple[Any, Any]:
    """Import ovsdbapp without letting the `ovs` library pick up eventlet.

    `ovs.poller` imports eventlet when it is installed (os-ken, our test-only oracle, pulls it
    in); eventlet's greenlets then keep every thread that used the OVSDB IDL from finishing,
    and asyncio's executor waits for them forever at exit. We never use eventlet.
    """
    hidden = "eventlet" not in sys.modules
    if hidden:
        # None makes the import raise ImportError; typeshed allows only modules here.
        sys.modules["eventlet"] = None  # type: ignore[assignment]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from ovsdbapp.backend.ovs_idl import connection
            from ovsdbapp.schema.open_vswitch import impl_idl
    finally:
        if hidden:
            del sys.modules["eventlet"]
    return connection, impl_idl


@dataclass(frozen=True, slots=True)
class BridgeSpec:
    name: str = "br0"
    datapath_type: str = "netdev"
    datapath_id: int = 0x1
    protocols: tuple[str, ...] = ("OpenFlow15",)
    fail_mode: str = "secure"
    internal_ports: tuple[str, ...] = ("gw0",)
    external_ids: dict[str, str] = field(default_factory=dict)


def _private_api(impl_idl: Any) -> Any:
    """ovsdbapp's Open_vSwitch API class, private to one connection, whose transactions do not
    wait for ovs-vswitchd (``ovs-vsctl --no-wait``).

    ovsdbapp keeps the connection in a class attribute (a process-wide singleton): a private
    subclass per instance lets two sandboxes, or a sandbox and the agent, talk to different
    ovsdb-servers from one process. Its transactions bump ``next_cfg`` and block until
    ovs-vswitchd has applied it: with the switch down (started after the agent, restarting)
    every write would time out. What we write is bookkeeping in external_ids, and where the
    switch must have applied a change (a new port's number) the caller waits for that."""

    class NoWaitTransaction(impl_idl.OvsVsctlTransaction):  # type: ignore[misc]
        def pre_commit(self, txn: Any) -> None:
            txn.expected_ifaces = set()  # (add_port records its interface here)

        def do_post_commit(self, txn: Any) -> None:
            pass

    def create_transaction(
        api: Any, check_error: bool = False, log_errors: bool = True, **_: Any
    ) -> Any:
        return NoWaitTransaction(
            api, api.ovsdb_connection, check_error=check_error, log_errors=log_errors
        )

    return type(
        "PrivateOvsdbIdl",
        (impl_idl.OvsdbIdl,),
        {"_ovsdb_connection": None, "create_transaction": create_transaction},
    )


class OVSDB:
    """A connection to ovsdb-server's Open_vSwitch database."""

    def __init__(self, endpoint: str, timeout: float = 10.0) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        connection, impl_idl = _import_ovsdbapp()
        try:
            idl = connection.OvsdbIdl.from_server(endpoint, "Open_vSwitch")
            self._conn = connection.Connection(idl=idl, timeout=timeout)
            self.api = _private_api(impl_idl)(self._conn)
        except Exception as exc:
            raise OVSDBError(f"cannot connect to OVSDB at {endpoint}: {exc}") from exc

    @property
    def connected(self) -> bool:
        """Whether the session to ovsdb-server is up now. The IDL reconnects by itself after
        a restart (and replays its monitor); while it is down, reads answer from its cache and
        writes wait up to ``timeout``, then fail."""
        conn = getattr(self, "_conn", None)
        session = getattr(getattr(conn, "idl", None), "_session", None)
        return bool(session is not None and session.is_connected())

    def close(self) -> None:
        conn = getattr(self, "_conn", None)
        if conn is not None:
            conn.stop(timeout=self.timeout)
            self._conn = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def ensure_bridge(self, spec: BridgeSpec) -> None:
        """Create (or correct) the bridge and its internal ports in one transaction."""
        other_config = {"datapath-id": f"{spec.datapath_id:016x}"}
        api = self.api
        with api.transaction(check_error=True) as txn:
            txn.add(api.add_br(spec.name, may_exist=True, datapath_type=spec.datapath_type))
            txn.add(
                api.db_set(
                    "Bridge",
                    spec.name,
                    ("protocols", list(spec.protocols)),
                    ("fail_mode", spec.fail_mode),
                    ("other_config", other_config),
                    ("external_ids", dict(spec.external_ids)),
                )
            )
            for port in spec.internal_ports:
                txn.add(api.add_port(spec.name, port, may_exist=True))
                txn.add(api.db_set("Interface", port, ("type", "internal")))

    def add_port(self, bridge: str, interface: str, external_ids: dict[str, str]) -> None:
        api = self.api
        with api.transaction(check_error=True) as txn:
            txn.add(api.add_port(bridge, interface, may_exist=True))
            txn.add(api.db_set("Interface", interface, ("external_ids", external_ids)))

    def del_port(self, bridge: str, interface: str) -> None:
        self.api.del_port(interface, bridge=bridge, if_exists=True).execute(check_error=True)

    def ofport(self, interface: str) -> int:
        value = self.api.db_get("Interface", interface, "ofport").execute(check_error=True)
        if isinstance(value, list):  # an unset optional column reads as []
            value = value[0] if value else -1
        return int(value)

    def bridge_ports(self, bridge: str) -> list[str]:
        return list(self.api.list_ports(bridge).execute(check_error=True))

    def interfaces(self) -> list[dict[str, Any]]:
        rows = self.api.db_list(
            "Interface", columns=["name", "ofport", "external_ids", "type"]
        ).execute(check_error=True)
        return list(rows)

    def pod_ports(self, bridge: str) -> list[PodPort]:
        """Interfaces on the bridge that a CNI recorded as pods (they carry ip + attached-mac)."""
        return self.read_pods(bridge)[0]

    def read_pods(
        self, bridge: str, not_pods: Iterable[str] = ()
    ) -> tuple[list[PodPort], list[NotAPod]]:
        """The bridge's pod ports, and its other Interfaces with why each is not a pod.

        ``not_pods`` names Interfaces known not to be pods (the gateway): they are neither.
        An Interface still without an OpenFlow port number is neither too (it is being added).
        """
        on_bridge = set(self.bridge_ports(bridge)) - set(not_pods)
        pods = []
        skipped = []
        for row in self.interfaces():
            name = row["name"]
            if name not in on_bridge:
                continue
            ext = row.get("external_ids") or {}
            ofport = row.get("ofport")
            if isinstance(ofport, list):
                ofport = ofport[0] if ofport else -1
            missing = [key for key in (EXT_POD_IPS, EXT_POD_MAC) if key not in ext]
            if missing:
                keys = " and ".join(f"external_ids:{key}" for key in missing)
                skipped.append(NotAPod(name, f"no {keys}"))
                continue
            if not isinstance(ofport, int) or ofport <= 0:
                continue
            try:
                ips = tuple(ipaddress.ip_address(s) for s in ext[EXT_POD_IPS].split(",") if s)
            except ValueError:
                skipped.append(NotAPod(name, f"bad external_ids:ip {ext[EXT_POD_IPS]!r}"))
                continue
            pods.append(
                PodPort(
                    interface=name,
                    ofport=ofport,
                    name=ext.get(EXT_POD_NAME, name),
                    namespace=ext.get(EXT_POD_NAMESPACE, ""),
                    ips=ips,
                    mac=ext[EXT_POD_MAC],
                )
            )
        return sorted(pods, key=lambda p: p.ofport), sorted(skipped, key=lambda s: s.interface)

    def datapath_type(self, bridge: str) -> str:
        """The bridge's datapath type: "netdev" (userspace), "system" (the kernel's; also
        what an unset column means), or another provider's name."""
        datapath_type = self.api.db_get("Bridge", bridge, "datapath_type").execute(check_error=True)
        if isinstance(datapath_type, list):  # an unset optional column reads as []
            datapath_type = datapath_type[0] if datapath_type else ""
        return str(datapath_type or "system")  # OVS's own default

    def ensure_zone_timeouts(
        self, bridge: str, zones: Iterable[int], timeouts: dict[str, int]
    ) -> list[str]:
        """Give each conntrack zone of ``zones`` the timeout policy ``timeouts`` (e.g.
        ``{"tcp_time_wait": 120}``) in the Datapath record of the bridge's datapath type,
        creating that record, the CT_Zone and its CT_Timeout_Policy as needed (what
        ``ovs-vsctl add-zone-tp`` does). A zone someone else configured (a CT_Zone without our
        external_ids mark) is left as it is and named in the returned list."""
        # ovsdbapp is imported (without eventlet) by the time a connection exists.
        from ovsdbapp.backend.ovs_idl import command

        datapath_type = self.datapath_type(bridge)
        wanted = dict(timeouts)
        foreign: list[str] = []

        class ZoneTimeouts(command.BaseCommand):  # type: ignore[misc]
            def run_idl(self, txn: Any) -> None:
                tables = self.api.tables
                root = next(iter(tables["Open_vSwitch"].rows.values()))
                datapath = root.datapaths.get(datapath_type)
                new_datapath = datapath is None
                if datapath is None:
                    datapath = txn.insert(tables["Datapath"])
                    datapath.external_ids = {ZONE_OWNER_KEY: "true"}
                    root.setkey("datapaths", datapath_type, datapath)
                for zone in zones:
                    # A row inserted in this transaction has no column to read yet.
                    ct_zone = None if new_datapath else datapath.ct_zones.get(zone)
                    policy = None
                    if ct_zone is None:
                        ct_zone = txn.insert(tables["CT_Zone"])
                        ct_zone.external_ids = {ZONE_OWNER_KEY: "true"}
                        datapath.setkey("ct_zones", zone, ct_zone)
                    elif ct_zone.external_ids.get(ZONE_OWNER_KEY) != "true":
                        foreign.append(f"zone {zone}")
                        continue
                    elif ct_zone.timeout_policy:
                        policy = ct_zone.timeout_policy[0]
                        if dict(policy.timeouts) == wanted:
                            continue
                    if policy is None:
                        policy = txn.insert(tables["CT_Timeout_Policy"])
                        policy.external_ids = {ZONE_OWNER_KEY: "true"}
                        ct_zone.timeout_policy = [policy]
                    policy.timeouts = wanted

        with self.api.transaction(check_error=True) as txn:
            txn.add(ZoneTimeouts(self.api))
        return foreign

    def remove_zone_timeouts(self) -> list[int]:
        """Remove the CT_Zone rows we made (``ensure_zone_timeouts``), with their timeout
        policies, from every Datapath record (and a Datapath record we made, once empty); the
        zones removed."""
        from ovsdbapp.backend.ovs_idl import command

        removed: list[int] = []

        class RemoveZoneTimeouts(command.BaseCommand):  # type: ignore[misc]
            def run_idl(self, txn: Any) -> None:
                root = next(iter(self.api.tables["Open_vSwitch"].rows.values()))
                for datapath_type, datapath in list(root.datapaths.items()):
                    zones = dict(datapath.ct_zones)
                    for zone, ct_zone in list(zones.items()):
                        if ct_zone.external_ids.get(ZONE_OWNER_KEY) != "true":
                            continue
                        datapath.delkey("ct_zones", zone)
                        for policy in ct_zone.timeout_policy:
                            policy.delete()
                        ct_zone.delete()
                        del zones[zone]
                        removed.append(int(zone))
                    # The Datapath record too, when we made it and nothing else is in it.
                    if not zones and datapath.external_ids.get(ZONE_OWNER_KEY) == "true":
                        root.delkey("datapaths", datapath_type)
                        datapath.delete()

        with self.api.transaction(check_error=True) as txn:
            txn.add(RemoveZoneTimeouts(self.api))
        return sorted(removed)

    def generation(self, bridge: str) -> int | None:
        """The cookie generation of the current agent run (None: no agent ran here yet)."""
        ext = self.api.db_get("Bridge", bridge, "external_ids").execute(check_error=True) or {}
        try:
            return int(ext[GENERATION_KEY])
        except (KeyError, ValueError):
            return None

    def next_generation(self, bridge: str) -> int:
        """A new cookie generation for this agent run, recorded on the bridge (1..65535).

        Each run's flows carry their generation in the cookie, so the next run can tell an
        older agent's flows from its own and delete them after adopting the switch."""
        ext = self.api.db_get("Bridge", bridge, "external_ids").execute(check_error=True) or {}
        try:
            previous = int(ext.get(GENERATION_KEY, "0"))
        except ValueError:
            previous = 0
        generation = previous % 0xFFFF + 1
        self.api.db_set(
            "Bridge", bridge, ("external_ids", {GENERATION_KEY: str(generation)})
        ).execute(check_error=True)
        return generation

    def forget_agent(self, bridge: str) -> list[str]:
        """Remove what agents record on the bridge (``AGENT_KEYS`` of its external_ids);
        returns the keys that were there."""
        ext = self.api.db_get("Bridge", bridge, "external_ids").execute(check_error=True) or {}
        present = [key for key in AGENT_KEYS if key in ext]
        if present:
            self.api.db_remove("Bridge", bridge, "external_ids", *present).execute(check_error=True)
        return present


# -- the group-id registry ------------------------------------------------------------------
GROUP_IDS_KEY = "ovsproxy-group-ids"
# Every key an agent writes to its bridge's external_ids (``OVSDB.forget_agent`` removes them).
AGENT_KEYS = (GENERATION_KEY, GROUP_IDS_KEY)


def encode_id_ranges(ids: Iterable[int]) -> str:
    """``{1, 2, 3, 7}`` -> ``"1-3,7"`` (compact: ids are allocated lowest first)."""
    parts: list[str] = []
    ordered = sorted(set(ids))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


# What a record may hold: OpenFlow's group ids (up to OFPG_MAX), and at most this many (one
# group per Service port with endpoints; far more than a switch holds).
MAX_GROUP_ID = 0xFFFFFF00
MAX_RECORDED_GROUP_IDS = 1 << 20


def decode_id_ranges(text: str, max_ids: int = MAX_RECORDED_GROUP_IDS) -> set[int]:
    """``"1-3,7"`` -> ``{1, 2, 3, 7}``; ValueError for a malformed record, an id past
    ``MAX_GROUP_ID`` or more than ``max_ids`` ids (counted before any is made)."""
    ranges: list[tuple[int, int]] = []
    count = 0
    for part in filter(None, text.split(",")):
        first, sep, last = part.partition("-")
        if not first.isdigit() or (sep and not last.isdigit()) or len(part) > 21:
            raise ValueError(f"bad id range {part[:40]!r}")
        lo, hi = int(first), int(last) if sep else int(first)
        if hi < lo or hi > MAX_GROUP_ID:
            raise ValueError(f"bad id range {part!r}")
        count += hi - lo + 1
        if count > max_ids:
            raise ValueError(f"more than {max_ids:,} ids (at {part!r})")
        ranges.append((lo, hi))
    ids: set[int] = set()
    for lo, hi in ranges:
        ids.update(range(lo, hi + 1))
    return ids


class OVSDBGroupRegistry:
    """Keeps the ids of our groups in the bridge's external_ids, so a restarted agent (or a
    reconnection) knows which groups are ours without listing them over OpenFlow.

    A save never fails the commit that asked for it, nor holds it up while ovsdb-server is
    away: it is written at once when OVSDB is connected, else (or when the write fails) kept
    as ``pending`` and written by a background retry as soon as OVSDB answers again (the
    newest ids win). ``load`` includes what is pending, so this agent never forgets a group
    it installed meanwhile."""

    def __init__(
        self, db: OVSDB, bridge: str, *, retry_initial: float = 0.25, retry_max: float = 5.0
    ) -> None:
        self.db = db
        self.bridge = bridge
        self.retry_initial, self.retry_max = retry_initial, retry_max
        self.pending: set[int] | None = None  # ids not yet written
        self.last_error: str | None = None
        self.failures = 0  # writes that failed (each is retried)
        self._retry: asyncio.Task[None] | None = None

    def _load(self) -> set[int] | None:
        ext = self.db.api.db_get("Bridge", self.bridge, "external_ids").execute(check_error=True)
        text = (ext or {}).get(GROUP_IDS_KEY)
        if text is None:
            return None
        try:
            return decode_id_ranges(text)
        except ValueError as exc:
            # Reported, not fatal: without a record the synchroniser lists the switch instead.
            self.last_error = f"external_ids:{GROUP_IDS_KEY} unreadable: {exc}"
            log.warning("bridge %s: %s", self.bridge, self.last_error)
            return None

    def _save(self, group_ids: set[int]) -> None:
        self.db.api.db_set(
            "Bridge", self.bridge, ("external_ids", {GROUP_IDS_KEY: encode_id_ranges(group_ids)})
        ).execute(check_error=True)

    async def load(self) -> set[int] | None:
        saved = await asyncio.to_thread(self._load)
        if self.pending is not None:
            return (saved or set()) | self.pending
        return saved

    async def save(self, group_ids: set[int]) -> None:
        ids = set(group_ids)
        if self._retry is None and self.db.connected:
            try:
                await asyncio.to_thread(self._save, ids)
                self.last_error = None
                return
            except Exception as exc:
                self._failed(exc)
        self.pending = ids
        if self._retry is None:
            log.warning(
                "OVSDB %s: the group-id registry is kept in memory until ovsdb-server answers",
                self.db.endpoint,
            )
            self._retry = asyncio.get_running_loop().create_task(
                self._write_pending(), name="ovsdb group-id registry"
            )

    def _failed(self, exc: Exception) -> None:
        self.failures += 1
        self.last_error = f"{type(exc).__name__}: {exc}"
        log.warning("OVSDB %s: saving the group-id registry failed: %s", self.db.endpoint, exc)

    async def _write_pending(self) -> None:
        delay = self.retry_initial
        try:
            while self.pending is not None:
                await asyncio.sleep(delay)
                delay = min(self.retry_max, delay * 2)
                if not self.db.connected:
                    continue
                ids = self.pending
                try:
                    await asyncio.to_thread(self._save, ids)
                except Exception as exc:
                    self._failed(exc)
                    continue
                if self.pending is ids:  # (a newer save while writing: write that one too)
                    self.pending = None
                    self.last_error = None
                    log.info("OVSDB %s: group-id registry saved again", self.db.endpoint)
        finally:
            self._retry = None

    async def close(self) -> None:
        """Stop retrying; one last write of pending ids if OVSDB is there."""
        task, self._retry = self._retry, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.pending is not None and self.db.connected:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self._save, self.pending)
                self.pending = None
        if self.pending is not None:
            log.warning(
                "OVSDB %s: group ids %s were not saved (ovsdb-server away)",
                self.db.endpoint,
                encode_id_ranges(self.pending),
            )

    def status(self) -> dict[str, object]:
        return {
            "saved": self.pending is None,
            "failures": self.failures,
            "last_error": self.last_error,
        }
