"""The agent started before the switch: it waits (503 meanwhile), then proceeds."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ovsproxy.lab import build_lab
from ovsproxy.ovs.sandbox import Sandbox
from tests.e2e.harness import AgentProcess, copy_examples

pytestmark = [pytest.mark.slow, pytest.mark.ovs]

# Longer than the 30 s start-up deadline the agent used to exit after.
SWITCH_AWAY = 35.0


class StartedAgent(AgentProcess):
    """Started without waiting for it to be healthy (it cannot be, yet)."""

    def wait_healthy(self, timeout: float = 30) -> None:
        if self.proc is not None and self.proc.poll() is None and not self.started_once:
            self.started_once = True
            return
        super().wait_healthy(timeout)

    started_once = False


def test_agent_started_before_the_switch_waits_then_serves(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    pods = build_lab(sandbox)
    sandbox.appctl("exit", target="ovs-vswitchd")  # the switch is not up (yet)
    mgmt = sandbox.rundir / f"{sandbox.bridge}.mgmt"
    deadline = time.monotonic() + 10
    while mgmt.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not mgmt.exists()
    agent = StartedAgent(sandbox, copy_examples(tmp_path / "manifests"), tmp_path / "agent.log")
    agent.start()
    try:
        away_until = time.monotonic() + SWITCH_AWAY
        answered = 0
        while time.monotonic() < away_until:
            assert agent.proc is not None and agent.proc.poll() is None, agent.log()[-3000:]
            try:
                code, body = agent.get("/healthz")
            except OSError:  # (the HTTP endpoint comes up a moment after the process)
                code, body = 0, ""
            if code:
                assert code == 503, body
                answered += 1
            time.sleep(1.0)
        assert answered >= SWITCH_AWAY / 2
        log = agent.log()
        assert f"waiting for the switch at {sandbox.openflow} before the first sync" in log
        assert f"still waiting for the switch at {sandbox.openflow} after 30s" in log
        sandbox.restart_vswitchd()
        agent.wait_healthy(60)
        assert f"the switch at {sandbox.openflow} is up after " in agent.log()
        result = agent.traffic(pods["client"].netns, "http", "http://10.96.0.10/", "--count", "20")
        assert result["failed"] == 0 and set(result["counts"]) == {"web-1", "web-2"}, result
    finally:
        agent.stop()
