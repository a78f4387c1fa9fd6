"""A small bounded HTTP/1.x server for the agent's endpoints (health, metrics, /status, the
healthCheckNodePorts): one request per connection, answered and closed.

Every input is bounded, so a hostile neighbour on the node's address can cost the agent at most
a fixed number of descriptors and a fixed amount of memory and time:

* a cap on open connections per ``ConnectionBudget``; at the cap, a new connection evicts the
  oldest one still reading its request of the client address with the most open (a pod that
  trickles requests loses its own places, not a kubelet probe's, which sends its request at
  once from the node's address);
* one deadline for the whole request (request line and headers), however it is trickled;
* bounded request line, header size and header count: answered 414 or 431, never a traceback;
* a deadline for writing the answer;
* a bad request is answered with its status; an error in a handler is a 500 and one log line,
  and repeated log lines are rate-limited (``RateLimitedLog``).

Imports nothing of ovsproxy (bottom layer).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import resource
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

REASONS = {
    200: "OK",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    414: "URI Too Long",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


# The kernel's queue of connections not yet accepted (capped by net.core.somaxconn): long
# enough that a probe's handshake is not dropped while a flood of connections waits.
LISTEN_BACKLOG = 4096
# asyncio accepts up to this many connections per wake-up, and the cap sees each one a few
# loop iterations later (its transport is made by a task, then connection_made is called
# soon; an evicted one is closed soon after): one listener holds at most about
# max_connections + 4 x ACCEPT_BATCH descriptors (bench http-hostile reports the most held).
ACCEPT_BATCH = 128


@dataclass(frozen=True, slots=True)
class Limits:
    """What one connection may cost."""

    max_connections: int = 64  # per budget (a server, or a set of servers sharing one)
    request_timeout: float = 5.0  # the whole request: line and headers
    write_timeout: float = 30.0  # the whole answer
    max_request_line: int = 4096
    max_header_bytes: int = 16384  # all header lines together
    max_headers: int = 64


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str  # without the query
    headers: dict[str, str]  # names lower-cased


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()


def text_response(status: int, text: str) -> Response:
    return Response(status, text.encode())


Handler = Callable[[Request], Awaitable[Response]]


class RequestError(Exception):
    """A request refused before it reached the handler, with the status it is answered."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


class RateLimitedLog:
    """One warning per ``interval`` per kind; the lines dropped meanwhile are counted and
    reported with the next one, so a flood of bad clients cannot flood the log."""

    def __init__(self, logger: logging.Logger, interval: float = 10.0) -> None:
        self.logger = logger
        self.interval = interval
        self._last: dict[str, float] = {}
        self._dropped: dict[str, int] = {}

    def emit(self, kind: str, message: str, *args: object) -> None:
        now = time.monotonic()
        last = self._last.get(kind)
        if last is not None and now - last < self.interval:
            self._dropped[kind] = self._dropped.get(kind, 0) + 1
            return
        self._last[kind] = now
        dropped = self._dropped.pop(kind, 0)
        suffix = f" ({dropped} more like it not logged)" if dropped else ""
        self.logger.warning(message + suffix, *args)


@dataclass(slots=True)
class _Connection:
    transport: asyncio.WriteTransport
    source: str  # the client's address
    reading: bool = True  # still sending its request (only those are evicted)


