"""The asyncio driver of an OpenFlow 1.5 connection to Open vSwitch.

One ``Channel`` owns one connection (``unix:PATH`` or ``tcp:HOST:PORT``) and keeps it up. The
protocol — handshake, xid matching, multipart reassembly, the bundle sequence (OPEN, CLOSE,
COMMIT or DISCARD) with its error attribution, and the keepalive decisions — is the sans-I/O
``openflow.session.Session``; this module only moves bytes, runs the session's timer, turns
its events into futures (one per request, one per bundle commit) and reconnects with capped
backoff (a unix socket is watched meanwhile: a restarted switch is tried within
``SOCKET_POLL``).

Readiness: after (re)connecting, the ``on_connected`` hook runs (the datapath replays its
state from it) before anything else may be sent. Until the hook has finished, requests from
outside the hook raise ``ChannelNotReady`` at once instead of queueing, so no change can
overtake the replay and no caller can deadlock waiting for a hook that waits for it.

Errors from the switch are raised as ``OpenFlowError`` (``.name`` like
``OFPET_GROUP_MOD_FAILED/OFPGMFC_GROUP_EXISTS``, the xid and the text of the failed
message); a failed bundle raises ``BundleError`` listing every failing message. The
exceptions live in ``openflow.errors``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import errno
import functools
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, cast

from ovsproxy.openflow import protocol as of
from ovsproxy.openflow import session as ses
from ovsproxy.openflow.counters import WireCounters
from ovsproxy.openflow.errors import (
    BundleError,
    ChannelError,
    ChannelNotReady,
    ConnectionLost,
    OpenFlowError,
    RequestTimeout,
    VersionMismatch,
)

__all__ = [
    "Bundle",
    "BundleError",
    "Channel",
    "ChannelError",
    "ChannelNotReady",
    "ConnectionLost",
    "Endpoint",
    "OpenFlowError",
    "RequestTimeout",
    "VersionMismatch",
    "WireCounters",
]

log = logging.getLogger(__name__)

# The session whose on_connected hook is running in this context (see Channel._check_ready).
_HOOK_SESSION: contextvars.ContextVar[object | None] = contextvars.ContextVar(
    "ovsproxy_openflow_hook_session", default=None
)
_WRITE_CHUNK = 256 * 1024  # bundle adds are written in chunks of about this size
_DRAIN_EVERY = 256 * 1024  # and the loop given a turn (and flow control) this often
# Bytes written but not yet taken by the switch before the connection is dropped: every writer
# that streams drains at the transport's 1 MiB high-water mark, so only a switch that stops
# reading (while it still sends, e.g. echo requests we answer) gets near this.
MAX_WRITE_BUFFER = 256 << 20
_RETRY_LOG_EVERY = 30.0  # while the endpoint stays unreachable, a reminder this often
# Between attempts, a unix endpoint's socket file is checked this often for a new one (a
# restarted switch): reconnection follows within this, whatever the backoff has grown to.
SOCKET_POLL = 0.1


def _socket_identity(path: str) -> tuple[int, int] | None:
    """(inode, change time) of the socket file, None while there is none. A killed switch
    leaves its socket behind; the restarted one unlinks it and binds a new one."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_ctime_ns


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


def describe_connect_error(endpoint: Endpoint, exc: BaseException) -> str:
    """What a failed connection attempt means, for an operator (socket and error)."""
    where = f"socket {endpoint.path}" if endpoint.kind == "unix" else str(endpoint)
    if isinstance(exc, FileNotFoundError):
        return (
            f"{endpoint}: the {where} does not exist (is ovs-vswitchd running, "
            f"and is the bridge created?) [{exc.strerror}]"
        )
    if isinstance(exc, ConnectionRefusedError):
        return f"{endpoint}: nothing accepts connections on the {where} (is ovs-vswitchd running?)"
    if isinstance(exc, PermissionError):
        return f"{endpoint}: permission denied on the {where} (run as root or fix its mode)"
    if isinstance(exc, TimeoutError) and not isinstance(exc, ChannelError):
        return f"{endpoint}: connecting timed out"
    if isinstance(exc, OSError) and exc.errno is not None:
        name = errno.errorcode.get(exc.errno, str(exc.errno))
        return f"{endpoint}: cannot connect to the {where}: {exc.strerror} ({name})"
    text = str(exc) or type(exc).__name__
    return text if text.startswith(str(endpoint)) else f"{endpoint}: {text}"


