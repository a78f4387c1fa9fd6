"""What follows a commit: the components that must see what each sync committed.

``Proxier(followers=...)`` calls every follower's ``after_commit`` in one place, in the order
given, once the commit is in and its own post-commit work (UDP conntrack flushes, learned-flow
deletes) is done, and before the sync's state is published as programmed. The agent's are
built once (``agent.core.commit_followers``): the node ingress's steering table
(``agent.nodeport.NodeIngress``), its healthCheckNodePort servers (``agent.nodeport.HealthChecks``),
then the ClusterIP feed of the route discoverer (``ClusterIPsFollower`` over
``servicecidr.feed.ClusterIPFeed``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from ovsproxy.model import IPAddress, ServicePortName, ServiceState


@dataclass(frozen=True, slots=True)
class Committed:
    """One sync's commit, as its followers see it."""

    # The Service ports the sync touched: their state now (None: removed or refused)
    touched: Mapping[ServicePortName, ServiceState | None]
    full: bool  # a full sync (every Service port touched)
    # Changes whenever a ClusterIP came or went (the tracker's count of such changes) ...
    cluster_ips_version: int
    # ... and every ClusterIP now (costs the number of Services: ask only when it changed)
    cluster_ips: Callable[[], frozenset[IPAddress]]


class Follower(Protocol):
    async def after_commit(self, committed: Committed) -> None:
        """Follow one commit; an exception fails the sync (the runner retries it)."""


class ClusterIPsFollower:
    """Hands every ClusterIP to ``feed`` after a commit, only when an address came or went:
    rebuilding the set on each endpoint change would make every sync cost the cluster's size."""

    __slots__ = ("_feed", "_version")

    def __init__(self, feed: Callable[[frozenset[IPAddress]], Awaitable[None]]) -> None:
        self._feed = feed
        self._version = -1  # what the feed last got

    async def after_commit(self, committed: Committed) -> None:
        if committed.cluster_ips_version != self._version:
            await self._feed(committed.cluster_ips())
            self._version = committed.cluster_ips_version
