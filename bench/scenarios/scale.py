"""Scale: cold start time and memory of the agent at 1,000 / 10,000 / 50,000 / 100,000
Services x 10 endpoints (200 / 500 / 1,000 with ``--quick``), and how they grow.

One kube-apiserver holds the cluster, grown size by size (``bench.kubeload``, as the admin,
before anything is timed). For each size, in one private sandbox: ``ovsproxy run
--kubeconfig`` against it (as in ``cold-start``: the shipped RBAC's ServiceAccount token,
spawn to "first sync done"; kube-apiserver's and etcd's CPU over that span and their RSS at
its end), its resident set size then (VmRSS) and at its peak (VmHWM), and ``ovs-ofctl``
loading the same groups and flows (the baseline, same run: ``ovs-ofctl``'s own dump of what
the agent installed, ``same_content`` once loaded). Loading 100,000 Services and their
slices into kube-apiserver takes most of the run's time (``load`` says how long each step
took).
Goals (issue 26): at every size, the cold start within 1.5x ovs-ofctl's; at every step, at
most 8 kB of RSS per added Service. Growth is judged on the marginal cost per Service
between consecutive sizes, of the agent's CPU time up to healthy (the wall time on a shared
machine drifts with its load) and of its RSS: where it is more than 25% above the first
step's, growth is not linear there, and the output says so.
The plot (``plot``) is committed with the results.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import tempfile
from pathlib import Path
from typing import Any

from bench import agentrun, dp, kubeload

NAME = "scale"
DESCRIPTION = "cold start time and RSS at 1,000 to 100,000 Services x 10 endpoints"

RESULTS = Path(__file__).resolve().parent.parent / "results"
SIZES = [1_000, 10_000, 50_000, 100_000]
QUICK_SIZES = [200, 500, 1_000]
ENDPOINTS = 10
GOAL_RATIO_VS_OFCTL = 1.5  # at every size (issue 26)
GOAL_RSS_PER_SERVICE_KB = 8  # per added Service, every step (issue 26)
NONLINEAR = 1.25  # marginal cost per Service above the first step's by this factor


async def _one(sb: Any, real: kubeload.RealCluster, services: int, tmp: Path) -> dict[str, Any]:
    load = await real.load(services, ENDPOINTS)  # (grown from the previous size)
    agentrun.reset(sb)
    before = real.server_usage()
    run = await agentrun.run_agent(
        agentrun.agent_flags(sb, ["--kubeconfig", str(real.kubeconfig)]),
        on_ready=real.server_usage,
    )
    server = kubeload.usage_delta(before, run.at_ready)
    groups_file, flows_file = tmp / f"groups-{services}", tmp / f"flows-{services}"
    content = agentrun.baseline_of_installed(sb, groups_file, flows_file)
    agentrun.reset(sb)
    ofctl = await asyncio.to_thread(dp.run_ofctl, sb, groups_file, flows_file)
    same = agentrun.switch_content(sb) == content
    agentrun.reset(sb)
    flows, groups, _ = content
    return {
        "services": services,
        "flows": flows,
        "groups": groups,
        "load": load.figures(),
        "cold_start_s": round(run.ready_s, 3),
        "cold_start_cpu_s": round(run.cpu_s, 3),
        "ofctl_s": round(ofctl.total_s, 3),
        "ratio_vs_ofctl": round(run.ready_s / ofctl.total_s, 2),
        "rss_mb": round(run.rss_kb / 1024, 1),
        "peak_rss_mb": round(run.hwm_kb / 1024, 1),
        # kube-apiserver's and etcd's CPU over the agent's cold start, their RSS at its end
        "server": server,
        "healthy": run.healthy,
        "same_content": same,
    }


def growth(rows: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """Marginal cost per Service between consecutive sizes, against the first step's."""
    steps = []
    for low, high in itertools.pairwise(rows):
        per_service = (high[key] - low[key]) / (high["services"] - low["services"])
        steps.append({"from": low["services"], "to": high["services"], "per_service": per_service})
    first = steps[0]["per_service"] if steps else 0.0
    for step in steps:
        step["vs_first_step"] = round(step["per_service"] / first, 2) if first > 0 else None
        step["linear"] = step["vs_first_step"] is None or step["vs_first_step"] <= NONLINEAR
        step["per_service"] = round(step["per_service"] * (1e3 if key.endswith("_s") else 1024), 3)
    return steps


def _plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r["services"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2), dpi=120)
    left.plot(x, [r["cold_start_s"] for r in rows], "o-", label="ovsproxy: API -> healthy")
    left.plot(x, [r["cold_start_cpu_s"] for r in rows], "^:", label="ovsproxy: its CPU time")
    left.plot(x, [r["ofctl_s"] for r in rows], "s--", label="ovs-ofctl: same flows + groups")
    left.set_xlabel(f"Services (x {ENDPOINTS} endpoints)")
    left.set_ylabel("seconds")
    left.set_title("Cold start")
    right.plot(x, [r["rss_mb"] for r in rows], "o-", label="RSS when healthy")
    right.plot(x, [r["peak_rss_mb"] for r in rows], "^--", label="peak RSS")
    right.set_xlabel(f"Services (x {ENDPOINTS} endpoints)")
    right.set_ylabel("MB")
    right.set_title("Agent memory")
    for ax in (left, right):
        ax.grid(True, alpha=0.3)
        ax.legend()
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def run(quick: bool) -> dict[str, Any]:
    sizes = QUICK_SIZES if quick else SIZES
    with tempfile.TemporaryDirectory(prefix="ovsproxy-bench-scale-") as tmp:

        async def measure(sb: Any) -> list[dict[str, Any]]:
            return [await _one(sb, real, services, Path(tmp)) for services in sizes]

        with kubeload.RealCluster(Path(tmp)) as real, dp.sandbox() as sb:
            rows = asyncio.run(measure(sb))
    time_growth, rss_growth = growth(rows, "cold_start_cpu_s"), growth(rows, "rss_mb")
    notes = []
    for name, steps, unit in (("cold start CPU", time_growth, "ms"), ("RSS", rss_growth, "kB")):
        for step in steps:
            if not step["linear"]:
                notes.append(
                    f"{name} is not linear from {step['from']:,} to {step['to']:,} Services: "
                    f"{step['per_service']} {unit} per Service, {step['vs_first_step']}x the "
                    "first step's"
                )
    RESULTS.mkdir(exist_ok=True)
    suffix = "-quick" if quick else ""
    path = RESULTS / f"{dt.date.today().isoformat()}-scale{suffix}.png"
    _plot(rows, path, f"ovsproxy cold start from kube-apiserver ({ENDPOINTS} endpoints each)")
    return {
        "api_server": "kube-apiserver",
        "sizes": rows,
        "same_content": all(r["same_content"] for r in rows),
        "goal_ratio_vs_ofctl": GOAL_RATIO_VS_OFCTL,
        "worst_ratio_vs_ofctl": max(r["ratio_vs_ofctl"] for r in rows),
        "goal_ratio_met": all(r["ratio_vs_ofctl"] <= GOAL_RATIO_VS_OFCTL for r in rows),
        "goal_rss_per_service_kb": GOAL_RSS_PER_SERVICE_KB,
        "goal_rss_met": all(s["per_service"] <= GOAL_RSS_PER_SERVICE_KB for s in rss_growth),
        "cold_start_cpu_growth": time_growth,  # per_service in ms of CPU
        "rss_growth": rss_growth,  # per_service in kB
        "linear": not notes,
        "not_linear": notes or ["growth is linear at every step (within 25%)"],
        "plot": str(path.relative_to(RESULTS.parent.parent)),
    }
