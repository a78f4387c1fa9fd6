"""Real clients for tests and the demo, run inside a network namespace.

``python -m ovsproxy.ovs.traffic http URL --count 60`` opens a new TCP connection per request
(so every request is a new conntrack entry and a new select-group choice) and prints one JSON
object: counts per answering pod, failures by kind, and latencies. ``--duration`` sends
continuously instead (for restart tests). ``udp HOST PORT`` does the same with datagrams, on one
socket (one conntrack entry) unless ``--new-socket``. ``bound HOST PORT --source-ports P,Q``
sends one HTTP/1.0 request from each bound source port in turn and prints ``{port: seconds or
error kind}``: the server closes first, so the endpoint holds each 4-tuple in TIME_WAIT (the
TIME_WAIT collision tests reuse those 4-tuples).

Every failed request is reported with its 5-tuple (``proto``, ``src``, ``source_port``, ``dst``,
``dport``), its phase and timing (``failed_requests``), so the rig can look that connection up
(``ovsproxy.lab.evidence``). The default TCP timeout, 2.5 s, leaves room for one retransmitted
SYN (Linux resends it after 1 s); a request that needed a retransmission (its connect took
>= 0.9 s, or the kernel's TCP_INFO counts a retransmitted segment) is counted in
``retransmitted`` and listed in ``retransmitted_requests``: not a failure, not hidden.

From Python, :func:`run_in_netns` runs the same client in a namespace, on a thread of this
process, and returns its result.
"""

from __future__ import annotations

import argparse
import collections
import errno
import http.client
import json
import socket
import struct
import sys
import threading
import time
import urllib.parse
from typing import Any, NamedTuple

from ovsproxy.netns import enter_netns

# Time for one TCP retransmission: a lost SYN is sent again after 1 s (the initial RTO).
TCP_TIMEOUT_S = 2.5
# A connect this slow waited for a retransmitted SYN (or SYN-ACK): counted, not a failure.
RETRANSMITTED_CONNECT_S = 0.9
_TCP_INFO_LEN = 104  # struct tcp_info up to tcpi_total_retrans (linux/tcp.h)


def _error_kind(exc: BaseException) -> str:
    if isinstance(exc, RequestFailed):
        exc = exc.cause
    if isinstance(exc, ConnectionRefusedError):
        return "refused"
    if isinstance(exc, TimeoutError | socket.timeout):
        return "timeout"
    if isinstance(exc, ConnectionResetError):
        return "reset"
    if isinstance(exc, OSError) and exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return "unreachable"
    code = exc.errno if type(exc) is OSError else None
    if code is not None and code in errno.errorcode:
        return errno.errorcode[code]  # e.g. EADDRINUSE, not a bare "OSError"
    return type(exc).__name__


class RequestFailed(Exception):
    """A request that failed, with where it was: ``phase`` ("connect" or "response"), the
    client's source port (0 before it had one) and the CLOCK_MONOTONIC time it started;
    ``source`` is the client's address (empty before it had one), ``tcp`` its socket's
    TCP_INFO at the failure (state, retransmissions; empty for UDP)."""

    def __init__(
        self,
        cause: BaseException,
        phase: str,
        source_port: int,
        started: float,
        *,
        source: str = "",
        tcp: dict[str, int] | None = None,
    ):
        super().__init__(f"{phase}: {cause!r}")
        self.cause, self.phase, self.source_port, self.started = cause, phase, source_port, started
        self.source, self.tcp = source, tcp or {}


class Answer(NamedTuple):
    """One answered request: the pod's name, the port that served, the client address the
    pod saw, how long the connect took and the connection's retransmitted segments."""

    pod: str
    served_port: str
    client: str
    connect_s: float = 0.0
    total_retrans: int = 0

    @property
    def retransmitted(self) -> bool:
        return self.connect_s >= RETRANSMITTED_CONNECT_S or self.total_retrans > 0


