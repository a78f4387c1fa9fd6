"""Service CIDR computation: which prefixes the node routes to Services, per IP family.

Pure arithmetic lives in ``aggregate``, source precedence and API conversion in ``sources``,
the stateful event processor in ``discoverer``. The route manager (``ovsproxy.routes``) only
consumes the results. Mirrors Antrea's split of pkg/agent/servicecidr vs pkg/agent/route.
"""

from ovsproxy.servicecidr.aggregate import (
    AddressLike,
    NetworkLike,
    common_prefix,
    covers,
    family_of,
    grow,
    parse_cluster_ip,
    reduce_networks,
    service_cidr_for,
    sort_networks,
    to_network,
)
from ovsproxy.servicecidr.discoverer import CIDRChange, ServiceCIDRDiscoverer, as_networks
from ovsproxy.servicecidr.handler import ServiceCIDRInformerHandler
from ovsproxy.servicecidr.sources import (
    SERVICE_CIDR_API_VERSION,
    SERVICE_CIDR_KIND,
    CIDRSource,
    cluster_ips_of_service,
    networks_from_service_cidr,
    parse_configured_cidrs,
    select_source,
)

__all__ = [
    "SERVICE_CIDR_API_VERSION",
    "SERVICE_CIDR_KIND",
    "AddressLike",
    "CIDRChange",
    "CIDRSource",
    "NetworkLike",
    "ServiceCIDRDiscoverer",
    "ServiceCIDRInformerHandler",
    "as_networks",
    "cluster_ips_of_service",
    "common_prefix",
    "covers",
    "family_of",
    "grow",
    "networks_from_service_cidr",
    "parse_cluster_ip",
    "parse_configured_cidrs",
    "reduce_networks",
    "select_source",
    "service_cidr_for",
    "sort_networks",
    "to_network",
]
