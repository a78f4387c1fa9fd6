"""The node's own entry points into Services (``NodeIngress``): NodePorts, external IPs and
load-balancer IPs, following the proxier.

Two of the proxier's followers (``proxy.followers``), in this order, get the Service ports
each commit touched:

* ``NodeIngress.after_commit`` updates the ``SteeringTracker`` for each of them and sends its
  pending change to the ``inet ovsproxy`` nftables table in one transaction (work proportional
  to the change; the first sync, or one after drift, rebuilds the table whole); a full sync
  also verifies the table against what we installed;
* ``HealthChecks.after_commit`` (the node ingress's ``health_checks``) makes the
  healthCheckNodePort servers match the Services that have one, with this node's ready local
  endpoint counts.

``start`` installs the policy routing that takes steered packets to the gateway
(``routes.steering``), makes the gateway's IPv4 reverse-path filter loose when it is strict
(``routes.rpfilter``: steered replies come back through it; checked again with the policy
routes until they are in place), and decides the node's IPs (configured; else the Node
object's addresses, with the Kubernetes API as the source; else read from the node's devices)
and, from ``node_port_addresses``, which of them accept NodePorts. ``set_node_ips`` takes the
Node's new addresses later (the agent then re-syncs the NodePort frontends). ``--cleanup``
deletes the table and the policy routes (``agent.cleanup.remove_steering``); the gateway's
rp_filter stays loose. See docs/nodeport.md.
"""

from __future__ import annotations

import logging
from typing import Any

from ovsproxy.config import AgentConfig
from ovsproxy.healthcheck import ProxyHealth, ServiceHealthServers, desired_health_checks
from ovsproxy.model import IPAddress, IPFamily, ServicePortName, ServiceState
from ovsproxy.model.node import UnservedPath
from ovsproxy.proxy.followers import Committed
from ovsproxy.routes import rpfilter
from ovsproxy.routes.backend import RouteBackendError
from ovsproxy.routes.steering import SteeringRoutes
from ovsproxy.steering import NodePortAddresses, SteeringTable, SteeringTracker, SyncResult
from ovsproxy.steering.table import load_binding

log = logging.getLogger("ovsproxy.agent")


class HealthChecks:
    """kube-proxy's healthCheckNodePort servers of one agent, following each commit (see the
    module docstring); started by the node ingress, which knows the addresses to listen on."""

    def __init__(self, node_name: str, health: ProxyHealth, netns: str | None) -> None:
        self.node_name = node_name
        self.health = health
        self.netns = netns
        self.servers: ServiceHealthServers | None = None
        # Service ports with a healthCheckNodePort: what the servers are computed from.
        self._checked: dict[ServicePortName, ServiceState] = {}

    def start(self, addresses: list[str] | None) -> None:
        """``addresses``: where the servers listen (None: every address)."""
        self.servers = ServiceHealthServers(
            self.health.is_healthy, addresses=addresses, netns=self.netns
        )

    async def after_commit(self, committed: Committed) -> None:
        changed = False
        for name, state in committed.touched.items():
            if state is not None and state.port.health_check_node_port:
                self._checked[name] = state
                changed = True
            elif self._checked.pop(name, None) is not None:
                changed = True
        if (changed or committed.full) and self.servers is not None:
            result = await self.servers.update(
                desired_health_checks(self._checked.values(), self.node_name)
            )
            for key in result.started:
                log.info("health check of %s/%s: serving", *key)
            for key in result.stopped:
                log.info("health check of %s/%s: stopped", *key)

    @property
    def running(self) -> int:
        return len(self.servers.running) if self.servers is not None else 0

    def status(self) -> list[dict[str, Any]]:
        servers = self.servers
        out: list[dict[str, Any]] = []
        if servers is not None:
            for key, port in sorted(servers.running.items()):
                status, _headers, _body = servers.answer(key)
                out.append({"service": f"{key[0]}/{key[1]}", "port": port, "status": status})
            for key, why in sorted(servers.failed.items()):
                out.append({"service": f"{key[0]}/{key[1]}", "failed": why})
        return out

    def dump(self) -> list[str]:
        running = self.servers.running if self.servers is not None else {}
        return [
            f"health-check {key[0]}/{key[1]} port {port}" for key, port in sorted(running.items())
        ]

    async def close(self) -> None:
        if self.servers is not None:
            await self.servers.close()


