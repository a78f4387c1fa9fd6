"""ServiceCIDR events (``model.ServiceCIDR`` values from the source) into the discoverer.

Usage, with the Kubernetes source::

    source.service_cidrs(ServiceCIDRHandler(discoverer))

It implements ``model.handler.ServiceCIDRHandler``. An error before the first successful list
(the cluster does not serve networking.k8s.io/v1 ServiceCIDR, or RBAC forbids it, or the API
server is unreachable) switches the discoverer to aggregation, so routes are never held back
waiting for this informer; a later successful list hands the ranges back to the API.
"""

from __future__ import annotations

import logging

from ovsproxy.model import ServiceCIDR
from ovsproxy.model.problems import SourceError
from ovsproxy.servicecidr.discoverer import ServiceCIDRDiscoverer

log = logging.getLogger(__name__)


class ServiceCIDRHandler:
    def __init__(self, discoverer: ServiceCIDRDiscoverer) -> None:
        self.discoverer = discoverer
        self.synced = False
        self.fell_back = False

    def on_add(self, cidr: ServiceCIDR) -> None:
        self.discoverer.upsert_service_cidr(cidr)

    def on_update(self, cidr: ServiceCIDR) -> None:
        self.discoverer.upsert_service_cidr(cidr)

    def on_delete(self, name: str) -> None:
        self.discoverer.delete_service_cidr(name)

    def on_synced(self) -> None:
        self.synced = True
        self.discoverer.service_cidrs_synced()

    def on_error(self, problem: SourceError) -> None:
        if self.synced or self.fell_back:
            return  # the informer retries by itself; the last known ranges stay in force
        self.fell_back = True
        log.info("ServiceCIDR API not usable (%s): aggregating ClusterIPs meanwhile", problem)
        self.discoverer.service_cidr_api_unavailable()
