"""A cluster served by the fake Kubernetes API (tests/k8s_fake) over real HTTP, for the
agent-level benchmarks (``cold-start``, ``churn``, ``scale``).

* ``service_object`` / ``slice_object``: a Service and its EndpointSlice as the API server
  sends them in a list (no kind/apiVersion on items; uid, resourceVersion, creationTimestamp,
  managedFields, the controller's labels, annotations and ownerReference), with exactly the
  content of ``bench.dp.cluster`` (same names, ClusterIPs and endpoints), so the groups and
  flows the agent installs can be compared with ``ovs-ofctl`` loading ``dp``'s.
* ``manifest_files``: the same cluster as YAML manifests (what a user writes: no server-set
  fields), 1,000 Services a file.
* ``ServingKubeApi``: the fake, answering lists from a cached snapshot with cached encoded
  pages, so what the clock sees is the agent, not the fake deep-copying and encoding 20,000
  objects in Python (a real API server serves lists from its watch cache). Paging is the
  API server's: ``limit`` + ``continue`` over one snapshot, the snapshot's resourceVersion on
  every page, no ``remainingItemCount`` when a label selector is given.
"""

from __future__ import annotations

import asyncio
import copy
import ipaddress
import json
from pathlib import Path
from typing import Any

import yaml
from tests.k8s_fake import FakeKubeApi
from tests.k8s_fake.server import _BY_PLURAL, RESOURCES, selector_matches

from bench import dp

NAMESPACE = "bench"
SERVICE_CIDR = "172.16.0.0/16"  # dp.cluster's ClusterIPs
SERVICES_PER_FILE = 1000
_CREATED = "2026-11-30T10:00:00Z"
_SUFFIX = "abcdefghijklmnopqrstuvwxyz0123456789"


def _suffix(i: int) -> str:
    out = []
    for _ in range(5):
        i, r = divmod(i * 7 + 3, len(_SUFFIX))
        out.append(_SUFFIX[r])
    return "".join(out)


def _uid(kind: int, i: int) -> str:
    return f"{kind:08x}-{i >> 16 & 0xFFFF:04x}-4{i & 0xFFF:03x}-8000-{i:012x}"


def service_object(i: int, *, server_fields: bool = True) -> dict[str, Any]:
    """Service ``svc-i``: ClusterIP dp.cluster's i-th, port http 80/TCP -> 8080."""
    name = f"svc-{i}"
    ip = str(ipaddress.IPv4Address(dp._CLUSTER_IP_BASE + 1 + i))
    meta: dict[str, Any] = {"name": name, "namespace": NAMESPACE, "labels": {"app": name}}
    if server_fields:
        meta.update(
            uid=_uid(1, i),
            resourceVersion="1",
            creationTimestamp=_CREATED,
            managedFields=[
                {
                    "manager": "kubectl-client-side-apply",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": _CREATED,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:metadata": {"f:labels": {".": {}, "f:app": {}}},
                        "f:spec": {
                            "f:internalTrafficPolicy": {},
                            "f:ports": {
                                ".": {},
                                'k:{"port":80,"protocol":"TCP"}': {
                                    ".": {},
                                    "f:name": {},
                                    "f:port": {},
                                    "f:protocol": {},
                                    "f:targetPort": {},
                                },
                            },
                            "f:selector": {},
                            "f:sessionAffinity": {},
                            "f:type": {},
                        },
                    },
                }
            ],
        )
    obj: dict[str, Any] = {
        "metadata": meta,
        "spec": {
            "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080}],
            "selector": {"app": name},
            "clusterIP": ip,
            "clusterIPs": [ip],
            "type": "ClusterIP",
            "sessionAffinity": "None",
            "ipFamilies": ["IPv4"],
            "ipFamilyPolicy": "SingleStack",
            "internalTrafficPolicy": "Cluster",
        },
    }
    if server_fields:
        obj["status"] = {"loadBalancer": {}}
    return obj


def endpoint_ips(i: int, endpoints: int) -> list[str]:
    return [
        str(ipaddress.IPv4Address(dp._ENDPOINT_BASE + i * endpoints + j)) for j in range(endpoints)
    ]


def endpoint_object(i: int, ip: str, pod: int) -> dict[str, Any]:
    return {
        "addresses": [ip],
        "conditions": {"ready": True, "serving": True, "terminating": False},
        "targetRef": {
            "kind": "Pod",
            "namespace": NAMESPACE,
            "name": f"svc-{i}-7d9f8b6c5-{_suffix(pod)}",
            "uid": _uid(3, pod),
        },
        "nodeName": f"node-{pod % 7}",
        "zone": f"zone-{pod % 3}",
    }