def tcp_info(sock: socket.socket) -> dict[str, int]:
    """The kernel's view of a TCP socket (``getsockopt(TCP_INFO)``): its state, the
    retransmissions of the segment in flight and the connection's total; empty if unreadable."""
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
    except OSError:
        return {}
    if len(raw) < _TCP_INFO_LEN:
        return {}
    state, _ca, retransmits, _probes, backoff = struct.unpack_from("5B", raw)
    (total,) = struct.unpack_from("I", raw, 100)
    return {"state": state, "retransmits": retransmits, "backoff": backoff, "total_retrans": total}


def _bound(sock: socket.socket, fallback: int) -> tuple[str, int]:
    try:
        name = sock.getsockname()
    except OSError:
        return "", fallback
    return str(name[0]), int(name[1]) or fallback


def http_once(url: str, timeout: float, source_port: int = 0) -> Answer:
    """One request on a new connection. ``source_port`` binds the client's port (a known
    5-tuple, e.g. to compare with a trace). Failures raise :class:`RequestFailed`, its cause
    the socket's error."""
    parts = urllib.parse.urlsplit(url)
    host, port = parts.hostname or "", parts.port or 80
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    started, phase = time.monotonic(), "connect"
    try:
        try:
            sock.settimeout(timeout)
            if source_port:
                # An earlier connection from this port may be in TIME_WAIT here (this side
                # closed first): without SO_REUSEADDR the bind fails with EADDRINUSE.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(("", source_port))
            sock.connect((host, port))
            connect_s = time.monotonic() - started
            conn.sock = sock
            phase = "response"
            pod, served, client = _exchange(conn, parts.path or "/")
            retrans = tcp_info(sock).get("total_retrans", 0)
            return Answer(pod, served, client, connect_s, retrans)
        except Exception as exc:
            address, bound = _bound(sock, source_port)
            raise RequestFailed(
                exc, phase, bound, started, source=address, tcp=tcp_info(sock)
            ) from exc
    finally:
        conn.close()
        sock.close()


def udp_once(sock: socket.socket, timeout: float, started: float | None = None) -> str:
    """One datagram on a connected UDP socket and its answer (``<pod>:<port>``); failures
    raise :class:`RequestFailed` with the socket's source address and port."""
    started = time.monotonic() if started is None else started
    try:
        sock.settimeout(timeout)
        sock.send(b"ping")
        return sock.recv(2048).decode()
    except Exception as exc:
        address, bound = _bound(sock, 0)
        raise RequestFailed(exc, "response", bound, started, source=address) from exc


def failure_record(exc: RequestFailed, proto: str, dst: str, dport: int) -> dict[str, Any]:
    """A failed request as the client reports it: kind, 5-tuple, phase and timing
    (``t``: CLOCK_MONOTONIC start, ``wall``: the same as Unix time)."""
    now = time.monotonic()
    record: dict[str, Any] = {
        "kind": _error_kind(exc.cause),
        "phase": exc.phase,
        "proto": proto,
        "src": exc.source.removeprefix("::ffff:"),
        "source_port": exc.source_port,
        "dst": dst,
        "dport": dport,
        "t": round(exc.started, 4),
        "wall": round(time.time() - (now - exc.started), 4),
        "took_s": round(now - exc.started, 4),
    }
    if exc.tcp:
        record["tcp_info"] = exc.tcp
    return record


def _exchange(conn: http.client.HTTPConnection, path: str) -> tuple[str, str, str]:
    conn.request("GET", path)
    response = conn.getresponse()
    body = response.read().decode().strip()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}")
    return body, response.getheader("X-Served-Port", ""), response.getheader("X-Client", "")


