"""Two Services claiming one port, as manifests allow and an API server's allocator would not
(issue 25): the older keeps it and answers all along, the newer's port is refused and named
(status, ovsproxy_services_refused, the log with the port), the rest of the newer Service is
served, and the newer's port is served once the older goes. One 2-node lab: web-1 on node-1
answers for the older Services, web-2 on node-2 for the newer."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest

from ovsproxy.lab.cluster import HTTP_PORT, Lab
from ovsproxy.lab.manifests import (
    LabPort,
    LabService,
    addresses,
    endpoint_texts,
    remove_service,
    write_service,
)

from .conftest import start_lab
from .helpers import client_pod, http, install
from .test_nodeport import get, node_ip
from .test_trace import pod_of, trace_json

pytestmark = [pytest.mark.slow, pytest.mark.ovs]

OLDER, NEWER = "2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z"
REQUESTS = 150


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    yield from start_lab(2)


def service(
    lab: Lab, name: str, cluster_ip: str, pod: str, created: str | None, *ports: LabPort, **kw: Any
) -> LabService:
    return LabService(
        name,
        addresses(cluster_ip),
        ports or (LabPort("http", 80, HTTP_PORT),),
        tuple(replace(ep, ips=ep.ips[:1]) for ep in lab.endpoints(pod)),  # IPv4 only
        created=created,
        **kw,
    )


def wait_conflict(lab: Lab, refused: str, owner: str, claim: str) -> None:
    def named(_node: str, status: dict[str, Any]) -> bool:
        return any(
            (c["refused"], c["owner"], c["claim"]) == (refused, owner, claim)
            for c in status.get("conflicts", [])
        )

    lab.wait_status(named, timeout=30)


def refused_metric(lab: Lab, node: str) -> float:
    address = lab.nodes[node].metrics_address
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    line = next(
        x for x in text.splitlines() if x.startswith('ovsproxy_services_refused{reason="conflict"}')
    )
    return float(line.rpartition(" ")[2])


def through(change: Callable[[], None], send: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``send`` (a run of requests) with ``change`` made while it runs."""
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.update(send()))
    thread.start()
    time.sleep(0.3)
    change()
    thread.join()
    return result


def assert_named(lab: Lab, refused: str, owner: str, claim: str, number: str) -> None:
    wait_conflict(lab, refused, owner, claim)
    for node in lab.nodes:
        assert refused_metric(lab, node) >= 1, (node, "metric")
        status = lab.agent_status(node)
        assert refused not in {s["name"] for s in status["services"]}, (node, status["services"])
        problem = next(c["problem"] for c in status["conflicts"] if c["refused"] == refused)
        service, owner_service = refused.split(":", 1)[0], owner.split(":", 1)[0]
        assert f"Service {service}" in problem and f"Service {owner_service}" in problem
        log = lab.agent_log(node)
        lines = [line for line in log.splitlines() if service in line]
        assert any(number in line for line in lines), (node, lines)


def test_node_port(lab: Lab) -> None:
    old = service(lab, "np-old", "10.96.4.10", "web-1", OLDER,
                  LabPort("http", 80, HTTP_PORT, node_port=30180), type="NodePort")  # fmt: skip
    new = service(lab, "np-new", "10.96.4.11", "web-2", NEWER,
                  LabPort("http", 80, HTTP_PORT, node_port=30180),
                  LabPort("other", 81, HTTP_PORT, node_port=30181), type="NodePort")  # fmt: skip
    install(lab, old)
    try:
        node_1, node_2 = node_ip(lab, "node-1", 0), node_ip(lab, "node-2", 0)

        def change() -> None:
            write_service(lab.manifests, new)
            assert_named(lab, "lab/np-new:http/TCP", "lab/np-old:http/TCP", "nodePort 30180/TCP",
                         "30180")  # fmt: skip

        out = through(change, lambda: http(lab, lab.external_netns, node_1, REQUESTS, port=30180))
        assert out["failed"] == 0 and out["counts"] == {"web-1": REQUESTS}, out
        # ovsproxy trace follows the owner (it used to refuse "nodePort 30180 of several ports")
        traced = trace_json(lab, "node-1", "192.168.50.100", f"{node_1}:30180")
        assert traced["verdict"] == "forwarded", traced
        assert pod_of(lab, traced["endpoint"]) == "web-1", traced
        # the rest of the newer Service is served
        other = http(lab, lab.external_netns, node_2, 20, port=30181)
        assert other["counts"] == {"web-2": 20}, other
        remove_service(lab.manifests, old)
        lab.wait_endpoints("lab/np-new:http/TCP", endpoint_texts(new.endpoints, HTTP_PORT))
        served = http(lab, lab.external_netns, node_2, 20, port=30180)
        assert served["counts"] == {"web-2": 20}, served
        lab.wait_status(lambda _n, s: not s["conflicts"])
    finally:
        remove_service(lab.manifests, old)
        remove_service(lab.manifests, new)