@dataclass
class ConnectionBudget:
    """The connections open on one or more servers, oldest first, and what they cost so far.

    At the cap, the connection evicted is the oldest still reading of the source with the
    most connections open: one client address (a pod) flooding the port evicts its own, not a
    kubelet's probe from the node's address.

    ``counters``: accepted, evicted (at the cap, still reading), refused (at the cap, none
    reading), timeouts, rejected (bad requests), errors (handler failures)."""

    limits: Limits = field(default_factory=Limits)
    log: RateLimitedLog = field(default_factory=lambda: RateLimitedLog(log))
    # In the order accepted; the transport is aborted on eviction (a task cancelled before it
    # ran never closes it).
    _open: dict[asyncio.Task[None], _Connection] = field(default_factory=dict)
    _per_source: dict[str, int] = field(default_factory=dict)
    counters: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            ("accepted", "evicted", "refused", "timeouts", "rejected", "errors"), 0
        )
    )

    @property
    def open(self) -> int:
        return len(self._open)

    def _victim(self) -> asyncio.Task[None] | None:
        """The oldest connection still reading of the source with the most open."""
        best: asyncio.Task[None] | None = None
        most = 0
        for task, conn in self._open.items():
            if conn.reading and self._per_source[conn.source] > most:
                best, most = task, self._per_source[conn.source]
        return best

    def admit(self, task: asyncio.Task[None], transport: asyncio.WriteTransport) -> bool:
        """Count ``task``'s connection; at the cap, evict one (``_victim``), or, when every
        open one is being answered, refuse this one (False)."""
        self.counters["accepted"] += 1
        peer = transport.get_extra_info("peername")
        source = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        if len(self._open) >= self.limits.max_connections:
            victim = self._victim()
            if victim is None:
                self.counters["refused"] += 1
                self.log.emit(
                    "refused",
                    "HTTP: %d connections open (the cap), all being answered: one refused",
                    self.limits.max_connections,
                )
                return False
            victim_conn = self._open[victim]
            self.release(victim)
            victim_conn.transport.abort()
            victim.cancel()
            self.counters["evicted"] += 1
            self.log.emit(
                "evicted",
                "HTTP: %d connections open (the cap): the oldest one still sending its request, "
                "of the client address with the most (%s), was closed",
                self.limits.max_connections,
                victim_conn.source,
            )
        self._open[task] = _Connection(transport, source)
        self._per_source[source] = self._per_source.get(source, 0) + 1
        return True

    def answering(self, task: asyncio.Task[None]) -> None:
        conn = self._open.get(task)
        if conn is not None:
            conn.reading = False

    def release(self, task: asyncio.Task[None]) -> None:
        conn = self._open.pop(task, None)
        if conn is not None:
            left = self._per_source[conn.source] - 1
            if left:
                self._per_source[conn.source] = left
            else:
                del self._per_source[conn.source]


async def read_request(reader: asyncio.StreamReader, limits: Limits) -> Request:
    """The request line and headers, within ``limits`` (the caller applies the deadline).
    The reader's own limit must be at least ``max_request_line`` and ``max_header_bytes``."""
    try:
        line = await reader.readline()
    except ValueError:  # longer than the reader's limit: no newline in sight
        raise RequestError(414, "request line too long") from None
    if len(line) > limits.max_request_line:
        raise RequestError(414, "request line too long")
    if not line:  # connected and closed, as a TCP health check does: nothing to answer
        raise ConnectionResetError("closed before a request")
    parts = line.decode("latin-1").split()
    if not parts:
        raise RequestError(400, "no request line")
    if len(parts) not in (2, 3) or not parts[1].startswith("/"):
        raise RequestError(400, "malformed request line")
    method, target = parts[0], parts[1]
    headers: dict[str, str] = {}
    total = 0
    count = 0
    while True:
        try:
            line = await reader.readline()
        except ValueError:
            raise RequestError(431, "header too long") from None
        if line in (b"\r\n", b"\n"):
            break
        if not line:
            raise RequestError(400, "connection closed within the headers")
        total += len(line)
        count += 1
        if total > limits.max_header_bytes or count > limits.max_headers:
            raise RequestError(431, "headers too large")
        name, sep, value = line.decode("latin-1").partition(":")
        if not sep:
            raise RequestError(400, "malformed header")
        headers[name.strip().lower()] = value.strip()
    return Request(method, target.split("?", 1)[0], headers)


def encode_response(response: Response) -> bytes:
    reason = REASONS.get(response.status, "")
    lines = [
        f"HTTP/1.1 {response.status} {reason}",
        f"Content-Type: {response.content_type}",
        *(f"{name}: {value}" for name, value in response.headers),
        f"Content-Length: {len(response.body)}",
        "Connection: close",
        "",
        "",
    ]
    return "\r\n".join(lines).encode("latin-1") + response.body


