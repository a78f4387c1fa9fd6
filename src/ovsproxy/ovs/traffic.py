"""Real clients for tests and the demo, run inside a network namespace.

``python -m ovsproxy.ovs.traffic http URL --count 60`` opens a new TCP connection per request
(so every request is a new conntrack entry and a new select-group choice) and prints one JSON
object: counts per answering pod, failures by kind, and latencies. ``--duration`` sends
continuously instead (for restart tests). ``udp HOST PORT`` does the same with datagrams, on one
socket (one conntrack entry) unless ``--new-socket``. ``bound HOST PORT --source-ports P,Q``
sends one HTTP/1.0 request from each bound source port in turn and prints ``{port: seconds or
error kind}``: the server closes first, so the endpoint holds each 4-tuple in TIME_WAIT (the
TIME_WAIT collision tests reuse those 4-tuples).

From Python, :func:`run_in_netns` runs it in a namespace and returns the parsed result.
"""

from __future__ import annotations

import argparse
import collections
import errno
import http.client
import json
import socket
import subprocess
import sys
import time
import urllib.parse
from typing import Any


def _error_kind(exc: BaseException) -> str:
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
    client's source port (0 before it had one) and the CLOCK_MONOTONIC time it started."""

    def __init__(self, cause: BaseException, phase: str, source_port: int, started: float):
        super().__init__(f"{phase}: {cause!r}")
        self.cause, self.phase, self.source_port, self.started = cause, phase, source_port, started


def http_once(url: str, timeout: float, source_port: int = 0) -> tuple[str, str, str]:
    """One request on a new connection: (pod name, served port, client address seen).
    ``source_port`` binds the client's port (a known 5-tuple, e.g. to compare with a trace).
    Failures raise :class:`RequestFailed`, its cause the socket's error."""
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
            conn.sock = sock
            phase = "response"
            return _exchange(conn, parts.path or "/")
        except Exception as exc:
            try:
                bound = int(sock.getsockname()[1])
            except OSError:
                bound = source_port
            raise RequestFailed(exc, phase, bound, started) from exc
    finally:
        conn.close()
        sock.close()


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
    timeout: float = 2.0,
    interval: float = 0.0,
    source_port: int = 0,
) -> dict[str, Any]:
    counts: collections.Counter[str] = collections.Counter()
    ports: collections.Counter[str] = collections.Counter()
    seen_as: collections.Counter[str] = collections.Counter()
    failures: collections.Counter[str] = collections.Counter()
    failure_times: list[float] = []
    failed_requests: list[dict[str, Any]] = []  # each failure: kind, phase, port, start time
    latencies: list[float] = []
    started = time.monotonic()
    sent = 0
    while (sent < count) if count else (time.monotonic() - started < duration):
        sent += 1
        t0 = time.monotonic()
        try:
            name, port, client = http_once(url, timeout, source_port)
            counts[name] += 1
            ports[port] += 1
            seen_as[client.removeprefix("::ffff:")] += 1
            latencies.append(time.monotonic() - t0)
        except RequestFailed as exc:
            kind = _error_kind(exc.cause)
            failures[kind] += 1
            failure_times.append(round(time.monotonic() - started, 3))
            latencies.append(time.monotonic() - t0)
            if len(failed_requests) < 50:
                failed_requests.append(
                    {
                        "kind": kind,
                        "phase": exc.phase,
                        "source_port": exc.source_port,
                        "t": round(exc.started, 4),
                        "wall": round(time.time() - (time.monotonic() - exc.started), 4),
                        "took_s": round(time.monotonic() - exc.started, 4),
                    }
                )
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
        "started": round(started, 4),
        "max_latency_s": round(max(latencies, default=0.0), 4),
        "elapsed_s": round(time.monotonic() - started, 3),
    }


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
    answers: list[str] = []
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = None
    for _ in range(count):
        if sock is None or new_socket:
            if sock is not None:
                sock.close()
            sock = socket.socket(family, socket.SOCK_DGRAM)
            if source_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(("", source_port))
            sock.settimeout(timeout)
            sock.connect((host, port))
        try:
            sock.send(b"ping")
            answer = sock.recv(2048).decode()
            counts[answer.split(":")[0]] += 1
            answers.append(answer)
        except Exception as exc:
            failures[_error_kind(exc)] += 1
            answers.append("")
        if interval:
            time.sleep(interval)
    if sock is not None:
        sock.close()
    return {
        "counts": dict(counts),
        "failed": sum(failures.values()),
        "failures": dict(failures),
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
    """Run this module's CLI in a namespace (None: this one) and parse its JSON result."""
    cmd = [sys.executable, "-m", "ovsproxy.ovs.traffic", *args]
    if netns:
        cmd = ["ip", "netns", "exec", netns, *cmd]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"traffic client failed: {result.stderr.strip()}")
    parsed: dict[str, Any] = json.loads(result.stdout)
    return parsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ovsproxy.ovs.traffic")
    sub = parser.add_subparsers(dest="mode", required=True)
    http_p = sub.add_parser("http")
    http_p.add_argument("url")
    http_p.add_argument("--count", type=int, default=0)
    http_p.add_argument("--duration", type=float, default=0.0)
    http_p.add_argument("--timeout", type=float, default=2.0)
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
        print(
            json.dumps(
                bound_requests(
                    args.host,
                    args.port,
                    [int(p) for p in args.source_ports.split(",")],
                    timeout=args.timeout,
                    bind_address=args.bind_address,
                )
            )
        )
        return 0
    if args.mode == "http":
        if not args.count and not args.duration:
            args.count = 1
        result = http_load(
            args.url,
            count=args.count,
            duration=args.duration,
            timeout=args.timeout,
            interval=args.interval,
            source_port=args.source_port,
        )
    else:
        result = udp_load(
            args.host,
            args.port,
            count=args.count,
            timeout=args.timeout,
            new_socket=args.new_socket,
            interval=args.interval,
            source_port=args.source_port,
        )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
