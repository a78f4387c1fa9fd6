"""The asyncio OpenFlow 1.5 channel to Open vSwitch.

One ``Channel`` owns one connection (``unix:PATH`` or ``tcp:HOST:PORT``) and keeps it up:
HELLO negotiation that insists on OpenFlow 1.5, replies matched to requests by xid with
timeouts, echo keepalive with dead-peer detection, barriers, streamed bundles, packet-ins,
reconnection with capped backoff, and wire counters. The codec (``protocol``) does all
encoding; this module only moves bytes.

Readiness: after (re)connecting, the ``on_connected`` hook runs (the datapath replays its
state from it) before anything else may be sent. Until the hook has finished, requests from
outside the hook raise ``ChannelNotReady`` at once instead of queueing, so no change can
overtake the replay and no caller can deadlock waiting for a hook that waits for it.

Errors from the switch are raised as ``OpenFlowError`` (``.name`` like
``OFPET_GROUP_MOD_FAILED/OFPGMFC_GROUP_EXISTS``, the xid and the text of the failed
message); a failed bundle raises ``BundleError`` listing every failing message.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ovsproxy.openflow import protocol as of

log = logging.getLogger(__name__)

# The session whose on_connected hook is running in this context (see Channel._check_ready).
_HOOK_SESSION: contextvars.ContextVar[object | None] = contextvars.ContextVar(
    "ovsproxy_openflow_hook_session", default=None
)
_WRITE_CHUNK = 256 * 1024  # bundle adds are written in chunks of about this size
_DRAIN_EVERY = 256 * 1024  # and the loop given a turn (and flow control) this often


# -- errors ---------------------------------------------------------------------------------


class ChannelError(Exception):
    """Base of the channel's own failures (not errors reported by the switch)."""


class ConnectionLost(ChannelError):
    """The connection closed (or was found dead) while a request was in flight."""


class ChannelNotReady(ChannelError):
    """Not connected, or the on_connected hook has not finished: retry later."""


class VersionMismatch(ChannelError):
    """The switch does not allow OpenFlow 1.5 on this bridge."""


class RequestTimeout(ChannelError, TimeoutError):
    """No reply within the timeout."""


class OpenFlowError(Exception):
    """An OFPT_ERROR from the switch, decoded.

    ``name`` is ``TYPE/CODE`` (e.g. ``OFPET_GROUP_MOD_FAILED/OFPGMFC_GROUP_EXISTS``),
    ``xid`` the transaction id, ``request`` the text of the message that failed (when the
    channel knows it), ``message`` that message itself, and ``error`` the decoded ``of.Error``.
    """

    def __init__(
        self,
        error: of.Error,
        xid: int,
        request: str | None = None,
        message: of.Message | None = None,
    ) -> None:
        self.error = error
        self.xid = xid
        self.message = message
        self.name = error.name
        self.code_name = error.code_name
        self.request = request
        text = f"{error.name} (xid={xid:#x})"
        if request:
            text += f": {request}"
        super().__init__(text)


class BundleError(OpenFlowError):
    """A bundle was refused; nothing from it was applied (it was discarded).

    ``failures`` lists an ``OpenFlowError`` for each message the switch rejected (usually
    one), ``error`` is the first of them (or the bundle-level error if none was reported).
    """

    def __init__(
        self,
        bundle_id: int,
        error: of.Error,
        xid: int,
        failures: Sequence[OpenFlowError],
        stage: str,
    ) -> None:
        self.bundle_id = bundle_id
        self.failures = list(failures)
        self.stage = stage
        first = self.failures[0] if self.failures else None
        super().__init__(
            first.error if first else error,
            first.xid if first else xid,
            first.request if first else f"bundle {bundle_id:#x} {stage}",
        )
        more = f" (+{len(self.failures) - 1} more)" if len(self.failures) > 1 else ""
        self.args = (f"bundle {bundle_id:#x} failed at {stage}: {self.args[0]}{more}",)


