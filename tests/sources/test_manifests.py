"""The manifest source: realistic manifests into the tracker, and files changing under it."""

from __future__ import annotations

import asyncio
import gc
import ipaddress
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ovsproxy.gcpause import gc_paused
from ovsproxy.model import (
    Endpoint,
    Protocol,
    ServiceType,
    TrafficDistribution,
    TrafficPolicy,
)
from ovsproxy.model.problems import SourceError, ValidationError
from ovsproxy.proxy.tracker import ChangeTracker
from ovsproxy.sources.manifests import ManifestSource, parse_manifest

MANIFESTS = Path(__file__).parent / "manifests"


def ips(*texts: str) -> tuple[Any, ...]:
    return tuple(ipaddress.ip_address(t) for t in texts)


def describe(endpoint: Endpoint) -> str:
    """``ip:port``, plus ready/serving/terminating as ``rst`` when not the plain ready state."""
    flags = (endpoint.ready, endpoint.serving, endpoint.terminating)
    if flags == (True, True, False):
        return str(endpoint)
    letters = "".join(c if on else "-" for c, on in zip("rst", flags, strict=True))
    return f"{endpoint} {letters}"


@dataclass
class Expect:
    port: dict[str, Any] = field(default_factory=dict)  # ServicePort attributes to compare
    endpoints: list[str] = field(default_factory=list)


# Each manifest (file or directory) with the exact model it must produce.
VALID = {
    "valid/dual-stack.yaml": {
        "prod/api:grpc/TCP": Expect(
            {"cluster_ips": ips("fd00:10:96::a", "10.96.0.10"), "port": 9090},
            # both families, IPv4 first; the IPv6 address stored canonical
            [
                "10.244.1.7:50051",
                "10.244.2.9:50051",
                "[fd00:10:244:1::7]:50051",
                "[fd00:10:244:2::9]:50051",
            ],
        )
    },
    "valid/multi-port.yaml": {
        # the named targetPort is 8080 on the old pods and 8081 on the new one
        "default/shop:http/TCP": Expect(
            {"port": 80}, ["10.244.1.10:8080", "10.244.1.11:8080", "10.244.2.20:8081"]
        ),
        "default/shop:https/TCP": Expect(
            {"port": 443}, ["10.244.1.10:8443", "10.244.1.11:8443", "10.244.2.20:8443"]
        ),
        "default/shop:dns/UDP": Expect(
            {"port": 53, "protocol": Protocol.UDP},
            ["10.244.1.10:5353", "10.244.1.11:5353", "10.244.2.20:5353"],
        ),
    },
    "valid/terminating.yaml": {
        "shop/checkout/TCP": Expect(
            {"port": 8080, "cluster_ips": ips("10.96.7.7")},
            # serving defaults to true when the condition is absent, as in kube-proxy
            [
                "10.244.3.1:8080",
                "10.244.3.2:8080 -st",
                "10.244.3.3:8080 --t",
                "10.244.3.4:8080 -s-",
            ],
        )
    },
    # headless, ExternalName, another proxy's Service, an FQDN slice, a Deployment
    "valid/ignored.yaml": {},
    "valid/several-slices.yaml": {
        # 10.244.5.2 is terminating in slice a and ready in slice b: the ready copy wins
        "infra/cache:redis/TCP": Expect(
            {"port": 6379}, ["10.244.5.1:6379", "10.244.5.2:6379", "10.244.5.3:6379"]
        )
    },
    "valid/external.yaml": {
        "edge/ingress:http/TCP": Expect(
            {
                "type": ServiceType.LOAD_BALANCER,
                "port": 80,
                "node_port": 30080,
                "external_ips": ips("192.0.2.10"),
                # 203.0.113.8 has ipMode Proxy; the hostname-only ingress has no address
                "load_balancer_ips": ips("203.0.113.7"),
                "internal_traffic_policy": TrafficPolicy.LOCAL,
                "external_traffic_policy": TrafficPolicy.LOCAL,
                "affinity_timeout": 10800,
                "traffic_distribution": TrafficDistribution.PREFER_CLOSE,
            },
        ),
        "edge/ingress:https/TCP": Expect({"port": 443, "node_port": 30443}),
        "edge/sticky/SCTP": Expect(
            {
                "type": ServiceType.NODE_PORT,
                "port": 8080,
                "node_port": 31000,
                "protocol": Protocol.SCTP,
                "affinity_timeout": 600,
                "traffic_distribution": TrafficDistribution.PREFER_SAME_NODE,
                "internal_traffic_policy": TrafficPolicy.CLUSTER,
            },
        ),
    },
    # Every other object in broken/ is invalid; this Service is fine and has no valid slice.
    "broken": {"t/fine/TCP": Expect({"port": 80}, [])},
}