def slice_name(i: int) -> str:
    return f"svc-{i}-{_suffix(i)}"


def slice_object(
    i: int,
    endpoints: list[dict[str, Any]],
    *,
    server_fields: bool = True,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    service = f"svc-{i}"
    meta: dict[str, Any] = {
        "name": slice_name(i),
        "namespace": NAMESPACE,
        "labels": {
            "app": service,
            "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
            "kubernetes.io/service-name": service,
        },
    }
    if server_fields:
        meta.update(
            generateName=f"{service}-",
            uid=_uid(2, i),
            resourceVersion="1",
            generation=1,
            creationTimestamp=_CREATED,
            annotations={
                "endpoints.kubernetes.io/last-change-trigger-time": _CREATED,
                **(annotations or {}),
            },
            ownerReferences=[
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "name": service,
                    "uid": _uid(1, i),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            managedFields=[
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "apiVersion": "discovery.k8s.io/v1",
                    "time": _CREATED,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:addressType": {},
                        "f:endpoints": {},
                        "f:metadata": {
                            "f:annotations": {
                                ".": {},
                                "f:endpoints.kubernetes.io/last-change-trigger-time": {},
                            },
                            "f:generateName": {},
                            "f:labels": {
                                ".": {},
                                "f:app": {},
                                "f:endpointslice.kubernetes.io/managed-by": {},
                                "f:kubernetes.io/service-name": {},
                            },
                            "f:ownerReferences": {
                                ".": {},
                                f'k:{{"uid":"{_uid(1, i)}"}}': {},
                            },
                        },
                        "f:ports": {},
                    },
                }
            ],
        )
    return {
        "metadata": meta,
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "http", "protocol": "TCP", "port": dp.ENDPOINT_PORT}],
    }


