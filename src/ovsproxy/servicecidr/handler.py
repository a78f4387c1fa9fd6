"""Adapter from the generic informer (``ovsproxy.sources.kubernetes``) to the discoverer.

Usage, with the source's extra-informer hook::

    source.informer(SERVICE_CIDRS, ServiceCIDRInformerHandler(discoverer))

It has the informer's handler shape (``on_add``, ``on_update``, ``on_delete``, ``on_synced``,
``on_error``) without importing the sources package. An error before the first successful list
(the cluster does not serve networking.k8s.io/v1 ServiceCIDR, or RBAC forbids it, or the API
server is unreachable) switches the discoverer to aggregation, so routes are never held back
waiting for this informer; a later successful list hands the ranges back to the API.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ovsproxy.servicecidr.discoverer import ServiceCIDRDiscoverer

log = logging.getLogger(__name__)


class ServiceCIDRInformerHandler:
    def __init__(self, discoverer: ServiceCIDRDiscoverer) -> None:
        self.discoverer = discoverer
        self.synced = False
        self.fell_back = False

    def on_add(self, obj: Mapping[str, Any]) -> None:
        self.discoverer.upsert_service_cidr(obj)

    def on_update(self, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        self.discoverer.upsert_service_cidr(new)

    def on_delete(self, obj: Mapping[str, Any]) -> None:
        self.discoverer.delete_service_cidr(obj)

    def on_synced(self) -> None:
        self.synced = True
        self.discoverer.service_cidrs_synced()

    def on_error(self, problem: object) -> None:
        if self.synced or self.fell_back:
            return  # the informer retries by itself; the last known ranges stay in force
        self.fell_back = True
        log.info("ServiceCIDR API not usable (%s): aggregating ClusterIPs meanwhile", problem)
        self.discoverer.service_cidr_api_unavailable()
