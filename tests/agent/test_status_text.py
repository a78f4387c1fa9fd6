"""`ovsproxy status` text says what the switch does with each Service port, from the same
/status data the JSON shows: the proxier's real selection, through the agent's status."""

from __future__ import annotations

import io
import ipaddress

from rich.console import Console

from ovsproxy.agent.core import NodeFacts, Semantics, build_core
from ovsproxy.agent.observability import StatusPages
from ovsproxy.agent.wiring import Components
from ovsproxy.cli.status_cmd import render_status
from ovsproxy.config import AgentConfig
from ovsproxy.metrics import HealthState, Metrics
from ovsproxy.model import ServiceType, TrafficPolicy
from ovsproxy.model.handler import SYNC_ENDPOINT_SLICES, SYNC_SERVICES
from tests.proxy.test_proxier_semantics import NODE, Recorder, apply, ep, port


async def _status() -> tuple[dict, str]:
    parts = Components(AgentConfig(node_name=NODE))
    parts.tracker.on_synced(SYNC_SERVICES)
    parts.tracker.on_synced(SYNC_ENDPOINT_SLICES)
    recorder = Recorder()
    parts.take_core(
        build_core(
            parts.config, recorder, NodeFacts(), semantics=Semantics.FLOWS, tracker=parts.tracker
        )
    )
    tracker = parts.tracker
    # iTP Local, its only endpoint on another node: the switch drops
    apply(
        tracker,
        port("10.96.0.2", name="local", internal_traffic_policy=TrafficPolicy.LOCAL),
        [ep("10.0.0.1")],
    )
    apply(tracker, port("10.96.0.1", name="empty"), [])  # no endpoint: rejects
    apply(tracker, port("10.96.0.3", name="ok"), [ep("10.0.0.1"), ep("10.0.0.2")])
    # dual-stack, IPv6 without endpoints: forwards IPv4, rejects IPv6
    apply(tracker, port("10.96.0.4", "fd00::4", name="dual"), [ep("10.0.0.3")])
    await parts.proxier.sync()
    info = StatusPages(parts, Metrics(), HealthState()).status_json()
    out = io.StringIO()
    render_status(info, Console(file=out, width=200, color_system=None))
    return info, out.getvalue()


def _line(text: str, name: str) -> str:
    return next(line for line in text.splitlines() if line.strip().startswith(f"ns/{name}:"))


async def test_status_text_says_dropping_rejecting_or_forwarding_to_n_endpoints() -> None:
    info, text = await _status()
    by_name = {s["name"]: s for s in info["services"]}
    local = by_name["ns/local:p/TCP"]
    assert local["dropping"] and not local["rejecting"]  # the JSON's view
    assert "dropping (internalTrafficPolicy Local: no usable endpoint on this node)" in _line(
        text, "local"
    )
    assert "forwarding" not in _line(text, "local")
    assert "rejecting (no usable endpoints)" in _line(text, "empty")
    assert "forwarding to 2 endpoints" in _line(text, "ok")
    dual = _line(text, "dual")
    assert "IPv4: forwarding to 1 endpoint;" in dual
    assert "IPv6: rejecting (no usable endpoints)" in dual


def _node_port_parts() -> Components:
    """An agent's parts with a proxier that programs NodePorts (the configuration's default),
    on a recording switch."""
    parts = Components(AgentConfig(node_name=NODE))
    parts.tracker.on_synced(SYNC_SERVICES)
    parts.tracker.on_synced(SYNC_ENDPOINT_SLICES)
    core = build_core(
        parts.config, Recorder(), NodeFacts(), semantics=Semantics.FLOWS, tracker=parts.tracker
    )
    assert core.proxier.node_ports
    parts.take_core(core)
    return parts


async def test_status_text_shows_nodeports_health_check_ports_and_source_ranges() -> None:
    parts = _node_port_parts()
    apply(
        parts.tracker,
        port(
            "10.96.0.5",
            name="lb",
            type=ServiceType.LOAD_BALANCER,
            node_port=30080,
            load_balancer_ips=(ipaddress.ip_address("203.0.113.5"),),
            external_traffic_policy=TrafficPolicy.LOCAL,
            health_check_node_port=32000,
            load_balancer_source_ranges=(ipaddress.ip_network("192.0.2.0/24"),),
        ),
        [ep("10.0.0.1")],
    )
    await parts.proxier.sync()
    info = StatusPages(parts, Metrics(), HealthState()).status_json()
    lb = next(s for s in info["services"] if s["name"] == "ns/lb:p/TCP")
    assert lb["node_port"] == 30080 and lb["health_check_node_port"] == 32000
    assert lb["load_balancer_source_ranges"] == ["192.0.2.0/24"]
    assert lb["families"]["IPv4"]["external"]["node_port_frontends"] == ["169.254.0.252"]
    out = io.StringIO()
    render_status(info, Console(file=out, width=250, color_system=None))
    text = out.getvalue()
    assert "NodePort 30080" in text
    assert "health check :32000" in text
    assert "source ranges 192.0.2.0/24" in text
    assert "external/LB IPs 203.0.113.5" in text


async def test_status_text_names_both_services_of_a_port_conflict() -> None:
    parts = _node_port_parts()
    nodeport = {"type": ServiceType.NODE_PORT, "node_port": 30080}
    apply(parts.tracker, port("10.96.0.5", name="old", created=1.0, **nodeport), [ep("10.0.0.1")])
    apply(parts.tracker, port("10.96.0.6", name="new", created=2.0, **nodeport), [ep("10.0.0.2")])
    await parts.proxier.sync()
    info = StatusPages(parts, Metrics(), HealthState()).status_json()
    assert [s["name"] for s in info["services"]] == ["ns/old:p/TCP"]
    assert [(c["refused"], c["owner"], c["claim"]) for c in info["conflicts"]] == [
        ("ns/new:p/TCP", "ns/old:p/TCP", "nodePort 30080/TCP")
    ]
    out = io.StringIO()
    render_status(info, Console(file=out, width=250, color_system=None))
    assert (
        "  Service ns/new: port p/TCP: nodePort 30080/TCP is already claimed by the older "
        "Service ns/old (port p/TCP); this port is refused"
    ) in out.getvalue().splitlines()


def test_status_text_says_whether_the_node_is_going_away() -> None:
    from ovsproxy.agent.node import NodeWatcher
    from ovsproxy.healthcheck import TO_BE_DELETED_TAINT, ProxyHealth
    from ovsproxy.model.node import Node

    parts = Components(AgentConfig(node_name=NODE))
    parts.node = NodeWatcher(NODE, ProxyHealth())

    def text() -> str:
        info = StatusPages(parts, Metrics(), HealthState()).status_json()
        out = io.StringIO()
        render_status(info, Console(file=out, width=200, color_system=None))
        return next(line for line in out.getvalue().splitlines() if " Node " in line)

    assert "not found" in text()
    ip = ipaddress.ip_address("192.0.2.5")
    parts.node.on_add(Node(NODE, internal_ips=(ip,)))
    assert "eligible, 192.0.2.5" in text()
    parts.node.on_update(Node(NODE, internal_ips=(ip,), taints=(TO_BE_DELETED_TAINT,)))
    assert f"going away (tainted {TO_BE_DELETED_TAINT}; /healthz 503)" in text()
    parts.node.on_delete(NODE)
    assert "deleted (/healthz 503)" in text()
