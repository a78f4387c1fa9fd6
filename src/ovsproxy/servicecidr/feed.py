"""The ClusterIP feed: the proxier's "all ClusterIPs now" as the discoverer's reference-counted
add/delete calls (and, the first time, the end of the initial list); and the Services behind a
ClusterIP the discoverer leaves unrouted, so the report names them."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Protocol

from ovsproxy.model import IPAddress, ServicePortName, ServiceState
from ovsproxy.servicecidr.discoverer import ServiceCIDRDiscoverer

log = logging.getLogger(__name__)


class _Commit(Protocol):
    """What the feed reads of a commit (``proxy.followers.Committed``, a layer above)."""

    @property
    def touched(self) -> Mapping[ServicePortName, ServiceState | None]: ...
    @property
    def cluster_ips_version(self) -> int: ...
    @property
    def cluster_ips(self) -> Callable[[], frozenset[IPAddress]]: ...


class ClusterIPFeed:
    """A commit follower (``agent.core.commit_followers``): hands the discoverer only the
    difference of the ClusterIP set, when it changed, and logs each ClusterIP the discoverer
    leaves unrouted (outside every configured or API range) once, with its Services."""

    def __init__(self, discoverer: ServiceCIDRDiscoverer) -> None:
        self.discoverer = discoverer
        self.known: frozenset[IPAddress] = frozenset()
        self.synced = False
        self._version = -1
        # the ClusterIPs of each Service (namespace/name), from the ports the commits touched
        self._services: dict[tuple[str, str], dict[ServicePortName, tuple[IPAddress, ...]]] = {}
        self._reported: frozenset[IPAddress] = frozenset()

    async def after_commit(self, committed: _Commit) -> None:
        for name, state in committed.touched.items():
            ports = self._services.setdefault(name.service, {})
            if state is None:
                ports.pop(name, None)
                if not ports:
                    del self._services[name.service]
            else:
                ports[name] = state.port.cluster_ips
        if committed.cluster_ips_version != self._version:
            await self(committed.cluster_ips())
            self._version = committed.cluster_ips_version

    async def __call__(self, ips: frozenset[IPAddress]) -> None:
        added, removed = ips - self.known, self.known - ips
        if added:
            self.discoverer.add_cluster_ips(added)
        if removed:
            self.discoverer.delete_cluster_ips(removed)
        self.known = ips
        if not self.synced:
            self.synced = True
            self.discoverer.cluster_ips_synced()
        self._report()

    def services_of(self, ip: IPAddress) -> list[str]:
        """``namespace/name`` of every Service with ClusterIP ``ip`` (among those seen)."""
        return sorted(
            f"{namespace}/{name}"
            for (namespace, name), ports in self._services.items()
            if any(ip in ips for ips in ports.values())
        )

    def _report(self) -> None:
        unrouted = self.discoverer.unrouted()
        for ip in sorted(unrouted - self._reported, key=lambda a: (a.version, int(a))):
            log.warning(
                "routes: Service %s: ClusterIP %s is outside every Service range of the node "
                "(--service-cidr or the ServiceCIDR API): not routed from the node",
                ", ".join(self.services_of(ip)) or "(unknown)",
                ip,
            )
        self._reported = unrouted
