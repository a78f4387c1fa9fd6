"""healthCheckNodePort servers, one per Service, with kube-proxy's semantics.

kube-proxy (pkg/proxy/healthcheck/service_health.go) opens, for every Service of type
LoadBalancer with externalTrafficPolicy Local, an HTTP server on its healthCheckNodePort on
the node's addresses. Any path answers JSON::

    {"service": {"namespace": ..., "name": ...}, "localEndpoints": N, "serviceProxyHealthy": B}

with status 200 when N > 0 and the proxy is healthy, else 503, and the header
``X-Load-Balancing-Endpoint-Weight: N`` on both (kube-proxy sets it on every answer). N counts
the distinct IPs of this node's *ready* endpoints across the Service's ports, per IP family as
kube-proxy's per-family proxiers do (a dual-stack pod counts once; the larger family count is
served), and terminating endpoints do not count: a node with only terminating endpoints fails
its check, so the load balancer drains it.

``ServiceHealthServers.update(mapping)`` makes the running servers match a desired mapping:
a new Service starts its server, a removed one stops, a changed port restarts, a changed
endpoint count changes the answer only. A port that cannot be opened (in use) is reported in
the result and in ``failed`` and retried on the next update; the other Services' servers are
unaffected.

Any path and any method are answered, as kube-proxy's; the request itself is bounded
(``ovsproxy.httpserver``: one connection budget for all the servers, one deadline per request,
bounded request line and headers).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ovsproxy.httpserver import (
    ConnectionBudget,
    HTTPServer,
    Limits,
    RateLimitedLog,
    Request,
    Response,
    listening_socket,
)
from ovsproxy.model import IPAddress, ServiceState
from ovsproxy.netns import enter_netns

log = logging.getLogger(__name__)

ServiceKey = tuple[str, str]  # (namespace, name)
WEIGHT_HEADER = "X-Load-Balancing-Endpoint-Weight"


@dataclass(frozen=True, slots=True)
class ServiceHealth:
    """One Service's health check: its port and the number of ready local endpoint IPs."""

    port: int
    local_endpoints: int = 0


def desired_health_checks(
    states: Iterable[ServiceState], node_name: str
) -> dict[ServiceKey, ServiceHealth]:
    """The servers this node must run, from all Service ports and their endpoints (pure)."""
    ports: dict[ServiceKey, int] = {}
    local_ips: dict[ServiceKey, set[IPAddress]] = {}
    for state in states:
        port = state.port
        if not port.health_check_node_port:
            continue
        key = port.name.service
        ports[key] = port.health_check_node_port
        ips = local_ips.setdefault(key, set())
        ips.update(ep.ip for ep in state.endpoints if ep.ready and ep.is_local(node_name))
    return {key: ServiceHealth(port, _per_family(local_ips[key])) for key, port in ports.items()}


def _per_family(ips: set[IPAddress]) -> int:
    """kube-proxy counts per IP family (each family's proxier its own endpoints): a dual-stack
    pod is one endpoint, not two. One server answers for both families: the larger count."""
    v4 = sum(1 for ip in ips if ip.version == 4)
    return max(v4, len(ips) - v4)


@dataclass(frozen=True, slots=True)
class UpdateResult:
    started: tuple[ServiceKey, ...] = ()
    stopped: tuple[ServiceKey, ...] = ()
    failed: Mapping[ServiceKey, str] = field(default_factory=dict)  # key -> why


class _Instance:
    __slots__ = ("health", "server")

    def __init__(self, health: ServiceHealth, server: HTTPServer) -> None:
        self.health = health
        self.server = server


