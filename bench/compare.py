"""Result files of two trees side by side: every numeric figure both sides have, and how many
moved by more than a threshold (issue 24 asks for before/after runs back to back).

    python -m bench.compare BEFORE.json AFTER.json [--threshold 5] [--list PREFIX]
    python -m bench.compare --before B1.json B2.json ... --after A1.json A2.json ... [...]

A side is one result file or several: ``all`` runs, or single-scenario runs (``python -m
bench SCENARIO --json``) that together cover several scenarios and rounds. A figure's value
on a side is its median over the files that have it, so runs alternated between the trees
compare their medians rather than one run's noise. Prints a markdown summary: the commits,
how many files and figures are shared, how many moved by more than the threshold (per
scenario), and with ``--list`` those whose path starts with PREFIX, with every run's value.
Which direction is better is not judged here: a figure can be a time, a rate, a count or a
baseline's.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

SKIPPED = ("date", "machine", "commit", "tree_clean", "quick")


def figures(report: Any, path: str = "") -> Iterator[tuple[str, float]]:
    """Every numeric leaf (booleans excluded) as (dotted path, value)."""
    if isinstance(report, dict):
        for key, value in report.items():
            yield from figures(value, f"{path}.{key}" if path else str(key))
    elif isinstance(report, list):
        for index, value in enumerate(report):
            yield from figures(value, f"{path}.{index}")
    elif isinstance(report, int | float) and not isinstance(report, bool):
        yield path, float(report)


def runs(reports: Iterable[dict[str, Any]]) -> dict[str, list[float]]:
    """Every figure of one side (result files' metadata and wall times left out) -> its value
    in each file that has it."""
    out: dict[str, list[float]] = {}
    for report in reports:
        for key, value in figures(report):
            if not key.startswith(SKIPPED) and "wall_s" not in key:
                out.setdefault(key, []).append(value)
    return out


Moved = tuple[str, float, float, float]


def moved(
    before: dict[str, list[float]], after: dict[str, list[float]], threshold: float
) -> tuple[list[str], list[Moved]]:
    """The figures both sides have, and those whose median's relative change exceeds
    ``threshold`` (a fraction): (path, median before, median after, change)."""
    shared = [k for k in before if k in after]
    out = []
    for key in shared:
        a, b = statistics.median(before[key]), statistics.median(after[key])
        if a == b:
            continue
        change = (b - a) / abs(a) if a else float("inf")
        if abs(change) > threshold:
            out.append((key, a, b, change))
    return shared, out


def _commits(reports: list[dict[str, Any]]) -> str:
    seen = {(str(r.get("commit", "?"))[:12], r.get("tree_clean")) for r in reports}
    return ", ".join(f"`{commit}` (clean: {clean})" for commit, clean in sorted(seen, key=str))


def _values(values: list[float]) -> str:
    return " / ".join(f"{v:g}" for v in values)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.compare")
    parser.add_argument("files", type=Path, nargs="*", help="BEFORE.json AFTER.json")
    parser.add_argument("--before", type=Path, nargs="+", default=[])
    parser.add_argument("--after", type=Path, nargs="+", default=[])
    parser.add_argument("--threshold", type=float, default=5.0, help="percent")
    parser.add_argument("--list", default=None, help="list the moved figures under PREFIX")
    args = parser.parse_args(argv)
    if args.files:
        if len(args.files) != 2 or args.before or args.after:
            parser.error("give BEFORE.json AFTER.json, or --before FILE... --after FILE...")
        args.before, args.after = [args.files[0]], [args.files[1]]
    if not args.before or not args.after:
        parser.error("both sides need at least one result file")
    before = [json.loads(p.read_text()) for p in args.before]
    after = [json.loads(p.read_text()) for p in args.after]
    old, new = runs(before), runs(after)
    shared, big = moved(old, new, args.threshold / 100)
    print(f"before: {_commits(before)}, {len(before)} file(s)")
    print(f"after: {_commits(after)}, {len(after)} file(s)\n")
    print(
        f"{len(shared)} shared figures (medians over the files that have them); {len(big)}"
        f" moved by more than {args.threshold:g}%.\n"
    )
    by_scenario = Counter(key.split(".")[0] for key, *_ in big)
    print("| scenario | moved |\n|---|---|")
    for scenario, count in sorted(by_scenario.items()):
        print(f"| {scenario} | {count} |")
    if args.list is not None:
        print("\n| figure | before | after | change | runs before | runs after |")
        print("|---|---|---|---|---|---|")
        for key, a, b, change in big:
            if key.startswith(args.list):
                print(
                    f"| {key} | {a:g} | {b:g} | {change * 100:+.1f}% "
                    f"| {_values(old[key])} | {_values(new[key])} |"
                )


if __name__ == "__main__":
    main()
