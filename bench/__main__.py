"""Benchmark entry point: ``python -m bench SCENARIO|all [--quick] [--json]``.

A scenario may take options of its own (``add_arguments``, e.g. ``chaos --nodes 3 --minutes 5
--seed 7``), and one with ``IN_ALL = False`` runs only when named (``all`` skips it).

Every scenario measures its baseline in the same invocation and reports ratios, because
absolute times on shared machines drift. Results go to ``bench/results/<date>-<scenario>.json``
plus a Markdown summary next to it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import pkgutil
import platform
import sys
import time
from pathlib import Path
from typing import Any

import bench.scenarios as scenarios_pkg

RESULTS = Path(__file__).parent / "results"
ORDER = [
    "encode",
    "load",
    "full-sync",
    "incremental",
    "routes",
    "nodeport",
    "memory",
    "fuzz",
    "cold-start",
    "churn",
    "scale",
    "peer-ovn",
    "peer-kube-proxy",
    "chaos",
    "soak",
    "http-hostile",
]


def available() -> dict[str, Any]:
    found = {}
    for info in pkgutil.iter_modules(scenarios_pkg.__path__):
        module = importlib.import_module(f"bench.scenarios.{info.name}")
        if hasattr(module, "NAME") and hasattr(module, "run"):
            found[module.NAME] = module
    return dict(sorted(found.items(), key=lambda kv: [*ORDER, kv[0]].index(kv[0])))


def machine() -> dict[str, Any]:
    import os

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
    }
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["memory_gb"] = round(int(line.split()[1]) / 1024**2, 1)
                break
    except OSError:
        pass
    try:
        import subprocess

        version = subprocess.run(
            ["ovs-vswitchd", "--version"], capture_output=True, text=True, timeout=5
        ).stdout.splitlines()
        if version:
            info["openvswitch"] = version[0].split()[-1]
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def provenance() -> dict[str, Any]:
    """The commit measured and whether the tree had changes not in it (then the figures are
    not exactly that commit's)."""
    import subprocess

    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "tree_clean": None if status is None else status == ""}


def to_markdown(name: str, result: dict[str, Any]) -> str:
    lines = [f"## {name}", "", "| figure | value |", "|---|---|"]
    for key, value in result.items():
        if isinstance(value, float):
            value = f"{value:,.3f}" if abs(value) < 1000 else f"{value:,.0f}"
        elif isinstance(value, int):
            value = f"{value:,}"
        elif isinstance(value, (dict, list)):
            value = "`" + json.dumps(value)[:200] + "`"
        lines.append(f"| {key} | {value} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    found = available()
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("scenario", choices=[*found, "all"])
    parser.add_argument("--quick", action="store_true", help="small sizes, for CI and smoke runs")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--no-save", action="store_true", help="do not write bench/results")
    for module in found.values():
        if hasattr(module, "add_arguments"):
            module.add_arguments(parser)
    args = parser.parse_args(argv)

    if args.scenario == "all":
        names = [name for name, module in found.items() if getattr(module, "IN_ALL", True)]
    else:
        names = [args.scenario]
    today = dt.date.today().isoformat()
    report: dict[str, Any] = {
        "date": today,
        "quick": args.quick,
        **provenance(),
        "machine": machine(),
    }
    failed = False
    for name in names:
        started = time.perf_counter()
        if not args.json:
            print(f"bench: {name} ...", file=sys.stderr, flush=True)
        try:
            options = {key: getattr(args, key) for key in getattr(found[name], "OPTIONS", ())}
            result = found[name].run(quick=args.quick, **options)
        except Exception as exc:  # one broken scenario must not hide the others' figures
            failed = True
            result = {"error": f"{type(exc).__name__}: {exc}"}
        result["wall_s"] = round(time.perf_counter() - started, 3)
        report[name] = result
        if not args.no_save:
            RESULTS.mkdir(exist_ok=True)
            suffix = "-quick" if args.quick else ""
            stem = RESULTS / f"{today}-{name}{suffix}"
            payload = {
                key: report[key] for key in ("date", "quick", "commit", "tree_clean", "machine")
            }
            payload[name] = result
            stem.with_suffix(".json").write_text(json.dumps(payload, indent=2) + "\n")
            stem.with_suffix(".md").write_text(to_markdown(name, result))
        if not args.json:
            print(to_markdown(name, result))
    if args.scenario == "all" and not args.no_save:
        # One file with every scenario's figures, for bench/README.md (python -m bench.readme).
        stem = RESULTS / f"{today}-all{'-quick' if args.quick else ''}"
        stem.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
        header = f"# Benchmarks {today}{' (quick)' if args.quick else ''}\n\n"
        header += f"commit `{report['commit']}`, tree clean: {report['tree_clean']}\n\n"
        header += "`" + json.dumps(report["machine"]) + "`\n\n"
        body = "\n".join(to_markdown(name, report[name]) for name in names)
        stem.with_suffix(".md").write_text(header + body)
    if args.json:
        print(json.dumps(report, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
