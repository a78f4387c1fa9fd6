"""An agent restarted onto a switch that already serves a frontend flushes that frontend's
untranslated conntrack entries once and publishes it without waiting for revalidation (no
packet to it was committed untranslated: the older agent's ServiceLB flow took it); a
frontend the switch did not serve is flushed again after revalidation, as on any commit.
Real OVS: the keys the restarted agent reads from the switch's FLOW_DESC dump are the keys
of the flows it stages."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from ovsproxy.datapath.conntrack import FlushFilter
from ovsproxy.model import Protocol
from ovsproxy.ovs.sandbox import Sandbox
from tests.semantics.harness import World, endpoint, make_world

pytestmark = [pytest.mark.ovs, pytest.mark.shared_sandbox]

KEPT, NEW = "10.96.0.71", "10.96.0.72"


def record_flushes(world: World) -> list[tuple[str, bool]]:
    """(frontend, flushed again) of each untranslated filter the world's flusher is given."""
    seen: list[tuple[str, bool]] = []
    flusher = world.semantics.conntrack
    flush = flusher.flush

    async def recorded(filters: Sequence[FlushFilter], *, again: bool = True) -> None:
        seen.extend((str(f.frontend), again) for f in filters)
        await flush(filters, again=again)

    flusher.flush = recorded  # type: ignore[method-assign]
    return seen


async def close(world: World) -> None:
    await world.semantics.close()
    await world.channel.close()


@pytest.mark.parametrize("with_new", [False, True], ids=["served-only", "and-a-new-one"])
async def test_a_restart_flushes_a_frontend_the_switch_served_once(
    sandbox: Sandbox, with_new: bool
) -> None:
    server = sandbox.add_pod("srv", udp_ports=(5353,))
    older = await make_world(sandbox, generation=1)
    try:
        older.service("kept", [KEPT], 53, protocol=Protocol.UDP)
        older.endpoints("kept", [endpoint(server, 5353)], Protocol.UDP)
        await older.sync()
    finally:
        await close(older)
    restarted = await make_world(sandbox, generation=2)
    try:
        flushed = record_flushes(restarted)
        restarted.service("kept", [KEPT], 53, protocol=Protocol.UDP)
        restarted.endpoints("kept", [endpoint(server, 5353)], Protocol.UDP)
        if with_new:
            restarted.service("new", [NEW], 53, protocol=Protocol.UDP)
            restarted.endpoints("new", [endpoint(server, 5353)], Protocol.UDP)
        await restarted.sync()
        assert (KEPT, False) in flushed  # once: the switch served it
        assert ((NEW, True) in flushed) == with_new  # not served before: again
        assert [f for f, _ in flushed].count(KEPT) == 1
        stats = restarted.semantics.conntrack.stats
        await restarted.semantics.conntrack.settled()
        assert stats.settle_flushes == (1 if with_new else 0)
    finally:
        restarted.delete_service("kept")
        if with_new:
            restarted.delete_service("new")
        await restarted.sync()
        await close(restarted)