class ServiceHealthServers:
    """The running health-check servers; one owner, on the event loop."""

    def __init__(
        self,
        proxy_healthy: Callable[[], bool],
        addresses: Sequence[str] | None = None,  # None: every address, both families
        netns: str | None = None,  # the node's network namespace (None: ours)
        limits: Limits | None = None,
    ) -> None:
        self.proxy_healthy = proxy_healthy
        self.addresses = list(addresses) if addresses is not None else None
        self.netns = netns
        self._instances: dict[ServiceKey, _Instance] = {}
        self.failed: dict[ServiceKey, str] = {}
        # Listening sockets are made on one worker thread inside ``netns`` (a socket keeps the
        # namespace it was created in); serving them stays on the event loop.
        self._executor: ThreadPoolExecutor | None = None
        self._joined = False
        # One connection budget for all the servers: a client that floods one port costs the
        # agent no more than clients of every port together may.
        self.budget = ConnectionBudget(limits or Limits(), RateLimitedLog(log))

    @property
    def running(self) -> dict[ServiceKey, int]:
        return {key: inst.health.port for key, inst in self._instances.items()}

    async def update(self, desired: Mapping[ServiceKey, ServiceHealth]) -> UpdateResult:
        stopped: list[ServiceKey] = []
        for key, inst in list(self._instances.items()):
            want = desired.get(key)
            if want is None or want.port != inst.health.port:
                await inst.server.close()
                del self._instances[key]
                stopped.append(key)
        self.failed = {k: v for k, v in self.failed.items() if k in desired}
        started: list[ServiceKey] = []
        failed: dict[ServiceKey, str] = {}
        for key, want in desired.items():
            running = self._instances.get(key)
            if running is not None:
                running.health = want  # the count changes the answer, not the server
                continue
            try:
                server = await self._listen(key, want.port)
            except OSError as exc:
                why = f"cannot listen on port {want.port}: {exc.strerror or exc}"
                log.error("health check of Service %s/%s: %s", *key, why)
                failed[key] = why
                continue
            self._instances[key] = _Instance(want, server)
            self.failed.pop(key, None)
            started.append(key)
        self.failed.update(failed)
        return UpdateResult(tuple(started), tuple(stopped), failed)

    async def close(self) -> None:
        for inst in self._instances.values():
            await inst.server.close()
        self._instances.clear()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def _socket_blocking(self, host: str | None, port: int) -> socket.socket:
        if self.netns is not None and not self._joined:
            enter_netns(self.netns)
            self._joined = True
        return listening_socket(host, port)

    async def _start(self, server: HTTPServer, host: str | None, port: int) -> None:
        if self.netns is None:
            await server.listen(host, port)
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="healthcheck")
        loop = asyncio.get_running_loop()
        sock = await loop.run_in_executor(self._executor, self._socket_blocking, host, port)
        try:
            await server.listen_socket(sock)
        except BaseException:
            sock.close()
            raise

    async def _listen(self, key: ServiceKey, port: int) -> HTTPServer:
        async def handler(_request: Request) -> Response:
            status, headers, body = self.answer(key)
            content_type = headers.pop("Content-Type")
            return Response(status, body, content_type, tuple(headers.items()))

        server = HTTPServer(handler, self.budget)
        hosts: list[str | None] = [None] if self.addresses is None else list(self.addresses)
        try:
            for host in hosts:
                await self._start(server, host, port)
        except OSError:
            await server.close()  # all addresses or none, so a retry can take the port
            raise
        return server

    def answer(self, key: ServiceKey) -> tuple[int, dict[str, str], bytes]:
        """Status, headers and body for a request to ``key``'s health check."""
        inst = self._instances.get(key)
        count = inst.health.local_endpoints if inst is not None else 0
        healthy = self.proxy_healthy()
        body = {
            "service": {"namespace": key[0], "name": key[1]},
            "localEndpoints": count,
            "serviceProxyHealthy": healthy,
        }
        headers = {
            "Content-Type": "application/json",
            "X-Content-Type-Options": "nosniff",
            WEIGHT_HEADER: str(count),
        }
        status = 200 if count and healthy else 503
        return status, headers, json.dumps(body, indent="\t").encode()
