"""Which external IPs a Service may have on this node: the one rule, applied where Services
enter the agent, between the source (manifests or the Kubernetes API) and the change
tracker. The flows, the steering table, the claims and the proxier all read the Services it
let through, so none of them has a rule of its own.

Refused, each with a problem naming the Service and ``spec.externalIPs``; the Service is
served without them:

* every external IP, when the agent is told to refuse them (``refuse_external_ips``):
  kube-proxy is deprecating externalIPs, and a cluster that admits any Service author's
  externalIPs lets that author take any address's traffic (CVE-2020-8554);
* this node's own addresses: steering one would take the node's own traffic to that port
  (its ssh, its kubelet) into the Service's endpoints;
* the API server's addresses: the node's own API traffic (this agent's included) would go
  to the Service's endpoints.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from ovsproxy.model import EndpointSlice, IPAddress, Service
from ovsproxy.model.handler import SourceHandler
from ovsproxy.model.problems import InvalidObject, SourceProblem, ValidationError

log = logging.getLogger(__name__)

FIELD = ("spec", "externalIPs")
REFUSED_ALL = "external IPs are refused on this node (refuse_external_ips)"
NODE_IP = "is this node's own address: steering it would take the node's own traffic"
API_SERVER_IP = "is the API server's address: the node's own API traffic would be taken"


@dataclass(frozen=True, slots=True)
class ExternalIPRule:
    refuse_all: bool = False
    node_ips: frozenset[IPAddress] = frozenset()
    api_server_ips: frozenset[IPAddress] = frozenset()

    def why_refused(self, ip: IPAddress) -> str | None:
        if self.refuse_all:
            return REFUSED_ALL
        if ip in self.node_ips:
            return NODE_IP
        if ip in self.api_server_ips:
            return API_SERVER_IP
        return None


def admit(service: Service, rule: ExternalIPRule) -> tuple[Service, tuple[ValidationError, ...]]:
    """``service`` without the external IPs ``rule`` refuses, and one problem per refused
    address (each port of a Service carries the Service's external IPs)."""
    refused: dict[IPAddress, str] = {}
    ports = []
    for port in service.ports:
        if not port.external_ips:
            ports.append(port)
            continue
        kept = []
        for ip in port.external_ips:
            why = rule.why_refused(ip)
            if why is None:
                kept.append(ip)
            else:
                refused.setdefault(ip, why)
        if len(kept) == len(port.external_ips):
            ports.append(port)
        else:
            ports.append(dataclasses.replace(port, external_ips=tuple(kept)))
    if not refused:
        return service, ()
    errors = tuple(
        ValidationError("Service", service.namespace, service.name, FIELD, str(ip), why)
        for ip, why in refused.items()
    )
    return dataclasses.replace(service, ports=tuple(ports)), errors


class ExternalIPFilter:
    """A ``SourceHandler`` in front of ``inner`` (the change tracker) that applies ``rule``
    to every Service. It keeps the Services that have external IPs as the source gave them,
    so that a new rule (the node's addresses found or changed, the API server's known)
    applies to them too (``set_rule``)."""

    def __init__(self, inner: SourceHandler, rule: ExternalIPRule) -> None:
        self.inner = inner
        self.rule = rule
        self._given: dict[tuple[str, str], Service] = {}
        # The current problems, per Service: what status shows, and what is logged once.
        self.problems: dict[tuple[str, str], tuple[ValidationError, ...]] = {}

    def set_rule(self, rule: ExternalIPRule) -> None:
        if rule == self.rule:
            return
        self.rule = rule
        for service in list(self._given.values()):
            self.inner.on_service_update(self._admit(service))

    def _admit(self, service: Service) -> Service:
        key = (service.namespace, service.name)
        if not any(port.external_ips for port in service.ports):
            self._given.pop(key, None)
            self.problems.pop(key, None)
            return service
        self._given[key] = service
        admitted, errors = admit(service, self.rule)
        if not errors:
            self.problems.pop(key, None)
        elif errors != self.problems.get(key):
            self.problems[key] = errors
            for error in errors:
                log.warning("%s", error)
            self.inner.on_error(InvalidObject(errors))
        return admitted

    # --- SourceHandler -------------------------------------------------------------------

    def on_service_add(self, service: Service) -> None:
        self.inner.on_service_add(self._admit(service))

    def on_service_update(self, service: Service) -> None:
        self.inner.on_service_update(self._admit(service))

    def on_service_delete(self, namespace: str, name: str) -> None:
        self._given.pop((namespace, name), None)
        self.problems.pop((namespace, name), None)
        self.inner.on_service_delete(namespace, name)

    def on_endpoint_slice_add(self, endpoint_slice: EndpointSlice) -> None:
        self.inner.on_endpoint_slice_add(endpoint_slice)

    def on_endpoint_slice_update(self, endpoint_slice: EndpointSlice) -> None:
        self.inner.on_endpoint_slice_update(endpoint_slice)

    def on_endpoint_slice_delete(self, namespace: str, name: str) -> None:
        self.inner.on_endpoint_slice_delete(namespace, name)

    def on_synced(self, kind: str) -> None:
        self.inner.on_synced(kind)

    def on_error(self, problem: SourceProblem) -> None:
        self.inner.on_error(problem)
