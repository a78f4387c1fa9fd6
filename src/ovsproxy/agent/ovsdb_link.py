"""The agent's OVSDB connection at start-up: retried until ovsdb-server answers.

An agent started before ovsdb-server (node boot, an OVS upgrade) says so once, clearly, and
retries with a capped backoff until the database answers and the run's cookie generation is
recorded; a stop request ends the wait. Once connected, the IDL reconnects by itself after
ovsdb-server restarts (``OVSDB.connected`` says whether it is up); the group-id registry keeps
what it cannot write meanwhile (``OVSDBGroupRegistry``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from ovsproxy.datapath import pipeline as pl
from ovsproxy.ovs.ovsdb import OVSDB

log = logging.getLogger("ovsproxy.agent")

RETRY_INITIAL = 0.5  # seconds
RETRY_MAX = 5.0


@dataclass
class OVSDBLink:
    """The start-up state for /status and /metrics: attempts so far and the last error."""

    endpoint: str
    attempts: int = 0
    last_error: str | None = None
    connected_at: float | None = None  # time.time() of the first success
    # Our conntrack zones' timeout policy: "set", or why it is not (set_zone_timeouts)
    zone_timeouts: str = "not set yet"

    def status(self, db: OVSDB | None) -> dict[str, object]:
        return {
            "endpoint": self.endpoint,
            "connected": bool(db is not None and db.connected),
            "start_attempts": self.attempts,
            "last_error": None if db is not None and db.connected else self.last_error,
            "zone_timeouts": self.zone_timeouts,
        }


async def connect(link: OVSDBLink, bridge: str, stop: asyncio.Event) -> tuple[OVSDB, int] | None:
    """The OVSDB connection and this run's cookie generation; None when ``stop`` came first."""
    delay = RETRY_INITIAL
    while not stop.is_set():
        link.attempts += 1
        db: OVSDB | None = None
        try:
            db = await asyncio.to_thread(OVSDB, link.endpoint)
            generation = await asyncio.to_thread(db.next_generation, bridge)
        except Exception as exc:
            if db is not None:
                await asyncio.to_thread(db.close)
            link.last_error = f"{type(exc).__name__}: {exc}"
            if link.attempts == 1 or link.attempts % 10 == 0:
                log.warning(
                    "OVSDB at %s is not reachable (%s); retrying every %gs at most, the agent "
                    "starts once it answers (attempt %d)",
                    link.endpoint,
                    exc,
                    RETRY_MAX,
                    link.attempts,
                )
            try:
                await asyncio.wait_for(stop.wait(), delay)
            except TimeoutError:
                pass
            delay = min(RETRY_MAX, delay * 2)
            continue
        if link.attempts > 1:
            log.info("OVSDB at %s answers after %d attempts", link.endpoint, link.attempts)
        link.connected_at = time.time()
        return db, generation
    return None


async def datapath_type_of(db: OVSDB, bridge: str) -> str | None:
    """The bridge's datapath type (``OVSDB.datapath_type``); None when it cannot be read (the
    mid-stream flows are then on: ``proxy.mid_stream.choose``)."""
    try:
        return await asyncio.to_thread(db.datapath_type, bridge)
    except Exception as exc:
        log.warning("the datapath type of bridge %s is not readable: %s", bridge, exc)
        return None


async def set_zone_timeouts(link: OVSDBLink, db: OVSDB, bridge: str) -> None:
    """Our conntrack zones remember closed TCP connections as long as Linux conntrack does
    (``pipeline.CT_TIMEOUT_POLICY``; why there). Not fatal: without it a reused 4-tuple costs a
    retransmission or a connection, nothing else; /status says which it is."""
    policy = dict(pl.CT_TIMEOUT_POLICY)
    try:
        foreign = await asyncio.to_thread(db.ensure_zone_timeouts, bridge, pl.CT_ZONES, policy)
    except Exception as exc:
        link.zone_timeouts = f"failed: {type(exc).__name__}: {exc}"
        log.warning("conntrack zone timeout policy not set: %s", exc)
        return
    text = " ".join(f"{key}={value}" for key, value in policy.items())
    if foreign:
        link.zone_timeouts = f"{text}, except {', '.join(foreign)} (configured by someone else)"
        log.warning("conntrack timeout policy: %s configured by someone else", ", ".join(foreign))
    else:
        link.zone_timeouts = text
