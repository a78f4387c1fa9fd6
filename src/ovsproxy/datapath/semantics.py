"""The agent-side helpers of the Service semantics, wired together for the agent.

``SemanticsHelpers(channel, datapath)`` holds:

* ``rejector`` (``reject.Rejector``): answers reject packet-ins; its meter is installed from the
  channel's on_connected hook before the datapath replays (``wrap_on_connected``);
* ``conntrack`` (``conntrack.ConntrackFlusher``): UDP conntrack flushes after endpoint removals,
  again once the datapath is revalidated (``appctl``: ``revalidator/wait``; ``close`` stops it);
* ``stale_resets`` (``stale_reset.StaleResetFlusher``): deletes the conntrack entry of an
  invalid TCP RST after a vswitchd restart (``handle`` gives it those packet-ins, the
  ``rejector`` the others);
* ``sweeper`` (``affinity.AffinitySweeper``): expires affinity flows above 65,535 s (``start``
  runs it as a task; ``close`` stops it).

``agent.core.build_core`` builds it with ``SemanticsHelpers.wired(channel, datapath)`` (meter
hook installed, sweeper started), registers its ``handle`` as the channel's packet-in
callback and hands its reject action, conntrack flusher and the channel's ``send`` to the
``Proxier``; ``status()`` is plain data.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from ovsproxy.datapath.affinity import SWEEP_INTERVAL, AffinitySweeper
from ovsproxy.datapath.conntrack import AppCtl, ConntrackFlusher, vswitchd_appctl
from ovsproxy.datapath.reject import Rejector
from ovsproxy.datapath.stale_reset import StaleResetFlusher, is_invalid_rst
from ovsproxy.openflow import protocol as of

log = logging.getLogger(__name__)


class SemanticsHelpers:
    """The agent-side helpers of the Service semantics that flows alone cannot do (the module
    docstring lists them)."""

    def __init__(
        self,
        channel: Any,
        datapath: Any,
        *,
        appctl: AppCtl | None = None,
        sweep_interval: float = SWEEP_INTERVAL,
        rejector: Rejector | None = None,
    ) -> None:
        self.channel = channel
        self.datapath = datapath
        self.rejector = rejector or Rejector(channel)
        self.conntrack = ConntrackFlusher(channel, appctl=appctl)
        self.stale_resets = StaleResetFlusher(channel)
        self.sweeper = AffinitySweeper(channel, datapath.tables, interval=sweep_interval)
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def wired(
        cls, channel: Any, datapath: Any, *, sweep_interval: float = SWEEP_INTERVAL
    ) -> SemanticsHelpers:
        """What the agent runs: the reject meter installed before the datapath's replay on
        every (re)connection (``wrap_on_connected``), the affinity sweeper started. The UDP
        flush waits for the switch's revalidators through its ovs-appctl when it is local."""
        appctl = vswitchd_appctl(str(getattr(channel, "endpoint", "")))
        semantics = cls(channel, datapath, appctl=appctl, sweep_interval=sweep_interval)
        semantics.wrap_on_connected()
        semantics.start()
        return semantics

    def handle(self, packet_in: of.PacketIn) -> None:
        if is_invalid_rst(packet_in):
            self.stale_resets.handle(packet_in)
        else:
            self.rejector.handle(packet_in)

    def wrap_on_connected(self) -> None:
        """Install the reject meter first on every (re)connection, then run the existing hook
        (the datapath's replay): flows bind to their meter when they are added."""
        previous = self.channel.on_connected

        async def on_connected() -> None:
            await self.rejector.install_meter()
            if previous is not None:
                await previous()

        self.channel.on_connected = on_connected

    def start(self) -> None:
        if self._task is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return
            self._task = loop.create_task(self.sweeper.run_until_cancelled(), name="affinity")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.conntrack.close()
        await self.rejector.close()
        await self.stale_resets.close()

    def status(self) -> dict[str, Any]:
        return {
            "reject": self.rejector.stats.as_dict(),
            "conntrack_flush": self.conntrack.stats.as_dict(),
            "invalid_rst": self.stale_resets.stats.as_dict(),
            "affinity_sweeper": self.sweeper.stats.as_dict(),
        }