# -- endpoint and counters ------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """``unix:PATH`` or ``tcp:HOST:PORT`` (``tcp:[v6addr]:PORT`` for IPv6)."""

    kind: str
    path: str = ""
    host: str = ""
    port: int = 0

    @classmethod
    def parse(cls, text: str) -> Endpoint:
        kind, _, rest = text.partition(":")
        if kind == "unix" and rest:
            return cls("unix", path=rest)
        if kind == "tcp" and rest:
            host, _, port = rest.rpartition(":")
            host = host.strip("[]")
            if host and port.isdigit():
                return cls("tcp", host=host, port=int(port))
        raise ValueError(f"bad OpenFlow endpoint {text!r}: use unix:PATH or tcp:HOST:PORT")

    def __str__(self) -> str:
        if self.kind == "unix":
            return f"unix:{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tcp:{host}:{self.port}"


class WireCounters:
    """Messages and bytes sent and received, by message kind (``FLOW_MOD``...).

    ``sent``/``received`` map kind -> [messages, bytes]; ``bundled`` counts the messages
    carried inside BUNDLE_ADD by their own kind. ``snapshot()`` is a plain dict.
    """

    def __init__(self) -> None:
        self.sent: dict[str, list[int]] = {}
        self.received: dict[str, list[int]] = {}
        self.bundled: dict[str, list[int]] = {}

    @staticmethod
    def _add(table: dict[str, list[int]], kind: str, messages: int, size: int) -> None:
        row = table.get(kind)
        if row is None:
            table[kind] = [messages, size]
        else:
            row[0] += messages
            row[1] += size

    def count_sent(self, kind: str, size: int, messages: int = 1) -> None:
        self._add(self.sent, kind, messages, size)

    def count_received(self, kind: str, size: int) -> None:
        self._add(self.received, kind, 1, size)

    def count_bundled(self, kind: str, size: int, messages: int = 1) -> None:
        self._add(self.bundled, kind, messages, size)

    def snapshot(self) -> dict[str, dict[str, dict[str, int]]]:
        return {
            name: {k: {"messages": v[0], "bytes": v[1]} for k, v in table.items()}
            for name, table in (
                ("sent", self.sent),
                ("received", self.received),
                ("bundled", self.bundled),
            )
        }

    def total(self, direction: str = "sent") -> tuple[int, int]:
        table = self.sent if direction == "sent" else self.received
        return sum(v[0] for v in table.values()), sum(v[1] for v in table.values())


# -- the connection (asyncio protocol) -------------------------------------------------------


@dataclass
class _Pending:
    future: asyncio.Future[Any]
    request: of.Message | None
    conn: _Connection | None = None
    parts: list[of.Message] = field(default_factory=list)  # multipart replies so far


