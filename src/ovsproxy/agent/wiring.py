"""Building the agent's components from its configuration; nothing here starts anything.

Which source (manifests or the Kubernetes API), which route backend (by platform, or forced
with ``route_backend``), the node ingress: NodePorts, external and load-balancer IPs
(``build_node_ingress``), the host-SNAT addresses (``build_host_snat``). The core (datapath,
Service semantics, proxier and what follows each commit) is ``agent.core.build_core``'s.
``Components`` holds what one run has built so far: the other agent modules (sync,
observability, lifecycle) read it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ovsproxy.config import ROUTE_BACKENDS, AgentConfig, ConfigError
from ovsproxy.lab import EXAMPLES
from ovsproxy.model import IPAddress
from ovsproxy.model.handler import SourceHandler
from ovsproxy.ovs.ovsdb import OVSDBGroupRegistry
from ovsproxy.proxy.external_ips import ExternalIPFilter, ExternalIPRule
from ovsproxy.proxy.tracker import ChangeTracker

if TYPE_CHECKING:
    from ovsproxy.agent.core import Core
    from ovsproxy.agent.counters import CounterPoller
    from ovsproxy.agent.hostsnat import HostSNAT
    from ovsproxy.agent.node import NodeWatcher
    from ovsproxy.agent.nodeport import NodeIngress
    from ovsproxy.agent.ovsdb_link import OVSDBLink
    from ovsproxy.agent.pods import PodWatcher
    from ovsproxy.datapath.semantics import SemanticsHelpers
    from ovsproxy.datapath.switch_sync import SwitchSync
    from ovsproxy.healthcheck import ProxyHealth
    from ovsproxy.openflow.connection import Channel
    from ovsproxy.ovs.ovsdb import OVSDB
    from ovsproxy.ovs.sandbox import Sandbox
    from ovsproxy.proxy.proxier import Proxier
    from ovsproxy.proxy.runner import SyncRunner
    from ovsproxy.routes import RouteBackend, RouteManager
    from ovsproxy.servicecidr import ServiceCIDRDiscoverer
    from ovsproxy.sources.kubernetes import KubernetesSource
    from ovsproxy.sources.manifests import ManifestSource

log = logging.getLogger("ovsproxy.agent")


@dataclass
class Components:
    """Everything one agent run owns, filled in as start-up proceeds (None: not there, yet or
    at all: no sandbox on a real OVS, no routes with ``--no-routes``)."""

    config: AgentConfig
    tracker: ChangeTracker = field(default_factory=ChangeTracker)
    # Between the source and the tracker: the external IPs refused on this node
    external_ips: ExternalIPFilter | None = None
    sandbox: Sandbox | None = None
    netns: str | None = None  # the node's network namespace for routes
    ovsdb: OVSDB | None = None
    ovsdb_link: OVSDBLink | None = None  # the start-up connection's state
    channel: Channel | None = None
    datapath: SwitchSync | None = None
    semantics: SemanticsHelpers | None = None
    proxier: Proxier | None = None
    runner: SyncRunner | None = None
    source: ManifestSource | KubernetesSource | None = None
    routes: RouteManager | None = None
    discoverer: ServiceCIDRDiscoverer | None = None
    node_ingress: NodeIngress | None = None  # NodePort/external steering and health checks
    host_snat: HostSNAT | None = None  # standalone, with routes: host-SNAT addresses
    pods: PodWatcher | None = None  # standalone mode: the bridge's pods, and what is not one
    node: NodeWatcher | None = None  # the Node object (the Kubernetes API source only)
    counters: CounterPoller | None = None  # live traffic per Service port and endpoint

    def take_core(self, core: Core) -> None:
        """The core built over ``channel`` (``agent.core.build_core``) becomes this run's."""
        self.tracker, self.datapath = core.tracker, core.datapath
        self.proxier, self.semantics = core.proxier, core.semantics

    @property
    def group_registry(self) -> OVSDBGroupRegistry | None:
        """The OVSDB record of our installed group ids, when the datapath keeps one."""
        registry = self.datapath.group_ids.registry if self.datapath is not None else None
        return registry if isinstance(registry, OVSDBGroupRegistry) else None


# -- the source -------------------------------------------------------------------------------


def manifest_paths(config: AgentConfig) -> list[str]:
    """The manifests to read: those given, or the bundled examples for the embedded default
    (no OVS and no Kubernetes API given); empty means the Kubernetes API."""
    if config.manifests:
        return list(config.manifests)
    if config.embedded and not (config.kubeconfig or config.in_cluster):
        return [str(EXAMPLES)]
    return []