# (file, line, object, field, value) of every problem in broken/
BROKEN = {
    ("services.yaml", 6, "Service t/bad-ip", "spec.clusterIP", "10.96.0.300"),
    ("services.yaml", 18, "Service t/bad-port", "spec.ports[1].port", 70000),
    ("services.yaml", 27, "Service t/bad-protocol", "spec.ports[0].protocol", "HTTP"),
    ("services.yaml", 36, "Service t/duplicate-port", "spec.ports[1].port", 80),
    ("services.yaml", 43, "Service t/family-mismatch", "spec.ipFamilies[0]", "IPv6"),
    ("services.yaml", 43, "Service t/family-mismatch", "spec.ipFamilies[1]", "IPv4"),
    ("services.yaml", 52, "Service t/unnamed-ports", "spec.ports[0].name", None),
    ("services.yaml", 53, "Service t/unnamed-ports", "spec.ports[1].name", None),
    (
        "services.yaml",
        61,
        "Service t/two-errors",
        "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
        100000,
    ),
    ("services.yaml", 62, "Service t/two-errors", "spec.ports[0].nodePort", 30007),
    (
        "slices.yaml",
        4,
        "EndpointSlice t/no-service-label",
        "metadata.labels[kubernetes.io/service-name]",
        None,
    ),
    ("slices.yaml", 19, "EndpointSlice t/wrong-family", "endpoints[1].addresses[0]", "fd00::3"),
    ("slices.yaml", 21, "EndpointSlice t/old-api", "apiVersion", "discovery.k8s.io/v1beta1"),
    ("slices.yaml", 41, "EndpointSlice t/fine-1", "endpoints[0].conditions.ready", "yes-please"),
}


async def load(*paths: Path) -> tuple[ChangeTracker, ManifestSource]:
    tracker = ChangeTracker()
    source = ManifestSource(list(paths), tracker, poll_interval=3600)
    await source.start()
    await source.stop()
    return tracker, source


@pytest.mark.parametrize("manifest", list(VALID))
async def test_manifest_gives_the_expected_model(manifest: str) -> None:
    tracker, source = await load(MANIFESTS / manifest)
    assert tracker.synced
    snapshot = {str(name): state for name, state in tracker.snapshot().items()}

    expected = VALID[manifest]
    assert set(snapshot) == set(expected)
    for name, expect in expected.items():
        state = snapshot[name]
        assert [describe(e) for e in state.endpoints] == expect.endpoints
        for attribute, value in expect.port.items():
            assert getattr(state.port, attribute) == value, (name, attribute)
    if manifest.startswith("valid/"):
        assert source.problems == []
        assert not tracker.stats.invalid


async def test_broken_objects_are_reported_with_file_line_and_field() -> None:
    tracker, source = await load(MANIFESTS / "broken")
    found = {
        (
            Path(p.location.file).name,
            p.location.line,
            p.object,
            p.field,
            p.value,
        )
        for p in source.problems
        if isinstance(p, ValidationError) and p.location
    }
    assert found == BROKEN
    assert len(source.problems) == len(BROKEN)
    # the tracker counts rejected objects: 7 Services (with 10 bad fields), 4 slices
    assert tracker.stats.invalid == {"Service": 7, "EndpointSlice": 4}


