"""Joining a network namespace from a worker thread (a leaf helper: imports nothing of ours).

A socket, netlink or not, belongs to the namespace of the thread that creates it, and keeps it
for its life. So the node-side parts that must act inside the node's namespace (the steering
table's libnftables context, the health-check servers' listening sockets) run their creating
calls on one worker thread that has joined it with ``setns``; the event loop's thread never
changes namespace.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000


def enter_netns(netns: str) -> None:
    """Move the calling thread into the named namespace (``/run/netns/<netns>``)."""
    # The process's own symbols (libc among them): find_library("c") would run ldconfig each time.
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        fd = os.open(NETNS_DIR / netns, os.O_RDONLY)
    except FileNotFoundError:
        raise FileNotFoundError(f"network namespace {netns!r} does not exist") from None
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into network namespace {netns}: {os.strerror(err)}")
    finally:
        os.close(fd)
