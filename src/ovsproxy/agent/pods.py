"""Pod polling (standalone mode): local pods come and go without Service events, so the agent
follows the bridge's pod ports in OVSDB and asks for a sync when they change.

Interfaces on the bridge that are not pods (no ``ip`` or ``attached-mac`` in their
external_ids, or a bad ``ip``) get no flow; each is logged once when it appears or its reason
changes (not at every poll), and the current ones are in ``not_pods`` for the metrics and
``ovsproxy status``. The gateway is no pod and no such port.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from ovsproxy.model.node import NotAPod, PodPort
from ovsproxy.ovs.ovsdb import OVSDB

log = logging.getLogger("ovsproxy.agent")

POD_POLL_INTERVAL = 2.0  # seconds; how soon a new or removed pod port is seen


class PodWatcher:
    """``current`` is the proxier's ``pods`` callback; ``poll`` runs as a task."""

    def __init__(self, bridge: str, gateway: str = "", interval: float = POD_POLL_INTERVAL) -> None:
        self.bridge = bridge
        self.gateway = gateway
        self.interval = interval
        self.pods: list[PodPort] = []
        self.not_pods: dict[str, str] = {}  # interface -> why it is not read as a pod

    async def current(self) -> list[PodPort]:
        return self.pods

    async def read(self, ovsdb: OVSDB) -> None:
        self.pods = await self._read(ovsdb)

    async def poll(self, ovsdb: OVSDB, on_change: Callable[[], None]) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                pods = await self._read(ovsdb)
            except Exception as exc:
                log.warning("reading pod ports from OVSDB failed: %s", exc)
                continue
            if pods != self.pods:
                self.pods = pods
                on_change()

    async def _read(self, ovsdb: OVSDB) -> list[PodPort]:
        not_pods = (self.gateway,) if self.gateway else ()
        pods, skipped = await asyncio.to_thread(ovsdb.read_pods, self.bridge, not_pods)
        self._note(skipped)
        return pods

    def _note(self, skipped: Iterable[NotAPod]) -> None:
        current = {port.interface: port.reason for port in skipped}
        for interface, reason in current.items():
            if self.not_pods.get(interface) != reason:
                # An uplink lacks the CNI's keys on purpose; a malformed address is a mistake.
                level = logging.INFO if reason.startswith("no ") else logging.WARNING
                log.log(
                    level,
                    "interface %s on bridge %s is not read as a pod (%s): it gets no flows",
                    interface,
                    self.bridge,
                    reason,
                )
        self.not_pods = current
