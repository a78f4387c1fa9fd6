"""`ovsproxy run` configuration: YAML file + flags, validated up front with the key named."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ovsproxy.config import AgentConfig, ConfigError, load
from ovsproxy.datapath.pipeline import Mode


def test_defaults_are_the_embedded_sandbox() -> None:
    config = load()
    assert config.embedded and config.mode is Mode.STANDALONE
    # kube-proxy's: health on the node's addresses, metrics (and here /status) on loopback
    assert config.health_host_port == ("0.0.0.0", 10256)
    assert config.metrics_host_port == ("127.0.0.1", 10249)


def test_file_values_then_flags_win(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("""
source: kubernetes
ovsdb: unix:/run/openvswitch/db.sock
openflow: unix:/run/openvswitch/br-int.mgmt
bridge: br-int
mode: integrated
first_table: 100
next_table: 70
group_id_min: 0x10000000
service_cidr: 10.96.0.0/12
min-sync-interval: 2
""")
    config = load(path, bridge="br-ex", min_sync_interval=None)
    assert config.bridge == "br-ex"  # the flag wins
    assert config.in_cluster and not config.embedded
    assert config.mode is Mode.INTEGRATED and config.first_table == 100
    assert config.group_id_min == 0x10000000
    assert config.service_cidr == ("10.96.0.0/12",)  # a single value becomes a list
    assert config.min_sync_interval == 2.0
    assert config.pipeline.next_table == 70


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"colour": "blue"}, "unknown configuration key 'colour'"),
        ({"service_cidr": ["10.96.0.0/33"]}, "service_cidr: '10.96.0.0/33' is not an IP network"),
        ({"mode": "sidecar"}, "mode: 'sidecar' is not one of standalone, integrated"),
        ({"first_table": "ten"}, "first_table: expected an integer, got 'ten'"),
        ({"ovsdb": "unix:/x"}, "ovsdb and openflow: give both"),
        ({"metrics_address": "nowhere"}, "metrics_address: 'nowhere' is not HOST:PORT"),
        ({"health_address": "10256"}, "health_address: '10256' is not HOST:PORT"),
        (
            {"health_address": "0.0.0.0:10249"},
            "health_address '0.0.0.0:10249' and metrics_address '127.0.0.1:10249' overlap",
        ),
        ({"log_format": "xml"}, "log_format: 'xml' is not text or json"),
        ({"first_table": 10, "next_table": 12}, "next_table 12 must be a table outside"),
        ({"manifests": ["a.yaml"], "kubeconfig": "k"}, "choose one source"),
        ({"cleanup": "yes"}, "cleanup: expected true or false"),
        ({"route_backend": "bsd"}, "route_backend: 'bsd' is not one of auto, linux, windows"),
        ({"mid_stream_flows": "maybe"}, "mid_stream_flows: 'maybe' is not one of auto, on, off"),
        ({"route_backend": "windows", "netns": "node"}, "network namespaces are Linux only"),
        ({"route_sync_interval": -1}, "route_sync_interval must be >= 0"),
        ({"service_proxy_name": "not/a-label"}, "service_proxy_name: 'not/a-label' is not a"),
    ],
)
def test_bad_values_name_the_key(values: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load(**values)  # type: ignore[arg-type]


def test_unreadable_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("bridge: [unclosed\n")
    with pytest.raises(ConfigError, match=r"config file .*broken.yaml"):
        load(path)
    path.write_text("- a list\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load(path)


def test_run_refuses_a_bad_config_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("first_table: 300\n")
    out = subprocess.run(
        [sys.executable, "-m", "ovsproxy", "run", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert out.returncode == 1
    assert "configuration: pipeline: first_table 300" in out.stderr
    assert "Traceback" not in out.stderr


def test_agent_config_is_frozen() -> None:
    with pytest.raises(AttributeError):
        AgentConfig().bridge = "x"  # type: ignore[misc]


def _readme_keys() -> dict[str, tuple[str, str]]:
    """``{key: (flag cell, default cell)}`` from docs/configuration.md's table."""
    readme = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()
    rows = {}
    for line in readme.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`") and cells[1].startswith("`--"):
            rows[cells[0].strip("`")] = (cells[1], cells[2])
    return rows


def _readme_default(name: str, value: object) -> str:
    if name == "node_name":
        return "the host name"
    if name == "group_id_max":
        return f"0x{value:X}"
    if value is None or value == ():
        return "—"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def test_every_key_is_a_flag_and_in_the_readme_with_its_default() -> None:
    import dataclasses

    from ovsproxy.cli.run_cmd import run

    flags = {p.name: p for p in run.params}
    readme = _readme_keys()
    defaults = AgentConfig()
    for f in dataclasses.fields(AgentConfig):
        assert f.name in flags, f"configuration key {f.name} has no flag"
        flag = flags[f.name].opts[0]  # type: ignore[attr-defined]
        assert f.name in readme, f"configuration key {f.name} is not in docs/configuration.md"
        flag_cell, default_cell = readme[f.name]
        assert f"`{flag}`" in flag_cell, (f.name, flag_cell)
        assert default_cell == _readme_default(f.name, getattr(defaults, f.name)), f.name
    assert set(readme) == {f.name for f in dataclasses.fields(AgentConfig)}


def test_route_backend_follows_the_platform_unless_forced() -> None:
    from ovsproxy.agent.wiring import build_route_backend, route_backend_name

    assert route_backend_name("auto", "linux") == "linux"
    assert route_backend_name("auto", "win32") == "windows"
    assert route_backend_name("linux", "win32") == "linux"
    assert route_backend_name("windows", "linux") == "windows"
    backend = build_route_backend(load(route_backend="windows"), None)
    assert backend.name == "windows"
    assert build_route_backend(load(), "node").name == (
        "windows" if sys.platform == "win32" else "linux"
    )
    with pytest.raises(ConfigError, match="Linux only"):
        build_route_backend(load(route_backend="windows"), "node")


def test_mid_stream_flows_is_auto_unless_set_and_reads_yaml_on_and_off(tmp_path: Path) -> None:
    assert load().mid_stream_flows == "auto"
    assert load(mid_stream_flows="off").mid_stream_flows == "off"
    path = tmp_path / "c.yaml"
    for text, want in (("on", "on"), ("off", "off"), ("true", "on"), ("'auto'", "auto")):
        path.write_text(f"mid_stream_flows: {text}\n")  # YAML 1.1 reads on/off as booleans
        assert load(path).mid_stream_flows == want
