"""A cluster in the real Kubernetes API server (``ovsproxy.lab.controlplane``), for the
agent-level benchmarks (``cold-start``, ``churn``, ``scale``).

* ``RealCluster``: etcd + kube-apiserver of the pinned release (no controller manager: the
  EndpointSlices are written directly, as an external controller writes them), a ServiceCIDR
  ``bench`` holding ``support.cluster``'s ClusterIPs beside the control plane's own range, and
  the agent's kubeconfig (``deploy/base/rbac.yaml``'s ServiceAccount token: what the agent
  reads with when deployed).
* ``RealCluster.load``: Services and their EndpointSlices created as the admin
  (``system:masters``: API priority and fairness does not queue it), many requests in flight
  over HTTP/2, before any clock starts; returns how long it took.
* ``server_usage``: CPU seconds and memory of kube-apiserver and etcd from ``/proc``, to put
  beside the agent's.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support import cluster

from bench import agentrun
from ovsproxy.lab.controlplane import ApiError, ControlPlane

try:  # lightkube >= 1.0 builds on httpx2, older releases on httpx
    import httpx2 as httpx
except ImportError:  # pragma: no cover - depends on the installed lightkube
    import httpx  # type: ignore[no-redef]

# The loader's name in managedFields and on the slices' managed-by label (not the
# EndpointSlice controller's: that controller would take them over).
FIELD_MANAGER = "ovsproxy-bench"
CIDR_NAME = "bench"
IN_FLIGHT = 16  # concurrent requests while loading (a connection each)
SERVER_COMPONENTS = ("kube-apiserver", "etcd")


@dataclass(frozen=True)
class LoadReport:
    """Services (and as many EndpointSlices) created, and the seconds each kind took."""

    services: int
    services_s: float
    slices_s: float

    def figures(self) -> dict[str, float]:
        seconds = self.services_s + self.slices_s
        return {
            "objects": 2 * self.services,
            "seconds": round(seconds, 2),
            "objects_per_s": round(2 * self.services / seconds, 1) if seconds else 0.0,
            "services_per_s": round(self.services / self.services_s, 1) if self.services_s else 0.0,
            "slices_per_s": round(self.services / self.slices_s, 1) if self.slices_s else 0.0,
        }


@dataclass(frozen=True)
class Usage:
    """A process's CPU seconds (user + system, all threads) and memory (kB)."""

    cpu_s: float
    rss_kb: int
    hwm_kb: int


def usage(pid: int) -> Usage:
    memory = agentrun.proc_status(pid)
    return Usage(agentrun.proc_cpu(pid), memory.get("VmRSS", 0), memory.get("VmHWM", 0))


def usage_delta(before: dict[str, Usage], after: dict[str, Usage]) -> dict[str, Any]:
    """Per component: CPU seconds between the two readings, RSS at the second."""
    return {
        name: {
            "cpu_s": round(after[name].cpu_s - before[name].cpu_s, 2),
            "rss_mb": round(after[name].rss_kb / 1024, 1),
            "peak_rss_mb": round(after[name].hwm_kb / 1024, 1),
        }
        for name in after
    }


