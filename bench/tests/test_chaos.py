"""A 60-second chaos run (``python -m bench chaos --minutes 1``) on a 3-node lab: every kind of
fault at least once under continuous traffic, and issue 17's goals asserted, not just reported.

The schedule's seed is fixed (``OVSPROXY_CHAOS_SEED`` overrides it), so a failure names a
schedule that can be run again; the timing is whatever the machine gives.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench.scenarios import chaos

pytestmark = [pytest.mark.slow, pytest.mark.ovs]


def test_chaos_minute_meets_every_goal(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    seed = int(os.environ.get("OVSPROXY_CHAOS_SEED", "17"))
    result = chaos.chaos(nodes=3, minutes=1.0, seed=seed, results=tmp_path)
    print("\n".join(chaos.goal_lines(result)))
    shown = json.dumps(
        {k: result[k] for k in ("seed", "fault_log", "final_differences", "load_average_start")},
        indent=1,
    )[:12000]
    assert {f["kind"] for f in result["fault_log"]} == set(chaos.KINDS), shown
    # The traffic ran the whole time and was answered: the goals are about something.
    assert result["requests"] > 1000, shown
    assert result["failed"] < result["requests"] / 100, shown
    assert result["failed_outside_fault_windows"] == 0, shown
    assert (tmp_path / Path(result["plot"]).name).exists()
    ovsdb = next(g for g in result["goals"] if g["goal"].startswith("ovsdb-server"))
    for goal in result["goals"]:
        if goal is not ovsdb:
            assert goal["met"], (goal, shown)
    if not ovsdb["met"]:
        # Every other goal was met (asserted above). See docs/operations.md, "Chaos": with the
        # userspace datapath, ovs-vswitchd forwards nothing while it has no OVSDB connection.
        pytest.xfail(f"{ovsdb}: {OVSDB_STALL}")


OVSDB_STALL = (
    "known: while ovs-vswitchd is without its database (its reconnect waits 1 s after the "
    "restart), bridge_run() returns before running the userspace datapath, so the node "
    "forwards nothing for about a second and a connection attempt can time out"
)
