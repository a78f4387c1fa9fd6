"""A kubelet's /healthz probe of a host-network agent, for the tests and the benches that
attack the agent's HTTP servers: a GET on a new connection from the node's address
(``KUBELET``, not the attacking pods' 127.0.0.1), with the kubelet's default 1 s timeout,
every ``period`` seconds in a thread of its own."""

from __future__ import annotations

import http.client
import threading
import time

PROBE_TIMEOUT = 1.0  # the kubelet's default probe timeout
KUBELET = "127.0.0.2"  # the probes' source address: the node's, not an attacking pod's


def probe_get(port: int, path: str, timeout: float = PROBE_TIMEOUT) -> int:
    """GET from the kubelet's address, as a kubelet probes a host-network pod: the status."""
    connection = http.client.HTTPConnection(
        "127.0.0.1", port, timeout=timeout, source_address=(KUBELET, 0)
    )
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


class Prober:
    """GET /healthz every ``period`` on a new connection until the block ends."""

    def __init__(self, port: int, period: float = 0.25) -> None:
        self.port = port
        self.period = period
        self.results: list[tuple[float, bool, float]] = []  # (when, ok, seconds)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            start = time.monotonic()
            try:
                ok = probe_get(self.port, "/healthz") == 200
            except OSError:
                ok = False
            took = time.monotonic() - start
            self.results.append((start, ok, took))
            self._stop.wait(max(0.0, self.period - took))

    @property
    def failed(self) -> int:
        return sum(1 for _, ok, _ in self.results if not ok)

    @property
    def times(self) -> list[float]:
        return [took for _, _, took in self.results]
