"""Interfaces that are not pods: each logged once per reason, listed in status (text and
JSON). A narrow double for OVSDB; tests/e2e/test_not_pods.py runs the same on a real OVS."""

from __future__ import annotations

import io
import logging

import pytest
from rich.console import Console

from ovsproxy.agent.observability import StatusPages, register_metrics
from ovsproxy.agent.pods import PodWatcher
from ovsproxy.agent.wiring import Components
from ovsproxy.cli.status_cmd import render_status
from ovsproxy.config import AgentConfig
from ovsproxy.metrics import HealthState, Metrics
from ovsproxy.model.node import NotAPod


class Bridge:
    """What ``OVSDB.read_pods`` answers, changed by the test between reads."""

    def __init__(self) -> None:
        self.not_pods: list[NotAPod] = []
        self.asked_to_skip: tuple[str, ...] = ()

    def read_pods(self, bridge: str, not_pods: tuple[str, ...]) -> tuple[list, list[NotAPod]]:
        self.asked_to_skip = not_pods
        return [], list(self.not_pods)


async def test_logged_once_per_reason_and_shown(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="ovsproxy.agent")
    bridge = Bridge()
    watcher = PodWatcher("br0", "gw0")
    bridge.not_pods = [NotAPod("uplink0", "no external_ids:ip and external_ids:attached-mac")]
    for _ in range(3):
        await watcher.read(bridge)  # type: ignore[arg-type]
    assert bridge.asked_to_skip == ("gw0",)  # the gateway is no pod and not reported
    line = "interface uplink0 on bridge br0 is not read as a pod"
    assert caplog.text.count(line) == 1
    # A new reason is news; a port that went away and came back is logged again.
    bridge.not_pods = [NotAPod("uplink0", "bad external_ids:ip 'x'")]
    await watcher.read(bridge)  # type: ignore[arg-type]
    bridge.not_pods = []
    await watcher.read(bridge)  # type: ignore[arg-type]
    bridge.not_pods = [NotAPod("uplink0", "bad external_ids:ip 'x'")]
    await watcher.read(bridge)  # type: ignore[arg-type]
    assert caplog.text.count(line) == 3
    assert [r.levelname for r in caplog.records if line in r.message] == [
        "INFO",
        "WARNING",
        "WARNING",
    ]
    parts = Components(AgentConfig())
    parts.pods = watcher
    metrics = Metrics()
    register_metrics(metrics, HealthState(), parts, {})
    assert "ovsproxy_bridge_interfaces_not_pods 1.0" in metrics.render().decode()
    info = StatusPages(parts, metrics, HealthState()).status_json()
    assert info["not_pods"] == [{"interface": "uplink0", "reason": "bad external_ids:ip 'x'"}]
    out = io.StringIO()
    render_status(info, Console(file=out, width=200, color_system=None))
    assert "uplink0: bad external_ids:ip 'x'" in out.getvalue()
