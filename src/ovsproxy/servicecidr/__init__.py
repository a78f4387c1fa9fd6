"""Service CIDR computation: which prefixes the node routes to Services, per IP family.

Pure arithmetic lives in ``aggregate``, source precedence in ``sources``, the stateful event
processor in ``discoverer``, its inputs in ``feed`` (the proxier's ClusterIPs) and ``handler``
(ServiceCIDR values, converted from API objects by ``ovsproxy.sources.servicecidrs``). The route
manager (``ovsproxy.routes``) only consumes the results. Mirrors Antrea's split of
pkg/agent/servicecidr vs pkg/agent/route."""

from ovsproxy.servicecidr.aggregate import (
    AGGREGATION_FLOOR,
    AddressLike,
    NetworkLike,
    aggregate,
    common_prefix,
    covers,
    family_of,
    floor_of,
    grow,
    parse_cluster_ip,
    reduce_networks,
    service_cidr_for,
    sort_networks,
    to_network,
)
from ovsproxy.servicecidr.discoverer import CIDRChange, ServiceCIDRDiscoverer, as_networks
from ovsproxy.servicecidr.feed import ClusterIPFeed
from ovsproxy.servicecidr.handler import ServiceCIDRHandler
from ovsproxy.servicecidr.sources import (
    CIDRSource,
    parse_configured_cidrs,
    select_source,
)

__all__ = [
    "AGGREGATION_FLOOR",
    "AddressLike",
    "CIDRChange",
    "CIDRSource",
    "ClusterIPFeed",
    "NetworkLike",
    "ServiceCIDRDiscoverer",
    "ServiceCIDRHandler",
    "aggregate",
    "as_networks",
    "common_prefix",
    "covers",
    "family_of",
    "floor_of",
    "grow",
    "parse_cluster_ip",
    "parse_configured_cidrs",
    "reduce_networks",
    "select_source",
    "service_cidr_for",
    "sort_networks",
    "to_network",
]
