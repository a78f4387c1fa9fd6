"""The lab's listening ports: below the ephemeral range, and free when chosen."""

from __future__ import annotations

import socket

from ovsproxy.lab import ports


def test_a_reserved_port_is_below_the_ephemeral_range_and_bindable() -> None:
    low = ports._ephemeral_low()
    for _ in range(20):
        port = ports.reserve_port()
        assert ports._LOWEST <= port < low
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # free: the check's socket is closed


def test_a_taken_port_is_never_handed_out(monkeypatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        busy = taken.getsockname()[1]
        taken.listen()
        # Only the taken port and one free one to choose from: it must pick the free one.
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            free = probe.getsockname()[1]
        picks = iter([busy, busy, free])
        monkeypatch.setattr(ports.random.SystemRandom, "randint", lambda *_: next(picks))
        monkeypatch.setattr(ports, "_LOWEST", 1)
        monkeypatch.setattr(ports, "_ephemeral_low", lambda: 65536)
        assert ports.reserve_port() == free
