"""Listening ports for the agents and servers that the lab and the tests start on loopback.

``bind(port 0)`` hands out a port of the ephemeral range, the range every outgoing connection
also takes its local port from: between choosing such a port and the agent's own bind, any
connection on the machine may take it (CI saw an agent exit on EADDRINUSE for its metrics
port). Ports below the range are taken only by explicit binds, so one chosen at random there,
and checked free, can only be raced by another explicit chooser picking the same one.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10000  # below: the well-known and registered services a machine may run


def _ephemeral_low() -> int:
    try:
        return int(_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def reserve_port(host: str = "127.0.0.1", *, attempts: int = 200) -> int:
    """A TCP port free on ``host`` now, below the ephemeral range."""
    high = _ephemeral_low() - 1
    if high <= _LOWEST:
        raise RuntimeError(f"no ports below the ephemeral range ({_RANGE}: starts at {high + 1})")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    chooser = random.SystemRandom()
    for _ in range(attempts):
        port = chooser.randint(_LOWEST, high)
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port on {host} in {_LOWEST}-{high} after {attempts} tries")
