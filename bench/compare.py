"""Two ``bench all`` result files side by side: every numeric figure they share, and how many
moved by more than a threshold (issue 24 asks for before/after runs back to back).

    python -m bench.compare BEFORE.json AFTER.json [--threshold 5] [--list PREFIX]

Prints a markdown summary: the commits, how many figures are shared, how many moved by more
than the threshold (per scenario), and with ``--list`` those of the scenarios whose path
starts with PREFIX. Which direction is better is not judged here: a figure can be a time, a
rate, a count or a baseline's.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Iterator
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


def moved(
    before: dict[str, Any], after: dict[str, Any], threshold: float
) -> tuple[list[str], list[tuple[str, float, float, float]]]:
    """The shared figures, and those whose relative change exceeds ``threshold`` (a fraction):
    (path, before, after, change)."""
    old = {k: v for k, v in figures(before) if not k.startswith(SKIPPED) and "wall_s" not in k}
    new = dict(figures(after))
    shared = [k for k in old if k in new]
    out = []
    for key in shared:
        a, b = old[key], new[key]
        if a == b:
            continue
        change = (b - a) / abs(a) if a else float("inf")
        if abs(change) > threshold:
            out.append((key, a, b, change))
    return shared, out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.compare")
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--threshold", type=float, default=5.0, help="percent")
    parser.add_argument("--list", default=None, help="list the moved figures under PREFIX")
    args = parser.parse_args(argv)
    before, after = json.loads(args.before.read_text()), json.loads(args.after.read_text())
    shared, big = moved(before, after, args.threshold / 100)
    print(
        f"before: `{before.get('commit', '?')[:12]}` (clean: {before.get('tree_clean')}),"
        f" after: `{after.get('commit', '?')[:12]}` (clean: {after.get('tree_clean')})\n"
    )
    print(f"{len(shared)} shared figures; {len(big)} moved by more than {args.threshold:g}%.\n")
    by_scenario = Counter(key.split(".")[0] for key, *_ in big)
    print("| scenario | moved |\n|---|---|")
    for scenario, count in sorted(by_scenario.items()):
        print(f"| {scenario} | {count} |")
    if args.list is not None:
        print("\n| figure | before | after | change |\n|---|---|---|---|")
        for key, a, b, change in big:
            if key.startswith(args.list):
                print(f"| {key} | {a:g} | {b:g} | {change * 100:+.1f}% |")


if __name__ == "__main__":
    main()
