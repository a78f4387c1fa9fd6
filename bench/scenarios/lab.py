"""The multi-node lab: how long ``Lab(3)`` (``ovsproxy lab up --nodes 3``) takes to come up.

Needs root. Each round brings a 3-node dual-stack lab up (nodes in parallel: sandbox, uplink,
host-gw routes, two pods each, one agent process each, until every agent's /healthz is 200)
and down again. Baseline, measured in the same run: three bare sandboxes (ovsdb-server +
ovs-vswitchd + bridge) started one after the other, the part of a node no lab can skip.
Figures: ``up_s`` per round (and the best), ``down_s``, ``sandboxes_s``, their ratio, and the
load average at the start (other work on a shared machine shows up here).
"""

from __future__ import annotations

import os
import time
from typing import Any

from ovsproxy.lab.cluster import Lab
from ovsproxy.ovs.sandbox import Sandbox

NAME = "lab"
DESCRIPTION = "multi-node lab: `lab up --nodes 3` wall time vs three bare sandboxes"


def run(quick: bool = False) -> dict[str, Any]:
    if os.geteuid() != 0:
        raise PermissionError("the lab bench needs root (namespaces, OVS sandboxes)")
    rounds = 1 if quick else 3
    load_start = os.getloadavg()[0]
    ups, downs = [], []
    for _ in range(rounds):
        lab = Lab(3)
        lab.up()
        ups.append(lab.started_in or 0.0)
        started = time.perf_counter()
        lab.down()
        downs.append(time.perf_counter() - started)
    started = time.perf_counter()
    for _ in range(3):
        with Sandbox():
            pass
    sandboxes = time.perf_counter() - started
    best = min(ups)
    return {
        "nodes": 3,
        "rounds": rounds,
        "up_s": [round(u, 3) for u in ups],
        "best_up_s": round(best, 3),
        "down_s": round(min(downs), 3),
        "sandboxes_s": round(sandboxes, 3),
        "ratio_vs_sandboxes": round(best / sandboxes, 2) if sandboxes else None,
        "target_up_s": 10.0,
        "load_average_at_start": round(load_start, 2),
    }
