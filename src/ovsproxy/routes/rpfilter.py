"""The IPv4 reverse-path filter on the gateway (Linux): checked, and loosened when strict.

Replies of steered connections (NodePort, external IP, LB IP) leave OVS through the gateway
with the virtual NodePort IP or the Service's external address as source, none of which the
node routes through the gateway: a strict reverse-path filter (``rp_filter=1``) on gw0 drops
them. Linux applies the larger of ``net.ipv4.conf.all.rp_filter`` and the device's value, so
setting the gateway's own to 2 (loose) always makes the filter loose there, whatever ``all``
says, without touching any other device. Loose mode accepts a source the node has any route
to (its default route covers the virtual NodePort IP and external addresses). IPv6 has no
such sysctl.

The values are read and written through ``/proc/sys`` by a short-lived thread that joins the
node's network namespace (``/proc/sys/net`` shows the reader's namespace).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from ovsproxy.netns import enter_netns

T = TypeVar("T")

STRICT = 1
LOOSE = 2
_CONF = Path("/proc/sys/net/ipv4/conf")


@dataclass(frozen=True, slots=True)
class RPFilter:
    """The values read for one device, and what the kernel applies (the larger)."""

    all: int
    device: int

    @property
    def effective(self) -> int:
        return max(self.all, self.device)

    @property
    def strict(self) -> bool:
        return self.effective == STRICT


def _in_netns(netns: str | None, work: Callable[[], T]) -> T:
    """Run ``work()`` on a fresh thread inside ``netns`` (None: here) and return its result."""
    result: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            if netns is not None:
                enter_netns(netns)
            result.append(work())
        except BaseException as exc:  # re-raised in the caller
            error.append(exc)

    thread = threading.Thread(target=run, name="rp_filter", daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


def read(device: str, netns: str | None = None) -> RPFilter:
    """``all`` and ``device``'s rp_filter (OSError naming the file when one is unreadable)."""

    def work() -> RPFilter:
        values = [int((_CONF / name / "rp_filter").read_text()) for name in ("all", device)]
        return RPFilter(all=values[0], device=values[1])

    return _in_netns(netns, work)


def set_device(device: str, value: int, netns: str | None = None) -> None:
    """Write ``device``'s rp_filter."""

    def work() -> None:
        (_CONF / device / "rp_filter").write_text(f"{value}\n")

    _in_netns(netns, work)