async def test_endpoint_details_survive_conversion() -> None:
    tracker, _ = await load(MANIFESTS / "valid")
    states = {str(n): s for n, s in tracker.snapshot().items()}
    api = states["prod/api:grpc/TCP"].endpoints[0]
    assert (api.node_name, api.zone) == ("node-1", "zone-a")
    cache = states["infra/cache:redis/TCP"].endpoints[2]
    assert cache.hint_zones == {"zone-a"} and cache.hint_nodes == {"node-1"}
    assert tracker.cluster_ips() >= set(ips("10.96.0.10", "fd00:10:96::a", "10.96.100.20"))
    assert ipaddress.ip_address("10.96.9.9") not in tracker.cluster_ips()  # other proxy's


def test_list_items_are_located_by_item() -> None:
    text = """\
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata: {name: a}
  spec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}
- apiVersion: v1
  kind: Service
  metadata: {name: b}
  spec:
    clusterIP: 10.96.0.2
    ports: [{port: 0}]
"""
    parsed = parse_manifest(text, "list.yaml")
    assert [o.key for o in parsed.objects] == [
        ("Service", "default", "a"),
        ("Service", "default", "b"),
    ]
    [problem] = parsed.problems
    assert isinstance(problem, ValidationError)
    assert (problem.location.item, problem.location.line, problem.field) == (
        1,
        13,
        "spec.ports[0].port",
    )


PROXY_NAMED = """\
apiVersion: v1
kind: Service
metadata: {name: plain}
spec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata:
  name: mine
  labels: {service.kubernetes.io/service-proxy-name: ovsproxy}
spec: {clusterIP: 10.96.0.2, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata:
  name: headless-labelled
  labels: {service.kubernetes.io/headless: ""}
spec: {clusterIP: 10.96.0.3, ports: [{port: 80}]}
"""


@pytest.mark.parametrize(
    "proxy_name,handled", [(None, {"plain"}), ("ovsproxy", {"mine"}), ("other", set())]
)
def test_manifests_follow_the_service_proxy_name(proxy_name: str | None, handled: set) -> None:
    parsed = parse_manifest(PROXY_NAMED, "named.yaml", service_proxy_name=proxy_name)
    assert not parsed.problems
    assert {o.key[2] for o in parsed.objects if o.key and o.ignored is None} == handled
    for obj in parsed.objects:
        assert (obj.value.ports == ()) == (obj.ignored is not None), obj


def test_unparsable_yaml_names_file_and_line() -> None:
    parsed = parse_manifest("kind: Service\nmetadata: {name: [x\n", "bad.yaml")
    assert parsed.parse_failed and parsed.objects == ()
    [problem] = parsed.problems
    assert isinstance(problem, SourceError)
    assert problem.location.file == "bad.yaml" and problem.location.line == 3
    assert "YAML does not parse" in problem.message


def test_a_value_that_does_not_construct_names_its_document_and_keeps_the_others() -> None:
    # YAML 1.1 resolves a plain 2024-13-45 as a timestamp that no date can hold.
    text = (
        "kind: Service\nmetadata:\n  name: first\n  annotations: {when: 2024-13-45}\n"
        "---\n" + SERVICE.format(port=80)
    )
    parsed = parse_manifest(text, "dates.yaml")
    assert not parsed.parse_failed
    assert [obj.key for obj in parsed.objects if obj.key] and len(parsed.objects) == 1
    [problem] = parsed.problems
    assert isinstance(problem, SourceError)
    assert problem.location.file == "dates.yaml" and problem.location.line == 1
    assert problem.location.document == 1
    assert "does not construct" in problem.message and "month" in problem.message


# --- files changing under the source --------------------------------------------------

