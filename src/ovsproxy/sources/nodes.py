"""This node's Node object from the Kubernetes API into a model value (``model.node.Node``).

As for ServiceCIDRs, the conversion happens here, so the agent never sees a Kubernetes object:
``NodeEvents`` has the informer's raw-object handler shape and hands converted values to a
``model.handler.NodeHandler``. The informer selects the one Node by name (a field selector,
as kube-proxy's node informer), so a Node is one object, decoded as plain JSON.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Mapping
from typing import Any

from ovsproxy.model import IPAddress, IPNetwork
from ovsproxy.model.handler import NodeHandler
from ovsproxy.model.node import Node
from ovsproxy.sources.kubejson import ClusterObjectEvents

log = logging.getLogger(__name__)

INTERNAL_IP = "InternalIP"
EXTERNAL_IP = "ExternalIP"


def node_field_selector(node_name: str) -> str:
    """The field selector of the one Node named ``node_name``."""
    return f"metadata.name={node_name}"


def convert_node(obj: Mapping[str, Any]) -> Node:
    """The fields of one Node the proxy reads (see ``model.node.Node``).

    An address or pod CIDR that does not parse is logged (naming the Node and the field) and
    skipped: the API server validates them, so only a broken or foreign object has one, and
    the rest of the Node still counts (its deletion and taints above all).
    """
    meta = _mapping(obj.get("metadata"))
    spec = _mapping(obj.get("spec"))
    status = _mapping(obj.get("status"))
    name = str(meta.get("name", ""))
    addresses: dict[str, list[IPAddress]] = {INTERNAL_IP: [], EXTERNAL_IP: []}
    for index, entry in enumerate(_list(status.get("addresses"))):
        entry = _mapping(entry)
        kind = entry.get("type")
        if kind not in addresses:
            continue  # Hostname, InternalDNS, ExternalDNS
        text = entry.get("address")
        try:
            ip = ipaddress.ip_address(str(text).strip())
        except ValueError:
            log.warning(
                "Node %s: status.addresses[%d].address: %r is not an IP address; skipped",
                name,
                index,
                text,
            )
            continue
        if ip not in addresses[kind]:
            addresses[kind].append(ip)
    pod_cidrs: list[IPNetwork] = []
    for index, text in enumerate(_list(spec.get("podCIDRs"))):
        try:
            net = ipaddress.ip_network(str(text).strip(), strict=False)
        except ValueError:
            log.warning("Node %s: spec.podCIDRs[%d]: %r is not a CIDR; skipped", name, index, text)
            continue
        if net not in pod_cidrs:
            pod_cidrs.append(net)
    deletion = meta.get("deletionTimestamp")
    taints = tuple(
        str(key)
        for taint in _list(spec.get("taints"))
        if (key := _mapping(taint).get("key")) is not None
    )
    return Node(
        name,
        internal_ips=tuple(addresses[INTERNAL_IP]),
        external_ips=tuple(addresses[EXTERNAL_IP]),
        pod_cidrs=tuple(pod_cidrs),
        deletion_timestamp=None if deletion is None else str(deletion),
        taints=taints,
    )


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


class NodeEvents(ClusterObjectEvents[Node]):
    """Raw Node objects of an informer -> ``Node`` values -> the handler."""

    __slots__ = ()

    def __init__(self, handler: NodeHandler) -> None:
        super().__init__(handler, convert_node)
