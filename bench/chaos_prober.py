"""``python -m bench.chaos_prober TARGETS_JSON [INTERVAL TCP_TIMEOUT UDP_TIMEOUT]`` (run inside a
client's network namespace): the chaos run's traffic. One thread per target sends requests to
it, ``INTERVAL`` seconds apart, until SIGTERM (a thread waiting out one timeout does not hold up
the other targets); each request on a new connection (TCP) or a new socket (UDP), so each is a
new conntrack entry and a new endpoint choice. One JSON line per request on stdout:
``[start, end, target index, ok, detail, failure]`` with CLOCK_MONOTONIC times (one clock for
the whole machine, so the run compares them with its fault times); detail is the answering pod,
or the failure's kind; failure is null, or the failed request's record (its 5-tuple, phase and
timing, as ``ovsproxy.ovs.traffic`` reports it).

A target is ``{"proto": "tcp"|"udp", "ip": ..., "port": ...}``.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from typing import Any

from ovsproxy.ovs.traffic import (
    RequestFailed,
    _error_kind,
    failure_record,
    http_once,
    udp_once,
    udp_socket,
)

stopping = threading.Event()
printing = threading.Lock()


def udp_new_socket(ip: str, port: int, timeout: float) -> str:
    with udp_socket(ip, port) as sock:
        return udp_once(sock, timeout).split(":")[0]


def once(
    target: dict[str, Any], timeouts: dict[str, float]
) -> tuple[bool, str, dict[str, Any] | None]:
    """(answered, pod or failure kind, the failure's record: 5-tuple, phase, timing)."""
    ip, port = target["ip"], int(target["port"])
    try:
        if target["proto"] == "udp":
            return True, udp_new_socket(ip, port, timeouts["udp"]), None
        host = f"[{ip}]" if ":" in ip else ip
        return True, http_once(f"http://{host}:{port}/", timeouts["tcp"]).pod, None
    except RequestFailed as exc:
        return False, _error_kind(exc), failure_record(exc, target["proto"], ip, port)
    except Exception as exc:  # every failure is a figure, whatever its kind
        return False, _error_kind(exc), None


def probe(index: int, target: dict[str, Any], interval: float, timeouts: dict[str, float]) -> None:
    while not stopping.is_set():
        t0 = time.monotonic()
        ok, detail, record = once(target, timeouts)
        t1 = time.monotonic()
        line = json.dumps([round(t0, 4), round(t1, 4), index, int(ok), detail, record])
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
