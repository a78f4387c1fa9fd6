"""kube-proxy's metric set under our prefix, checked name by name against kube-proxy's own
definitions: its name (``kubeproxy_`` made ``ovsproxy_``), type, label names and buckets.

kube-proxy's list is read from its source, pkg/proxy/metrics/metrics.go of the pinned
Kubernetes (tools/kube/go.mod) in Go's module cache, which scripts/build-kube.sh fills. Not from
a running kube-proxy's /metrics: that needs a control plane, a Node and kube-proxy in its own
namespace (5-35 s of a CPU that other tests share), and /metrics shows a vector only once it
has a sample, so a kube-proxy that never synced, was never probed and never reconciled
conntrack would not show half of the list anyway; the source declares all of it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import subprocess
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from ovsproxy.agent.core import NodeFacts, Semantics, build_core
from ovsproxy.agent.observability import register_metrics
from ovsproxy.agent.sync import Syncer
from ovsproxy.agent.wiring import Components
from ovsproxy.config import AgentConfig
from ovsproxy.metrics import HealthState, Metrics, health_routes
from ovsproxy.model import (
    Endpoint,
    EndpointSlice,
    IPFamily,
    Protocol,
    Service,
    ServicePort,
    ServicePortName,
    SlicePort,
)
from ovsproxy.model.handler import SYNC_ENDPOINT_SLICES, SYNC_SERVICES
from ovsproxy.proxy.runner import SyncRunner
from tests.fakes.switch import FakeSwitch

ROOT = Path(__file__).resolve().parents[2]

# kube-proxy's metrics of its iptables and nftables backends that have no counterpart in an
# OpenFlow proxy (ours syncs no iptables rules, nfacct counters or nftables chains), and why.
NOT_OURS = {
    "kubeproxy_sync_proxy_rules_iptables_restore_failures_total": "iptables-restore only",
    "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total": "iptables only",
    "kubeproxy_sync_proxy_rules_iptables_total": "iptables rules by table",
    "kubeproxy_sync_proxy_rules_iptables_last": "iptables rules by table",
    "kubeproxy_sync_proxy_rules_nftables_sync_failures_total": "ovsproxy_syncs_total{error}",
    "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total": "nftables chains",
    "kubeproxy_iptables_ct_state_invalid_dropped_packets_total": "an nfacct counter",
    "kubeproxy_iptables_localhost_nodeports_accepted_packets_total": "an nfacct counter",
}


def kube_proxy_metrics_source() -> str:
    go_mod = (ROOT / "tools/kube/go.mod").read_text()
    version = re.search(r"^\s*k8s\.io/kubernetes (v\S+)", go_mod, re.M)
    assert version, "tools/kube/go.mod pins no k8s.io/kubernetes"
    cache = subprocess.run(
        ["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=True
    ).stdout.strip()
    path = Path(cache) / f"k8s.io/kubernetes@{version[1]}/pkg/proxy/metrics/metrics.go"
    assert path.is_file(), f"{path}: not there (scripts/build-kube.sh fills the module cache)"
    return path.read_text()


def _buckets(expression: str) -> tuple[float, ...]:
    """component-base's bucket helpers, evaluated from their Go text."""
    out: list[float] = []
    for kind, a, b, n in re.findall(
        r"(Exponential|Linear)Buckets\(([\d.]+), ([\d.]+), (\d+)\)", expression
    ):
        start, step = float(a), float(b)
        for i in range(int(n)):
            out.append(start * step**i if kind == "Exponential" else start + step * i)
    return tuple(out)


