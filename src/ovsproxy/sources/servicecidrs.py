"""ServiceCIDR objects from the Kubernetes API into model values (``model.ServiceCIDR``).

As for Services, the conversion happens here, so ``ovsproxy.servicecidr`` never sees a
Kubernetes object: ``ServiceCIDREvents`` has the informer's raw-object handler shape and hands
converted values to a ``model.handler.ServiceCIDRHandler``.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Mapping
from typing import Any

from ovsproxy.model import IPNetwork, ServiceCIDR
from ovsproxy.model.handler import ServiceCIDRHandler
from ovsproxy.sources.kubejson import ClusterObjectEvents

log = logging.getLogger(__name__)


def _net_key(net: IPNetwork) -> tuple[int, int, int]:
    return (net.version, int(net.network_address), net.prefixlen)


def convert_service_cidr(obj: Mapping[str, Any]) -> ServiceCIDR:
    """The name and the prefixes (``spec.cidrs``, in a stable order) of one ServiceCIDR.

    Invalid entries are logged and skipped; the apiserver validates them, so that only happens
    with a broken or foreign object. The object's Ready condition is deliberately ignored: a
    ServiceCIDR being created or deleted may still have ClusterIPs allocated from it (deletion
    waits on a finalizer until none is left), so its range must stay routed for as long as the
    object exists.
    """
    name = service_cidr_name(obj)
    spec = obj.get("spec") or {}
    nets: list[IPNetwork] = []
    for text in spec.get("cidrs") or ():
        try:
            net = ipaddress.ip_network(str(text).strip(), strict=False)
        except ValueError:
            log.warning("ServiceCIDR %s: skipping invalid cidr %r", name, text)
            continue
        if net not in nets:
            nets.append(net)
    return ServiceCIDR(name, tuple(sorted(nets, key=_net_key)))


def service_cidr_name(obj: Mapping[str, Any]) -> str:
    """``metadata.name`` (ServiceCIDR is cluster-scoped: no namespace)."""
    return str((obj.get("metadata") or {}).get("name", ""))


class ServiceCIDREvents(ClusterObjectEvents[ServiceCIDR]):
    """Raw ServiceCIDR objects of an informer -> ``ServiceCIDR`` values -> the handler."""

    __slots__ = ()

    def __init__(self, handler: ServiceCIDRHandler) -> None:
        super().__init__(handler, convert_service_cidr)