SERVICE = """\
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: demo}}
spec:
  clusterIP: 10.96.0.10
  ports:
  - name: http
    port: {port}
    targetPort: 8080
"""
SLICE = """\
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: demo
  labels: {{kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{{name: http, port: 8080}}]
endpoints:
{endpoints}
"""


def manifest(port: int = 80, endpoints: tuple[str, ...] = ("10.244.0.11", "10.244.0.12")) -> str:
    listed = "\n".join(f"- addresses: [{ip}]" for ip in endpoints)
    return SERVICE.format(port=port) + "---\n" + SLICE.format(endpoints=listed)


def endpoints_of(tracker: ChangeTracker) -> dict[str, list[str]]:
    return {str(n): [str(e) for e in s.endpoints] for n, s in tracker.snapshot().items()}


async def test_good_broken_good_keeps_the_last_good_state(tmp_path: Path) -> None:
    path = tmp_path / "web.yaml"
    path.write_text(manifest())
    tracker = ChangeTracker()
    source = ManifestSource([tmp_path], tracker, poll_interval=3600)
    await source.start()
    assert [str(n) for n in tracker.checkpoint()] == ["demo/web:http/TCP"]
    good = tracker.snapshot()

    # broken: an unclosed flow sequence on the last endpoint line (line 22); the parser
    # notices at the end of the file (line 23)
    broken = manifest(endpoints=("10.244.0.11", "10.244.0.12", "10.244.0.13")).replace(
        "[10.244.0.13]", "[10.244.0.13"
    )
    path.write_text(broken)
    await source.rescan()
    assert tracker.checkpoint() == {}
    assert tracker.snapshot() == good
    [problem] = source.problems
    assert isinstance(problem, SourceError)
    assert (problem.location.file, problem.location.line) == (str(path), 23)
    assert str(problem).startswith(f"{path}:23: YAML does not parse")
    assert "flow sequence started at line 22, column 14" in problem.message
    assert tracker.stats.errors["manifests"] == 1

    # good again, with the third endpoint: the diff against the last good state is applied
    path.write_text(manifest(endpoints=("10.244.0.11", "10.244.0.12", "10.244.0.13")))
    await source.rescan()
    [change] = tracker.checkpoint().values()
    assert [str(e) for e in change.previous.endpoints] == ["10.244.0.11:8080", "10.244.0.12:8080"]
    assert [str(e) for e in change.current.endpoints] == [
        "10.244.0.11:8080",
        "10.244.0.12:8080",
        "10.244.0.13:8080",
    ]
    assert source.problems == []
    await source.stop()


async def test_polling_notices_edits_and_notifies(tmp_path: Path) -> None:
    path = tmp_path / "web.yaml"
    path.write_text(manifest())
    tracker = ChangeTracker()
    changed = asyncio.Event()
    async with ManifestSource([tmp_path], tracker, poll_interval=0.02) as source:
        tracker.checkpoint()
        tracker.set_notify(changed.set)
        path.write_text(manifest(port=8000))
        await asyncio.wait_for(changed.wait(), 5)
        [change] = tracker.checkpoint().values()
        assert (change.previous.port.port, change.current.port.port) == (80, 8000)
        parses = source.parses
        os.utime(path)  # touched, same bytes: no parse, no change
        await asyncio.sleep(0.1)
        assert source.parses == parses and tracker.pending == 0


