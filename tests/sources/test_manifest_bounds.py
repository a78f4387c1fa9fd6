"""Bounds of the manifest parser (issue 35): aliases are never expanded past a bound, any
failure is one file's or one object's problem, and non-regular or over-size files are never
read. The live counterpart, a real agent on real files, is tests/e2e/test_hostile_manifests.py."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from ovsproxy.model.problems import SourceError
from ovsproxy.proxy.tracker import ChangeTracker
from ovsproxy.sources import fastyaml
from ovsproxy.sources.manifests import (
    MAX_ALIAS_EXPANSION,
    ManifestSource,
    UnreadableFile,
    expanded_size,
    parse_manifest,
    read_regular_file,
)
from ovsproxy.sources.report import NAMED_FIELDS

SERVICE = """apiVersion: v1
kind: Service
metadata: {name: good, namespace: demo}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, protocol: TCP}]
"""


def laughs(levels: int, fan_out: int = 10) -> str:
    lines = [f"a0: &a0 [{', '.join(['x'] * fan_out)}]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * fan_out)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_before_it_is_built() -> None:
    bomb = (
        SERVICE
        + "  selector: {app: {wrong: type}}\n"
        + "".join(
            "  " + line + "\n"
            for line in ["x-laughs:", *("  " + x for x in laughs(9).splitlines())]
        )
    )
    started = time.perf_counter()
    parsed = parse_manifest(bomb + "---\n" + SERVICE.replace("good", "other"), "b.yaml")
    assert time.perf_counter() - started < 5  # before the bound: hours, and out of memory
    assert [str(p) for p in parsed.problems] == [
        f"b.yaml:1 (document 1): aliases expand to more than {MAX_ALIAS_EXPANSION:,} extra nodes"
    ]
    assert [obj.key for obj in parsed.objects] == [("Service", "demo", "other")]


def test_an_alias_inside_its_own_anchor_is_refused() -> None:
    parsed = parse_manifest(SERVICE + "  x: &loop [*loop]\n", "c.yaml")
    assert parsed.objects == () and len(parsed.problems) == 1


def test_the_fast_path_never_reads_aliases() -> None:
    assert fastyaml.documents((SERVICE + "  x: &a [1]\n  y: *a\n").encode()) is None


def _count(value: object) -> int:
    """Nodes of a constructed value with every shared (aliased) part counted each time."""
    if isinstance(value, dict):
        return 1 + sum(_count(k) + _count(v) for k, v in value.items())
    if isinstance(value, list):
        return 1 + sum(_count(item) for item in value)
    return 1


@given(st.integers(1, 5), st.integers(1, 6))
def test_expanded_size_counts_every_alias(levels: int, fan_out: int) -> None:
    text = laughs(levels, fan_out)
    node = yaml.compose(text)
    assert expanded_size(node, 10**9) == _count(yaml.safe_load(text))
    # no extra node allowed: only a document without aliases passes
    assert (expanded_size(node, 0) is None) == (levels > 1)


def test_1200_wrong_typed_values_are_one_objects_problem_the_first_100_named() -> None:
    """Every wrong-typed port is found (no more a cap of 1,000 re-conversions that made the
    object unreadable); the first ``NAMED_FIELDS`` are named, each at its own line, and the
    rest counted in one line that names no field (and so has no empty field before it)."""
    ports = "".join(f"  - {{name: p{i}, port: [x], protocol: TCP}}\n" for i in range(1200))
    typed = SERVICE.replace("good", "typed").split("  ports:", maxsplit=1)[0]
    text = typed + "  ports:\n" + ports + "---\n" + SERVICE
    parsed = parse_manifest(text, "t.yaml")
    assert [obj.value is not None for obj in parsed.objects] == [False, True]
    lines = [str(p) for p in parsed.problems]
    assert len(lines) == NAMED_FIELDS + 1
    assert lines[0] == (
        "t.yaml:7 (document 1): Service demo/typed: spec.ports[0].port: "
        "must be a port number between 1 and 65535 (got ['x'])"
    )
    assert lines[NAMED_FIELDS - 1].startswith(
        f"t.yaml:{6 + NAMED_FIELDS} (document 1): Service demo/typed: "
        f"spec.ports[{NAMED_FIELDS - 1}].port: "
    )
    assert lines[-1] == (
        f"t.yaml:1 (document 1): Service demo/typed: {1200 - NAMED_FIELDS} more bad "
        f"fields, not named (the first {NAMED_FIELDS} are)"
    )


def test_only_regular_files_of_at_most_the_limit_are_read(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.yaml"
    zero.symlink_to("/dev/zero")
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * 101)
    for path, why in ((fifo, "a FIFO"), (zero, "a character device"), (big, "100-byte limit")):
        with pytest.raises(UnreadableFile, match=why):
            read_regular_file(path, 100)
    assert read_regular_file(big, 101) == b"#" * 101


def test_a_file_that_cannot_be_read_keeps_its_objects(tmp_path: Path) -> None:
    """EIO (``/proc/self/mem`` read at 0) is not "deleted": the Service stays, reported."""
    (tmp_path / "svc.yaml").write_text(SERVICE)
    tracker = ChangeTracker()
    source = ManifestSource([tmp_path], tracker, poll_interval=3600)

    async def scenario() -> list[object]:
        await source.rescan()
        link = tmp_path / ".tmp"
        link.symlink_to("/proc/self/mem")
        link.replace(tmp_path / "svc.yaml")
        await source.rescan()
        return source.problems

    problems = asyncio.run(scenario())
    assert tracker.service_count() == 1
    assert [str(p) for p in problems if isinstance(p, SourceError)] == [
        f"{tmp_path / 'svc.yaml'}: cannot be read: Input/output error"
    ]