def http_load(
    url: str,
    *,
    count: int = 0,
    duration: float = 0.0,
    timeout: float = TCP_TIMEOUT_S,
    interval: float = 0.0,
    source_port: int = 0,
) -> dict[str, Any]:
    parts = urllib.parse.urlsplit(url)
    dst, dport = parts.hostname or "", parts.port or 80
    counts: collections.Counter[str] = collections.Counter()
    ports: collections.Counter[str] = collections.Counter()
    seen_as: collections.Counter[str] = collections.Counter()
    failures: collections.Counter[str] = collections.Counter()
    failure_times: list[float] = []
    failed_requests: list[dict[str, Any]] = []  # each failure: kind, 5-tuple, phase, timing
    retransmitted: list[dict[str, Any]] = []
    latencies: list[float] = []
    started = time.monotonic()
    sent = 0
    while (sent < count) if count else (time.monotonic() - started < duration):
        sent += 1
        t0 = time.monotonic()
        try:
            answer = http_once(url, timeout, source_port)
            counts[answer.pod] += 1
            ports[answer.served_port] += 1
            seen_as[answer.client.removeprefix("::ffff:")] += 1
            latencies.append(time.monotonic() - t0)
            if answer.retransmitted:
                retransmitted.append(
                    {
                        "t": round(t0, 4),
                        "connect_s": round(answer.connect_s, 4),
                        "total_retrans": answer.total_retrans,
                        "took_s": round(latencies[-1], 4),
                    }
                )
        except RequestFailed as exc:
            failures[_error_kind(exc.cause)] += 1
            failure_times.append(round(time.monotonic() - started, 3))
            latencies.append(time.monotonic() - t0)
            if len(failed_requests) < 50:
                failed_requests.append(failure_record(exc, "tcp", dst, dport))
        if interval:
            time.sleep(interval)
    return {
        "url": url,
        "seen_as": dict(seen_as),
        "sent": sent,
        "counts": dict(counts),
        "ports": dict(ports),
        "failed": sum(failures.values()),
        "failures": dict(failures),
        "failure_times": failure_times[:50],
        "failed_requests": failed_requests,
        "retransmitted": len(retransmitted),
        "retransmitted_requests": retransmitted[:50],
        "started": round(started, 4),
        "max_latency_s": round(max(latencies, default=0.0), 4),
        "elapsed_s": round(time.monotonic() - started, 3),
    }


def udp_socket(host: str, port: int, source_port: int = 0) -> socket.socket:
    """A UDP socket connected to ``host``:``port`` (bound to ``source_port`` when given)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    if source_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("", source_port))
    sock.connect((host, port))
    return sock


def udp_load(
    host: str,
    port: int,
    *,
    count: int,
    timeout: float = 1.0,
    new_socket: bool = False,
    interval: float = 0.0,
    source_port: int = 0,
) -> dict[str, Any]:
    """``source_port`` binds the socket to that port: runs with the same port share one
    conntrack entry (a 5-tuple), as one long-lived socket would."""
    counts: collections.Counter[str] = collections.Counter()
    failures: collections.Counter[str] = collections.Counter()
    failed_requests: list[dict[str, Any]] = []
    answers: list[str] = []
    sock = None
    for _ in range(count):
        if sock is None or new_socket:
            if sock is not None:
                sock.close()
            sock = udp_socket(host, port, source_port)
        try:
            answer = udp_once(sock, timeout)
            counts[answer.split(":")[0]] += 1
            answers.append(answer)
        except RequestFailed as exc:
            failures[_error_kind(exc.cause)] += 1
            if len(failed_requests) < 50:
                failed_requests.append(failure_record(exc, "udp", host, port))
            answers.append("")
        if interval:
            time.sleep(interval)
    if sock is not None:
        sock.close()
    return {
        "counts": dict(counts),
        "failed": sum(failures.values()),
        "failures": dict(failures),
        "failed_requests": failed_requests,
        "answers": answers,
    }


def bound_requests(
    host: str, port: int, source_ports: list[int], *, timeout: float, bind_address: str = ""
) -> dict[int, float | str]:
    """One HTTP/1.0 request from each source port, in turn: seconds taken, or the error kind.
    HTTP/1.0 so the server closes first and the endpoint, not the client, keeps the 4-tuple in
    TIME_WAIT; SO_REUSEADDR so a port this side used before can be bound again."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    out: dict[int, float | str] = {}
    for source in source_ports:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.settimeout(timeout)
        started = time.monotonic()
        try:
            sock.bind((bind_address, source))
            sock.connect((host, port))
            sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
            while sock.recv(4096):
                pass
            out[source] = round(time.monotonic() - started, 3)
        except OSError as exc:
            out[source] = _error_kind(exc)
        finally:
            sock.close()
    return out


