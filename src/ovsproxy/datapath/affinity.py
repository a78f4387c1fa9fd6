"""Expiring session-affinity flows whose timeout OVS cannot hold (above 65,535 s).

Kubernetes allows ``sessionAffinityConfig.clientIP.timeoutSeconds`` up to 86,400; OpenFlow
timeouts are 16-bit. Antrea caps the timeout silently. Here, a Service whose timeout exceeds the
limit gets learned flows without an OVS timeout whose cookie carries the timeout and a "swept"
bit (``pipeline.learned_cookie``); this sweeper dumps those flows every ``interval`` seconds and
deletes each whose idle age (OpenFlow 1.5 flow stats: time since a packet last hit it, i.e.
since the client's last new connection) has reached its timeout. So the semantics stay
kube-proxy's (the timer restarts with each new connection), exact to within ``interval``
(default 60 s, under 0.1 % of 86,400 s). The state is all in the switch: a restarted agent
sweeps the flows of its predecessor. While no agent runs, such flows do not expire.

A client whose flow is deleted a moment after a new connection refreshed it (between our dump
and our delete) is re-balanced once: the only imprecision.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ovsproxy.datapath import pipeline as pl
from ovsproxy.openflow import protocol as of

log = logging.getLogger(__name__)

# Seconds between sweeps (the agent's; the proxier's status says it)
SWEEP_INTERVAL = 60.0


def expired_flows(flows: Iterable[of.FlowDesc]) -> list[of.FlowDesc]:
    """The swept learned flows whose idle age has reached the timeout in their cookie."""
    out = []
    for desc in flows:
        timeout, swept = pl.learned_cookie_timeout(desc.flow.cookie)
        if not swept or desc.flow.idle_timeout or desc.idle_age is None or timeout <= 0:
            continue
        if desc.idle_age >= timeout:
            out.append(desc)
    return out


def delete_message(flow: of.FlowMod) -> of.FlowMod:
    """Delete exactly this learned flow (and only while its cookie is unchanged)."""
    return flow.as_delete()


@dataclass
class SweepStats:
    sweeps: int = 0
    swept_flows: int = 0  # flows under agent expiry seen by the last sweep
    deleted: int = 0
    errors: int = 0
    last_error: str = ""
    interval: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "interval_s": self.interval,
            "sweeps": self.sweeps,
            "flows_under_agent_expiry": self.swept_flows,
            "deleted": self.deleted,
            "errors": self.errors,
            "last_error": self.last_error,
        }


class AffinitySweeper:
    """``await sweeper.sweep_once()`` or run ``sweeper.run()`` as a task."""

    def __init__(
        self, channel: Any, tables: pl.Tables, *, interval: float = SWEEP_INTERVAL
    ) -> None:
        self.channel = channel
        self.tables = tables
        self.interval = interval
        self.stats = SweepStats(interval=interval)

    async def sweep_once(self) -> int:
        flows = await self.channel.dump_flows(
            self.tables.session_affinity,
            cookie=pl.learned_cookie(0, swept=True),
            cookie_mask=pl.LEARNED_CATEGORY_MASK | pl.LEARNED_SWEPT,
        )
        self.stats.sweeps += 1
        self.stats.swept_flows = len(flows)
        doomed = expired_flows(flows)
        if doomed:
            await self.channel.send([delete_message(d.flow) for d in doomed])
            self.stats.deleted += len(doomed)
            log.debug("affinity: %d learned flow(s) expired by the agent", len(doomed))
        return len(doomed)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            if not getattr(self.channel, "connected", True):
                continue
            try:
                await self.sweep_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.stats.errors += 1
                self.stats.last_error = str(exc)
                log.warning("affinity: sweep failed: %s", exc)

    async def run_until_cancelled(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await self.run()
