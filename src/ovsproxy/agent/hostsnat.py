"""The node's host-SNAT addresses (standalone, with the node's routes): chosen and installed
by the agent itself, before the datapath is built (the pipeline's SNAT flows name them).

Per IP family: ``--host-snat-ip`` when given, else the reserved address of the node's pod
CIDR (``ovsproxy.model.hostsnat``; the pod CIDRs are the gateway's connected prefixes, then
the Node's ``spec.podCIDRs`` when it is read: the gateway's prefix is what the node routes),
refused when the gateway or a local pod has
it. For each address chosen the gateway gets its neighbour entry to the virtual MAC
(``routes.hostsnat``). A family without one leaves two paths unserved, reported with the
reason in the log, ``/status`` (``host_snat``, ``unserved_paths``) and
``ovsproxy_unserved_paths``: the node's own Service connections to endpoints on other nodes,
and steered (externalTrafficPolicy Cluster) ones to endpoints on other nodes. ``--cleanup``
removes the neighbour entries (and host routes) it made.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from ovsproxy.config import AgentConfig
from ovsproxy.model import IPAddress, IPFamily, IPNetwork
from ovsproxy.model.hostsnat import HostSNATChoice, choose_host_snat, connected_prefixes
from ovsproxy.model.node import PodPort, UnservedPath
from ovsproxy.routes.backend import RouteBackendError
from ovsproxy.routes.hostsnat import HostSNATRoutes

log = logging.getLogger("ovsproxy.agent")

# What a family without a host-SNAT address cannot serve (the /status and metric names).
HOST_SNAT_PATHS = ("node-to-remote-endpoint", "external-cluster-to-remote-endpoint")


class HostSNAT:
    """The host-SNAT addresses of one agent run and their neighbour entries."""

    def __init__(self, config: AgentConfig, netns: str | None) -> None:
        self.config = config
        self.routes = HostSNATRoutes(config.gateway, netns)
        self.choices: dict[IPFamily, HostSNATChoice] = {}

    @property
    def addresses(self) -> tuple[IPAddress, ...]:
        return tuple(c.address for c in self.choices.values() if c.address is not None)

    async def choose(
        self, pods: Iterable[PodPort], node_pod_cidrs: Sequence[IPNetwork] = ()
    ) -> dict[IPFamily, HostSNATChoice]:
        """Each family's address as the agent decides it, nothing installed (``ovsproxy
        verify`` asks this too). ``node_pod_cidrs``: the Node's ``spec.podCIDRs`` where it is
        read, tried after the gateway's prefixes."""
        overrides = {IPFamily.of(ip): ip for ip in self.config.pipeline.host_snat_ips}
        pod_ips = [ip for pod in pods for ip in pod.ips]
        try:
            await self.routes.open()
            interfaces = await self.routes.gateway_addresses()
        except (RouteBackendError, OSError) as exc:
            interfaces = []
            unreadable = f"the gateway's addresses cannot be read: {exc}"
        else:
            unreadable = ""
        choices = {}
        for family in IPFamily:
            choice = choose_host_snat(
                family,
                override=overrides.get(family),
                pod_cidrs=[*connected_prefixes(interfaces), *node_pod_cidrs],
                gateway_ips=[i.ip for i in interfaces],
                pod_ips=pod_ips,
            )
            if choice.address is None and unreadable and family not in overrides:
                choice = HostSNATChoice(family, None, choice.origin, unreadable)
            choices[family] = choice
        return choices

    async def start(
        self, pods: Iterable[PodPort], node_pod_cidrs: Sequence[IPNetwork] = ()
    ) -> tuple[IPAddress, ...]:
        """Choose each family's address (``choose``) and install its neighbour entry;
        returns the addresses (the pipeline's ``host_snat_ips``)."""
        for family, choice in (await self.choose(pods, node_pod_cidrs)).items():
            if choice.address is not None:
                try:
                    for change in await self.routes.ensure(choice.address):
                        log.info("host SNAT: %s", change)
                except (RouteBackendError, OSError) as exc:
                    choice = HostSNATChoice(
                        family, None, choice.origin, f"its neighbour entry failed: {exc}"
                    )
            self.choices[family] = choice
            if choice.address is not None:
                log.info("host SNAT IPv%d: %s (%s)", family, choice.address, choice.origin)
            else:
                log.warning(
                    "no IPv%d host-SNAT address (%s): the node's own and captured "
                    "(externalTrafficPolicy Cluster) IPv%d Service connections reach local "
                    "endpoints only",
                    family,
                    choice.reason,
                    family,
                )
        return self.addresses

    def unserved(self, pods: Iterable[PodPort]) -> list[UnservedPath]:
        """The paths without a host-SNAT address, and those whose address a local pod has
        taken since the start (its replies would go to the virtual MAC)."""
        used = {ip for pod in pods for ip in pod.ips}
        out: list[UnservedPath] = []
        for family, choice in sorted(self.choices.items()):
            reason = choice.reason
            if choice.address is not None and choice.address in used:
                reason = f"{choice.address} is now used by a local pod as well"
            if reason:
                out.extend(UnservedPath(path, family, reason) for path in HOST_SNAT_PATHS)
        return out

    def status(self) -> dict[str, Any]:
        return {
            f"IPv{int(family)}": {
                "address": str(c.address) if c.address is not None else None,
                "origin": c.origin,
                "reason": c.reason or None,
            }
            for family, c in sorted(self.choices.items())
        }

    async def cleanup(self) -> list[str]:
        """--cleanup: remove the neighbour entries and host routes made for our addresses;
        returns what was removed."""
        return await self.routes.remove(list(self.addresses))

    async def close(self) -> None:
        await self.routes.close()