async def test_object_moving_between_files_is_not_deleted(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(manifest())
    (tmp_path / "b.yaml").write_text("# nothing yet\n")
    tracker = ChangeTracker()
    source = ManifestSource([tmp_path], tracker, poll_interval=3600)
    await source.start()
    tracker.checkpoint()
    events = dict(tracker.stats.events)

    (tmp_path / "b.yaml").write_text(SERVICE.format(port=80))  # the Service moves to b
    (tmp_path / "a.yaml").write_text(manifest().split("---\n")[1])  # a keeps the slice
    await source.rescan()
    assert tracker.checkpoint() == {}
    assert dict(tracker.stats.events) == events  # no delete, no add, no update
    assert source.problems == []


async def test_removed_file_removes_its_objects(tmp_path: Path) -> None:
    (tmp_path / "web.yaml").write_text(manifest())
    tracker, source = ChangeTracker(), None
    source = ManifestSource([tmp_path], tracker, poll_interval=3600)
    await source.start()
    tracker.checkpoint()
    (tmp_path / "web.yaml").unlink()
    await source.rescan()
    [change] = tracker.checkpoint().values()
    assert change.current is None and len(change.previous.endpoints) == 2
    assert tracker.stats.events["Service/delete"] == 1
    assert tracker.stats.events["EndpointSlice/delete"] == 1


async def test_invalid_edit_keeps_the_last_valid_object(tmp_path: Path) -> None:
    path = tmp_path / "web.yaml"
    path.write_text(manifest())
    tracker = ChangeTracker()
    source = ManifestSource([path], tracker, poll_interval=3600)
    await source.start()
    tracker.checkpoint()

    path.write_text(manifest(port=70000))
    await source.rescan()
    assert tracker.checkpoint() == {}
    [problem] = source.problems
    assert (problem.field, problem.value, problem.location.line) == ("spec.ports[0].port", 70000, 8)
    assert endpoints_of(tracker) == {"demo/web:http/TCP": ["10.244.0.11:8080", "10.244.0.12:8080"]}

    path.write_text(manifest(port=8080))
    await source.rescan()
    [change] = tracker.checkpoint().values()
    assert (change.previous.port.port, change.current.port.port) == (80, 8080)
    assert source.problems == []


async def test_duplicate_definition_first_file_wins(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(SERVICE.format(port=80))
    (tmp_path / "b.yaml").write_text(SERVICE.format(port=81))
    tracker = ChangeTracker()
    source = ManifestSource([tmp_path], tracker, poll_interval=3600)
    await source.start()
    [state] = tracker.checkpoint().values()
    assert state.current.port.port == 80
    [problem] = source.problems
    assert problem.location.file == str(tmp_path / "b.yaml")
    assert str(tmp_path / "a.yaml") in problem.message

    (tmp_path / "a.yaml").unlink()
    await source.rescan()
    [change] = tracker.checkpoint().values()
    assert (change.previous.port.port, change.current.port.port) == (80, 81)
    assert source.problems == []


async def test_missing_path_is_reported_and_picked_up_later(tmp_path: Path) -> None:
    path = tmp_path / "later.yaml"
    tracker = ChangeTracker()
    source = ManifestSource([path], tracker, poll_interval=3600)
    await source.start()
    assert tracker.synced and tracker.snapshot() == {}
    [problem] = source.problems
    assert problem.message == "no such file or directory"
    path.write_text(manifest())
    await source.rescan()
    assert list(endpoints_of(tracker)) == ["demo/web:http/TCP"]
    assert source.problems == []


async def test_hidden_entries_and_other_suffixes_are_skipped(tmp_path: Path) -> None:
    # the layout of a mounted ConfigMap: real files under ..data, links at the top
    data = tmp_path / "..2024_01_01"
    data.mkdir()
    (data / "web.yaml").write_text(manifest())
    (tmp_path / "..data").symlink_to(data.name)
    (tmp_path / "web.yaml").symlink_to(Path("..data") / "web.yaml")
    (tmp_path / "notes.txt").write_text("kind: Service\n")
    shutil.copy(data / "web.yaml", tmp_path / ".hidden.yaml")
    tracker, source = await load(tmp_path)
    assert list(endpoints_of(tracker)) == ["demo/web:http/TCP"]
    assert source.problems == []


def test_gc_pause_nests_and_restores_the_collector() -> None:
    assert gc.isenabled()
    with gc_paused():
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # it was off before: it stays off
    finally:
        gc.enable()