def host_is_local_name(host_header: str | None) -> bool:
    """A Host header a DNS-rebinding page cannot send: none (HTTP/1.0), an IP literal or
    ``localhost``. A rebinding attack needs a DNS name of its own in the browser's Host."""
    if host_header is None:
        return True
    host = host_header.strip()
    if host.startswith("["):  # [v6]:port
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    if host.lower() == "localhost":
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class HTTPServer:
    """Serves ``handler`` on one or more listening sockets within ``budget``."""

    def __init__(self, handler: Handler, budget: ConnectionBudget) -> None:
        self.handler = handler
        self.budget = budget
        self.servers: list[asyncio.Server] = []

    @property
    def _reader_limit(self) -> int:
        limits = self.budget.limits
        return max(limits.max_request_line, limits.max_header_bytes)

    async def listen(self, host: str | None, port: int) -> int:
        """Listen on ``host``:``port`` (None: every address); returns the port (``port`` 0:
        the kernel's pick)."""
        sock = listening_socket(host, port)
        try:
            await self.listen_socket(sock)
        except BaseException:
            sock.close()
            raise
        return int(sock.getsockname()[1])

    async def listen_socket(self, sock: socket.socket) -> None:
        """Serve on a listening socket made by ``listening_socket`` (in another network
        namespace, say)."""
        server = await asyncio.start_server(
            self._connected, sock=sock, limit=self._reader_limit, backlog=ACCEPT_BATCH
        )
        # asyncio listens with the batch size it accepts at once; the kernel's queue is longer
        sock.listen(LISTEN_BACKLOG)
        self.servers.append(server)

    async def close(self) -> None:
        for server in self.servers:
            server.close()
        for server in self.servers:
            with contextlib.suppress(Exception):
                await server.wait_closed()
        self.servers = []

    def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # A task per connection, created here so that the budget can cancel it.
        task = asyncio.get_running_loop().create_task(self._serve(reader, writer))
        if not self.budget.admit(task, writer.transport):
            task.cancel()
            writer.transport.abort()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        budget = self.budget
        limits = budget.limits
        task = asyncio.current_task()
        assert task is not None
        response: Response | None = None
        answered = False
        refused = False  # answered before the whole request was read
        try:
            try:
                async with asyncio.timeout(limits.request_timeout):
                    request = await read_request(reader, limits)
            except TimeoutError:
                budget.counters["timeouts"] += 1
                response = text_response(408, "request not received in time\n")
            except RequestError as exc:
                budget.counters["rejected"] += 1
                budget.log.emit(
                    f"bad-{exc.status}", "HTTP: answered %d to a client: %s", exc.status, exc
                )
                response = text_response(exc.status, f"{exc}\n")
                refused = True
            if response is None:
                # only a request read whole is safe from eviction (an early answer's lingering
                # is not)
                budget.answering(task)
                try:
                    response = await self.handler(request)
                except Exception as exc:
                    budget.counters["errors"] += 1
                    budget.log.emit(
                        "handler", "HTTP: %s failed: %s: %s", request.path, type(exc).__name__, exc
                    )
                    response = text_response(500, "internal error\n")
            async with asyncio.timeout(limits.write_timeout):
                writer.write(encode_response(response))
                await writer.drain()
            answered = True
            if refused:
                await _discard_input(reader, writer)
        except (TimeoutError, ConnectionError, asyncio.CancelledError):
            pass  # a client that went away, or did not read its answer in time, or evicted
        except Exception as exc:  # never a traceback per request
            budget.counters["errors"] += 1
            budget.log.emit("serve", "HTTP: %s: %s", type(exc).__name__, exc)
        finally:
            budget.release(task)
            if answered:
                writer.close()
            else:  # nothing worth flushing to a client that was too slow or was evicted
                writer.transport.abort()


LINGER_SECONDS = 1.0
LINGER_BYTES = 256 * 1024


async def _discard_input(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """After an early answer, read (bounded) what the client is still sending: closing with
    unread input resets the connection, and the reset can overtake the answer."""
    with contextlib.suppress(OSError, RuntimeError):
        writer.write_eof()
    left = LINGER_BYTES
    with contextlib.suppress(TimeoutError, OSError, ValueError):
        async with asyncio.timeout(LINGER_SECONDS):
            while left > 0 and (chunk := await reader.read(min(left, 65536))):
                left -= len(chunk)


def listening_socket(host: str | None, port: int) -> socket.socket:
    """A TCP listening socket on ``host`` (None: every address; both families where the
    kernel has IPv6), as asyncio's start_server would open it."""
    if host is None:
        try:
            sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            host = "::"
        except OSError:  # no IPv6 in this kernel
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            host = "0.0.0.0"
    else:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def raise_open_files_limit() -> tuple[int, int]:
    """Raise this process's soft limit on open descriptors to its hard limit (as Go's runtime
    does at start); returns (soft, hard) after. Failing to is logged, not fatal."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-files limit from %d to %d: %s", soft, hard, exc)
    return soft, hard