class NodeIngress:
    """The node's own entry points into Services: the steering table, its policy routes and the
    health-check servers of one agent."""

    def __init__(self, config: AgentConfig, netns: str | None, health: ProxyHealth) -> None:
        self.config = config
        self.netns = netns
        self.addresses = NodePortAddresses.parse(config.node_port_addresses)
        self.node_ips: tuple[IPAddress, ...] = config.node_ips
        # Where node_ips came from: "config", "Node" (the API's Node object) or "devices"
        self.node_ips_from = "config" if config.node_ips else "devices"
        # Those of node_ips that accept NodePorts: computed when the node IPs change
        self.node_port_ips = self.addresses.node_port_ips(self.node_ips)
        self.tracker = SteeringTracker()
        self.table = SteeringTable(netns)
        self.routes = SteeringRoutes(config.gateway, netns)
        self.health_checks = HealthChecks(config.node_name, health, netns)
        # Counts for metrics and status, kept per touched port (not recounted per sync).
        self._node_ports: set[ServicePortName] = set()
        self._source_ranges: dict[ServicePortName, int] = {}
        self.element_count = 0  # elements of the table's sets
        self.last: SyncResult | None = None
        self.errors = 0  # failed steering syncs
        self.policy_routes: list[str] = []
        self._routes_ok = False
        # The gateway's IPv4 reverse-path filter as found and left (status), and what it
        # keeps from serving when it could not be made loose.
        self.rp_filter: dict[str, Any] = {}
        self.unserved: list[UnservedPath] = []

    async def start(self, node_object_ips: tuple[IPAddress, ...] = ()) -> None:
        """``node_object_ips``: the Node object's addresses, used unless IPs are configured."""
        try:
            load_binding()  # fail at start-up, in one line, rather than in every sync
        except RuntimeError as exc:
            raise RuntimeError(f"{exc} (or run with --no-node-ports)") from None
        await self.routes.open()
        if not self.node_ips and node_object_ips:
            self._take_node_ips(node_object_ips, "Node")
            log.info("node IPs (from the Node object): %s", _text(self.node_ips))
        if not self.node_ips:
            self._take_node_ips(tuple(await self.routes.node_addresses()), "devices")
            log.info("node IPs (from the node's devices): %s", _text(self.node_ips))
        if not self.node_ips:
            log.warning("no node IP found: NodePorts are not captured (give --node-ip)")
        await self._ensure_policy_routes()
        self.tracker.set_node_ips(self.node_ips, self.addresses)
        if await self.table.adopt():
            log.info("capture table: adopted the one a previous run left (patched, not rebuilt)")
        node_port_ips = self.node_port_ips
        # kube-proxy: every address when nodePortAddresses is empty, else the selected IPs.
        listen = None if not self.config.node_port_addresses else [str(ip) for ip in node_port_ips]
        self.health_checks.start(listen)
        log.info("NodePorts on %s", _text(node_port_ips) or "none")

    async def _ensure_policy_routes(self) -> None:
        """The steering table's rule and route per family; a missing gateway (the CNI has not made
        it yet) is logged and retried after the next sync."""
        families = sorted({IPFamily.of(ip) for ip in self.node_ips}) or list(IPFamily)
        try:
            for change in await self.routes.ensure(families):
                log.info("capture policy routing: %s", change)
            self.policy_routes = await self.routes.installed()
            self._routes_ok = True
        except RouteBackendError as exc:
            log.warning("capture policy routing not in place yet: %s", exc)
            self._routes_ok = False
        self._check_rp_filter()

    def _check_rp_filter(self) -> None:
        """Replies of steered connections leave OVS through the gateway with a source the
        node does not route there: a strict rp_filter drops them; make the gateway's loose."""
        gateway = self.config.gateway
        self.unserved = []
        try:
            found = rpfilter.read(gateway, self.netns)
            if found.strict:
                rpfilter.set_device(gateway, rpfilter.LOOSE, self.netns)
                log.warning(
                    "net.ipv4.conf.%s.rp_filter was %d (all: %d), strict: set it to %d (loose) so "
                    "that replies of NodePort, external IP and LB IP connections are not dropped",
                    gateway,
                    found.device,
                    found.all,
                    rpfilter.LOOSE,
                )
            now = rpfilter.read(gateway, self.netns)
        except OSError as exc:
            reason = f"net.ipv4.conf.{gateway}.rp_filter cannot be checked or loosened: {exc}"
            log.warning("%s; captured IPv4 replies are dropped if it is strict", reason)
            self.rp_filter = {"error": reason}
            self.unserved = [UnservedPath("external-replies", IPFamily.IPv4, reason)]
            return
        self.rp_filter = {"all": now.all, gateway: now.device, "effective": now.effective}
        if now.strict:  # written, yet still strict: say exactly what is wrong
            reason = (
                f"net.ipv4.conf.{gateway}.rp_filter is {now.device} and all is {now.all}: the "
                "kernel applies the larger, strict; set the gateway's to 2 or both to 0"
            )
            self.unserved = [UnservedPath("external-replies", IPFamily.IPv4, reason)]

    def set_node_ips(self, node_ips: tuple[IPAddress, ...]) -> bool:
        """The Node object's new addresses (configured IPs stay): whether the node IPs
        changed. The steering table follows at the next sync; the health-check servers keep
        the addresses they listen on (see docs/nodeport.md)."""
        if self.node_ips_from == "config" or not node_ips or node_ips == self.node_ips:
            return False
        log.info("node IPs (from the Node object): %s", _text(node_ips))
        self._take_node_ips(node_ips, "Node")
        self.tracker.set_node_ips(self.node_ips, self.addresses)
        self._routes_ok = False  # a new family needs its policy route: ensured at the next sync
        return True

    def _take_node_ips(self, node_ips: tuple[IPAddress, ...], origin: str) -> None:
        self.node_ips, self.node_ips_from = node_ips, origin
        self.node_port_ips = self.addresses.node_port_ips(node_ips)

    async def after_commit(self, committed: Committed) -> None:
        """Follow one proxier commit (see the module docstring)."""
        touched, full = committed.touched, committed.full
        if not self._routes_ok:
            await self._ensure_policy_routes()
        for name, state in touched.items():
            port = state.port if state is not None else None
            self.tracker.update(port, name=name)
            if port is not None and port.node_port:
                self._node_ports.add(name)
            else:
                self._node_ports.discard(name)
            if port is not None and port.load_balancer_source_ranges:
                self._source_ranges[name] = len(port.load_balancer_source_ranges)
            else:
                self._source_ranges.pop(name, None)
        try:
            if full and self.table.installed is not None and not await self.table.verify():
                log.warning("capture table differs from what we installed: rebuilding it")
            if full:
                # Diffed against what the table holds (an adopted table may hold what this
                # run never wanted): O(elements), on full syncs only.
                self.tracker.take_changes()
                self.last = await self.table.sync(self.tracker.state())
            else:
                self.last = await self.table.sync_changes(
                    self.tracker.take_changes(), self.tracker.state
                )
            if self.last.error:
                log.warning("capture table patch refused (%s): rebuilt", self.last.error)
        except Exception:
            # The table forgets what it held on any failure: the next sync rebuilds it whole
            # from the tracker's state, so the change taken here is not lost.
            self.errors += 1
            raise
        self.element_count = self.table.installed_size
        if self.last.kind != "none":
            log.info(
                "capture table: %s, %d element(s), %d byte(s) in %.3fs",
                self.last.kind,
                self.last.elements,
                self.last.bytes,
                self.last.seconds,
            )

    @property
    def node_port_count(self) -> int:
        return len(self._node_ports)

    @property
    def source_range_count(self) -> int:
        return sum(self._source_ranges.values())

    def status(self) -> dict[str, Any]:
        last = self.last
        return {
            "node_ips": [str(ip) for ip in self.node_ips],
            "node_ips_from": self.node_ips_from,
            "node_port_ips": [str(ip) for ip in self.node_port_ips],
            "node_port_addresses": list(self.config.node_port_addresses),  # empty: every node IP
            "table": "inet ovsproxy",
            "elements": self.element_count,
            "last_sync": None
            if last is None
            else {"kind": last.kind, "elements": last.elements, "bytes": last.bytes},
            "errors": self.errors,
            "policy_routes": self.policy_routes,
            "rp_filter": self.rp_filter,
            "health_checks": self.health_checks.status(),
        }

    def dump(self) -> list[str]:
        """The steering table's elements as we installed them, one per line (for /dump)."""
        state = self.table.installed
        if state is None:
            return ["# capture table inet ovsproxy: not installed"]
        lines = [f"# capture table inet ovsproxy: {state.size} element(s)"]
        for (name, family), elements in sorted(state.sets.items(), key=lambda kv: str(kv[0])):
            for element in sorted(elements, key=str):
                lines.append(f"capture {name.value}-v{int(family)} " + " ".join(map(str, element)))
        return lines + self.health_checks.dump()

    async def close(self) -> None:
        await self.health_checks.close()
        await self.table.close()
        await self.routes.close()


def _text(ips: tuple[IPAddress, ...]) -> str:
    return ", ".join(str(ip) for ip in ips)