def run_in_netns(netns: str | None, *args: str, timeout: float = 120) -> dict[str, Any]:
    """Run this module's CLI arguments in a namespace (None: this one) and return what it
    would print, parsed.

    In this process, on a thread of its own that joins the namespace (its sockets are the
    namespace's; the thread, and its membership, end with the call): the same client as the
    CLI's, without a Python start-up per call (about 0.1 s idle, several times that on a busy
    machine; the suite makes thousands of calls)."""
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            if netns:
                enter_netns(netns)
            # What the CLI prints: JSON's types (a "bound" result's ports become strings).
            outcome["result"] = json.loads(json.dumps(run(list(args))))
        except BaseException as exc:  # handed to the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=work, name=f"traffic in {netns or 'this namespace'}")
    thread.daemon = True
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"traffic client in {netns}: no result after {timeout} s: {args}")
    if "error" in outcome:
        exc = outcome["error"]
        raise RuntimeError(f"traffic client failed in {netns}: {exc!r}") from exc
    result: dict[str, Any] = outcome["result"]
    return result


def main(argv: list[str] | None = None) -> int:
    print(json.dumps(run(argv)))
    return 0


def run(argv: list[str] | None = None) -> Any:
    """Parse the CLI's arguments and run that client; its result (JSON-able)."""
    parser = argparse.ArgumentParser(prog="python -m ovsproxy.ovs.traffic")
    sub = parser.add_subparsers(dest="mode", required=True)
    http_p = sub.add_parser("http")
    http_p.add_argument("url")
    http_p.add_argument("--count", type=int, default=0)
    http_p.add_argument("--duration", type=float, default=0.0)
    http_p.add_argument("--timeout", type=float, default=TCP_TIMEOUT_S)
    http_p.add_argument("--interval", type=float, default=0.0)
    http_p.add_argument("--source-port", type=int, default=0)
    udp_p = sub.add_parser("udp")
    udp_p.add_argument("host")
    udp_p.add_argument("port", type=int)
    udp_p.add_argument("--count", type=int, default=1)
    udp_p.add_argument("--timeout", type=float, default=1.0)
    udp_p.add_argument("--new-socket", action="store_true")
    udp_p.add_argument("--interval", type=float, default=0.0)
    udp_p.add_argument("--source-port", type=int, default=0)
    bound_p = sub.add_parser("bound")
    bound_p.add_argument("host")
    bound_p.add_argument("port", type=int)
    bound_p.add_argument("--source-ports", required=True, help="comma-separated")
    bound_p.add_argument("--bind-address", default="")
    bound_p.add_argument("--timeout", type=float, default=5.0)
    args = parser.parse_args(argv)
    if args.mode == "bound":
        return bound_requests(
            args.host,
            args.port,
            [int(p) for p in args.source_ports.split(",")],
            timeout=args.timeout,
            bind_address=args.bind_address,
        )
    if args.mode == "http":
        if not args.count and not args.duration:
            args.count = 1
        return http_load(
            args.url,
            count=args.count,
            duration=args.duration,
            timeout=args.timeout,
            interval=args.interval,
            source_port=args.source_port,
        )
    return udp_load(
        args.host,
        args.port,
        count=args.count,
        timeout=args.timeout,
        new_socket=args.new_socket,
        interval=args.interval,
        source_port=args.source_port,
    )


if __name__ == "__main__":
    sys.exit(main())