class RealCluster:
    """A control plane holding a ``support.cluster`` cluster; use as a context manager."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.control_plane = ControlPlane(controllers=False)
        self.kubeconfig: Path | None = None
        self.services = 0
        self.uids: dict[int, str] = {}

    def __enter__(self) -> RealCluster:
        self.control_plane.start()
        try:
            cp = self.control_plane
            cp.create_namespace(cluster.NAMESPACE)
            cp.request(
                "POST",
                "/apis/networking.k8s.io/v1/servicecidrs",
                {
                    "apiVersion": "networking.k8s.io/v1",
                    "kind": "ServiceCIDR",
                    "metadata": {"name": CIDR_NAME},
                    "spec": {"cidrs": [cluster.SERVICE_CIDR]},
                },
            )
            self.kubeconfig = cp.ovsproxy_kubeconfig(self.workdir / "agent.kubeconfig")
        except BaseException:
            cp.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.control_plane.stop()

    def server_usage(self) -> dict[str, Usage]:
        pids = dict(self.control_plane.processes())
        return {name: usage(pids[name]) for name in SERVER_COMPONENTS if name in pids}

    def _client(self) -> httpx.AsyncClient:
        cp = self.control_plane
        return httpx.AsyncClient(
            base_url=cp.url,
            verify=str(cp.ca_file),
            http2=True,
            headers={
                "Authorization": f"Bearer {cp.admin.token}",
                "Content-Type": "application/json",
            },
            timeout=120,
            limits=httpx.Limits(max_connections=4, max_keepalive_connections=4),
        )

    async def load(self, services: int, endpoints: int) -> LoadReport:
        """Grow the cluster to ``services`` Services with ``endpoints`` endpoints each (the
        Services first, then their slices, each owned by its Service); returns the time."""
        started = time.perf_counter()
        new = range(self.services, services)
        cp = self.control_plane
        if True:
            answers = await send_all(
                cp,
                "POST",
                [
                    (
                        f"/api/v1/namespaces/{cluster.NAMESPACE}/services",
                        {
                            "apiVersion": "v1",
                            "kind": "Service",
                            **cluster.service_object(i, server_fields=False),
                        },
                    )
                    for i in new
                ],
                201,
            )
            services_s = time.perf_counter() - started
            for i, answer in zip(new, answers, strict=True):
                self.uids[i] = answer["metadata"]["uid"]
            await send_all(
                cp,
                "POST",
                [
                    (
                        f"/apis/discovery.k8s.io/v1/namespaces/{cluster.NAMESPACE}/endpointslices",
                        self.slice(i, cluster.endpoints_of(i, endpoints)),
                    )
                    for i in new
                ],
                201,
            )
        self.services = max(self.services, services)
        return LoadReport(len(new), services_s, time.perf_counter() - started - services_s)

    def slice(
        self, i: int, endpoints: list[dict[str, Any]], annotations: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """Service ``i``'s EndpointSlice as the loader writes it (owned by the Service)."""
        obj = cluster.slice_object(
            i, endpoints, server_fields=False, managed_by=FIELD_MANAGER, annotations=annotations
        )
        obj["metadata"]["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": "Service",
                "name": f"svc-{i}",
                "uid": self.uids[i],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", **obj}

    async def list_pages(self) -> list[bytes]:
        """The list pages the agent's informers read (500 a page, its label selector), as
        the server sends them."""
        from ovsproxy.sources.convert import PROXY_LABEL_SELECTOR

        pages: list[bytes] = []
        async with self._client() as client:
            for path in ("/api/v1/services", "/apis/discovery.k8s.io/v1/endpointslices"):
                token = ""
                while True:
                    params = {
                        "limit": str(agentrun.PAGE_SIZE),
                        "labelSelector": PROXY_LABEL_SELECTOR,
                    }
                    if token:
                        params["continue"] = token
                    response = await client.get(path, params=params)
                    response.raise_for_status()
                    pages.append(response.content)
                    token = json.loads(response.content)["metadata"].get("continue", "")
                    if not token:
                        break
        return pages


class Connection:
    """One keep-alive HTTP/1.1 connection to the API server, one request at a time (a
    Python HTTP/2 client cost more CPU per request than the API server's handling of it,
    on the same two cores)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes):
        self.reader, self.writer, self.head = reader, writer, head

    @classmethod
    async def open(cls, cp: ControlPlane) -> Connection:
        """A connection as the admin."""
        context = ssl.create_default_context(cafile=str(cp.ca_file))
        reader, writer = await asyncio.open_connection("127.0.0.1", cp.port, ssl=context)
        head = (
            f"Host: 127.0.0.1:{cp.port}\r\nAuthorization: Bearer {cp.admin.token}\r\n"
            "Accept: application/json\r\n"
        ).encode()
        return cls(reader, writer, head)

    async def request(
        self, method: str, target: str, body: bytes, content_type: bytes = b"application/json"
    ) -> tuple[int, bytes]:
        self.writer.write(
            b"%s %s HTTP/1.1\r\n%sContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s"
            % (method.encode(), target.encode(), self.head, content_type, len(body), body)
        )
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        headers = {
            k.strip().lower(): v.strip() for k, _, v in (x.partition(b":") for x in lines[1:] if x)
        }
        if b"content-length" in headers:
            return status, await self.reader.readexactly(int(headers[b"content-length"]))
        chunks = []
        while size := int((await self.reader.readuntil(b"\r\n"))[:-2], 16):
            chunks.append(await self.reader.readexactly(size))
            await self.reader.readexactly(2)
        await self.reader.readexactly(2)
        return status, b"".join(chunks)

    def close(self) -> None:
        self.writer.close()


async def send_all(
    cp: ControlPlane, method: str, requests: list[tuple[str, dict[str, Any]]], expect: int
) -> list[dict[str, Any]]:
    """Every (path, body) as ``method`` (``IN_FLIGHT`` at a time, as the admin); the answers
    in order. Raises ``ApiError`` at the first status other than ``expect``."""
    answers: list[dict[str, Any]] = [{} for _ in requests]
    todo: Iterator[int] = iter(range(len(requests)))
    query = f"?fieldManager={FIELD_MANAGER}"

    async def worker() -> None:
        connection = await Connection.open(cp)
        try:
            for index in todo:
                path, body = requests[index]
                status, answer = await connection.request(
                    method, path + query, json.dumps(body).encode()
                )
                if status != expect:
                    raise ApiError(method, path, status, answer.decode(errors="replace"))
                answers[index] = json.loads(answer)
        finally:
            connection.close()

    async with asyncio.TaskGroup() as group:
        for _ in range(min(IN_FLIGHT, len(requests))):
            group.create_task(worker())
    return answers
