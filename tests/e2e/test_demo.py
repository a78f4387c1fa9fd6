"""`ovsproxy demo --json`: the one-command tour works and reports real traffic."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.ovs]


def test_demo_json_exits_0_with_traffic_on_every_endpoint() -> None:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    out = subprocess.run(
        [sys.executable, "-m", "ovsproxy", "demo", "--json", "--requests", "20"],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["ok"] is True
    initial, after = report["phases"]
    assert {r["client"] for r in initial["results"]} == {"pod demo/client", "node (Service route)"}
    for result in initial["results"] + after["results"]:
        assert result["failed"] == 0
        assert set(result["counts"]) == set(result["expected"])  # every endpoint answered
        assert sum(result["counts"].values()) == 20
    # After the change the removed endpoint gets nothing and the new one gets traffic.
    assert all(set(r["counts"]) == {"web-1", "api-2"} for r in after["results"])
    assert any("fd00:10:96::20" in r["url"] for r in initial["results"])