def external_ip_rule(
    config: AgentConfig, api_server_ips: frozenset[IPAddress] = frozenset()
) -> ExternalIPRule:
    """The external IPs this node refuses (``proxy.external_ips``): all of them when told
    to, else its own addresses and the API server's."""
    return ExternalIPRule(config.refuse_external_ips, frozenset(config.node_ips), api_server_ips)


async def api_server_ips(host: str | None) -> frozenset[IPAddress]:
    """The API server's addresses: its host as given, or what its name resolves to (once,
    at start; a name that does not resolve gives none, logged)."""
    if not host:
        return frozenset()
    try:
        return frozenset({ipaddress.ip_address(host)})
    except ValueError:
        pass
    try:
        found = await asyncio.get_running_loop().getaddrinfo(host, None)
    except OSError as exc:
        log.warning("API server %s does not resolve (%s): its address is not refused", host, exc)
        return frozenset()
    return frozenset(ipaddress.ip_address(info[4][0]) for info in found)


def build_source(config: AgentConfig, tracker: SourceHandler) -> ManifestSource | KubernetesSource:
    # Imported when chosen: the other source's libraries are not loaded.
    paths = manifest_paths(config)
    if paths:
        from ovsproxy.sources.manifests import ManifestSource

        log.info("source: manifests %s (watched for changes)", ", ".join(paths))
        return ManifestSource(
            [Path(p) for p in paths],
            tracker,
            service_proxy_name=config.service_proxy_name,
            max_file_bytes=config.manifest_max_bytes,
        )
    from ovsproxy.sources.kubernetes import KubernetesSource

    where = config.kubeconfig or (
        "in-cluster service account" if config.in_cluster else "$KUBECONFIG / default kubeconfig"
    )
    log.info("source: Kubernetes API (%s)", where)
    return KubernetesSource(
        tracker,
        kubeconfig=config.kubeconfig,
        in_cluster=config.in_cluster,
        service_proxy_name=config.service_proxy_name,
    )


# -- routes -----------------------------------------------------------------------------------


def route_backend_name(choice: str, platform: str = sys.platform) -> str:
    """``auto`` picks by platform: Windows' NetTCPIP cmdlets on win32, netlink elsewhere."""
    if choice not in ROUTE_BACKENDS:
        raise ConfigError(f"route_backend: {choice!r} is not one of {', '.join(ROUTE_BACKENDS)}")
    if choice != "auto":
        return choice
    return "windows" if platform == "win32" else "linux"


def build_route_backend(config: AgentConfig, netns: str | None) -> RouteBackend:
    name = route_backend_name(config.route_backend)
    if name == "windows":
        if netns is not None:
            raise ConfigError("route_backend windows and netns: network namespaces are Linux only")
        from ovsproxy.routes.windows import WindowsRouteBackend

        return WindowsRouteBackend()
    from ovsproxy.routes.linux import LinuxRouteBackend

    return LinuxRouteBackend(netns=netns)


def build_routes(
    config: AgentConfig, netns: str | None
) -> tuple[RouteManager, ServiceCIDRDiscoverer]:
    """The route manager and the discoverer deciding its prefixes (the ServiceCIDR API is
    asked only when the Services come from the API too)."""
    from ovsproxy.routes import RouteManager
    from ovsproxy.servicecidr import ServiceCIDRDiscoverer

    discoverer = ServiceCIDRDiscoverer(
        configured=config.service_cidr, use_api=not manifest_paths(config)
    )
    backend = build_route_backend(config, netns)
    log.info("routes: %s backend on %s", backend.name, config.gateway)
    routes = RouteManager(backend, config.gateway, sync_interval=config.route_sync_interval)
    return routes, discoverer


def build_node_ingress(config: AgentConfig, netns: str | None, health: ProxyHealth) -> NodeIngress:
    """NodePort, external IP and LB IP steering with its health checks (``config.steers``)."""
    from ovsproxy.agent.nodeport import NodeIngress

    return NodeIngress(config, netns, health)


def build_host_snat(config: AgentConfig, netns: str | None) -> HostSNAT:
    """The host-SNAT addresses and their neighbour entries (standalone, with the routes)."""
    from ovsproxy.agent.hostsnat import HostSNAT

    return HostSNAT(config, netns)
