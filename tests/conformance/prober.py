"""``python -m tests.conformance.prober URL`` (run inside a client's network namespace): HTTP
requests to URL back to back, each on a new connection, one JSON line per answer on stdout:
``{"t": <CLOCK_MONOTONIC seconds>, "pod": <answering pod or null>}``, until killed.

CLOCK_MONOTONIC is one clock for the whole machine, so the test compares these times with its
own ``time.monotonic()``: when it changed an EndpointSlice, and when traffic followed.
"""

from __future__ import annotations

import json
import sys
import time

from ovsproxy.ovs.traffic import http_once


def main(url: str, interval: float = 0.005, timeout: float = 0.5) -> None:
    while True:
        try:
            pod: str | None = http_once(url, timeout)[0]
        except Exception:
            pod = None
        print(json.dumps({"t": time.monotonic(), "pod": pod}), flush=True)
        time.sleep(interval)


if __name__ == "__main__":
    main(sys.argv[1])
