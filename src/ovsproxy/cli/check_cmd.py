"""``ovsproxy check PATH...``: validate manifests the way the manifest source reads them.

Prints every problem as ``file:line (document N): Kind namespace/name: field: why (got
value)``, then a summary of what is valid. Across all the files, Services that claim the same
nodePort, healthCheckNodePort or address:port are problems too, with the file:line of both
(the agent's decision, ``proxy.claims``: the older Service keeps it). Exit status 1 when
there is any problem.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import replace

import click

from ovsproxy.gcpause import gc_paused
from ovsproxy.model import Service, ServicePort
from ovsproxy.model.problems import Problem, SourceError, SourceLocation
from ovsproxy.proxy.claims import resolve
from ovsproxy.sources.manifests import (
    DEFAULT_MAX_FILE_BYTES,
    SOURCE,
    ManifestObject,
    ObjectKey,
    ParsedManifest,
    discover_files,
    duplicate_problem,
    parse_manifest,
    read_regular_file,
)


def check_paths(paths: list[str]) -> tuple[list[ParsedManifest], list[Problem]]:
    """Parse every manifest under ``paths``; all problems, cross-file duplicates included."""
    found = discover_files(paths)
    problems: list[Problem] = [*found.missing, *(problem for _, problem in found.unlisted)]
    parsed: list[ParsedManifest] = []
    first: dict[ObjectKey, ManifestObject] = {}
    with gc_paused():
        for path in found.files:
            try:
                data = read_regular_file(path, DEFAULT_MAX_FILE_BYTES)
            except OSError as exc:
                why = exc.strerror or str(exc)
                problems.append(SourceError(SOURCE, why, SourceLocation(str(path))))
                continue
            manifest = parse_manifest(data, str(path))
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
    problems.extend(port_conflicts(first.values()))
    return parsed, problems


def port_conflicts(objects: Iterable[ManifestObject]) -> list[Problem]:
    """Every port of these Services refused because an older one claims the same port, with
    the file:line of both Services."""
    where: dict[tuple[str, str], SourceLocation] = {}
    ports: list[ServicePort] = []
    for obj in objects:
        if isinstance(obj.value, Service) and obj.value.ports:
            where[obj.value.namespace, obj.value.name] = obj.location
            ports.extend(obj.value.ports)
    return [
        replace(
            conflict,
            location=where[conflict.refused.service],
            owner_location=where[conflict.owner.service],
        )
        for name, conflicts in sorted(resolve(ports).items())
        for conflict in conflicts
    ]


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
