"""``ovsproxy check PATH...``: validate manifests the way the manifest source reads them.

Prints every problem as ``file:line (document N): Kind namespace/name: field: why (got
value)``, then a summary of what is valid. Exit status 1 when there is any problem.
"""

from __future__ import annotations

from collections import Counter

import click

from ovsproxy.gcpause import gc_paused
from ovsproxy.model.problems import Problem
from ovsproxy.sources.manifests import (
    ManifestObject,
    ObjectKey,
    ParsedManifest,
    discover_files,
    duplicate_problem,
    parse_manifest,
)


def check_paths(paths: list[str]) -> tuple[list[ParsedManifest], list[Problem]]:
    """Parse every manifest under ``paths``; all problems, cross-file duplicates included."""
    files, missing = discover_files(paths)
    problems: list[Problem] = list(missing)
    parsed: list[ParsedManifest] = []
    first: dict[ObjectKey, ManifestObject] = {}
    with gc_paused():
        for path in files:
            try:
                manifest = parse_manifest(path.read_bytes(), str(path))
            except OSError as exc:
                raise click.FileError(str(path), hint=str(exc)) from exc
            parsed.append(manifest)
            problems.extend(manifest.problems)
            seen_here: set[ObjectKey] = set()
            for obj in manifest.objects:
                if obj.key is None or obj.key in seen_here:
                    continue  # duplicates inside one file are already among its problems
                seen_here.add(obj.key)
                kept = first.setdefault(obj.key, obj)
                if kept is not obj:
                    problems.append(duplicate_problem(kept, obj))
    return parsed, problems


def summarize(parsed: list[ParsedManifest], problems: list[Problem]) -> str:
    counts: Counter[str] = Counter()
    for manifest in parsed:
        counts["other"] += manifest.other_documents
        for obj in manifest.objects:
            if obj.value is None:
                counts["invalid"] += 1
            elif obj.ignored:
                counts["ignored"] += 1
            else:
                counts[obj.kind] += 1
    text = (
        f"{len(parsed)} file(s): {counts['Service']} Service(s) and "
        f"{counts['EndpointSlice']} EndpointSlice(s) valid"
    )
    extras = []
    if counts["ignored"]:
        extras.append(
            f"{counts['ignored']} Service(s) ignored (headless, ExternalName, other proxy)"
        )
    if counts["other"]:
        extras.append(f"{counts['other']} object(s) of other kinds skipped")
    if counts["invalid"]:
        extras.append(f"{counts['invalid']} invalid object(s)")
    if extras:
        text += "; " + "; ".join(extras)
    failed = sum(1 for m in parsed if m.parse_failed)
    if failed:
        text += f"; {failed} file(s) do not parse"
    return text + f". {len(problems)} problem(s)."


@click.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path())
def check(paths: tuple[str, ...]) -> None:
    """Validate Service and EndpointSlice manifests (files or directories)."""
    parsed, problems = check_paths(list(paths))
    for problem in problems:
        location, _, text = str(problem).partition(": ")
        if problem.location is None:
            location, text = "", str(problem)
        click.echo(f"{click.style(location, bold=True)}: {text}" if location else text)
    summary = summarize(parsed, problems)
    click.secho(summary, fg="red" if problems else "green")
    raise SystemExit(1 if problems else 0)
