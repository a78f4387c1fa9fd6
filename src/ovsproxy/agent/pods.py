"""Pod polling (standalone mode): local pods come and go without Service events, so the agent
follows the bridge's pod ports in OVSDB and asks for a sync when they change."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ovsproxy.model.node import PodPort
from ovsproxy.ovs.ovsdb import OVSDB

log = logging.getLogger("ovsproxy.agent")

POD_POLL_INTERVAL = 2.0  # seconds; how soon a new or removed pod port is seen


class PodWatcher:
    """``current`` is the proxier's ``pods`` callback; ``poll`` runs as a task."""

    def __init__(self, bridge: str, interval: float = POD_POLL_INTERVAL) -> None:
        self.bridge = bridge
        self.interval = interval
        self.pods: list[PodPort] = []

    async def current(self) -> list[PodPort]:
        return self.pods

    async def read(self, ovsdb: OVSDB) -> None:
        self.pods = await asyncio.to_thread(ovsdb.pod_ports, self.bridge)

    async def poll(self, ovsdb: OVSDB, on_change: Callable[[], None]) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                pods = await asyncio.to_thread(ovsdb.pod_ports, self.bridge)
            except Exception as exc:
                log.warning("reading pod ports from OVSDB failed: %s", exc)
                continue
            if pods != self.pods:
                self.pods = pods
                on_change()
