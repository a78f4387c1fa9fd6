"""Start-up's wait for the switch: the OpenFlow channel retries with capped backoff and logs
why each attempt fails; this says, once and then periodically, what start-up waits for."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from ovsproxy.openflow.connection import Channel, describe_connect_error

log = logging.getLogger("ovsproxy.agent")

SWITCH_WAIT_LOG_EVERY = 30.0  # seconds between "still waiting for the switch" lines


async def wait_for_switch(
    channel: Channel, stop: asyncio.Event, log_every: float = SWITCH_WAIT_LOG_EVERY
) -> bool:
    """Wait, for as long as it takes, until the OpenFlow channel is connected (True) or
    ``stop`` is set (False). The switch may start after the agent (a node booting, an OVS
    upgrade): the channel retries with capped backoff and logs why each attempt fails; this
    says what start-up waits for. /healthz answers 503 meanwhile (not connected, no sync).
    A bridge that refuses OpenFlow 1.5 raises: that needs the operator, not time."""
    if channel.connected:
        return True
    log.info(
        "waiting for the switch at %s before the first sync (/healthz answers 503 until then)",
        channel.endpoint,
    )
    started = asyncio.get_running_loop().time()
    stopping = asyncio.ensure_future(stop.wait())
    try:
        while True:
            ready = asyncio.ensure_future(channel.wait_ready())
            done, _ = await asyncio.wait(
                {ready, stopping}, timeout=log_every, return_when=asyncio.FIRST_COMPLETED
            )
            if ready in done:
                ready.result()  # raises VersionMismatch
                waited = asyncio.get_running_loop().time() - started
                log.info("the switch at %s is up after %.1fs", channel.endpoint, waited)
                return True
            ready.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ready
            if stopping in done:
                return False
            last = channel.last_error
            log.warning(
                "still waiting for the switch at %s after %.0fs (%d attempts%s)",
                channel.endpoint,
                asyncio.get_running_loop().time() - started,
                channel.failed_attempts,
                f", last: {describe_connect_error(channel.endpoint, last)}" if last else "",
            )
    finally:
        stopping.cancel()
