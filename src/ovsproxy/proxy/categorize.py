"""Which endpoints a node uses for a Service port: kube-proxy's CategorizeEndpoints.

Pure functions, decided exactly as kube-proxy's ``pkg/proxy/topology.go`` does:

* Usable endpoints are the Ready ones; only when there are none, the ones that are Serving
  and Terminating (decided separately for the cluster set and for the local set).
* The cluster set is used unless internalTrafficPolicy is Local and nothing external can
  reach the port; the local set (endpoints on this node) when internalTrafficPolicy is Local,
  or externalTrafficPolicy is Local and the port is externally accessible.
* Topology narrows the cluster set from the endpoints' hints, which the EndpointSlice
  controller writes according to the Service's trafficDistribution: PreferSameNode when every
  ready endpoint has a node hint and one names this node, else PreferSameZone when every
  ready endpoint has a zone hint and one names this node's zone, else the whole cluster. A
  single endpoint without hints, or no hint for this node/zone, falls back to the cluster.
  The Service's own trafficDistribution field is not read here: the hints carry it (and a
  manifest that wants topology writes the hints, as the controller would).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import NamedTuple

from ovsproxy.model import Endpoint, IPFamily, ServicePort


class TopologyMode(enum.StrEnum):
    NONE = ""
    PREFER_SAME_ZONE = "PreferSameZone"
    PREFER_SAME_NODE = "PreferSameNode"


class CategorizedEndpoints(NamedTuple):
    """kube-proxy's four results. None means the port never uses that kind of endpoint."""

    cluster: tuple[Endpoint, ...] | None
    local: tuple[Endpoint, ...] | None
    all_reachable: tuple[Endpoint, ...]  # the union of cluster and local
    # Usable endpoints exist somewhere in the cluster (true even when none is reachable
    # from this node): decides between dropping and rejecting.
    has_any: bool


def topology_mode(endpoints: Iterable[Endpoint], node_name: str, zone: str) -> TopologyMode:
    """The topology filter the hints of the ready endpoints allow on this node."""
    has_ready = False
    all_have_node_hints = all_have_zone_hints = True
    hinted_for_node = hinted_for_zone = False
    for endpoint in endpoints:
        if not endpoint.ready:
            continue
        has_ready = True
        if not endpoint.hint_nodes:
            all_have_node_hints = False
        elif node_name in endpoint.hint_nodes:
            hinted_for_node = True
        if not endpoint.hint_zones:
            all_have_zone_hints = False
        elif zone in endpoint.hint_zones:
            hinted_for_zone = True
    if not has_ready:
        return TopologyMode.NONE
    if all_have_node_hints and hinted_for_node:
        return TopologyMode.PREFER_SAME_NODE
    if all_have_zone_hints and hinted_for_zone:
        return TopologyMode.PREFER_SAME_ZONE
    return TopologyMode.NONE


def available_for_topology(
    endpoint: Endpoint, mode: TopologyMode, node_name: str, zone: str
) -> bool:
    # No fallback here: the fallback happened when the mode was chosen.
    if mode is TopologyMode.PREFER_SAME_NODE:
        return node_name in endpoint.hint_nodes
    if mode is TopologyMode.PREFER_SAME_ZONE:
        return zone in endpoint.hint_zones
    return True


def categorize_endpoints(
    endpoints: Iterable[Endpoint],
    port: ServicePort,
    node_name: str,
    zone: str | None = None,
    *,
    family: IPFamily | None = None,
) -> CategorizedEndpoints:
    """Split a port's endpoints into the sets a node programs (see the module docstring).

    ``zone`` is this node's ``topology.kubernetes.io/zone`` label. With ``family``, only
    that family's endpoints are considered, as in kube-proxy's per-family proxiers. Every
    result keeps the order of ``endpoints``. With no endpoints at all, the sets the port
    uses are empty (kube-proxy returns nil for all four).
    """
    candidates = [ep for ep in endpoints if family is None or ep.ip.version == family]
    zone = zone or ""
    if not candidates:
        return CategorizedEndpoints(
            () if port.uses_cluster_endpoints else None,
            () if port.uses_local_endpoints else None,
            (),
            False,
        )

    mode = TopologyMode.NONE
    cluster: tuple[Endpoint, ...] | None = None
    has_any = False
    if port.uses_cluster_endpoints:
        mode = topology_mode(candidates, node_name, zone)
        cluster = tuple(
            ep
            for ep in candidates
            if ep.ready and available_for_topology(ep, mode, node_name, zone)
        )
        if not cluster:
            # No ready endpoint anywhere (a topology mode is only chosen when one exists in
            # this node's topology): fall back to the ones still serving while terminating.
            cluster = tuple(ep for ep in candidates if ep.serving and ep.terminating)
        has_any = bool(cluster)

    if not port.uses_local_endpoints:
        assert cluster is not None  # a port uses at least one of the two sets
        return CategorizedEndpoints(cluster, None, cluster, has_any)

    has_local_ready = has_local_serving_terminating = False
    for ep in candidates:
        if ep.ready:
            has_any = True
            has_local_ready = has_local_ready or ep.is_local(node_name)
        elif ep.serving and ep.terminating:
            has_any = True
            has_local_serving_terminating = has_local_serving_terminating or ep.is_local(node_name)
    uses_terminating = False
    if has_local_ready:
        local = tuple(ep for ep in candidates if ep.is_local(node_name) and ep.ready)
    elif has_local_serving_terminating:
        uses_terminating = True
        local = tuple(
            ep for ep in candidates if ep.is_local(node_name) and ep.serving and ep.terminating
        )
    else:
        local = ()

    if cluster is None:
        return CategorizedEndpoints(None, local, local, has_any)
    if mode is TopologyMode.NONE and not uses_terminating:
        # cluster holds every ready endpoint and local only ready ones: cluster ⊇ local.
        return CategorizedEndpoints(cluster, local, cluster, has_any)
    # Remote endpoints in cluster, terminating or topologically excluded local ones in local.
    members = {*cluster, *local}
    reachable = tuple(ep for ep in candidates if ep in members)
    return CategorizedEndpoints(cluster, local, reachable, has_any)