def test_node_port_without_creation_timestamps_stays_with_the_service_seen_first(lab: Lab) -> None:
    """Manifests as kubectl writes them carry no creationTimestamp (issue 35): the Service the
    agents saw first keeps nodePort 30080 on every node, before, while and after a second
    file claims it, and the second file's port is refused and named. The second Service's
    name sorts first, so deciding by namespace/name would hand it the port."""
    first = service(lab, "np-z-first", "10.96.4.60", "web-1", None,
                    LabPort("http", 80, HTTP_PORT, node_port=30080), type="NodePort")  # fmt: skip
    second = service(lab, "np-a-second", "10.96.4.61", "web-2", None,
                     LabPort("http", 80, HTTP_PORT, node_port=30080), type="NodePort")  # fmt: skip
    install(lab, first)
    try:
        node_1, node_2 = node_ip(lab, "node-1", 0), node_ip(lab, "node-2", 0)
        before = http(lab, lab.external_netns, node_1, 20, port=30080)
        assert before["failed"] == 0 and before["counts"] == {"web-1": 20}, before

        def change() -> None:
            write_service(lab.manifests, second)
            assert_named(lab, "lab/np-a-second:http/TCP", "lab/np-z-first:http/TCP",
                         "nodePort 30080/TCP", "30080")  # fmt: skip

        out = through(change, lambda: http(lab, lab.external_netns, node_1, REQUESTS, port=30080))
        assert out["failed"] == 0 and out["counts"] == {"web-1": REQUESTS}, out
        for node in (node_1, node_2):
            after = http(lab, lab.external_netns, node, 20, port=30080)
            assert after["failed"] == 0 and after["counts"] == {"web-1": 20}, (node, after)
    finally:
        remove_service(lab.manifests, first)
        remove_service(lab.manifests, second)


ADDRESS_CASES = [
    # (kind, the older's ClusterIP, the newer's, the address both claim, extra spec)
    pytest.param("cip", "10.96.4.20", "10.96.4.20", "10.96.4.20", {}, id="ClusterIP"),
    pytest.param(
        "ext", "10.96.4.30", "10.96.4.31", "198.51.100.30",
        {"externalIPs": ["198.51.100.30"]}, id="external-IP",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "old_ip", "new_ip", "claimed", "spec"), ADDRESS_CASES)
def test_address_port(
    lab: Lab, kind: str, old_ip: str, new_ip: str, claimed: str, spec: dict[str, Any]
) -> None:
    old = service(lab, f"{kind}-old", old_ip, "web-1", OLDER, extra_spec=spec)
    new = service(lab, f"{kind}-new", new_ip, "web-2", NEWER,
                  LabPort("http", 80, HTTP_PORT), LabPort("other", 81, HTTP_PORT),
                  extra_spec=spec)  # fmt: skip
    install(lab, old)
    client = client_pod(lab.nodes["node-1"])
    try:

        def change() -> None:
            write_service(lab.manifests, new)
            assert_named(lab, f"lab/{kind}-new:http/TCP", f"lab/{kind}-old:http/TCP",
                         f"{claimed}:80/TCP", f"{claimed}:80")  # fmt: skip

        out = through(change, lambda: http(lab, client, claimed, REQUESTS))
        assert out["failed"] == 0 and out["counts"] == {"web-1": REQUESTS}, out
        other = http(lab, client, new_ip, 20, port=81)  # the newer's other port is served
        assert other["counts"] == {"web-2": 20}, other
        remove_service(lab.manifests, old)
        lab.wait_endpoints(f"lab/{kind}-new:http/TCP", endpoint_texts(new.endpoints, HTTP_PORT))
        served = http(lab, client, claimed, 20)
        assert served["counts"] == {"web-2": 20}, served
    finally:
        remove_service(lab.manifests, old)
        remove_service(lab.manifests, new)


def health(lab: Lab, node: str) -> tuple[int, str]:
    """The answer of ``node``'s health check on 32110, asked from the external client:
    (HTTP status, the Service it speaks for)."""
    answer = get(lab.external_netns, node_ip(lab, node, 0), 32110)
    body = json.loads(answer["body"]) if answer["body"] else {}
    return answer["status"], "{namespace}/{name}".format(**body["service"]) if body else ""


def test_health_check_node_port(lab: Lab) -> None:
    local = {"externalTrafficPolicy": "Local", "healthCheckNodePort": 32110}
    old = service(lab, "hc-old", "10.96.4.40", "web-1", OLDER, type="LoadBalancer",
                  extra_spec=local)  # fmt: skip
    new = service(lab, "hc-new", "10.96.4.41", "web-2", NEWER, type="LoadBalancer",
                  extra_spec=local)  # fmt: skip
    install(lab, old)
    want_old = {"node-1": (200, "lab/hc-old"), "node-2": (503, "lab/hc-old")}
    deadline = time.monotonic() + 10
    while {n: health(lab, n) for n in lab.nodes} != want_old and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        write_service(lab.manifests, new)
        answers = []
        for _ in range(20):  # the older's health check answers, for the older, all along
            answers.append({n: health(lab, n) for n in lab.nodes})
            time.sleep(0.05)
        assert_named(lab, "lab/hc-new:http/TCP", "lab/hc-old:http/TCP",
                     "healthCheckNodePort 32110", "32110")  # fmt: skip
        answers.append({n: health(lab, n) for n in lab.nodes})
        assert all(a == want_old for a in answers), answers
        for node in lab.nodes:  # no health-check server was tried for the newer
            checks = lab.agent_status(node)["node_ports"]["health_checks"]
            assert all(c["service"] != "lab/hc-new" for c in checks), checks
        remove_service(lab.manifests, old)
        want_new = {"node-1": (503, "lab/hc-new"), "node-2": (200, "lab/hc-new")}
        deadline = time.monotonic() + 10
        while {n: health(lab, n) for n in lab.nodes} != want_new and time.monotonic() < deadline:
            time.sleep(0.1)
        assert {n: health(lab, n) for n in lab.nodes} == want_new
    finally:
        remove_service(lab.manifests, old)
        remove_service(lab.manifests, new)
