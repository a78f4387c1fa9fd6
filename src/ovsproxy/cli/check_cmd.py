"""``ovsproxy check PATH...``: validate manifests the way the manifest source reads them.

Prints every problem as ``file:line (document N): Kind namespace/name: field: why (got
value)``, then a summary of what is valid. Across all the files, Services that claim the same
nodePort, healthCheckNodePort or address:port are problems too, with the file:line of both
(the agent's decision, ``proxy.claims``: the older Service keeps it), and so are external IPs
the agent refuses (``proxy.external_ips``): the node's and the API server's addresses as
given, or all of them with ``--refuse-external-ips``. Exit status 1 when there is any
problem.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Iterable
from dataclasses import replace

import click

from ovsproxy.gcpause import gc_paused
from ovsproxy.model import Service, ServicePort
from ovsproxy.model.problems import Problem, SourceError, SourceLocation
from ovsproxy.proxy.claims import resolve
from ovsproxy.proxy.external_ips import ExternalIPRule, admit
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


def check_paths(
    paths: list[str], rule: ExternalIPRule | None = None
) -> tuple[list[ParsedManifest], list[Problem]]:
    """Parse every manifest under ``paths``; all problems, cross-file duplicates included,
    and the external IPs ``rule`` refuses (the agent's rule: ``proxy.external_ips``)."""
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
    if rule is not None:
        admitted = []
        for obj in first.values():
            if isinstance(obj.value, Service):
                service, refused = admit(obj.value, rule)
                problems.extend(replace(error, location=obj.location) for error in refused)
                obj = replace(obj, value=service)
            admitted.append(obj)
        problems.extend(port_conflicts(admitted))
    else:
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
@click.option(
    "--node-ip",
    multiple=True,
    help="the node's IP (repeat): an external IP that is one is refused, as the agent does",
)
@click.option(
    "--api-server-ip",
    multiple=True,
    help="the API server's IP (repeat): an external IP that is one is refused",
)
@click.option(
    "--refuse-external-ips", is_flag=True, help="every external IP is refused, as the agent's flag"
)
def check(
    paths: tuple[str, ...],
    node_ip: tuple[str, ...],
    api_server_ip: tuple[str, ...],
    refuse_external_ips: bool,
) -> None:
    """Validate Service and EndpointSlice manifests (files or directories)."""
    try:
        rule = ExternalIPRule(
            refuse_external_ips,
            frozenset(ipaddress.ip_address(ip) for ip in node_ip),
            frozenset(ipaddress.ip_address(ip) for ip in api_server_ip),
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    parsed, problems = check_paths(list(paths), rule)
    for problem in problems:
        location, _, text = str(problem).partition(": ")
        if problem.location is None:
            location, text = "", str(problem)
        click.echo(f"{click.style(location, bold=True)}: {text}" if location else text)
    summary = summarize(parsed, problems)
    click.secho(summary, fg="red" if problems else "green")
    raise SystemExit(1 if problems else 0)
