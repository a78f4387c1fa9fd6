"""Fuzzing the text inputs (issue 35): manifest files and watch streams.

Manifests: every input is a seed file (the bundled examples, the test suite's valid and broken
manifests, and hostile ones: an alias bomb, many wrong-typed values, deep nesting) changed by
one or more of: byte flips, byte overwrites, truncation, insertion and deletion, a line
duplicated, deleted or re-indented, YAML syntax inserted (anchors, aliases, tags, flow
brackets, ``: ``, ``- ``, tabs, NUL, document markers), a number made huge, a splice of two
seeds, and an alias bomb appended. Each goes through ``parse_manifest`` (both parsers: the
fast path and PyYAML), which must never raise: a failure is one file's problem, reported.

Watch streams: every input is a watch event (ADDED/MODIFIED/DELETED Services and
EndpointSlices, BOOKMARK, ERROR 410 and 500) changed the same ways at the byte level, decoded
by the Service and EndpointSlice codecs and handed to an informer's event handling: the
decoder's own errors (``msgspec.DecodeError``, ``ValueError``) and the informer's status
errors (``ApiStatusError``, ``ResourceExpired``) are expected, anything else is a finding.
The inputs of a batch also go as one stream, in random chunk sizes, through the informer's
line framer with a bound: it must give back exactly the lines (each no longer than the bound,
else ``WatchLineTooLong``).

Figures: ``inputs``, ``unexpected_exceptions`` (goal 0, with examples), ``framing_mismatches``
(watch, goal 0), the slowest input (CPU time), ``inputs_per_s``, and the process's peak RSS
after each part (``peak_rss_mib``; goal: bounded, under ``GOAL_PEAK_RSS_MIB``).
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import random
import resource
import time
import traceback
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgspec

from ovsproxy.lab import EXAMPLES
from ovsproxy.model.problems import SourceError
from ovsproxy.sources import kubejson
from ovsproxy.sources.kubernetes import (
    SERVICES,
    ApiStatusError,
    Informer,
    ResourceExpired,
    WatchLineTooLong,
)
from ovsproxy.sources.manifests import parse_manifest

GOAL_PEAK_RSS_MIB = 1024
_TEST_MANIFESTS = Path(__file__).resolve().parents[2] / "tests" / "sources" / "manifests"
_SNIPPETS = [
    b"&a ",
    b"*a",
    b"!!python/object:os.system ",
    b"!!binary ",
    b"[",
    b"]",
    b"{",
    b"}",
    b": ",
    b"- ",
    b"\t",
    b"\x00",
    b"---\n",
    b"...\n",
    b"%YAML 1.1\n",
    b"? ",
    b"<<: *a\n",
    b"'",
    b'"',
    b"\\u0000",
    b"#",
    b"|\n",
    b">-\n",
    b"9" * 400,
    b"1e999",
    b"0x",
    b"~",
    b"\xff\xfe",
    b"\r\n",
    b"\xc2\x85",
]


def _peak_rss_mib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


def _alias_bomb(levels: int = 9) -> bytes:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
    return ("\n".join(lines) + "\n").encode()


def manifest_seeds() -> list[tuple[str, bytes]]:
    found = [(f"example:{p.name}", p.read_bytes()) for p in sorted(EXAMPLES.glob("*.yaml"))]
    if _TEST_MANIFESTS.is_dir():
        found += [
            (f"tests:{p.parent.name}/{p.name}", p.read_bytes())
            for p in sorted(_TEST_MANIFESTS.rglob("*.yaml"))
        ]
    web = (EXAMPLES / "web.yaml").read_bytes()
    found.append(("list", b"apiVersion: v1\nkind: List\nitems:\n" + _indent(web, 2, b"- ")))
    return found


def heavy_seeds() -> list[tuple[str, bytes]]:
    """Seeds that cost up to 0.2 s each (many errors, deep nesting): 1 input in 1,000."""
    web = (EXAMPLES / "web.yaml").read_bytes()
    ports = "".join(f"  - {{name: p{i}, port: [x], protocol: TCP}}\n" for i in range(1100))
    return [
        ("hostile:alias-bomb", web.split(b"---")[0] + b"  x:\n" + _indent(_alias_bomb(), 4)),
        (
            "hostile:wrong-typed",
            (
                "apiVersion: v1\nkind: Service\nmetadata: {name: t, namespace: d}\n"
                f"spec:\n  clusterIP: 10.96.0.5\n  ports:\n{ports}"
            ).encode(),
        ),
        ("hostile:deep", b"apiVersion: v1\nkind: Service\nspec: " + b"[" * 5000 + b"]" * 5000),
    ]


def _indent(text: bytes, spaces: int, first: bytes = b"") -> bytes:
    pad = b" " * spaces
    lines = text.splitlines()
    return b"".join(
        (pad + (first if i == 0 else b" " * len(first)) + line + b"\n")
        for i, line in enumerate(lines)
    )


class TextMutator:
    """Changes text seeds the ways the module docstring lists; seeded, so reproducible."""

    def __init__(
        self,
        rng: random.Random,
        seeds: list[tuple[str, bytes]],
        lines: bool,
        heavy: list[tuple[str, bytes]] | None = None,
    ) -> None:
        self.rng = rng
        self.seeds = seeds
        self.heavy = heavy or seeds
        self.ops: list[tuple[str, Callable[[bytearray], bytearray]]] = [
            ("flip", self.flip),
            ("overwrite", self.overwrite),
            ("truncate", self.truncate),
            ("insert", self.insert),
            ("delete", self.delete),
            ("snippet", self.snippet),
            ("number", self.number),
            ("splice", self.splice),
        ]
        if lines:
            self.ops += [("line", self.line), ("bomb", self.bomb)]

    def next(self) -> tuple[str, bytes]:
        rng = self.rng
        name, seed = rng.choice(self.heavy if rng.random() < 0.001 else self.seeds)
        data = bytearray(seed)
        how = []
        for _ in range(rng.choice((1, 1, 1, 2, 3, 5))):
            op, change = rng.choice(self.ops)
            data = change(data)
            how.append(op)
        return f"{'+'.join(how)} of {name}", bytes(data)

    def _at(self, data: bytearray) -> int:
        return self.rng.randrange(len(data) + 1)

    def flip(self, data: bytearray) -> bytearray:
        if data:
            i = self.rng.randrange(len(data))
            data[i] ^= 1 << self.rng.randrange(8)
        return data

    def overwrite(self, data: bytearray) -> bytearray:
        if data:
            data[self.rng.randrange(len(data))] = self.rng.randrange(256)
        return data

    def truncate(self, data: bytearray) -> bytearray:
        return data[: self._at(data)]

    def insert(self, data: bytearray) -> bytearray:
        i = self._at(data)
        return (
            data[:i]
            + bytes(self.rng.randrange(256) for _ in range(self.rng.randint(1, 8)))
            + data[i:]
        )

    def delete(self, data: bytearray) -> bytearray:
        i = self._at(data)
        return data[:i] + data[i + self.rng.randint(1, 16) :]

    def snippet(self, data: bytearray) -> bytearray:
        i = self._at(data)
        return data[:i] + self.rng.choice(_SNIPPETS) + data[i:]

    def number(self, data: bytearray) -> bytearray:
        digits = [i for i, b in enumerate(data) if 0x30 <= b <= 0x39]
        if not digits:
            return data
        i = self.rng.choice(digits)
        return (
            data[:i]
            + self.rng.choice((b"99999999999999999999", b"-1", b"0", b"65536"))
            + data[i + 1 :]
        )

    def splice(self, data: bytearray) -> bytearray:
        _, other = self.rng.choice(self.seeds)
        return data[: self._at(data)] + other[self.rng.randrange(len(other) + 1) :]

    def line(self, data: bytearray) -> bytearray:
        lines = bytes(data).split(b"\n")
        i = self.rng.randrange(len(lines))
        choice = self.rng.randrange(3)
        if choice == 0:
            lines.insert(i, lines[i])
        elif choice == 1:
            del lines[i]
        else:
            lines[i] = b" " * self.rng.randint(0, 9) + lines[i].lstrip()
        return bytearray(b"\n".join(lines))

    def bomb(self, data: bytearray) -> bytearray:
        return data + b"\nx-laughs:\n" + _indent(_alias_bomb(self.rng.randint(3, 9)), 2)


class _Findings:
    def __init__(self) -> None:
        self.unexpected: Counter[str] = Counter()
        self.examples: list[dict[str, Any]] = []

    def add(self, where: str, exc: BaseException, how: str, data: bytes) -> None:
        key = f"{where}: {type(exc).__name__}"
        self.unexpected[key] += 1
        if len(self.examples) < 10:
            tb = traceback.extract_tb(exc.__traceback__)
            at = f"{Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else "?"
            self.examples.append(
                {
                    "where": key,
                    "error": str(exc)[:200],
                    "at": at,
                    "mutation": how,
                    "input": data[:300].decode("utf-8", "replace"),
                }
            )


def fuzz_manifests(count: int, seed: int) -> dict[str, Any]:
    logging.disable(logging.WARNING)  # every input's problems would be logged
    try:
        return _fuzz_manifests(count, seed)
    finally:
        logging.disable(logging.NOTSET)


def _fuzz_manifests(count: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    seeds, heavy = manifest_seeds(), heavy_seeds()
    mutator = TextMutator(rng, seeds, lines=True, heavy=heavy)
    findings = _Findings()
    ops: Counter[str] = Counter()
    problems = parsed_objects = 0
    slowest = (0, "")
    started = time.perf_counter()
    for done in range(1, count + 1):
        how, data = mutator.next()
        ops[how.split(" ")[0].split("+")[0]] += 1
        cpu = time.thread_time_ns()
        try:
            result = parse_manifest(data, "fuzz.yaml")
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            findings.add("parse_manifest", exc, how, data)
            continue
        elapsed = time.thread_time_ns() - cpu
        if elapsed > slowest[0]:
            slowest = (elapsed, how)
        problems += len(result.problems)
        parsed_objects += sum(1 for obj in result.objects if obj.value is not None)
        if done % 4096 == 0:
            gc.collect()
    wall = time.perf_counter() - started
    return {
        "seeds": len(seeds) + len(heavy),
        "inputs": count,
        "inputs_by_mutation": dict(sorted(ops.items())),
        "unexpected_exceptions": sum(findings.unexpected.values()),
        "unexpected_by_kind": dict(findings.unexpected),
        "unexpected_examples": findings.examples,
        "problems_reported": problems,
        "valid_objects": parsed_objects,
        "slowest_ms": round(slowest[0] / 1e6, 3),
        "slowest_input": slowest[1],
        "inputs_per_s": round(count / wall),
        "peak_rss_mib": _peak_rss_mib(),
    }


def watch_seeds() -> list[tuple[str, bytes]]:
    service = {
        "kind": "Service",
        "apiVersion": "v1",
        "metadata": {"name": "web", "namespace": "demo", "resourceVersion": "12"},
        "spec": {
            "type": "ClusterIP",
            "clusterIP": "10.96.0.10",
            "clusterIPs": ["10.96.0.10"],
            "ipFamilies": ["IPv4"],
            "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}],
        },
    }
    slice_ = {
        "kind": "EndpointSlice",
        "apiVersion": "discovery.k8s.io/v1",
        "metadata": {
            "name": "web-1",
            "namespace": "demo",
            "resourceVersion": "13",
            "labels": {"kubernetes.io/service-name": "web"},
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [
            {"addresses": [f"10.244.0.{i}"], "conditions": {"ready": True}, "nodeName": "n"}
            for i in range(1, 4)
        ],
    }
    status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired"}
    events = [
        ("ADDED service", {"type": "ADDED", "object": service}),
        ("MODIFIED service", {"type": "MODIFIED", "object": service}),
        ("DELETED service", {"type": "DELETED", "object": service}),
        ("ADDED slice", {"type": "ADDED", "object": slice_}),
        ("MODIFIED slice", {"type": "MODIFIED", "object": slice_}),
        (
            "BOOKMARK",
            {
                "type": "BOOKMARK",
                "object": {"kind": "Service", "metadata": {"resourceVersion": "99"}},
            },
        ),
        ("ERROR 410", {"type": "ERROR", "object": {**status, "code": 410, "message": "too old"}}),
        ("ERROR 500", {"type": "ERROR", "object": {**status, "code": 500, "message": "x"}}),
    ]
    return [(name, json.dumps(event).encode()) for name, event in events]


class _NullHandler:
    def on_add(self, value: object) -> None:
        pass

    def on_update(self, value: object) -> None:
        pass

    def on_delete(self, key: object) -> None:
        pass

    def on_synced(self) -> None:
        pass

    def on_error(self, problem: SourceError) -> None:
        pass


class _Chunks:
    """A response whose body arrives in the given chunks (the informer's framer reads it)."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk


_EXPECTED_WATCH = (msgspec.DecodeError, ValueError, ApiStatusError, ResourceExpired)
_MAX_LINE = 64 * 1024


async def _frame(informer: Informer[Any], stream: bytes, rng: random.Random) -> list[bytes]:
    chunks, pos = [], 0
    while pos < len(stream):
        size = rng.choice((1, 7, 100, 4096, 65536))
        chunks.append(stream[pos : pos + size])
        pos += size
    return [line async for line in informer._lines(_Chunks(chunks))]  # type: ignore[arg-type]


def _expected_lines(stream: bytes) -> list[bytes] | None:
    lines = stream.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    if any(len(line) > _MAX_LINE for line in lines):
        return None  # WatchLineTooLong
    return lines


def fuzz_watch(count: int, seed: int, batch: int = 64) -> dict[str, Any]:
    logging.disable(logging.WARNING)  # unknown event types are logged
    try:
        return _fuzz_watch(count, seed, batch)
    finally:
        logging.disable(logging.NOTSET)


def _fuzz_watch(count: int, seed: int, batch: int) -> dict[str, Any]:
    rng = random.Random(seed)
    seeds = watch_seeds()
    # Lines without end: a long run of one seed's bytes, past the framer's bound.
    seeds.append(("long line", seeds[0][1][:-1] + b" " * (_MAX_LINE + 10) + b"}"))
    mutator = TextMutator(rng, seeds, lines=False)
    findings = _Findings()
    codecs = {"service": kubejson.service_codec(None), "slice": kubejson.endpoint_slice_codec()}
    informers = {
        name: Informer(None, SERVICES, _NullHandler(), codec, max_event_bytes=_MAX_LINE)  # type: ignore[arg-type]
        for name, codec in codecs.items()
    }
    ops: Counter[str] = Counter()
    framing_mismatches = 0
    decoded = 0
    slowest = (0, "")
    loop = asyncio.new_event_loop()
    started = time.perf_counter()
    done = 0
    try:
        while done < count:
            inputs = [mutator.next() for _ in range(min(batch, count - done))]
            done += len(inputs)
            for how, data in inputs:
                ops[how.split(" ")[0].split("+")[0]] += 1
                cpu = time.thread_time_ns()
                for name, codec in codecs.items():
                    try:
                        event = codec.event(data)
                        decoded += 1
                        informers[name]._on_event(event)
                    except _EXPECTED_WATCH:
                        pass
                    except Exception as exc:
                        findings.add(f"{name} event", exc, how, data)
                elapsed = time.thread_time_ns() - cpu
                if elapsed > slowest[0]:
                    slowest = (elapsed, how)
            stream = b"\n".join(data.replace(b"\n", b" ") for _, data in inputs) + b"\n"
            expected = _expected_lines(stream)
            try:
                lines = loop.run_until_complete(_frame(informers["service"], stream, rng))
            except WatchLineTooLong:
                lines = None
            except Exception as exc:
                findings.add("framer", exc, "stream", stream)
                continue
            if lines != expected:
                framing_mismatches += 1
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
    wall = time.perf_counter() - started
    return {
        "seeds": len(seeds),
        "inputs": count,
        "inputs_by_mutation": dict(sorted(ops.items())),
        "unexpected_exceptions": sum(findings.unexpected.values()),
        "unexpected_by_kind": dict(findings.unexpected),
        "unexpected_examples": findings.examples,
        "framing_mismatches": framing_mismatches,
        "decoded": decoded,
        "slowest_ms": round(slowest[0] / 1e6, 3),
        "slowest_input": slowest[1],
        "inputs_per_s": round(count / wall),
        "peak_rss_mib": _peak_rss_mib(),
    }