def kube_proxy_metrics(source: str) -> dict[str, tuple[str, tuple[str, ...], tuple[float, ...]]]:
    """{full name: (type, label names, buckets)} of every metric metrics.go declares."""
    out = {}
    for match in re.finditer(
        r"metrics\.New(Histogram|Gauge|Counter)(Vec)?\(\s*&metrics\.\w+Opts\{(.*?)\n\t\t\}"
        r"(?:,\s*\[\]string\{([^}]*)\})?",
        source,
        re.S,
    ):
        kind, _, body, labels = match.groups()
        subsystem = re.search(r"Subsystem:\s*(\w+)", body)
        assert subsystem and subsystem[1] == "kubeProxySubsystem", body
        name = re.search(r'Name:\s*"(\w+)"', body)
        assert name, body
        buckets = re.search(r"Buckets:(.*?)StabilityLevel", body, re.S)
        label_names = tuple(re.findall(r'"(\w+)"', labels or ""))
        out[f"kubeproxy_{name[1]}"] = (
            kind.lower(),
            label_names,
            _buckets(buckets[1]) if buckets else (),
        )
    for name in re.findall(r'metrics\.NewDesc\(\s*"(\w+)"', source):
        out[name] = ("counter", (), ())
    return out


def ours() -> dict[str, tuple[str, tuple[str, ...], tuple[float, ...]]]:
    """{name: (type, label names, buckets)} of our /metrics after a full and a partial sync,
    a slice change with a trigger time, one answer each from /healthz and /livez and one UDP
    conntrack flush of each family."""
    switch = FakeSwitch()
    parts = Components(AgentConfig(node_name="n"))
    parts.take_core(
        build_core(
            parts.config, switch, NodeFacts(), semantics=Semantics.NONE, tracker=parts.tracker
        )
    )
    metrics, health = Metrics(), HealthState()
    register_metrics(metrics, health, parts, {})
    syncer = Syncer(parts, metrics, health)
    parts.runner = SyncRunner(syncer)
    tracker = parts.tracker
    port = ServicePort(ServicePortName("ns", "web", ""), (ipaddress.ip_address("10.96.0.1"),), 80)
    tracker.on_service_add(Service("ns", "web", (port,)))
    endpoint = Endpoint(ipaddress.ip_address("10.0.0.1"), 8080)
    ports = (SlicePort("", Protocol.TCP, (endpoint,)),)
    tracker.on_endpoint_slice_add(EndpointSlice("ns", "web-1", "web", ports, time.time()))
    tracker.on_synced(SYNC_SERVICES)
    tracker.on_synced(SYNC_ENDPOINT_SLICES)
    parts.runner.request()

    async def run() -> None:
        await syncer(True)
        await syncer(False)
        routes = health_routes(health)
        for path in ("/healthz", "/livez"):
            await routes[path](None)  # type: ignore[arg-type]

    asyncio.run(run())
    for family in IPFamily:
        syncer._conntrack_flushed(family, 0.001, 1)
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        labels: set[str] = set()
        buckets = []
        for sample in family.samples:
            labels |= set(sample.labels) - {"le"}
            v4 = sample.labels.get("ip_family") == "IPv4"
            if sample.name.endswith("_bucket") and v4 and sample.labels["le"] != "+Inf":
                buckets.append(float(sample.labels["le"]))
        out[family.name] = (family.type, tuple(sorted(labels)), tuple(buckets))
    return out


def test_kube_proxy_metric_set_is_ours_name_by_name() -> None:
    theirs = kube_proxy_metrics(kube_proxy_metrics_source())
    assert len(theirs) == 23, sorted(theirs)  # the parse found every declaration
    exported = ours()
    checked = 0
    for name, (kind, labels, buckets) in sorted(theirs.items()):
        if name in NOT_OURS:
            continue
        ours_name = "ovsproxy_" + name.removeprefix("kubeproxy_")
        if kind == "counter":  # the parser names a counter's family without _total
            ours_name = ours_name.removesuffix("_total")
        assert ours_name in exported, f"{name}: no {ours_name}"
        our_kind, our_labels, our_buckets = exported[ours_name]
        assert our_kind == kind, (name, our_kind, kind)
        assert our_labels == tuple(sorted(labels)), (name, our_labels, labels)
        assert len(our_buckets) == len(buckets), (name, our_buckets, buckets)
        for ours_bound, bound in zip(our_buckets, buckets, strict=True):
            assert abs(ours_bound - bound) < 1e-9, (name, our_buckets, buckets)
        checked += 1
    assert checked == len(theirs) - len(NOT_OURS) == 15