# -- the transport ----------------------------------------------------------------------------

# The kernel's send buffer for the connection: a full sync's bundle is streamed while it is
# built, by synchronous code that cannot wait for the socket (``SwitchSync`` writes it while the
# owners are staged), so the kernel should take what Open vSwitch has not read yet instead of
# the transport queueing it until the loop runs again.
SEND_BUFFER = 32 * 1024 * 1024
_SO_SNDBUFFORCE = getattr(socket, "SO_SNDBUFFORCE", 32)  # Linux: past net.core.wmem_max


def _grow_send_buffer(sock: Any) -> None:
    """SO_SNDBUFFORCE where allowed (CAP_NET_ADMIN), else SO_SNDBUF (capped by the kernel at
    net.core.wmem_max); never smaller than the kernel's default."""
    try:
        current = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        if current >= SEND_BUFFER:
            return
        try:
            sock.setsockopt(socket.SOL_SOCKET, _SO_SNDBUFFORCE, SEND_BUFFER)
        except OSError:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
    except OSError as exc:  # not a socket option this transport has: keep the default
        log.debug("openflow: send buffer left as it is: %s", exc)


class _Connection(asyncio.Protocol):
    """One transport: feeds the session, writes what it queues, runs its timer."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.session = ses.Session(
            str(channel.endpoint),
            channel.counters,
            miss_send_len=channel.miss_send_len,
            connect_timeout=channel.connect_timeout,
            echo_interval=channel.echo_interval,
            echo_timeout=channel.echo_timeout,
            max_reply_bytes=channel.max_reply_bytes,
        )
        loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.futures: dict[int, asyncio.Future[Any]] = {}
        self.bundle_futures: dict[int, asyncio.Future[None]] = {}  # by bundle id
        self.closed: asyncio.Future[ChannelError] = loop.create_future()
        self.handshake: asyncio.Future[int] = loop.create_future()
        # Retrieved even when nobody waits any more (e.g. closing during the handshake).
        self.handshake.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._can_write = asyncio.Event()
        self._can_write.set()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")

    # -- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # typeshed types this BaseTransport; a stream connection always gets a Transport.
        stream = cast(asyncio.Transport, transport)
        self.transport = stream
        # Bigger buffers: a full sync writes tens of megabytes.
        stream.set_write_buffer_limits(high=1024 * 1024)
        sock = stream.get_extra_info("socket")
        if sock is not None:
            _grow_send_buffer(sock)
        self.session.connection_made(time.monotonic())
        self.flush()
        self._schedule()

    def data_received(self, data: bytes) -> None:
        events = self.session.receive_data(data, time.monotonic())
        if events:
            self.channel._on_events(self, events)
        if self.transport is not None and not self.transport.is_closing():
            self.flush()  # echo replies, the handshake's next step
            self._schedule()

    def connection_lost(self, exc: Exception | None) -> None:
        self._can_write.set()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        events = self.session.connection_lost(time.monotonic(), exc)
        self.channel._on_events(self, events)
        # anything the session did not know of
        for future in [*self.futures.values(), *self.bundle_futures.values()]:
            if not future.done():
                future.set_exception(ConnectionLost(f"{self.channel.endpoint}: connection lost"))
        if not self.closed.done():
            lost = next((e.error for e in events if isinstance(e, ses.Closed)), None)
            self.closed.set_result(lost or ConnectionLost(f"{self.channel.endpoint}: closed"))
        if not self.handshake.done():
            self.handshake.set_exception(ConnectionLost(f"{self.channel.endpoint}: closed"))

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    # -- the session's timer --------------------------------------------------------------

    def _schedule(self) -> None:
        deadline = self.session.next_deadline()
        if deadline >= self._timer_at:
            return  # the timer fires first; poll() then finds nothing due and reschedules
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = deadline
        if deadline == float("inf"):
            self._timer = None
            return
        delay = max(0.0, deadline - time.monotonic())
        self._timer = asyncio.get_running_loop().call_later(delay, self._poll)

    def _poll(self) -> None:
        self._timer, self._timer_at = None, float("inf")
        events = self.session.poll(time.monotonic())
        if events:
            self.channel._on_events(self, events)
        if self.transport is not None and not self.transport.is_closing():
            self.flush()
            self._schedule()

    # -- writing --------------------------------------------------------------------------

    def flush(self) -> int:
        """Writes what the session queued; returns the number of bytes."""
        data = self.session.data_to_send()
        if data:
            self.write(data)
        return len(data)

    def _closed_error(self) -> ConnectionLost:
        """How the connection ended (the session's account once it knows), to raise."""
        lost = self.session.lost  # a new exception each time: raised in many tasks
        return ConnectionLost(str(lost or f"{self.channel.endpoint}: connection closed"))

    def write(self, data: bytes) -> None:
        transport = self.transport
        if transport is None:
            raise self._closed_error()
        if transport.is_closing():
            # Dropped: asyncio calls connection_lost once a closing transport is done, and the
            # session then fails every request outstanding, saying how the connection ended.
            return
        unsent = transport.get_write_buffer_size()
        limit = self.channel.max_write_buffer
        if unsent + len(data) > limit and unsent > 0:
            # (one write larger than the limit into an empty buffer is the caller's: it drains)
            self.abort(
                f"the switch is not reading: {unsent:,} bytes written are not taken "
                f"(limit {limit:,}); dropping the connection"
            )
            return
        transport.write(data)

    async def drain(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            await self._raise_closed()
        # Yield even when not paused: the loop must run to push buffered bytes to the
        # socket (so the switch works while we encode) and to read its errors.
        await asyncio.sleep(0)
        await self._can_write.wait()
        if transport.is_closing():
            await self._raise_closed()

    async def _raise_closed(self) -> NoReturn:
        # A closing transport calls connection_lost within a loop turn or two: wait for it,
        # so the error says how the connection ended (reset, closed, dropped by us and why).
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.closed), 1.0)
        raise self._closed_error()

    def abort(self, reason: str | None = None) -> None:
        """Drops the connection at once (``reason``: why, for the session's report)."""
        if reason is not None:
            self.session.close(reason, time.monotonic())
        if self.transport is not None:
            self.transport.abort()

    # -- requests -------------------------------------------------------------------------

    def request(self, msg: of.Message) -> asyncio.Future[Any]:
        """Sends a request; the future gets its reply (or error)."""
        xid = self.session.request(msg)
        future = self._future(xid)
        self.flush()
        return future

    def bundle_future(self, bundle_id: int) -> asyncio.Future[None]:
        """The outcome of committing bundle ``bundle_id`` (``BundleCommitted`` or
        ``BundleFailed`` from the session)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.bundle_futures[bundle_id] = future
        future.add_done_callback(lambda _: self.bundle_futures.pop(bundle_id, None))
        return future

    def _future(self, xid: int) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.futures[xid] = future
        future.add_done_callback(functools.partial(self._forget, xid))
        return future

    def _forget(self, xid: int, _future: object = None) -> None:
        self.futures.pop(xid, None)
        self.session.forget(xid)


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

    def __init__(self, channel: Channel, conn: _Connection, flags: int) -> None:
        self.channel = channel
        self.conn = conn
        session = conn.session
        self._session = session
        # The OPEN is pipelined: its reply (or error) is checked at commit time. It is not
        # written yet: a small bundle goes out as one write, OPEN, adds and CLOSE (each write
        # wakes the switch, and on a busy machine each wake-up costs a scheduling delay).
        self._state = session.open_bundle(flags)
        self._since_drain = 0

    @property
    def bundle_id(self) -> int:
        return self._state.bundle_id

    @property
    def flags(self) -> int:
        return self._state.flags

    @property
    def state(self) -> ses.BundleStatus:
        return self._state.state

    @property
    def messages(self) -> Mapping[int, of.Message]:
        """xid -> message, to name failures."""
        return self._state.messages

    @property
    def errors(self) -> list[OpenFlowError]:
        return self._state.errors

    def __len__(self) -> int:
        return len(self._state.messages)

    def add(self, msg: of.Message) -> int:
        """Adds a FLOW_MOD, GROUP_MOD or PACKET_OUT (buffered; returns its xid)."""
        session = self._session
        xid = session.bundle_add(self._state, msg)
        if session.pending_output >= _WRITE_CHUNK:
            self._since_drain += self.conn.flush()
        return xid

    def add_bodies(self, msg_type: int, bodies: Sequence[bytes]) -> None:
        """Adds one message per body (a ``msg_type`` message's encoding without its header,
        e.g. ``FlowMod.wire``): the bulk path, no object per message. The bundle keeps
        ``bodies`` until it ends (do not change the list)."""
        session = self._session
        session.bundle_add_bodies(self._state, msg_type, bodies)
        if session.pending_output >= _WRITE_CHUNK:
            self._since_drain += self.conn.flush()

    @property
    def backlog(self) -> int:
        """Bytes added but not yet taken by the socket (buffered here or in the transport)."""
        transport = self.conn.transport
        buffered = transport.get_write_buffer_size() if transport is not None else 0
        return buffered + self._session.pending_output

    async def add_all(self, messages: Iterable[of.Message]) -> None:
        """Adds every message, draining the transport as it goes (OVS works meanwhile)."""
        for msg in messages:
            self.add(msg)
            if self._since_drain >= _DRAIN_EVERY:
                await self.drain()

    async def drain(self) -> None:
        """Writes what is buffered and waits until the transport can take more."""
        self.conn.flush()
        self._since_drain = 0
        await self.conn.drain()

    async def commit(self, timeout: float | None = None) -> None:
        """Closes and commits (the session runs CLOSE -> COMMIT, or DISCARD when anything
        failed). Raises ``BundleError`` (the switch then holds nothing from it) if anything
        failed, ``ConnectionLost`` if the connection closed first."""
        channel = self.channel
        timeout = channel.bundle_timeout if timeout is None else timeout
        # Queued behind what is buffered and written with it (one write).
        self._session.commit_bundle(self._state)
        outcome = self.conn.bundle_future(self._state.bundle_id)
        self.conn.flush()
        self._since_drain = 0
        try:
            await channel._await(outcome, timeout, f"the commit of bundle {self.bundle_id:#x}")
        finally:
            outcome.cancel()  # (no-op once done) nothing waits for it any more
            self._give_up()  # after a timeout or a cancellation (no-op once it has ended)

    async def discard(self) -> None:
        """Throws the bundle away (nothing from it is applied); no-op once it has ended."""
        self._give_up()

    def _give_up(self) -> None:
        self._session.discard_bundle(self._state)
        with contextlib.suppress(ChannelError):
            self.conn.flush()

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
        max_write_buffer: int = MAX_WRITE_BUFFER,
        max_reply_bytes: int = ses.MAX_REPLY_BYTES,
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
        self.max_write_buffer = max_write_buffer
        self.max_reply_bytes = max_reply_bytes
        self.counters = WireCounters()
        self.packet_ins: asyncio.Queue[of.PacketIn] = asyncio.Queue(packet_in_queue)
        self.packet_ins_dropped = 0
        self.datapath_id: int | None = None
        self.connections = 0  # successful handshakes so far
        self.failed_attempts = 0  # connection attempts that failed since the last success
        self.last_error: BaseException | None = None
        self.unsolicited_errors: deque[OpenFlowError] = deque(maxlen=100)
        self._conn: _Connection | None = None
        self._ready = False
        self._session: object | None = None
        self._ready_event = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._fatal: BaseException | None = None
        self._failing_since: float | None = None
        self._failure_logged: tuple[str, float] | None = None  # text, when

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
            last = self.last_error
            raise ChannelNotReady(
                f"{self.endpoint}: not connected after {timeout}s"
                + (f" (last error: {describe_connect_error(self.endpoint, last)})" if last else "")
            ) from None

    async def close(self) -> None:
        self._closing = True
        task, self._task = self._task, None
        conn = self._conn
        if conn is not None:
            conn.abort("the channel was closed")
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
            # The socket as this attempt finds it: a later one is a new switch (_wait_retry).
            socket_identity = (
                _socket_identity(self.endpoint.path) if self.endpoint.kind == "unix" else None
            )
            try:
                conn = await self._connect()
                backoff = self.backoff_min
                lost = await conn.closed
                if not self._closing:
                    self.last_error = lost
                    log.warning("openflow: %s; reconnecting", lost)
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
                self._log_failure(exc, backoff)
            finally:
                self._set_not_ready()
            if self._closing:
                break
            if await self._wait_retry(backoff, socket_identity):
                backoff = self.backoff_min  # a new switch: retry briskly again
            else:
                backoff = min(backoff * 2, self.backoff_max)

    async def _wait_retry(self, delay: float, seen: tuple[int, int] | None) -> bool:
        """Sleep ``delay`` before the next attempt. A unix socket is watched meanwhile: a
        restarted ovs-vswitchd creates its bridge's socket anew, and the attempt is made
        within SOCKET_POLL of that, not after a backoff that has grown while it was away.
        True when the wait ended for a new socket."""
        if self.endpoint.kind != "unix":
            await asyncio.sleep(delay)
            return False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + delay
        while (left := deadline - loop.time()) > 0:
            await asyncio.sleep(min(left, SOCKET_POLL))
            now = _socket_identity(self.endpoint.path)
            if now is not None and now != seen:
                return True
        return False

    def _log_failure(self, exc: Exception, backoff: float) -> None:
        """One warning when attempts start failing or the reason changes, then a reminder
        every _RETRY_LOG_EVERY seconds (a missing switch must not flood the log)."""
        self.failed_attempts += 1
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
        text = describe_connect_error(self.endpoint, exc)
        logged = self._failure_logged
        if logged is None or logged[0] != text:
            log.warning(
                "openflow: %s; retrying in %.2fs (backoff up to %.1fs)",
                text,
                backoff,
                self.backoff_max,
            )
        elif now - logged[1] >= _RETRY_LOG_EVERY:
            log.warning(
                "openflow: still not connected after %d attempts in %.0fs: %s; retrying every "
                "%.1fs",
                self.failed_attempts,
                now - self._failing_since,
                text,
                self.backoff_max,
            )
        else:
            log.debug("openflow: %s; retrying in %.2fs", text, backoff)
            return
        self._failure_logged = (text, now)

    def _set_not_ready(self) -> None:
        self._ready = False
        self._session = None
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.abort()

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
        session = conn.session
        self._session = session
        try:
            # The session times each handshake step out (connect_timeout) by itself.
            self.datapath_id = await conn.handshake
        except BaseException:
            conn.abort("the handshake failed")
            raise
        self.connections += 1
        after = f" after {self.failed_attempts} failed attempts" if self.failed_attempts else ""
        self.failed_attempts = 0
        self._failing_since = self._failure_logged = None
        self._fatal = None
        self.last_error = None
        log.info(
            "openflow: connected to %s (dpid %016x)%s", self.endpoint, self.datapath_id or 0, after
        )
        if self.on_connected is not None:
            token = _HOOK_SESSION.set(session)
            try:
                await self.on_connected()
            except Exception as exc:
                log.error("openflow: on_connected hook failed: %s; reconnecting", exc)
                conn.abort(f"the on_connected hook failed: {exc}")
                raise
            finally:
                _HOOK_SESSION.reset(token)
        if self._conn is conn and not conn.closed.done():
            self._ready = True
            self._ready_event.set()
        return conn

    # -- sending -------------------------------------------------------------------------------

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
        future = conn.request(msg)
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
        session = conn.session
        futures: list[tuple[int, asyncio.Future[Any]]] = []
        loop = asyncio.get_running_loop()
        try:
            for msg in messages:
                xid = session.send(msg)
                future: asyncio.Future[Any] = loop.create_future()
                conn.futures[xid] = future
                futures.append((xid, future))
            conn.flush()
            await conn.drain()
            await self.request(of.BarrierRequest(), timeout)
        finally:
            errors: list[BaseException] = []
            for xid, future in futures:
                conn.futures.pop(xid, None)
                session.forget(xid)
                error = future.exception() if future.done() else None
                if error is not None:
                    errors.append(error)
                future.cancel()
        if errors:
            raise errors[0]

    def bundle(self, flags: int = of.BundleFlags.ATOMIC | of.BundleFlags.ORDERED) -> Bundle:
        """A new bundle on the current connection (see ``Bundle``)."""
        return Bundle(self, self._check_ready(), int(flags))

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
        replies = await self._flow_descs(table_id, cookie, cookie_mask, match, timeout)
        return [flow for reply in replies for flow in reply.flows]

    async def _flow_descs(
        self,
        table_id: int,
        cookie: int,
        cookie_mask: int,
        match: of.Match | None,
        timeout: float | None,
    ) -> list[of.FlowDescReply]:
        """The FLOW_DESC replies (their flows decoded only when read)."""
        request = of.FlowDescRequest(table_id, cookie=cookie, cookie_mask=cookie_mask, match=match)
        replies: list[of.FlowDescReply] = await self.request(
            request, timeout or self.bundle_timeout
        )
        return replies

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
        """The cookies of the installed flows that match ``cookie``/``mask`` (a FLOW_DESC
        dump of which only the cookies are decoded)."""
        replies = await self._flow_descs(of.OFPTT_ALL, cookie, mask, None, None)
        return [c for reply in replies for c in reply.cookies]

    async def flow_keys(self, cookie: int, mask: int) -> list[tuple[int, bytes]]:
        """(cookie, key) of the installed flows that match ``cookie``/``mask``: the key is
        the flow's table, priority and match as bytes (``FlowDescReply.keyed_cookies``)."""
        replies = await self._flow_descs(of.OFPTT_ALL, cookie, mask, None, None)
        return [pair for reply in replies for pair in reply.keyed_cookies]

    # -- receiving ------------------------------------------------------------------------------

    def _on_events(self, conn: _Connection, events: list[ses.Event]) -> None:
        """Turns the session's events into future results, callbacks and logs."""
        futures = conn.futures
        for event in events:
            match event:
                case ses.Reply(xid, reply):
                    future = futures.get(xid)
                    if future is not None and not future.done():
                        future.set_result(reply)
                case ses.RequestFailed(xid, error):
                    future = futures.get(xid)
                    if future is not None and not future.done():
                        future.set_exception(error)
                case ses.BundleCommitted(bundle_id):
                    outcome = conn.bundle_futures.get(bundle_id)
                    if outcome is not None and not outcome.done():
                        outcome.set_result(None)
                case ses.BundleFailed(bundle_id, error):
                    outcome = conn.bundle_futures.get(bundle_id)
                    if outcome is not None and not outcome.done():
                        outcome.set_exception(error)
                case ses.PacketInReceived(message):
                    self._on_packet_in(message)
                case ses.Ready(datapath_id):
                    if not conn.handshake.done():
                        conn.handshake.set_result(datapath_id)
                case ses.HandshakeFailed(error):
                    if not conn.handshake.done():
                        conn.handshake.set_exception(error)
                case ses.UnsolicitedError(failure):
                    self.unsolicited_errors.append(failure)
                    log.warning("openflow: error for an unknown request: %s", failure)
                case ses.MustClose():
                    # Logged once, as the reason the connection ended (by _run or _connect).
                    if conn.transport is not None:
                        conn.transport.abort()
                case ses.Closed():
                    if conn is self._conn:
                        self._ready = False

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
