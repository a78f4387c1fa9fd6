"""This node's Node object, followed from the Kubernetes API (kube-proxy's node handling).

``NodeWatcher`` is the ``NodeHandler`` the API source's Node informer delivers to (a field
selector picks the one Node named ``--node-name``). On every add and update it gives the Node
to the proxy health, so ``/healthz`` answers 503 from the event on while the node is being
deleted or is tainted ``ToBeDeletedByClusterAutoscaler``, and once it is deleted (``/livez``
and the datapath are not affected). A changed address set goes to ``follow``'s callback (the
agent re-syncs the NodePort frontends and the steering table on the new node IPs). The Node's
podCIDRs are kept on the value (``node.pod_cidrs``) for whoever needs them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from ovsproxy.healthcheck import ProxyHealth
from ovsproxy.model import IPAddress
from ovsproxy.model.node import Node
from ovsproxy.model.problems import SourceError

log = logging.getLogger("ovsproxy.agent")


class NodeWatcher:
    """The last Node seen (None: not found, or deleted) and what follows it."""

    def __init__(self, name: str, health: ProxyHealth) -> None:
        self.name = name
        self.health = health
        self.node: Node | None = None
        self.deleted = False  # a delete event came (and no add since)
        self.synced = asyncio.Event()  # the first list is in (the Node found or not)
        self.errors = 0
        self._on_addresses: Callable[[tuple[IPAddress, ...]], None] | None = None

    def follow(self, on_addresses: Callable[[tuple[IPAddress, ...]], None]) -> None:
        """Call ``on_addresses`` with the Node's IPs (``Node.host_ips``) whenever they change,
        and now if the Node has some. A Node without addresses changes nothing."""
        self._on_addresses = on_addresses
        if self.node is not None and self.node.host_ips:
            on_addresses(self.node.host_ips)

    @property
    def host_ips(self) -> tuple[IPAddress, ...]:
        return self.node.host_ips if self.node is not None else ()

    def on_add(self, node: Node) -> None:
        self._set(node)

    def on_update(self, node: Node) -> None:
        self._set(node)

    def on_delete(self, name: str) -> None:
        self.node, self.deleted = None, True
        self._sync_health(None, f"Node {name} deleted")

    def on_synced(self) -> None:
        if self.node is None:
            log.warning(
                "Node %s not found: node IPs from the configuration or the node's devices; "
                "/healthz follows the Node once it appears",
                self.name,
            )
        self.synced.set()

    def on_error(self, problem: SourceError) -> None:
        self.errors += 1  # (the informer has logged it and retries)

    def _set(self, node: Node) -> None:
        old, self.node, self.deleted = self.node, node, False
        why = "being deleted" if node.deleting else ", ".join(node.taints) or "no taint"
        self._sync_health(node, f"Node {node.name} ({why})")
        ips = node.host_ips
        if ips and (old is None or old.host_ips != ips):
            log.info("Node %s addresses: %s", node.name, ", ".join(map(str, ips)))
            if self._on_addresses is not None:
                self._on_addresses(ips)

    def _sync_health(self, node: Node | None, what: str) -> None:
        before = self.health.node_eligible
        self.health.sync_node(node)
        if self.health.node_eligible != before:
            if self.health.node_eligible:
                log.info("%s: eligible again, /healthz follows the proxy's health", what)
            else:
                log.warning("%s: /healthz answers 503 (load balancers drain this node)", what)

    def status(self) -> dict[str, Any]:
        node = self.node
        return {
            "name": self.name,
            "found": node is not None,
            "deleted": self.deleted,
            "eligible": self.health.node_eligible,
            "deletion_timestamp": node.deletion_timestamp if node else None,
            "taints": list(node.taints) if node else [],
            "internal_ips": [str(ip) for ip in node.internal_ips] if node else [],
            "external_ips": [str(ip) for ip in node.external_ips] if node else [],
            "pod_cidrs": [str(net) for net in node.pod_cidrs] if node else [],
        }
