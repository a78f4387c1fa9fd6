"""Agent configuration: a YAML file and command-line flags (flags win), validated up front.

Every key of the file is the flag's name with '_' for '-'. A bad value fails start-up with the
key and the value named; nothing half-configured runs.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ovsproxy.datapath.pipeline import Mode, PipelineConfig
from ovsproxy.model import IPAddress
from ovsproxy.proxy.mid_stream import MID_STREAM_SETTINGS
from ovsproxy.sources.convert import check_service_proxy_name
from ovsproxy.steering.desired import NodePortAddresses

# kube-proxy's: its healthz on every address, its metrics on loopback (the CLI's default too)
DEFAULT_HEALTH_ADDRESS = "0.0.0.0:10256"
DEFAULT_METRICS_ADDRESS = "127.0.0.1:10249"


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class AgentConfig:
    # source
    manifests: tuple[str, ...] = ()
    # a manifest file larger than this is not read (reported; its last good content stays)
    manifest_max_bytes: int = 64 << 20
    kubeconfig: str | None = None
    in_cluster: bool = False
    # handle only Services labelled service.kubernetes.io/service-proxy-name=<this>; none:
    # only Services without that label (kube-proxy's rule)
    service_proxy_name: str | None = None
    # serve every Service without its externalIPs, each Service with them a problem
    # (proxy.external_ips; kube-proxy is deprecating externalIPs)
    refuse_external_ips: bool = False
    # OVS; when none of these is given the agent runs its embedded private sandbox
    ovsdb: str | None = None
    openflow: str | None = None
    bridge: str = "br0"
    gateway: str = "gw0"
    netns: str | None = None  # the node's network namespace for routes (None: this one)
    # pipeline
    mode: Mode = Mode.STANDALONE
    first_table: int = 10
    next_table: int = 20
    group_id_min: int = 1
    group_id_max: int = 0xFFFFFEFF
    # standalone: re-create a Service connection's translation after an ovs-vswitchd restart
    # (proxy.mid_stream): auto (by the bridge's datapath type), on or off
    mid_stream_flows: str = "auto"
    # standalone: SNAT source of node-originated Service traffic to endpoints on other nodes,
    # one per family; empty: the agent derives it from the gateway's pod CIDR (agent.hostsnat)
    host_snat_ip: tuple[str, ...] = ()
    # node
    node_name: str = field(default_factory=socket.gethostname)
    zone: str | None = None
    # this node's IPs, primary of each family first (empty: read from the node's devices)
    node_ip: tuple[str, ...] = ()
    # NodePort, external IP and LB IP steering (standalone; needs the routes)
    node_ports: bool = True
    # kube-proxy's nodePortAddresses: CIDRs or "primary"; empty: every node IP
    node_port_addresses: tuple[str, ...] = ()
    # routes
    service_cidr: tuple[str, ...] = ()
    manage_routes: bool = True
    route_sync_interval: float = 60.0
    route_backend: str = "auto"  # auto (by platform), linux or windows
    # runner
    # kube-proxy's 1 s pays for rewriting whole iptables tables; a sync here costs what changed,
    # so 0.1 s bounds the latency a change waits for at little CPU (bench churn)
    min_sync_interval: float = 0.1
    full_resync_interval: float = 3600.0
    # live traffic counters (agent.counters): seconds between reads of the switch's group
    # statistics (0: never, only on demand), and the most series per counter metric
    counters_interval: float = 15.0
    counters_max_series: int = 1000
    # observability: the node-facing address serves only the health paths (kube-proxy's
    # healthz 0.0.0.0:10256; empty: none); the operator's serves /metrics (kube-proxy's
    # 127.0.0.1:10249) and, on loopback only, /status and /dump
    health_address: str = DEFAULT_HEALTH_ADDRESS
    metrics_address: str = DEFAULT_METRICS_ADDRESS
    log_level: str = "info"
    log_format: str = "text"
    # shutdown
    cleanup: bool = False

    @property
    def embedded(self) -> bool:
        """No OVS and no source given: run the private sandbox with the bundled examples."""
        return self.ovsdb is None and self.openflow is None

    @property
    def pipeline(self) -> PipelineConfig:
        return PipelineConfig(
            mode=self.mode,
            first_table=self.first_table,
            next_table=self.next_table,
            group_id_min=self.group_id_min,
            group_id_max=self.group_id_max,
            host_snat_ips=tuple(ipaddress.ip_address(ip) for ip in self.host_snat_ip),
            node_ips=self.node_ips,
        )

    @property
    def node_ips(self) -> tuple[IPAddress, ...]:
        return tuple(ipaddress.ip_address(ip) for ip in self.node_ip)

    @property
    def node_port_ips(self) -> tuple[IPAddress, ...]:
        """This node's IPs that accept NodePorts (``node_port_addresses`` of ``node_ip``)."""
        node_ips = self.node_ips
        return NodePortAddresses.parse(self.node_port_addresses).node_port_ips(node_ips)

    @property
    def steers(self) -> bool:
        """Node-side steering runs: asked for, standalone, and with the node's routes."""
        return self.node_ports and self.mode == Mode.STANDALONE and self.manage_routes

    @property
    def metrics_host_port(self) -> tuple[str, int]:
        return _host_port(self.metrics_address)

    @property
    def health_host_port(self) -> tuple[str, int] | None:
        """None: no node-facing health listener (``health_address`` empty)."""
        return _host_port(self.health_address) if self.health_address else None

    def service_cidrs(self) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
        return [ipaddress.ip_network(c, strict=False) for c in self.service_cidr]


