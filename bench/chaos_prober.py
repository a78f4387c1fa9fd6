"""``python -m bench.chaos_prober TARGETS_JSON [INTERVAL TCP_TIMEOUT UDP_TIMEOUT]`` (run inside a
client's network namespace): the chaos run's traffic. One thread per target sends requests to
it, ``INTERVAL`` seconds apart, until SIGTERM (a thread waiting out one timeout does not hold up
the other targets); each request on a new connection (TCP) or a new socket (UDP), so each is a
new conntrack entry and a new endpoint choice. One JSON line per request on stdout:
``[start, end, target index, ok, detail]`` with CLOCK_MONOTONIC times (one clock for the whole
machine, so the run compares them with its fault times); detail is the answering pod, or the
failure's kind.

A target is ``{"proto": "tcp"|"udp", "ip": ..., "port": ...}``.
"""

from __future__ import annotations

import json
import signal
import socket
import sys
import threading
import time
from typing import Any

from ovsproxy.ovs.traffic import _error_kind, http_once

stopping = threading.Event()
printing = threading.Lock()


def udp_once(ip: str, port: int, timeout: float) -> str:
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout)
        sock.connect((ip, port))
        sock.send(b"ping")
        return sock.recv(2048).decode().split(":")[0]


def once(target: dict[str, Any], timeouts: dict[str, float]) -> tuple[bool, str]:
    ip, port = target["ip"], int(target["port"])
    try:
        if target["proto"] == "udp":
            return True, udp_once(ip, port, timeouts["udp"])
        host = f"[{ip}]" if ":" in ip else ip
        return True, http_once(f"http://{host}:{port}/", timeouts["tcp"])[0]
    except Exception as exc:  # every failure is a figure, whatever its kind
        return False, _error_kind(exc)


def probe(index: int, target: dict[str, Any], interval: float, timeouts: dict[str, float]) -> None:
    while not stopping.is_set():
        t0 = time.monotonic()
        ok, detail = once(target, timeouts)
        t1 = time.monotonic()
        line = json.dumps([round(t0, 4), round(t1, 4), index, int(ok), detail])
        with printing:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
        stopping.wait(interval)


def main(targets: list[dict[str, Any]], interval: float, timeouts: dict[str, float]) -> None:
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    threads = [
        threading.Thread(target=probe, args=(i, t, interval, timeouts), daemon=True)
        for i, t in enumerate(targets)
    ]
    for thread in threads:
        thread.start()
    while not stopping.is_set():
        stopping.wait(0.5)
    for thread in threads:
        thread.join(5)


if __name__ == "__main__":
    args = sys.argv[1:]
    main(
        json.loads(args[0]),
        float(args[1]) if len(args) > 1 else 0.15,
        {
            "tcp": float(args[2]) if len(args) > 2 else 2.0,
            "udp": float(args[3]) if len(args) > 3 else 1.0,
        },
    )
