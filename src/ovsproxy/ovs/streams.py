"""Long-lived TCP connections that push numbered records, for restart tests.

``python -m ovsproxy.ovs.streams serve --port 9000`` (in an endpoint's namespace) accepts
connections; ``python -m ovsproxy.ovs.streams run --targets JSON --duration S`` (in a client's)
opens one connection per target ``{"name", "host", "port", "mode"}`` and prints one JSON list
of results. The mode says who pushes: ``client`` (the server only ACKs), ``server`` (the
client only ACKs: a download, a server push) or ``both``. A pusher sends a 9-byte record (``D``
and a 64-bit sequence number) every ``--interval`` seconds; the receiver checks the numbers
follow each other and notes every silence longer than ``GAP`` seconds as (from, to) in wall
time (``time.time()``, the same clock in every namespace). After ``--duration`` the client
sends ``E``; the server stops pushing and answers ``E`` and a JSON line with its side's
counts, which the client adds to its result.

Per connection: ``error`` (empty, or how it failed: ``reset``, ``timeout``, ...), and per
direction ``sent``, ``received``, ``in_order`` and ``gaps``; 0 lost bytes means received ==
sent and in order.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

RECORD = 9  # b"D" + 8-byte sequence number
GAP = 0.3  # seconds without a record that count as a gap (records come every 50 ms)
READ_TIMEOUT = 120.0  # a connection silent this long has failed


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionAbortedError("closed by the peer")
        data += chunk
    return data


class _Receiver:
    """Counts the records of one direction and the silences between them."""

    def __init__(self) -> None:
        self.received = 0
        self.in_order = True
        self.gaps: list[tuple[float, float]] = []
        self._last = time.time()

    def record(self, seq: int) -> None:
        now = time.time()
        if now - self._last > GAP:
            self.gaps.append((self._last, now))
        self._last = now
        if seq != self.received:
            self.in_order = False
        self.received += 1

    def as_dict(self) -> dict[str, Any]:
        return {"received": self.received, "in_order": self.in_order, "gaps": self.gaps}


class _Pusher:
    """Sends a record every ``interval`` seconds from a thread, until stopped."""

    def __init__(self, sock: socket.socket, lock: threading.Lock, interval: float) -> None:
        self.sock, self.lock, self.interval = sock, lock, interval
        self.sent = 0
        self.error = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                with self.lock:
                    self.sock.sendall(b"D" + self.sent.to_bytes(8, "big"))
                self.sent += 1
                self._stop.wait(self.interval)
        except OSError as exc:
            self.error = _error_kind(exc)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(READ_TIMEOUT)


def _error_kind(exc: BaseException) -> str:
    if isinstance(exc, ConnectionResetError | BrokenPipeError):
        return "reset"
    if isinstance(exc, TimeoutError | socket.timeout):
        return "timeout"
    if isinstance(exc, ConnectionAbortedError):
        return "closed"
    return type(exc).__name__


# -- the server ---------------------------------------------------------------------------
def _serve_connection(sock: socket.socket, interval: float) -> None:
    try:
        sock.settimeout(READ_TIMEOUT)
        mode = _recv_exact(sock, 1)
        lock = threading.Lock()
        pusher = _Pusher(sock, lock, interval) if mode in (b"s", b"b") else None
        rx = _Receiver()
        while _recv_exact(sock, 1) != b"E":
            rx.record(int.from_bytes(_recv_exact(sock, 8), "big"))
        report: dict[str, Any] = {**rx.as_dict(), "sent": 0, "error": ""}
        if pusher is not None:
            pusher.stop()
            report.update(sent=pusher.sent, error=pusher.error)
        with lock:
            sock.sendall(b"E" + json.dumps(report).encode() + b"\n")
        sock.shutdown(socket.SHUT_WR)
        while sock.recv(4096):
            pass
    except OSError:
        pass  # the client reports its side; a reset reaches it too
    finally:
        sock.close()


def serve(port: int, interval: float, ready: Callable[[], None] | None = None) -> None:
    listener = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("::", port))
    listener.listen(128)
    if ready is not None:
        ready()
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_serve_connection, args=(conn, interval), daemon=True).start()


# -- the client ---------------------------------------------------------------------------
def run_one(target: dict[str, Any], duration: float, interval: float) -> dict[str, Any]:
    mode = str(target["mode"])
    result: dict[str, Any] = {"name": target.get("name", ""), "mode": mode, "error": ""}
    client_pushes, server_pushes = mode in ("client", "both"), mode in ("server", "both")
    rx = _Receiver()
    server: dict[str, Any] = {}
    pusher: _Pusher | None = None
    try:
        sock = socket.create_connection((target["host"], int(target["port"])), timeout=5)
    except OSError as exc:
        return {**result, "error": f"connect: {_error_kind(exc)}"}
    try:
        sock.settimeout(READ_TIMEOUT)
        lock = threading.Lock()
        sock.sendall({"client": b"c", "server": b"s", "both": b"b"}[mode])
        reader_error: list[str] = []

        def read() -> None:
            try:
                while (kind := _recv_exact(sock, 1)) == b"D":
                    rx.record(int.from_bytes(_recv_exact(sock, 8), "big"))
                if kind != b"E":
                    raise ValueError(f"unexpected record {kind!r}")
                line = b""
                while not line.endswith(b"\n"):
                    line += _recv_exact(sock, 1)
                server.update(json.loads(line))
            except (OSError, ValueError) as exc:
                reader_error.append(_error_kind(exc))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        if client_pushes:
            pusher = _Pusher(sock, lock, interval)
        time.sleep(duration)
        if pusher is not None:
            pusher.stop()
        with lock:
            sock.sendall(b"E")
        reader.join(READ_TIMEOUT)
        result["error"] = (pusher.error if pusher else "") or "".join(reader_error[:1])
    except OSError as exc:
        result["error"] = _error_kind(exc)
    finally:
        sock.close()
    sent = pusher.sent if pusher is not None else 0
    result["to_server"] = (
        {"sent": sent, **{k: server.get(k) for k in ("received", "in_order", "gaps")}}
        if client_pushes
        else None
    )
    result["to_client"] = {"sent": server.get("sent"), **rx.as_dict()} if server_pushes else None
    return result


def run(targets: list[dict[str, Any]], duration: float, interval: float) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = [{} for _ in targets]

    def one(i: int) -> None:
        results[i] = run_one(targets[i], duration, interval)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(targets))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="mode", required=True)
    serve_p = sub.add_parser("serve")
    serve_p.add_argument("--port", type=int, required=True)
    serve_p.add_argument("--interval", type=float, default=0.05)
    serve_p.add_argument("--ready-file")
    run_p = sub.add_parser("run")
    run_p.add_argument("--targets", required=True, help="a JSON list of targets")
    run_p.add_argument("--duration", type=float, required=True)
    run_p.add_argument("--interval", type=float, default=0.05)
    args = parser.parse_args(argv)
    if args.mode == "serve":
        ready_file = args.ready_file

        def ready() -> None:
            if ready_file:
                with open(ready_file, "w") as f:
                    f.write("ready\n")

        serve(args.port, args.interval, ready)
        return 0
    print(json.dumps(run(json.loads(args.targets), args.duration, args.interval)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