def _host_port(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    number = int(port)
    if not sep or not 0 <= number <= 65535:
        raise ValueError(address)
    return host.strip("[]") or "0.0.0.0", number


_TUPLE_FIELDS = {"manifests", "service_cidr", "host_snat_ip", "node_ip", "node_port_addresses"}
# The route backends ``route_backend`` may name; ``auto`` picks by platform (agent.wiring).
ROUTE_BACKENDS = ("auto", "linux", "windows")


def _coerce(name: str, value: Any, default: Any) -> Any:
    if name in _TUPLE_FIELDS:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{name}: expected a list, got {value!r}")
        return tuple(str(v) for v in value)
    if name == "mode":
        try:
            return Mode(str(value))
        except ValueError:
            raise ConfigError(f"mode: {value!r} is not one of standalone, integrated") from None
    if name == "mid_stream_flows" and isinstance(value, bool):  # YAML reads on/off as booleans
        return "on" if value else "off"
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{name}: expected true or false, got {value!r}")
        return value
    if isinstance(default, int) and not isinstance(default, bool):
        try:
            return int(value, 0) if isinstance(value, str) else int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}: expected an integer, got {value!r}") from None
    if isinstance(default, float):
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}: expected a number, got {value!r}") from None
    return None if value is None else str(value)


def validate(config: AgentConfig) -> AgentConfig:
    try:
        check_service_proxy_name(config.service_proxy_name)
    except ValueError as exc:
        raise ConfigError(f"service_proxy_name: {exc}") from None
    for cidr in config.service_cidr:
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            raise ConfigError(f"service_cidr: {cidr!r} is not an IP network") from None
    for ip in config.host_snat_ip:
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            raise ConfigError(f"host_snat_ip: {ip!r} is not an IP address") from None
    for ip in config.node_ip:
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            raise ConfigError(f"node_ip: {ip!r} is not an IP address") from None
    try:
        NodePortAddresses.parse(config.node_port_addresses)
    except ValueError as exc:
        raise ConfigError(str(exc).replace("nodePortAddresses", "node_port_addresses")) from None
    try:
        config.pipeline  # noqa: B018 - validates tables and group range
    except ValueError as exc:
        raise ConfigError(f"pipeline: {exc}") from None
    for key in ("metrics_address", "health_address"):
        address = getattr(config, key)
        try:
            if address or key == "metrics_address":
                _host_port(address)
        except ValueError:
            raise ConfigError(f"{key}: {address!r} is not HOST:PORT") from None
    health = config.health_host_port
    metrics = config.metrics_host_port
    wildcard = {"0.0.0.0", "::"}
    if (
        health is not None
        and health[1] != 0
        and health[1] == metrics[1]
        and (health[0] == metrics[0] or wildcard & {health[0], metrics[0]})
    ):
        raise ConfigError(
            f"health_address {config.health_address!r} and metrics_address "
            f"{config.metrics_address!r} overlap; the node's address serves the health paths "
            "only: give them different ports"
        )
    if config.log_format not in ("text", "json"):
        raise ConfigError(f"log_format: {config.log_format!r} is not text or json")
    if config.log_level.lower() not in ("debug", "info", "warning", "error"):
        raise ConfigError(f"log_level: {config.log_level!r} is not debug/info/warning/error")
    if config.mid_stream_flows not in MID_STREAM_SETTINGS:
        raise ConfigError(
            f"mid_stream_flows: {config.mid_stream_flows!r} is not one of "
            f"{', '.join(MID_STREAM_SETTINGS)}"
        )
    if config.route_backend not in ROUTE_BACKENDS:
        raise ConfigError(
            f"route_backend: {config.route_backend!r} is not one of {', '.join(ROUTE_BACKENDS)}"
        )
    if config.route_backend == "windows" and config.netns is not None:
        raise ConfigError("route_backend windows and netns: network namespaces are Linux only")
    if config.route_sync_interval < 0:
        raise ConfigError("route_sync_interval must be >= 0 (0: no periodic route sync)")
    if config.min_sync_interval < 0 or config.full_resync_interval <= 0:
        raise ConfigError("min_sync_interval must be >= 0 and full_resync_interval > 0")
    if config.counters_interval < 0 or not 1 <= config.counters_max_series <= 1_000_000:
        raise ConfigError(
            "counters_interval must be >= 0 and counters_max_series between 1 and 1,000,000"
        )
    if (config.ovsdb is None) != (config.openflow is None):
        raise ConfigError("ovsdb and openflow: give both (a real OVS) or neither (the sandbox)")
    if config.manifest_max_bytes < 1:
        raise ConfigError("manifest_max_bytes must be >= 1")
    if config.manifests and (config.kubeconfig or config.in_cluster):
        raise ConfigError("manifests and kubeconfig/in_cluster: choose one source")
    if config.kubeconfig and config.in_cluster:
        raise ConfigError("kubeconfig and in_cluster: choose one")
    return config


def load(path: str | Path | None = None, **overrides: Any) -> AgentConfig:
    """File values, then overrides (flags; None means not given)."""
    defaults = AgentConfig()
    values: dict[str, Any] = {}
    if path is not None:
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"config file {path}: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"config file {path}: expected a mapping of keys to values")
        if data.get("source") == "kubernetes" and "kubeconfig" not in data:
            data.setdefault("in_cluster", True)
        data.pop("source", None)
        values.update(data)
    values.update({k: v for k, v in overrides.items() if v is not None and v != ()})
    known = {f.name: f for f in dataclasses.fields(AgentConfig)}
    kwargs = {}
    for key, value in values.items():
        name = key.replace("-", "_")
        if name not in known:
            raise ConfigError(f"unknown configuration key {key!r}")
        kwargs[name] = _coerce(name, value, getattr(defaults, name))
    return validate(AgentConfig(**kwargs))
