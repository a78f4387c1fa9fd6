"""The cost of refusing an object grows linearly with its bad fields (issue 35: 20,000 bad
endpoints took 9.6 s, a search of the list per error and one conversion of the whole object
per wrong-typed field).

Cost is counted, not timed: the Python lines run (``sys.settrace`` line events) plus the bytes
of every value handed to ``msgspec.convert`` (which does its work in C, out of the tracer's
sight). The spy passes every call through to the real function; it only measures. Ten times
the bad endpoints must cost about ten times as much: a quadratic cost would be a hundred.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import msgspec
import pytest

from ovsproxy.model.problems import InvalidObjectError
from ovsproxy.sources import convert
from ovsproxy.sources.manifests import parse_manifest
from ovsproxy.sources.report import NAMED_FIELDS

SMALL, LARGE = 500, 5000

# One bad endpoint of each shape the converter refuses.
BAD_ENDPOINTS: dict[str, Callable[[int], dict[str, Any]]] = {
    "not an address": lambda i: {"addresses": [f"nope-{i}"]},
    "no address": lambda i: {"addresses": []},
    "special address": lambda i: {"addresses": ["127.0.0.1"]},
    "wrong type": lambda i: {"addresses": [i]},
    "wrong-typed item": lambda i: {"addresses": ["10.0.0.1"], "conditions": i},
    "nameless hint": lambda i: {"addresses": ["10.0.0.1"], "hints": {"forZones": [{}]}},
}


def bad_slice(count: int, endpoint: Callable[[int], dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": "bad",
            "namespace": "demo",
            "labels": {"kubernetes.io/service-name": "web"},
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [endpoint(i) for i in range(count)],
    }


class Cost:
    """Line events and bytes converted while it is entered."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.lines = 0
        self.converted = 0
        real = msgspec.convert

        def counted_convert(obj: Any, *args: Any, **kwargs: Any) -> Any:
            self.converted += len(msgspec.json.encode(obj))
            return real(obj, *args, **kwargs)

        monkeypatch.setattr(msgspec, "convert", counted_convert)

    def _trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            self.lines += 1
        return self._trace

    def measure(self, work: Callable[[], object]) -> int:
        self.lines = self.converted = 0
        sys.settrace(self._trace)
        try:
            work()
        finally:
            sys.settrace(None)
        return self.lines + self.converted


@pytest.fixture
def cost(monkeypatch: pytest.MonkeyPatch) -> Iterator[Cost]:
    yield Cost(monkeypatch)


def refuse(obj: dict[str, Any]) -> tuple[str, ...]:
    with pytest.raises(InvalidObjectError) as refused:
        convert.convert_endpoint_slice(obj)
    return tuple(str(error) for error in refused.value.errors)


@pytest.mark.parametrize("shape", BAD_ENDPOINTS)
def test_refusing_ten_times_the_bad_endpoints_costs_about_ten_times(cost: Cost, shape: str) -> None:
    small, large = (bad_slice(n, BAD_ENDPOINTS[shape]) for n in (SMALL, LARGE))
    small_cost = cost.measure(lambda: refuse(small))
    large_cost = cost.measure(lambda: refuse(large))
    ratio = large_cost / small_cost
    assert ratio < 15, f"{shape}: {LARGE} bad endpoints cost {ratio:.1f}x {SMALL}"
    # ... and every one of them was found: the first named, the rest counted.
    errors = refuse(large)
    assert len(errors) == NAMED_FIELDS + 1
    assert "endpoints[0]" in errors[0]
    assert errors[-1] == (
        f"EndpointSlice demo/bad: {LARGE - NAMED_FIELDS} more bad fields, not named "
        f"(the first {NAMED_FIELDS} are)"
    )


def test_a_manifest_of_bad_endpoints_costs_linearly(cost: Cost) -> None:
    """The whole manifest path (YAML, conversion, each problem's line in the file)."""

    def manifest(count: int) -> str:
        obj = bad_slice(count, BAD_ENDPOINTS["not an address"])
        return msgspec.json.encode(obj).decode()  # JSON is YAML

    small, large = manifest(SMALL), manifest(LARGE)
    small_cost = cost.measure(lambda: parse_manifest(small, "s.yaml"))
    large_cost = cost.measure(lambda: parse_manifest(large, "l.yaml"))
    assert large_cost / small_cost < 15, f"{large_cost / small_cost:.1f}x"
    parsed = parse_manifest(large, "l.yaml")
    assert len(parsed.problems) == NAMED_FIELDS + 1
