"""The ClusterIP feed: the proxier's "all ClusterIPs now" as the discoverer's reference-counted
add/delete calls (and, the first time, the end of the initial list)."""

from __future__ import annotations

from ovsproxy.model import IPAddress
from ovsproxy.servicecidr.discoverer import ServiceCIDRDiscoverer


class ClusterIPFeed:
    """Called with the complete set of ClusterIPs after a sync that changed it (the proxier's
    follower ``proxy.followers.ClusterIPsFollower(ClusterIPFeed(discoverer))``); hands the
    discoverer only the difference."""

    def __init__(self, discoverer: ServiceCIDRDiscoverer) -> None:
        self.discoverer = discoverer
        self.known: frozenset[IPAddress] = frozenset()
        self.synced = False

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
