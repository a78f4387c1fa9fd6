"""healthCheckNodePort servers: real HTTP on loopback; start/stop/restart as Services change;
a port conflict reported without stopping the others."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import socket
import urllib.error
import urllib.request

import pytest

from ovsproxy.healthcheck import (
    WEIGHT_HEADER,
    ServiceHealth,
    ServiceHealthServers,
    desired_health_checks,
)
from ovsproxy.httpserver import Limits
from ovsproxy.lab.ports import reserve_port
from ovsproxy.model import (
    Endpoint,
    ServicePort,
    ServicePortName,
    ServiceState,
    ServiceType,
    TrafficPolicy,
)

HOST = "127.0.0.1"


def free_port() -> int:
    return reserve_port(HOST)


def get(port: int, path: str = "/", host: str = HOST) -> tuple[int, dict[str, str], dict]:
    host = f"[{host}]" if ":" in host else host
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=5) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), json.loads(err.read())


async def fetch(port: int, path: str = "/", host: str = HOST) -> tuple[int, dict[str, str], dict]:
    return await asyncio.to_thread(get, port, path, host)


def refused(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex((HOST, port)) != 0


async def test_answers_with_kube_proxys_body_and_header() -> None:
    healthy = [True]
    servers = ServiceHealthServers(lambda: healthy[0], addresses=[HOST])
    port = free_port()
    try:
        result = await servers.update({("shop", "web"): ServiceHealth(port, 2)})
        assert result.started == (("shop", "web"),) and not result.failed
        status, headers, body = await fetch(port, "/any/path")
        assert status == 200
        assert headers[WEIGHT_HEADER] == "2"
        assert headers["Content-Type"] == "application/json"
        assert body == {
            "service": {"namespace": "shop", "name": "web"},
            "localEndpoints": 2,
            "serviceProxyHealthy": True,
        }
        # no local endpoint: 503, weight 0; the server keeps running
        result = await servers.update({("shop", "web"): ServiceHealth(port, 0)})
        assert not result.started and not result.stopped
        status, headers, body = await fetch(port)
        assert (status, headers[WEIGHT_HEADER], body["localEndpoints"]) == (503, "0", 0)
        # local endpoints but an unhealthy proxy: 503
        await servers.update({("shop", "web"): ServiceHealth(port, 1)})
        healthy[0] = False
        status, headers, body = await fetch(port)
        assert (status, body["serviceProxyHealthy"], headers[WEIGHT_HEADER]) == (503, False, "1")
    finally:
        await servers.close()
    assert refused(port)


async def test_servers_start_stop_and_move_with_services() -> None:
    servers = ServiceHealthServers(lambda: True, addresses=[HOST])
    a, b, c = free_port(), free_port(), free_port()
    try:
        await servers.update({("ns", "a"): ServiceHealth(a, 1), ("ns", "b"): ServiceHealth(b, 1)})
        assert (await fetch(a))[0] == 200 and (await fetch(b))[0] == 200
        # b removed, a moved to port c
        result = await servers.update({("ns", "a"): ServiceHealth(c, 1)})
        assert set(result.stopped) == {("ns", "a"), ("ns", "b")}
        assert result.started == (("ns", "a"),)
        assert refused(a) and refused(b)
        status, _, body = await fetch(c)
        assert status == 200 and body["service"]["name"] == "a"
        assert servers.running == {("ns", "a"): c}
        await servers.update({})
        assert refused(c) and servers.running == {}
    finally:
        await servers.close()


async def test_a_port_conflict_is_reported_and_the_others_keep_serving() -> None:
    servers = ServiceHealthServers(lambda: True, addresses=[HOST])
    taken = socket.socket()
    taken.bind((HOST, 0))
    taken.listen()
    busy = taken.getsockname()[1]
    ok = free_port()
    desired = {("ns", "blocked"): ServiceHealth(busy, 1), ("ns", "fine"): ServiceHealth(ok, 1)}
    try:
        result = await servers.update(desired)
        assert result.started == (("ns", "fine"),)
        assert set(result.failed) == {("ns", "blocked")}
        assert f"port {busy}" in result.failed[("ns", "blocked")]
        assert "in use" in result.failed[("ns", "blocked")]
        assert servers.failed == result.failed
        assert (await fetch(ok))[0] == 200
        # the port is freed: the next update takes it
        taken.close()
        result = await servers.update(desired)
        assert result.started == (("ns", "blocked"),) and not result.failed
        assert not servers.failed
        status, _, body = await fetch(busy)
        assert status == 200 and body["service"]["name"] == "blocked"
        assert (await fetch(ok))[0] == 200
    finally:
        taken.close()
        await servers.close()


def _state(name: str, port_name: str, hc: int, endpoints: list[Endpoint]) -> ServiceState:
    return ServiceState(
        ServicePort(
            name=ServicePortName("ns", name, port_name),
            cluster_ips=(ipaddress.ip_address("10.96.0.1"),),
            port=80,
            type=ServiceType.LOAD_BALANCER,
            external_traffic_policy=TrafficPolicy.LOCAL,
            node_port=30000,
            health_check_node_port=hc,
        ),
        tuple(endpoints),
    )


def test_local_endpoints_count_ready_local_ips_across_ports() -> None:
    def ep(ip: str, port: int, node: str, ready: bool = True) -> Endpoint:
        return Endpoint(ipaddress.ip_address(ip), port, ready=ready, node_name=node)

    states = [
        # 10.0.0.1 serves both ports: one endpoint, as kube-proxy counts
        _state("web", "http", 32000, [ep("10.0.0.1", 80, "a"), ep("10.0.0.2", 80, "b")]),
        _state("web", "https", 32000, [ep("10.0.0.1", 443, "a"), ep("10.0.0.3", 443, "a")]),
        # terminating (not ready) endpoints do not count
        _state("drain", "", 32001, [ep("10.0.0.4", 80, "a", ready=False)]),
        _state("plain", "", 0, [ep("10.0.0.5", 80, "a")]),  # no health check
    ]
    assert desired_health_checks(states, "a") == {
        ("ns", "web"): ServiceHealth(32000, 2),
        ("ns", "drain"): ServiceHealth(32001, 0),
    }
    assert desired_health_checks(states, "b")[("ns", "web")] == ServiceHealth(32000, 1)
    assert desired_health_checks(states, "")[("ns", "web")].local_endpoints == 0
    # A dual-stack pod (one IPv4 and one IPv6 address) is one endpoint, as each of
    # kube-proxy's per-family proxiers counts it.
    dual = [ep("10.0.0.7", 80, "c"), ep("fd00::7", 80, "c"), ep("fd00::8", 80, "c")]
    assert (
        desired_health_checks([_state("dual", "", 32002, dual)], "c")[
            ("ns", "dual")
        ].local_endpoints
        == 2
    )


async def test_listens_on_every_given_address() -> None:
    servers = ServiceHealthServers(lambda: True, addresses=["127.0.0.1", "::1"])
    port = free_port()
    try:
        await servers.update({("ns", "a"): ServiceHealth(port, 1)})
        for host in ("127.0.0.1", "::1"):
            assert (await fetch(port, host=host))[0] == 200
    finally:
        await servers.close()


async def _exchange(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        writer.write(request)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def test_hostile_requests_are_answered_with_a_status_and_no_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A load balancer's port is open to anyone: an oversized request line or a header flood
    gets 414/431, a logged line at most (rate-limited), never a traceback."""
    servers = ServiceHealthServers(lambda: True, addresses=[HOST])
    port = free_port()
    try:
        await servers.update({("shop", "web"): ServiceHealth(port, 1)})
        with caplog.at_level(logging.DEBUG):
            for _ in range(20):
                long_line = b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n"
                assert (await _exchange(port, long_line)).startswith(b"HTTP/1.1 414 ")
                flood = b"GET / HTTP/1.1\r\n" + b"X-Flood: 1\r\n" * 5000 + b"\r\n"
                assert (await _exchange(port, flood)).startswith(b"HTTP/1.1 431 ")
        assert not any(r.exc_info for r in caplog.records), caplog.text
        assert "Traceback" not in caplog.text
        assert len(caplog.records) <= 2, caplog.text  # one per kind per 10 s
        assert (await fetch(port))[0] == 200
    finally:
        await servers.close()


async def test_slow_clients_share_one_cap_and_a_prompt_request_is_answered() -> None:
    """Clients that never finish their requests, on every health-check port at once, hold no
    more than one cap of connections together; a prompt request still gets its answer."""
    servers = ServiceHealthServers(lambda: True, addresses=[HOST], limits=Limits(max_connections=8))
    ports = [free_port(), free_port()]
    slow: list[asyncio.StreamWriter] = []
    try:
        await servers.update(
            {("shop", f"web{i}"): ServiceHealth(port, 1) for i, port in enumerate(ports)}
        )
        for i in range(40):
            _, writer = await asyncio.open_connection(HOST, ports[i % 2])
            writer.write(b"GET / HTTP/1.1\r\n")  # and never the rest
            slow.append(writer)
            await asyncio.sleep(0.005)
            assert servers.budget.open <= 8
        assert servers.budget.counters["evicted"] >= 30
        assert (await fetch(ports[0]))[0] == 200
        assert (await fetch(ports[1]))[0] == 200
    finally:
        for writer in slow:
            writer.close()
        await servers.close()
