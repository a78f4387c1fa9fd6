"""Memory: resident set size of 10,000 Services x 10 endpoints, and the cost per Service.

Each measurement runs in a fresh Python process (clean numbers: no other scenario's heap, no
warm caches), which reports its VmRSS (``/proc/self/status``) after each layer:

* ``baseline``: interpreter and ovsproxy imported;
* ``model``: the ServicePorts and their endpoints (what the tracker holds);
* ``desired``: every Service's groups and flows built (``service_objects``) and staged in a
  ``SwitchSync``;
* ``installed``: after the commit (to a switch that accepts everything and keeps nothing, so
  what a real bundle holds until its reply is not in it): the installed-state cache, which
  shares the flows and the groups' buckets with the desired state, after the memory policy
  around the sync (``datapath.memory``) gave the heap's free pages back to the OS.

What it measures is the datapath and the model in one process, as the agent holds them, for
the Services' own groups and flows (not the standalone mode's mid-stream flows, one per TCP
endpoint, which the proxier adds: ``proxy.mid_stream``); the agent's whole resident set
(with the informers' objects, the proxier's trackers, the channel) is ``cold-start``'s
``agent_rss_mb_api``.

Goals (issue 16, at 10,000 x 10): ``rss_total_mb`` <= 150 and ``per_endpoint_datapath_bytes``
<= 1,024; with ``--quick`` (2,000 Services) they are printed but mean little.

Two cluster sizes are measured (1,000 and 10,000 Services; 200 and 2,000 with ``--quick``);
the per-Service figures are the difference between them divided by the difference in
Services, so fixed costs (imports, the pipeline, allocator slack) cancel out.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

NAME = "memory"
DESCRIPTION = "RSS of 10,000 Services x 10 endpoints (model + desired + installed) and per Service"

ROOT = Path(__file__).resolve().parent.parent.parent
ENDPOINTS = 10
GOAL_RSS_TOTAL_MB = 150  # at 10,000 x 10
GOAL_PER_ENDPOINT_DATAPATH_BYTES = 1024


def _rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def probe(services: int, endpoints: int = ENDPOINTS) -> dict[str, Any]:
    """Runs in its own process: RSS in kB after each layer."""
    import asyncio

    from bench import dp
    from ovsproxy.datapath.flow_context import Context
    from ovsproxy.datapath.memory import memory_policy
    from ovsproxy.datapath.switch_sync import SwitchSync
    from ovsproxy.diagnostics.compare import RecordingSwitch

    rss = {"baseline": _rss_kb()}
    ports = dp.cluster(services, endpoints)
    rss["model"] = _rss_kb()

    async def build_and_commit() -> SwitchSync:
        # A switch that keeps nothing: only our own state is measured.
        datapath = SwitchSync(RecordingSwitch(), dp.CONFIG, dp.GENERATION)
        ctx = Context(datapath.tables, dp.GENERATION)
        with memory_policy(datapath):  # as the agent's sync runs (agent.sync)
            dp.stage_cluster(datapath, ports, ctx)
            rss["desired"] = _rss_kb()
            await datapath.commit()
        return datapath

    datapath = asyncio.run(build_and_commit())
    rss["installed"] = _rss_kb()
    return {
        "services": services,
        "endpoints": services * endpoints,
        "flows": len(datapath.installed_flows),
        "groups": len(datapath.installed_groups),
        "rss_kb": rss,
    }


def _measure(services: int) -> dict[str, Any]:
    code = (
        "import json; from bench.scenarios.memory import probe; "
        f"print(json.dumps(probe({services})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(quick: bool) -> dict[str, Any]:
    small_n, big_n = (200, 2_000) if quick else (1_000, 10_000)
    small, big = _measure(small_n), _measure(big_n)
    s, b = small["rss_kb"], big["rss_kb"]

    def mb(kb: int) -> float:
        return round(kb / 1024, 1)

    def per_service(low: str, high: str) -> float:
        """kB per Service for the layers between `low` and `high`."""
        grown = (b[high] - b[low]) - (s[high] - s[low])
        return round(grown / (big_n - small_n), 2)

    total_mb = mb(b["installed"])
    per_endpoint = round(per_service("model", "installed") * 1024 / ENDPOINTS)
    return {
        "services": big_n,
        "endpoints_per_service": ENDPOINTS,
        "flows": big["flows"],
        "groups": big["groups"],
        "rss_total_mb": total_mb,
        "rss_baseline_mb": mb(b["baseline"]),
        "model_mb": mb(b["model"] - b["baseline"]),
        "desired_mb": mb(b["desired"] - b["model"]),
        "installed_mb": mb(b["installed"] - b["desired"]),
        "datapath_mb": mb(b["installed"] - b["model"]),
        "per_service_kb": per_service("baseline", "installed"),
        "per_service_model_kb": per_service("baseline", "model"),
        "per_service_datapath_kb": per_service("model", "installed"),
        "per_endpoint_datapath_bytes": per_endpoint,
        "goal_rss_total_mb": GOAL_RSS_TOTAL_MB,
        "goal_per_endpoint_datapath_bytes": GOAL_PER_ENDPOINT_DATAPATH_BYTES,
        "goal_met": total_mb <= GOAL_RSS_TOTAL_MB
        and per_endpoint <= GOAL_PER_ENDPOINT_DATAPATH_BYTES,
        "small_cluster": {"services": small_n, "rss_kb": s},
        "big_cluster": {"services": big_n, "rss_kb": b},
    }
