"""Loading Services from manifests: 10,000 Services x 10 endpoints (500 with ``--quick``) into
the model and tracker.

Manifests are written like the API's own YAML (block style, a Service and its EndpointSlice
per Service, 1,000 Services a file). Measured in the same run:

* baseline: ``yaml.load_all`` with libyaml's CSafeLoader over the same files, nothing else;
* load: ``ManifestSource.start()`` into a ``ChangeTracker`` (read, parse, validate, convert,
  deliver) and the first ``checkpoint()`` (merge slices, build the ServiceStates);
* incremental: one endpoint added in one file, ``rescan()`` + ``checkpoint()``; and the same
  change given straight to the tracker (what a watch event costs), which must not depend on
  the number of Services.
"""

from __future__ import annotations

import asyncio
import gc
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from ovsproxy.model import EndpointSlice, SlicePort
from ovsproxy.proxy.tracker import ChangeTracker
from ovsproxy.sources.manifests import ManifestSource

NAME = "load"
DESCRIPTION = "10,000 Services x 10 endpoints from YAML manifests into the tracker, vs bare libyaml"

SERVICES_PER_FILE = 1000
ENDPOINTS = 10

SERVICE = """\
apiVersion: v1
kind: Service
metadata:
  name: svc-{i}
  namespace: bench
  labels:
    app: svc-{i}
spec:
  type: ClusterIP
  clusterIP: {cluster_ip}
  clusterIPs:
  - {cluster_ip}
  ipFamilies:
  - IPv4
  ipFamilyPolicy: SingleStack
  sessionAffinity: None
  internalTrafficPolicy: Cluster
  selector:
    app: svc-{i}
  ports:
  - name: http
    port: 80
    protocol: TCP
    targetPort: 8080
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: svc-{i}-x7k2p
  namespace: bench
  labels:
    kubernetes.io/service-name: svc-{i}
    endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io
addressType: IPv4
ports:
- name: http
  port: 8080
  protocol: TCP
endpoints:
{endpoints}"""

ENDPOINT = """\
- addresses:
  - {ip}
  conditions:
    ready: true
    serving: true
    terminating: false
  nodeName: node-{node}
  zone: zone-{zone}
  targetRef:
    kind: Pod
    namespace: bench
    name: svc-{i}-{n}
"""


def _ip(prefix: int, index: int) -> str:
    return f"{prefix}.{index >> 16 & 255}.{index >> 8 & 255}.{index & 255}"


def write_manifests(directory: Path, services: int) -> list[Path]:
    files = []
    for start in range(0, services, SERVICES_PER_FILE):
        documents = []
        for i in range(start, min(start + SERVICES_PER_FILE, services)):
            endpoints = "".join(
                ENDPOINT.format(
                    ip=_ip(10, (i * ENDPOINTS + n) + 256), node=n % 7, zone=n % 3, i=i, n=n
                )
                for n in range(ENDPOINTS)
            )
            documents.append(SERVICE.format(i=i, cluster_ip=_ip(172, i + 1), endpoints=endpoints))
        path = directory / f"services-{start // SERVICES_PER_FILE:03d}.yaml"
        path.write_text("---\n".join(documents))
        files.append(path)
    return files


def _baseline(files: list[Path]) -> float:
    started = time.perf_counter()
    for path in files:
        with path.open("rb") as stream:
            for _ in yaml.load_all(stream, Loader=yaml.CSafeLoader):
                pass
    return time.perf_counter() - started


async def _load(directory: Path) -> tuple[float, float, ChangeTracker, ManifestSource]:
    tracker = ChangeTracker()
    source = ManifestSource([directory], tracker, poll_interval=3600)
    started = time.perf_counter()
    await source.start()
    await source.stop()
    loaded = time.perf_counter()
    changes = tracker.checkpoint()
    checkpointed = time.perf_counter()
    assert len(changes) == tracker.service_count(), "every Service port is new"
    return loaded - started, checkpointed - loaded, tracker, source


async def _incremental(files: list[Path], tracker: ChangeTracker, source: ManifestSource):
    path = files[0]
    text = path.read_text()
    marker = "endpoints:\n"
    extra = ENDPOINT.format(ip="10.255.255.1", node=0, zone=0, i=0, n=99)
    path.write_text(text.replace(marker, marker + extra, 1))
    started = time.perf_counter()
    await source.rescan()
    changes = tracker.checkpoint()
    file_change = time.perf_counter() - started
    assert len(changes) == 1, changes

    # The same kind of change straight to the tracker: what one watch event costs.
    [(name, change)] = changes.items()
    assert change.current is not None
    eleven = change.current.endpoints
    rounds = 200
    started = time.perf_counter()
    for round_ in range(rounds):
        endpoints = eleven if round_ % 2 else eleven[:-1]  # 10, 11, 10, ... endpoints
        port = SlicePort(name.port, name.protocol, endpoints)
        tracker.on_endpoint_slice_update(
            EndpointSlice(name.namespace, "svc-0-x7k2p", name.name, (port,))
        )
        assert len(tracker.checkpoint()) == 1
    event_change = (time.perf_counter() - started) / rounds
    return file_change, event_change


def run(quick: bool) -> dict[str, Any]:
    services = 500 if quick else 10_000
    with tempfile.TemporaryDirectory(prefix="ovsproxy-bench-load-") as tmp:
        directory = Path(tmp)
        files = write_manifests(directory, services)
        size = sum(p.stat().st_size for p in files)
        gc.collect()
        baseline = min(_baseline(files) for _ in range(2 if quick else 1))
        gc.collect()
        load_s, checkpoint_s, tracker, source = asyncio.run(_load(directory))
        total = load_s + checkpoint_s
        file_change_s, event_change_s = asyncio.run(_incremental(files, tracker, source))
        states = tracker.snapshot()
        endpoints = sum(len(s.endpoints) for s in states.values())
    return {
        "services": services,
        "endpoints": endpoints,
        "files": len(files),
        "yaml_mb": round(size / 1e6, 1),
        "baseline_yaml_load_s": round(baseline, 3),
        "load_s": round(load_s, 3),
        "first_checkpoint_s": round(checkpoint_s, 3),
        "services_per_s": round(services / total),
        "baseline_services_per_s": round(services / baseline),
        "ratio_vs_yaml_load": round(total / baseline, 2),
        "one_file_changed_rescan_and_checkpoint_s": round(file_change_s, 4),
        "one_event_and_checkpoint_us": round(event_change_s * 1e6, 1),
    }
