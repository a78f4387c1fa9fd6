"""``python -m bench.soak_client SPEC_JSON`` (run inside a client's network namespace): the soak
run's traffic from one client. One thread per target sends its ``count`` requests back to back,
each on a new connection (TCP) or a new socket (UDP): every request is a new conntrack entry and
a new endpoint choice.

SPEC: ``{"targets": [{"proto": "tcp"|"udp", "ip": ..., "port": ...}], "count": N,
"timeouts": {"tcp": s, "udp": s}}``. Output, JSON lines on stdout: a failed request at once,
``{"failed": <its record: 5-tuple, phase, timing>, "target": i}`` (the run collects its evidence
while the switch still holds it); a request that needed a TCP retransmission likewise,
``{"retransmitted": {...}, "target": i}``; at the end one ``{"done": [per target: {"sent",
"failed", "retransmitted", "latencies_ms": [...]}]}``.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

from ovsproxy.ovs.traffic import (
    RequestFailed,
    failure_record,
    http_once,
    udp_once,
    udp_socket,
)

printing = threading.Lock()


def emit(obj: dict[str, Any]) -> None:
    with printing:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()


def run_target(
    index: int, target: dict[str, Any], count: int, timeouts: dict[str, float]
) -> dict[str, Any]:
    ip, port, proto = target["ip"], int(target["port"]), target["proto"]
    url = f"http://[{ip}]:{port}/" if ":" in ip else f"http://{ip}:{port}/"
    latencies: list[float] = []
    failed = retransmitted = 0
    for _ in range(count):
        t0 = time.monotonic()
        try:
            if proto == "udp":
                with udp_socket(ip, port) as sock:
                    udp_once(sock, timeouts["udp"], t0)
            else:
                answer = http_once(url, timeouts["tcp"])
                if answer.retransmitted:
                    retransmitted += 1
                    emit(
                        {
                            "retransmitted": {
                                "t": round(t0, 4),
                                "connect_s": round(answer.connect_s, 4),
                                "total_retrans": answer.total_retrans,
                            },
                            "target": index,
                        }
                    )
        except RequestFailed as exc:
            failed += 1
            emit({"failed": failure_record(exc, proto, ip, port), "target": index})
        except OSError as exc:  # before a socket had a tuple (e.g. no route): still a failure
            failed += 1
            emit({"failed": {"kind": type(exc).__name__, "proto": proto}, "target": index})
        latencies.append(round((time.monotonic() - t0) * 1000, 3))
    return {
        "sent": count,
        "failed": failed,
        "retransmitted": retransmitted,
        "latencies_ms": latencies,
    }


def main(spec: dict[str, Any]) -> None:
    results: list[dict[str, Any]] = [{} for _ in spec["targets"]]

    def work(i: int, target: dict[str, Any]) -> None:
        results[i] = run_target(i, target, int(spec["count"]), spec["timeouts"])

    threads = [
        threading.Thread(target=work, args=(i, t), daemon=True)
        for i, t in enumerate(spec["targets"])
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    emit({"done": results})


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