def cluster_objects(
    services: int, endpoints: int, *, server_fields: bool = True
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(Services, EndpointSlices) of dp.cluster(services, endpoints)."""
    svcs = [service_object(i, server_fields=server_fields) for i in range(services)]
    slices = [
        slice_object(
            i,
            [
                endpoint_object(i, ip, i * endpoints + j)
                for j, ip in enumerate(endpoint_ips(i, endpoints))
            ],
            server_fields=server_fields,
        )
        for i in range(services)
    ]
    return svcs, slices


def manifest_files(directory: Path, services: int, endpoints: int) -> list[Path]:
    """The same cluster as manifests (Service, then its EndpointSlice), 1,000 a file."""
    svcs, slices = cluster_objects(services, endpoints, server_fields=False)
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    files = []
    for start in range(0, services, SERVICES_PER_FILE):
        docs: list[dict[str, Any]] = []
        for i in range(start, min(start + SERVICES_PER_FILE, services)):
            docs.append({"apiVersion": "v1", "kind": "Service", **svcs[i]})
            docs.append({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", **slices[i]})
        path = directory / f"services-{start // SERVICES_PER_FILE:03d}.yaml"
        path.write_text(yaml.dump_all(docs, Dumper=dumper, sort_keys=False))
        files.append(path)
    return files


class ServingKubeApi(FakeKubeApi):
    """The fake API with lists served from a cached snapshot and cached encoded pages (see
    the module docstring). Watches, selectors and 410s are the fake's own."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # (plural, namespace, selector text) -> (resourceVersion, snapshot id, items)
        self._listed: dict[tuple[str, str | None, str], tuple[int, int, list[Any]]] = {}
        self._pages: dict[tuple[int, int, int], bytes] = {}
        self.served_bytes = 0

    def load(self, plural: str, objects: list[dict[str, Any]]) -> None:
        """Store many objects at once (as ``apply`` would, without the per-object copy)."""
        for obj in objects:
            meta = obj["metadata"]
            self._rv += 1
            meta["resourceVersion"] = str(self._rv)
            self._objects[plural][(meta.get("namespace", ""), meta["name"])] = obj
        self._history.clear()
        self._oldest_rv = self._rv

    def prepare(self, plural: str, selector: str, limit: int) -> int:
        """Take the snapshot and encode every page of a list before the clock starts;
        returns the bytes of all pages."""
        requirements = _parse(selector)
        rv, snapshot_id, items = self._snapshot(plural, None, selector, requirements)
        total = 0
        for offset in range(0, max(len(items), 1), limit):
            total += len(self._page(plural, rv, snapshot_id, items, offset, limit, bool(selector)))
        return total

    def pages(self) -> list[bytes]:
        return list(self._pages.values())

    def _snapshot(
        self, plural: str, namespace: str | None, text: str, requirements: Any
    ) -> tuple[int, int, list[Any]]:
        key = (plural, namespace, text)
        cached = self._listed.get(key)
        if cached is not None and cached[0] == self._rv:
            return cached
        items = [
            obj
            for k, obj in sorted(self._objects[plural].items())
            if (not namespace or k[0] == namespace) and selector_matches(requirements, obj)
        ]
        snapshot_id = next(self._snapshot_ids)
        self._snapshots[snapshot_id] = (self._rv, items)
        self._listed[key] = (self._rv, snapshot_id, items)
        return self._listed[key]

    def _page(
        self,
        plural: str,
        rv: int,
        snapshot_id: int,
        items: list[Any],
        offset: int,
        limit: int,
        selected: bool,
    ) -> bytes:
        key = (snapshot_id, offset, limit)
        data = self._pages.get(key)
        if data is None:
            page = items[offset : offset + limit] if limit else items[offset:]
            metadata: dict[str, Any] = {"resourceVersion": str(rv)}
            end = offset + len(page)
            if end < len(items):
                metadata["continue"] = f"{snapshot_id}:{end}"
                if not selected:  # the API server counts only unfiltered lists
                    metadata["remainingItemCount"] = len(items) - end
            kind, _ = RESOURCES[(*_BY_PLURAL[plural], plural)]
            group, version = _BY_PLURAL[plural]
            body = {
                "kind": f"{kind}List",
                "apiVersion": f"{group}/{version}" if group else version,
                "metadata": metadata,
                "items": page,
            }
            data = self._pages[key] = json.dumps(body, separators=(",", ":")).encode()
        return data

    async def _list(
        self, writer: Any, plural: str, namespace: Any, selector: Any, fields: Any, params: Any
    ):
        if fields:  # (the agent's one Node: nothing to make cheaper)
            await super()._list(writer, plural, namespace, selector, fields, params)
            return
        limit = int(params.get("limit") or 0)
        token = params.get("continue")
        if token:
            snapshot_id, offset = map(int, token.split(":"))
            if snapshot_id not in self._snapshots:
                message = "The provided continue parameter is too old to display a consistent list"
                await self._respond(writer, 410, _gone(message))
                return
            rv, items = self._snapshots[snapshot_id]
        else:
            offset = 0
            rv, snapshot_id, items = self._snapshot(
                plural, namespace, params.get("labelSelector") or "", selector
            )
        selected = bool(params.get("labelSelector"))
        data = self._page(plural, rv, snapshot_id, items, offset, limit, selected)
        self.served_bytes += len(data)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(data)
        )
        writer.write(data)
        await writer.drain()

    async def _stream(self, writer: Any, watcher: Any, timeout: float) -> None:
        """The fake's watch stream, cheaper per event: the changes queued by the time the
        stream runs go out as one write (the churn generator sends up to 1,000 a second, and
        a wait and a drain per event made this process the bottleneck). Anything else in
        the queue (an end, an abort, a bookmark) is the fake's own stream's to handle."""
        from tests.k8s_fake.server import _Change

        if self.bookmark_interval:
            await super()._stream(writer, watcher, timeout)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        queue = watcher.queue
        while (remaining := deadline - loop.time()) > 0:
            if queue.empty():
                try:
                    item = await asyncio.wait_for(queue.get(), remaining)
                except TimeoutError:
                    return
                queue.put_nowait(item)  # (back at the end of an empty queue: first)
            chunks = []
            while not queue.empty() and isinstance(queue._queue[0], _Change):
                event = self._event_for(watcher, queue.get_nowait())
                if event is not None:
                    data = json.dumps(event).encode() + b"\n"
                    chunks.append(b"%x\r\n%s\r\n" % (len(data), data))
            if chunks:
                writer.write(b"".join(chunks))
                await writer.drain()
            if not queue.empty() and not isinstance(queue._queue[0], _Change):
                # an end, abort, gone or bookmark: the fake's stream takes it from here
                await super()._stream(writer, watcher, max(0.0, deadline - loop.time()))
                return

    def apply_fast(self, plural: str, obj: dict[str, Any]) -> None:
        """``apply`` for an object the caller built fresh and never touches again (no
        deep copy): keeps the churn generator's own cost low."""
        meta = obj["metadata"]
        key = (meta.get("namespace", ""), meta["name"])
        old = self._objects[plural].get(key)
        if old is not None:
            meta["uid"] = old["metadata"].get("uid", meta.get("uid"))
        self._rv += 1
        meta["resourceVersion"] = str(self._rv)
        self._objects[plural][key] = obj
        from tests.k8s_fake.server import _Change

        self._record(_Change(self._rv, plural, old, obj))


def _parse(text: str) -> Any:
    from tests.k8s_fake.server import parse_selector

    return parse_selector(text)


def _gone(message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "Expired",
        "code": 410,
    }


def copy_object(obj: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(obj)