class _Connection(asyncio.Protocol):
    """One transport: frames received bytes into messages and hands them to the channel."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.parser = of.Parser()
        self.transport: asyncio.Transport | None = None
        self.closed = asyncio.get_running_loop().create_future()
        self._can_write = asyncio.Event()
        self._can_write.set()
        self.last_receive = time.monotonic()
        self.hello: asyncio.Future[of.Hello] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        # Bigger buffers: a full sync writes tens of megabytes.
        self.transport.set_write_buffer_limits(high=1024 * 1024)  # type: ignore[union-attr]

    def data_received(self, data: bytes) -> None:
        self.last_receive = time.monotonic()
        self.parser.feed(data)
        try:
            for raw in self.parser:
                self.channel._on_message(self, raw)
        except of.OpenFlowDecodeError as exc:
            log.error(
                "openflow: unframeable data from the switch (%s); dropping the connection", exc
            )
            self.abort(ConnectionLost(f"garbage from the switch: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self._can_write.set()
        if not self.closed.done():
            self.closed.set_result(exc)
        if not self.hello.done():
            self.hello.set_exception(ConnectionLost("connection closed during the handshake"))
        self.channel._on_connection_lost(self, exc)

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    async def drain(self) -> None:
        if self.transport is None or self.transport.is_closing():
            raise ConnectionLost("connection closed")
        # Yield even when not paused: the loop must run to push buffered bytes to the
        # socket (so the switch works while we encode) and to read its errors.
        await asyncio.sleep(0)
        await self._can_write.wait()
        if self.transport.is_closing():
            raise ConnectionLost("connection closed")

    def write(self, data: bytes) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            raise ConnectionLost("connection closed")
        transport.write(data)

    def abort(self, reason: Exception | None = None) -> None:
        if self.transport is not None:
            self.transport.abort()


# -- bundles ------------------------------------------------------------------------------------


class Bundle:
    """An OpenFlow bundle being streamed. Get one from ``Channel.bundle()``::

        async with channel.bundle() as bundle:
            for msg in messages:
                bundle.add(msg)          # buffered; written in chunks, no round trip
                ...
            await bundle.drain()         # now and then, for flow control
        # leaving the block closes and commits (atomic, ordered), or discards on error

    Errors the switch reports for any message of the bundle (at add time or at commit)
    are collected by xid and raised as one ``BundleError`` naming the failing messages;
    the bundle is then discarded, so nothing from it is installed.
    """

    def __init__(self, channel: Channel, conn: _Connection, bundle_id: int, flags: int) -> None:
        self.channel = channel
        self.conn = conn
        self.bundle_id = bundle_id
        self.flags = flags
        self.messages: dict[int, of.Message] = {}  # xid -> message, to name failures
        self.errors: list[OpenFlowError] = []
        self.state = "open"
        self._chunk: list[bytes] = []
        self._chunk_size = 0
        self._since_drain = 0
        self._inner: dict[int, list[int]] = {}  # msg_type -> [messages, bytes], counted at commit
        self._open_future: asyncio.Future[Any] | None = None

    def __len__(self) -> int:
        return len(self.messages)

    def _start(self) -> None:
        # The OPEN is pipelined: its reply (or error) is checked at commit time.
        self._open_future = self.channel._send_request(
            of.BundleCtrl(self.bundle_id, of.BundleCtrlType.OPEN_REQUEST, self.flags),
            conn=self.conn,
        )

    def add(self, msg: of.Message) -> int:
        """Adds a FLOW_MOD, GROUP_MOD or PACKET_OUT (buffered; returns its xid)."""
        if self.state != "open":
            raise ChannelError(f"bundle {self.bundle_id:#x} is {self.state}")
        xid = self.channel._new_xid()
        data = of.encode_bundle_add(self.bundle_id, msg, xid, self.flags)
        self.messages[xid] = msg
        self._tally(msg.msg_type, len(data))
        self._chunk.append(data)
        self._chunk_size += len(data)
        if self._chunk_size >= _WRITE_CHUNK:
            self._flush()
        return xid

    def add_encoded(self, inner: bytes, msg: of.Message | None = None) -> int:
        """Adds an already-encoded message (its xid is rewritten to the bundle add's)."""
        if self.state != "open":
            raise ChannelError(f"bundle {self.bundle_id:#x} is {self.state}")
        xid = self.channel._new_xid()
        data = of.bundle_add(self.bundle_id, inner, xid, self.flags)
        if msg is not None:
            self.messages[xid] = msg
        else:
            self.messages[xid] = of.decode(inner)
        self._tally(inner[1], len(data))
        self._chunk.append(data)
        self._chunk_size += len(data)
        if self._chunk_size >= _WRITE_CHUNK:
            self._flush()
        return xid

    async def add_all(self, messages: Iterable[of.Message]) -> None:
        """Adds every message, draining the transport as it goes (OVS works meanwhile)."""
        for msg in messages:
            self.add(msg)
            if self._since_drain >= _DRAIN_EVERY:
                await self.drain()

    def _flush(self) -> None:
        if not self._chunk:
            return
        data = b"".join(self._chunk)
        n = len(self._chunk)
        self._chunk = []
        self._chunk_size = 0
        self._since_drain += len(data)
        self.conn.write(data)
        self.channel.counters.count_sent("BUNDLE_ADD_MESSAGE", len(data), n)

    async def drain(self) -> None:
        """Writes what is buffered and waits until the transport can take more."""
        self._flush()
        self._since_drain = 0
        await self.conn.drain()

    def _tally(self, msg_type: int, added: int) -> None:
        row = self._inner.get(msg_type)
        if row is None:
            row = self._inner[msg_type] = [0, 0]
        row[0] += 1
        row[1] += added - of.BUNDLE_ADD_HEADER_LEN

    def _count_inner(self) -> None:
        # Tallied per type as messages were added: a loop over 120,000 messages here took
        # 0.1 s after the commit reply of a full sync.
        counters = self.channel.counters
        for msg_type, (messages, size) in self._inner.items():
            counters.count_bundled(of.message_kind(msg_type), size, messages)

    async def commit(self, timeout: float | None = None) -> None:
        """Closes and commits. Raises ``BundleError`` (after discarding) if anything failed."""
        if self.state != "open":
            raise ChannelError(f"bundle {self.bundle_id:#x} is {self.state}")
        self.state = "committing"
        channel = self.channel
        timeout = channel.bundle_timeout if timeout is None else timeout
        try:
            await self.drain()
            assert self._open_future is not None
            # CLOSE's reply comes after every add was processed, so every add error is in.
            close = channel._send_request(
                of.BundleCtrl(self.bundle_id, of.BundleCtrlType.CLOSE_REQUEST, self.flags),
                conn=self.conn,
            )
            try:
                await channel._await(self._open_future, timeout, "bundle open")
                await channel._await(close, timeout, "bundle close")
            except OpenFlowError as exc:
                await self._discard_quietly()
                raise self._failure(exc, "open/close") from None
            if self.errors:
                await self._discard_quietly()
                raise self._failure(None, "add")
            commit = channel._send_request(
                of.BundleCtrl(self.bundle_id, of.BundleCtrlType.COMMIT_REQUEST, self.flags),
                conn=self.conn,
            )
            try:
                await channel._await(commit, timeout, "bundle commit")
            except OpenFlowError as exc:
                # Open vSwitch has already discarded the bundle (it always does at commit).
                raise self._failure(exc, "commit") from None
            self._count_inner()
            self.state = "committed"
        finally:
            if self.state != "committed":
                self.state = "failed"
            channel._bundles.pop(self.bundle_id, None)

    async def discard(self) -> None:
        if self.state in ("committed", "discarded"):
            return
        self.state = "discarding"
        try:
            self._chunk.clear()
            self._chunk_size = 0
            await self._discard_quietly()
        finally:
            self.state = "discarded"
            self.channel._bundles.pop(self.bundle_id, None)

    async def _discard_quietly(self) -> None:
        with contextlib.suppress(ChannelError, OpenFlowError, TimeoutError):
            future = self.channel._send_request(
                of.BundleCtrl(self.bundle_id, of.BundleCtrlType.DISCARD_REQUEST, self.flags),
                conn=self.conn,
            )
            await self.channel._await(future, self.channel.request_timeout, "bundle discard")

    def _failure(self, error: OpenFlowError | None, stage: str) -> BundleError:
        base = error.error if error else self.errors[0].error
        xid = error.xid if error else self.errors[0].xid
        return BundleError(self.bundle_id, base, xid, self.errors, stage)

    def _record_error(self, xid: int, error: of.Error) -> None:
        msg = self.messages.get(xid)
        text = of.to_text(msg) if msg is not None else None
        self.errors.append(OpenFlowError(error, xid, text, msg))

    async def __aenter__(self) -> Bundle:
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            await self.commit()
        else:
            await self.discard()


# -- the channel ---------------------------------------------------------------------------------


class Channel:
    """A self-healing OpenFlow 1.5 connection to one bridge.

    ``on_connected`` (async, no arguments) runs after every (re)connection, before anyone
    else may send; ``on_packet_in`` (sync) gets each PACKET_IN, which also go to the
    bounded ``packet_ins`` queue (oldest dropped when full).
    """

    def __init__(
        self,
        endpoint: str | Endpoint,
        *,
        on_connected: Callable[[], Awaitable[None]] | None = None,
        on_packet_in: Callable[[of.PacketIn], None] | None = None,
        request_timeout: float = 10.0,
        bundle_timeout: float = 120.0,
        connect_timeout: float = 5.0,
        echo_interval: float = 5.0,
        echo_timeout: float = 15.0,
        backoff_min: float = 0.05,
        backoff_max: float = 2.0,
        packet_in_queue: int = 1024,
        miss_send_len: int = 0xFFFF,
    ) -> None:
        self.endpoint = endpoint if isinstance(endpoint, Endpoint) else Endpoint.parse(endpoint)
        self.on_connected = on_connected
        self.on_packet_in = on_packet_in
        self.request_timeout = request_timeout
        self.bundle_timeout = bundle_timeout
        self.connect_timeout = connect_timeout
        self.echo_interval = echo_interval
        self.echo_timeout = echo_timeout
        self.backoff_min = backoff_min
        self.backoff_max = backoff_max
        self.miss_send_len = miss_send_len
        self.counters = WireCounters()
        self.packet_ins: asyncio.Queue[of.PacketIn] = asyncio.Queue(packet_in_queue)
        self.packet_ins_dropped = 0
        self.datapath_id: int | None = None
        self.connections = 0  # successful handshakes so far
        self.last_error: BaseException | None = None
        self.unsolicited_errors: deque[OpenFlowError] = deque(maxlen=100)
        self._conn: _Connection | None = None
        self._ready = False
        self._session: object | None = None
        self._ready_event = asyncio.Event()
        self._pending: dict[int, _Pending] = {}
        self._bundles: dict[int, Bundle] = {}
        self._xids = itertools.count(1)
        self._bundle_ids = itertools.count(1)
        self._task: asyncio.Task[None] | None = None
        self._echo_task: asyncio.Task[None] | None = None
        self._closing = False
        self._fatal: BaseException | None = None

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """Connected, handshake done and the on_connected hook finished."""
        return self._ready

    async def start(self, wait: bool = True, timeout: float | None = None) -> None:
        """Starts the connect/reconnect loop; with ``wait``, returns once ready (raising
        ``VersionMismatch`` at once if the bridge does not allow OpenFlow 1.5)."""
        if self._task is None:
            self._closing = False
            self._task = asyncio.create_task(self._run(), name=f"openflow {self.endpoint}")
        if wait:
            await self.wait_ready(timeout if timeout is not None else self.connect_timeout * 2)

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Waits until connected and the hook has run (don't call it from inside the hook)."""

        async def wait() -> None:
            while not self._ready:
                if self._fatal is not None:
                    raise self._fatal
                self._ready_event.clear()
                if self._ready:
                    return
                await self._ready_event.wait()

        try:
            await asyncio.wait_for(wait(), timeout)
        except TimeoutError:
            raise ChannelNotReady(
                f"{self.endpoint}: not connected after {timeout}s"
                + (f" (last error: {self.last_error})" if self.last_error else "")
            ) from None

    async def close(self) -> None:
        self._closing = True
        task, self._task = self._task, None
        conn = self._conn
        if conn is not None:
            conn.abort()
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def __aenter__(self) -> Channel:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _run(self) -> None:
        backoff = self.backoff_min
        while not self._closing:
            try:
                conn = await self._connect()
                backoff = self.backoff_min
                await conn.closed
            except asyncio.CancelledError:
                raise
            except VersionMismatch as exc:
                # Fatal for waiters (the bridge must be reconfigured); keep retrying slowly.
                self.last_error = self._fatal = exc
                log.error("openflow: %s", exc)
                self._ready_event.set()
                backoff = self.backoff_max
            except Exception as exc:  # any failure means: reconnect later
                self.last_error = exc
                log.warning("openflow: %s: %s; reconnecting in %.2fs", self.endpoint, exc, backoff)
            finally:
                self._set_not_ready()
            if self._closing:
                break
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.backoff_max)

    def _set_not_ready(self) -> None:
        self._ready = False
        self._session = None
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.abort()
        if self._echo_task is not None:
            self._echo_task.cancel()
            self._echo_task = None

    async def _open_transport(self) -> _Connection:
        loop = asyncio.get_running_loop()
        ep = self.endpoint
        if ep.kind == "unix":
            _, conn = await loop.create_unix_connection(lambda: _Connection(self), ep.path)
        else:
            _, conn = await loop.create_connection(lambda: _Connection(self), ep.host, ep.port)
        return conn

    async def _connect(self) -> _Connection:
        conn = await asyncio.wait_for(self._open_transport(), self.connect_timeout)
        self._conn = conn
        session = object()
        self._session = session
        try:
            await self._handshake(conn)
        except BaseException:
            conn.abort()
            raise
        self.connections += 1
        self._fatal = None
        self.last_error = None
        self._echo_task = asyncio.create_task(self._keepalive(conn), name="openflow echo")
        log.info("openflow: connected to %s (dpid %016x)", self.endpoint, self.datapath_id or 0)
        if self.on_connected is not None:
            token = _HOOK_SESSION.set(session)
            try:
                await self.on_connected()
            except Exception as exc:
                log.error("openflow: on_connected hook failed: %s; reconnecting", exc)
                conn.abort()
                raise
            finally:
                _HOOK_SESSION.reset(token)
        if self._conn is conn and not conn.closed.done():
            self._ready = True
            self._ready_event.set()
        return conn

    async def _handshake(self, conn: _Connection) -> None:
        xid = self._new_xid()
        data = of.encode(of.Hello([of.OFP_VERSION]), xid)
        conn.write(data)
        self.counters.count_sent("HELLO", len(data))
        hello = await asyncio.wait_for(conn.hello, self.connect_timeout)
        if of.OFP_VERSION not in hello.versions:
            allowed = ", ".join(of.constants.VERSION_NAMES.get(v, str(v)) for v in hello.versions)
            raise VersionMismatch(
                f"{self.endpoint}: the bridge does not allow OpenFlow 1.5 (it offers {allowed}); "
                "set protocols=OpenFlow15 on the bridge, e.g. "
                "`ovs-vsctl set bridge br0 protocols=OpenFlow13,OpenFlow15`"
            )
        # A management (service) connection gets packet-ins only with a nonzero
        # miss_send_len; NXT_PACKET_IN2 carries the controller action's userdata.
        self._write_now(conn, of.SetConfig(0, self.miss_send_len))
        self._write_now(conn, of.SetPacketInFormat(of.constants.NXPIF_NXT_PACKET_IN2))
        features = self._send_request(of.FeaturesRequest(), conn=conn)
        reply = await self._await(features, self.connect_timeout, "features request")
        self.datapath_id = reply.datapath_id
        await self._await(
            self._send_request(of.BarrierRequest(), conn=conn), self.connect_timeout, "barrier"
        )

    async def _keepalive(self, conn: _Connection) -> None:
        """Echo when the line is quiet; a peer silent for echo_timeout is dead."""
        try:
            while not conn.closed.done():
                await asyncio.sleep(self.echo_interval)
                if time.monotonic() - conn.last_receive < self.echo_interval:
                    continue
                future = self._send_request(of.EchoRequest(b"ovsproxy"), conn=conn)
                deadline = time.monotonic() + self.echo_timeout
                while not future.done():
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(asyncio.shield(future), min(remaining, 1.0))
                    # Anything received (e.g. replies behind a long bundle) proves liveness.
                    if time.monotonic() - conn.last_receive < self.echo_timeout:
                        deadline = max(deadline, conn.last_receive + self.echo_timeout)
                if not future.done():
                    log.warning(
                        "openflow: %s silent for %.1fs: dead peer, reconnecting",
                        self.endpoint,
                        self.echo_timeout,
                    )
                    future.cancel()
                    conn.abort()
                    return
                with contextlib.suppress(Exception):
                    future.result()
        except asyncio.CancelledError:
            pass

    # -- sending -------------------------------------------------------------------------------

    def _new_xid(self) -> int:
        xid = next(self._xids) & 0xFFFFFFFF
        if xid == 0:
            xid = next(self._xids) & 0xFFFFFFFF
        return xid

    def _check_ready(self) -> _Connection:
        conn = self._conn
        if (
            conn is None
            or (not self._ready and _HOOK_SESSION.get() is not self._session)
            or self._session is None
        ):
            raise ChannelNotReady(
                f"{self.endpoint}: not connected"
                + ("" if conn is None else " (replay in progress)")
            )
        return conn

    def _write_now(self, conn: _Connection, msg: of.Message) -> int:
        xid = self._new_xid()
        data = msg.encode(xid)
        conn.write(data)
        self.counters.count_sent(of.message_kind(msg.msg_type), len(data))
        return xid

    def _send_request(self, msg: of.Message, *, conn: _Connection) -> asyncio.Future[Any]:
        xid = self._new_xid()
        data = msg.encode(xid)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[xid] = _Pending(future, msg, conn)
        future.add_done_callback(lambda _f, xid=xid: self._pending.pop(xid, None))
        conn.write(data)
        self.counters.count_sent(of.message_kind(msg.msg_type), len(data))
        return future

    async def _await(self, future: asyncio.Future[Any], timeout: float | None, what: str) -> Any:
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError:
            future.cancel()
            raise RequestTimeout(f"{self.endpoint}: no reply to {what} within {timeout}s") from None

    async def request(self, msg: of.Message, timeout: float | None = None) -> Any:
        """Sends a message that has a reply and returns the reply (for multipart requests,
        the list of reply messages). A switch error is raised as ``OpenFlowError``."""
        conn = self._check_ready()
        future = self._send_request(msg, conn=conn)
        return await self._await(
            future, timeout or self.request_timeout, of.message_kind(msg.msg_type)
        )

    async def barrier(self, timeout: float | None = None) -> None:
        """Waits until the switch has processed everything sent before."""
        await self.request(of.BarrierRequest(), timeout)

    async def echo(self, data: bytes = b"", timeout: float | None = None) -> float:
        """Round-trip time of an echo, in seconds."""
        started = time.monotonic()
        await self.request(of.EchoRequest(data), timeout)
        return time.monotonic() - started

    async def send(self, messages: Iterable[of.Message], timeout: float | None = None) -> None:
        """Sends messages (no bundle), then a barrier; raises the first error reported for
        any of them as ``OpenFlowError`` (messages after a failed one were still applied)."""
        conn = self._check_ready()
        futures = []
        for msg in messages:
            xid = self._new_xid()
            data = msg.encode(xid)
            future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            self._pending[xid] = _Pending(future, msg, conn)
            futures.append((xid, future))
            conn.write(data)
            self.counters.count_sent(of.message_kind(msg.msg_type), len(data))
        await conn.drain()
        try:
            await self.request(of.BarrierRequest(), timeout)
        finally:
            errors = []
            for xid, future in futures:
                self._pending.pop(xid, None)
                if future.done() and future.exception() is not None:
                    errors.append(future.exception())
                future.cancel()
        if errors:
            raise errors[0]

    def bundle(self, flags: int = of.BundleFlags.ATOMIC | of.BundleFlags.ORDERED) -> Bundle:
        """A new bundle on the current connection (see ``Bundle``)."""
        conn = self._check_ready()
        bundle_id = next(self._bundle_ids) & 0xFFFFFFFF
        bundle = Bundle(self, conn, bundle_id, int(flags))
        self._bundles[bundle_id] = bundle
        bundle._start()
        return bundle

    async def commit_bundle(self, messages: Sequence[of.Message]) -> None:
        """Sends the messages as one atomic, ordered bundle; raises on any error (then
        nothing from the bundle is applied). Empty: nothing is sent."""
        if not messages:
            return
        bundle = self.bundle()
        try:
            await bundle.add_all(messages)
        except BaseException:
            await bundle.discard()
            raise
        await bundle.commit()

    async def dump_flows(
        self,
        table_id: int = of.OFPTT_ALL,
        *,
        cookie: int = 0,
        cookie_mask: int = 0,
        match: of.Match | None = None,
        timeout: float | None = None,
    ) -> list[of.FlowDesc]:
        """Installed flows (FLOW_DESC), each with its flow as an ADD ``FlowMod``."""
        request = of.FlowDescRequest(table_id, cookie=cookie, cookie_mask=cookie_mask, match=match)
        replies = await self.request(request, timeout or self.bundle_timeout)
        return [flow for reply in replies for flow in reply.flows]

    async def dump_groups(
        self,
        group_id: int = of.OFPG_ALL,
        *,
        max_buckets: int = 1000,
        timeout: float | None = None,
    ) -> list[of.GroupMod]:
        """Installed groups (GROUP_DESC) as ADD ``GroupMod`` values.

        Open vSwitch (3.1) cannot describe a group whose GROUP_DESC entry exceeds 64 KB
        (about 1,000 service buckets): it overflows the 16-bit lengths and corrupts the
        stream. So the group stats are read first and groups with more than
        ``max_buckets`` buckets are refused with ``ChannelError``; use ``group_stats`` or
        ``group_ids`` for those.
        """
        timeout = timeout or self.bundle_timeout
        big = [
            s
            for s in await self.group_stats(group_id, timeout=timeout)
            if s.n_buckets > max_buckets
        ]
        if big:
            listed = ", ".join(f"{s.group_id} ({s.n_buckets} buckets)" for s in big[:5])
            raise ChannelError(
                f"cannot dump groups over {max_buckets} buckets through OpenFlow "
                f"(Open vSwitch overflows GROUP_DESC lengths): {listed}"
            )
        replies = await self.request(of.GroupDescRequest(group_id), timeout)
        return [group for reply in replies for group in reply.groups]

    async def group_stats(
        self, group_id: int = of.OFPG_ALL, *, timeout: float | None = None
    ) -> list[of.GroupStats]:
        """Installed groups' statistics (GROUP_STATS): ids, bucket counts, counters."""
        replies = await self.request(of.GroupStatsRequest(group_id), timeout or self.bundle_timeout)
        return [stats for reply in replies for stats in reply.stats]

    async def group_ids(self) -> set[int]:
        """Ids of every installed group (from GROUP_STATS: safe for big groups)."""
        return {s.group_id for s in await self.group_stats()}

    async def flow_cookies(self, cookie: int, mask: int) -> list[int]:
        return [f.flow.cookie for f in await self.dump_flows(cookie=cookie, cookie_mask=mask)]

    # -- receiving ------------------------------------------------------------------------------

    def _on_message(self, conn: _Connection, raw: bytes) -> None:
        msg_type = raw[1]
        if raw[0] != of.OFP_VERSION and msg_type not in (of.MsgType.HELLO, of.MsgType.ERROR):
            # Only a desynchronized stream gets here (e.g. a reply whose 16-bit length
            # overflowed): nothing after it can be framed reliably.
            log.error(
                "openflow: %s: stream out of sync (version %#x); reconnecting",
                self.endpoint,
                raw[0],
            )
            conn.abort()
            return
        kind = of.message_kind(msg_type)
        self.counters.count_received(kind, len(raw))
        xid = int.from_bytes(raw[4:8], "big")
        if msg_type == of.MsgType.ECHO_REQUEST:
            data = bytearray(raw)
            data[1] = of.MsgType.ECHO_REPLY
            conn.write(bytes(data))
            self.counters.count_sent("ECHO_REPLY", len(data))
            return
        try:
            msg = of.decode(raw)
        except of.OpenFlowDecodeError as exc:
            pending = self._pending.get(xid)
            if pending is not None and not pending.future.done():
                pending.future.set_exception(ChannelError(f"undecodable reply: {exc}"))
            else:
                log.debug("openflow: ignoring %s message: %s", kind, exc)
            return
        if msg_type == of.MsgType.HELLO:
            if not conn.hello.done():
                conn.hello.set_result(msg)
            return
        if msg_type == of.MsgType.ERROR:
            self._on_error(conn, xid, msg)
            return
        if isinstance(msg, of.PacketIn):
            self._on_packet_in(msg)
            return
        pending = self._pending.get(xid)
        if pending is None or pending.future.done():
            return
        if msg_type == of.MsgType.MULTIPART_REPLY:
            pending.parts.append(msg)
            if not getattr(msg, "more", False):
                pending.future.set_result(pending.parts)
            return
        pending.future.set_result(msg)

    def _on_error(self, conn: _Connection, xid: int, error: of.Error) -> None:
        if error.type == of.constants.OFPET_HELLO_FAILED and not conn.hello.done():
            conn.hello.set_exception(
                VersionMismatch(
                    f"{self.endpoint}: the switch refused the OpenFlow 1.5 hello "
                    f"({error.code_name}); set protocols=OpenFlow15 on the bridge"
                )
            )
            return
        pending = self._pending.get(xid)
        if pending is not None and not pending.future.done():
            text = of.to_text(pending.request) if pending.request is not None else None
            pending.future.set_exception(OpenFlowError(error, xid, text))
            return
        for bundle in self._bundles.values():
            if xid in bundle.messages:
                bundle._record_error(xid, error)
                return
        failure = OpenFlowError(error, xid)
        self.unsolicited_errors.append(failure)
        log.warning("openflow: error for an unknown request: %s", failure)

    def _on_packet_in(self, msg: of.PacketIn) -> None:
        if self.on_packet_in is not None:
            try:
                self.on_packet_in(msg)
            except Exception:  # a faulty callback must not kill the connection
                log.exception("openflow: packet-in callback failed")
        if self.packet_ins.full():
            self.packet_ins.get_nowait()
            self.packet_ins_dropped += 1
        self.packet_ins.put_nowait(msg)

    def _on_connection_lost(self, conn: _Connection, exc: Exception | None) -> None:
        if conn is self._conn:
            self._ready = False
        reason = ConnectionLost(f"{self.endpoint}: connection lost" + (f" ({exc})" if exc else ""))
        for xid, pending in list(self._pending.items()):
            if pending.conn is conn:
                del self._pending[xid]
                if not pending.future.done():
                    pending.future.set_exception(reason)
        for bundle_id, bundle in list(self._bundles.items()):
            if bundle.conn is conn:
                bundle.state = "lost"
                del self._bundles[bundle_id]
