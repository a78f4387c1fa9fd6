"""Flushing the conntrack entries of removed UDP endpoints and the untranslated entries of new
frontends (OVS userspace datapath included).

A UDP "connection" lives as long as datagrams flow, so a client that keeps its socket would keep
sending into an endpoint that left the Service. As kube-proxy does (``conntrack -D --orig-dst
<service IP> --dst-nat <endpoint IP> -p udp``), after the commit that removed an endpoint the
proxier flushes the entries of that (frontend, endpoint) pair; the client's next datagram is a
new connection and picks a live endpoint.

The same flush, with the frontend itself as the "endpoint", clears a new frontend (any
protocol) of the plain entries committed before it was one (``FlushFilter.untranslated``; the
proxier's ``_frontends_new`` says why a client would otherwise stay lost).

One flush is not enough. Open vSwitch applies the commit to its cached datapath flows only when
its revalidators re-translate them (right after a flow-table change, then every
``max-revalidator`` ms): until then a client's next datagram, a new connection after the flush,
meets the cached flow of its 5-tuple's first packet, which still DNATs to the removed endpoint,
and commits the entry again; it then lives as long as the client sends (a client sending every
few milliseconds hit this in about one removal in five). So every filter is flushed twice: at
once (most clients move on their next datagram), and again once the datapath has been
revalidated, when no cached flow can recreate the entry any more -- whatever the client's rate.
Revalidated means two ``ovs-appctl revalidator/wait`` (the first may end with a round that had
started before the commit; the second ends a round that started after it) when an ``appctl``
runner is given, else ``REVALIDATION_GRACE`` seconds (best effort: two default revalidator
periods). The second flush runs in the background, coalesced across syncs, and skips pairs
that came back meanwhile (``restored``). It is skipped after a commit onto a switch that held
no flow of ours (``again=False``: a cold start, a vswitchd restart): no cached datapath flow
was translated from our pipeline, so none can commit an entry into our zones again (and a
cold start publishes without waiting for two revalidator rounds). The proxier also flushes a
new frontend's untranslated entries once when the switch already served that frontend (an
agent restart: the older agent's flow took every packet to it; ``CommitStats.held_before``).
Cost: two flush messages per removed (frontend, endpoint) pair and two appctl calls per
batch; nothing per unchanged endpoint or Service.

Mechanism, in order of preference:

1. ``NXT_CT_FLUSH`` over our OpenFlow channel (Open vSwitch 3.1+): zone, ``ip_proto``, original
   tuple (dst = frontend IP and port), reply tuple (src = endpoint IP and port). OVS filters the
   zone itself; works for the kernel and the userspace datapath.
2. If the switch refuses it (older OVS answers OFPBRC_BAD_SUBTYPE), and an ``appctl`` runner
   was given: ``ovs-appctl dpctl/dump-conntrack zone=Z``, filter here, and
   ``dpctl/flush-conntrack zone=Z <full original tuple>`` per entry (what OVS < 3.1 accepts).
3. Otherwise: a warning (once), ``mode = "unsupported"`` in the status, and stale UDP entries
   live until their conntrack timeout (30 s idle for unreplied UDP in OVS).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ovsproxy.datapath import pipeline as pl
from ovsproxy.model import IPAddress, IPFamily, Protocol
from ovsproxy.openflow.protocol.ct_flush import CtFlush

log = logging.getLogger(__name__)

AppCtl = Callable[[Sequence[str]], Awaitable[str]]

_UNSUPPORTED = ("BAD_SUBTYPE", "BAD_EXPERIMENTER", "BAD_TYPE", "EOPNOTSUPP")

# Without an appctl runner: how long after a flush the datapath is taken to be revalidated (two
# periods of OVS's default other_config:max-revalidator, 500 ms).
REVALIDATION_GRACE = 1.0
# An appctl call that takes longer than this is given up (the second flush then runs anyway).
APPCTL_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True, order=True)
class FlushFilter:
    """The conntrack entries of traffic to ``frontend:port`` (``protocol``), DNATed to
    ``endpoint:endpoint_port`` (None: to any endpoint, e.g. the frontend went away)."""

    protocol: Protocol
    frontend: IPAddress
    port: int
    endpoint: IPAddress | None = None
    endpoint_port: int = 0

    @classmethod
    def untranslated(cls, protocol: Protocol, frontend: IPAddress, port: int) -> FlushFilter:
        """The entries of ``frontend:port`` that no Service translated (their reply comes
        from the frontend itself): plain connections committed before it was a frontend."""
        return cls(protocol, frontend, port, frontend, port)

    @property
    def family(self) -> IPFamily:
        return IPFamily.of(self.frontend)

    @property
    def zone(self) -> int:
        return pl.ct_zone(self.family)

    def message(self) -> CtFlush:
        reply = (self.endpoint, None, self.endpoint_port, 0)
        return CtFlush(
            self.zone,
            self.protocol.ip_proto,
            orig=(None, self.frontend, 0, self.port),
            reply=reply,
        )

    def matches(self, entry: ConntrackEntry) -> bool:
        if entry.zone != self.zone or entry.proto != self.protocol.ip_proto:
            return False
        if entry.orig_dst != self.frontend or entry.orig_dport != self.port:
            return False
        if self.endpoint is not None and entry.reply_src != self.endpoint:
            return False
        return not self.endpoint_port or entry.reply_sport == self.endpoint_port

    def __str__(self) -> str:
        if self.endpoint == self.frontend and self.endpoint_port == self.port:
            target = "itself (untranslated)"
        elif self.endpoint is None:
            target = "*"
        else:
            target = f"{self.endpoint}:{self.endpoint_port}"
        return f"{self.protocol} {self.frontend}:{self.port} -> {target} (zone {self.zone})"


@dataclass(frozen=True, slots=True)
class ConntrackEntry:
    """One line of ``dpctl/dump-conntrack``."""

    proto: int
    orig_src: IPAddress
    orig_dst: IPAddress
    orig_sport: int
    orig_dport: int
    reply_src: IPAddress
    reply_sport: int
    zone: int

    def flush_tuple(self) -> str:
        """The full original tuple, as ``dpctl/flush-conntrack`` takes it."""
        key = "ct_nw_" if self.orig_src.version == 4 else "ct_ipv6_"
        return (
            f"{key}src={self.orig_src},{key}dst={self.orig_dst},ct_nw_proto={self.proto},"
            f"ct_tp_src={self.orig_sport},ct_tp_dst={self.orig_dport}"
        )


_PROTO_NAMES = {"tcp": 6, "udp": 17, "sctp": 132, "icmp": 1, "icmpv6": 58}
_TUPLE = r"src=([0-9a-fA-F.:]+),dst=([0-9a-fA-F.:]+),sport=(\d+),dport=(\d+)"
_LINE = re.compile(rf"^(\w+),orig=\({_TUPLE}\),reply=\({_TUPLE}\)(.*)$")
_ZONE = re.compile(r"zone=(\d+)")


def parse_dump(text: str) -> list[ConntrackEntry]:
    """Entries with ports (tcp, udp, sctp) of ``ovs-appctl dpctl/dump-conntrack`` output."""
    import ipaddress

    entries = []
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if not m or m.group(1) not in _PROTO_NAMES:
            continue
        zone_m = _ZONE.search(m.group(10))
        entries.append(
            ConntrackEntry(
                proto=_PROTO_NAMES[m.group(1)],
                orig_src=ipaddress.ip_address(m.group(2)),
                orig_dst=ipaddress.ip_address(m.group(3)),
                orig_sport=int(m.group(4)),
                orig_dport=int(m.group(5)),
                reply_src=ipaddress.ip_address(m.group(6)),
                reply_sport=int(m.group(8)),
                zone=int(zone_m.group(1)) if zone_m else 0,
            )
        )
    return entries


@dataclass
class FlushStats:
    mode: str = "openflow"  # "openflow" (NXT_CT_FLUSH), "appctl", "unsupported"
    requests: int = 0  # filters handled
    messages: int = 0  # NXT_CT_FLUSH sent
    appctl_entries: int = 0  # entries flushed one by one through ovs-appctl
    settle_flushes: int = 0  # filters flushed again after the datapath was revalidated
    settle_restored: int = 0  # filters not flushed again: their pair came back meanwhile
    revalidation: str = "appctl"  # how revalidation is awaited: "appctl", or "timed"
    failures: int = 0
    last_error: str = ""
    recent: list[str] = field(default_factory=list)  # the last filters, for the status

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "requests": self.requests,
            "messages": self.messages,
            "appctl_entries": self.appctl_entries,
            "settle_flushes": self.settle_flushes,
            "settle_restored": self.settle_restored,
            "revalidation": self.revalidation,
            "failures": self.failures,
            "last_error": self.last_error,
            "recent": list(self.recent),
        }


class ConntrackFlusher:
    """Flushes conntrack entries by filter, at once and again after revalidation; see the
    module docstring for why and for the fallbacks.

    ``channel`` needs ``send(messages)`` (OpenFlow, raising on an error reply); ``appctl``
    runs ``ovs-appctl`` against the switch's ovs-vswitchd with the given arguments.
    """

    def __init__(
        self,
        channel: Any,
        *,
        appctl: AppCtl | None = None,
        revalidation_grace: float = REVALIDATION_GRACE,
    ) -> None:
        self.channel = channel
        self.appctl = appctl
        self.revalidation_grace = revalidation_grace
        self.stats = FlushStats(revalidation="appctl" if appctl is not None else "timed")
        self._lock = asyncio.Lock()
        # To flush again after revalidation: filter -> when it was queued (a counter).
        self._pending: dict[FlushFilter, int] = {}
        self._queued = 0
        self._settle: asyncio.Task[None] | None = None
        # Told of each flush, per family: (family, seconds, filters applied: 0 when it failed)
        self.on_flushed: Callable[[IPFamily, float, int], None] | None = None

    async def flush(self, filters: Sequence[FlushFilter], *, again: bool = True) -> None:
        """Flush now; unless ``again`` is False, flush again (in the background) once the
        datapath is revalidated."""
        if not filters:
            return
        self.stats.requests += len(filters)
        self.stats.recent = [str(f) for f in filters[-10:]]
        await self._flush_now(filters)
        if self.stats.mode == "unsupported" or not again:
            return
        self._queued += 1
        self._pending.update(dict.fromkeys(filters, self._queued))
        if self._settle is None or self._settle.done():
            self._settle = asyncio.get_running_loop().create_task(
                self._settle_pending(), name="conntrack settle"
            )

    def restored(self, filters: Iterable[FlushFilter]) -> None:
        """These pairs are valid again (an endpoint came back): no second flush for them."""
        if self._pending:
            for f in filters:
                if self._pending.pop(f, None) is not None:
                    self.stats.settle_restored += 1

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def settled(self) -> None:
        """Returns once every flush so far has had its second flush."""
        while self._settle is not None and not self._settle.done():
            await asyncio.shield(self._settle)

    async def close(self) -> None:
        task, self._settle = self._settle, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _settle_pending(self) -> None:
        while self._pending:
            # Each filter was queued after its commit, so a wait that starts now starts after
            # the commits of all of them; those queued during the wait go in the next round.
            waiting = dict(self._pending)
            await self._revalidated()
            batch = [f for f, queued in waiting.items() if self._pending.get(f) == queued]
            for f in batch:
                del self._pending[f]
            if batch:
                self.stats.settle_flushes += len(batch)
                await self._flush_now(batch)

    async def _revalidated(self) -> None:
        if self.appctl is not None and self.stats.revalidation == "appctl":
            try:
                for _ in range(2):
                    await asyncio.wait_for(self.appctl(["revalidator/wait"]), APPCTL_TIMEOUT)
                return
            except Exception as exc:
                self.stats.revalidation = "timed"  # for good: one warning, no retry per batch
                log.warning(
                    "conntrack: ovs-appctl revalidator/wait failed (%s); from now on the "
                    "second flush waits %.1f s instead",
                    str(exc) or type(exc).__name__,
                    self.revalidation_grace,
                )
        await asyncio.sleep(self.revalidation_grace)

    async def _flush_now(self, filters: Sequence[FlushFilter]) -> None:
        async with self._lock:
            started, failures = time.perf_counter(), self.stats.failures
            try:
                await self._flush_locked(filters)
            finally:
                if self.on_flushed is not None:
                    seconds = time.perf_counter() - started
                    applied = self.stats.failures == failures and self.stats.mode != "unsupported"
                    for family, count in Counter(f.family for f in filters).items():
                        self.on_flushed(family, seconds, count if applied else 0)

    async def _flush_locked(self, filters: Sequence[FlushFilter]) -> None:
        if self.stats.mode == "openflow":
            try:
                await self.channel.send([f.message() for f in filters])
                self.stats.messages += len(filters)
                return
            except Exception as exc:
                name = str(getattr(exc, "name", "")) or str(exc)
                if not any(marker in name for marker in _UNSUPPORTED):
                    self._failed(exc)
                    return
                self.stats.mode = "appctl" if self.appctl is not None else "unsupported"
                log.warning(
                    "conntrack: the switch does not take NXT_CT_FLUSH (%s: OVS < 3.1?); %s",
                    name,
                    "falling back to ovs-appctl dpctl/flush-conntrack"
                    if self.appctl is not None
                    else "stale UDP entries of removed endpoints live until they time out",
                )
        if self.stats.mode == "appctl":
            await self._flush_appctl(filters)

    async def _flush_appctl(self, filters: Sequence[FlushFilter]) -> None:
        assert self.appctl is not None
        try:
            for zone in sorted({f.zone for f in filters}):
                dump = await self.appctl(["dpctl/dump-conntrack", f"zone={zone}"])
                for entry in parse_dump(dump):
                    if any(f.matches(entry) for f in filters):
                        await self.appctl(
                            ["dpctl/flush-conntrack", f"zone={zone}", entry.flush_tuple()]
                        )
                        self.stats.appctl_entries += 1
        except Exception as exc:
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        self.stats.failures += 1
        self.stats.last_error = str(exc)
        log.warning("conntrack: flush failed: %s", exc)


def subprocess_appctl(target: str | None = None) -> AppCtl:
    """An ``appctl`` runner: ``ovs-appctl [-t TARGET] ARGS...`` (default: ovs-vswitchd)."""

    async def run(args: Sequence[str]) -> str:
        cmd = ["ovs-appctl", *(["-t", target] if target else []), *args]
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        try:
            out, err = await proc.communicate()
        except asyncio.CancelledError:  # (a timeout): the process goes too
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {err.decode().strip()}")
        return out.decode()

    return run


def vswitchd_appctl(openflow: str) -> AppCtl | None:
    """An ``appctl`` runner for the ovs-vswitchd that serves the OpenFlow endpoint
    ``openflow``, or None when it cannot be found from here (see
    :func:`vswitchd_control_socket`)."""
    ctl = vswitchd_control_socket(openflow)
    return subprocess_appctl(ctl) if ctl else None


def vswitchd_control_socket(openflow: str) -> str | None:
    """The control socket of the ovs-vswitchd that serves the OpenFlow endpoint ``openflow``,
    or None when it cannot be found from here (a ``tcp:`` endpoint, or no control socket). A
    bridge's ``unix:<rundir>/<bridge>.mgmt`` lies in the daemon's run directory, next to its
    control socket: ``ovs-vswitchd.ctl`` (``--unixctl`` as the sandbox names it) or
    ``ovs-vswitchd.<pid>.ctl`` (OVS's default, the pid from its pidfile)."""
    kind, _, path = openflow.partition(":")
    if kind != "unix" or not path:
        return None
    rundir = Path(path).parent
    ctl = rundir / "ovs-vswitchd.ctl"
    if not ctl.exists():
        with contextlib.suppress(OSError, ValueError):
            pid = int((rundir / "ovs-vswitchd.pid").read_text().strip())
            ctl = rundir / f"ovs-vswitchd.{pid}.ctl"
    if not ctl.exists() or not os.access(ctl, os.W_OK):
        return None
    return str(ctl)
