"""The one rule on external IPs (``proxy.external_ips``): what it refuses, and that a new
rule (the node's addresses found later, the API server's) applies to the Services already
delivered. The live counterpart: tests/e2e/test_external_ip_rules.py."""

from __future__ import annotations

import asyncio
import ipaddress

from ovsproxy.agent.wiring import api_server_ips
from ovsproxy.model import IPAddress, Protocol, Service, ServicePort, ServicePortName
from ovsproxy.model.problems import InvalidObject
from ovsproxy.proxy.external_ips import (
    API_SERVER_IP,
    NODE_IP,
    REFUSED_ALL,
    ExternalIPFilter,
    ExternalIPRule,
    admit,
)
from ovsproxy.proxy.tracker import ChangeTracker

ip = ipaddress.ip_address


def _service(*external: str) -> Service:
    ports = tuple(
        ServicePort(
            name=ServicePortName("demo", "ext", name, Protocol.TCP),
            cluster_ips=(ip("10.96.0.50"),),
            port=port,
            external_ips=tuple(ip(a) for a in external),
        )
        for name, port in (("http", 80), ("https", 443))
    )
    return Service("demo", "ext", ports)


def _external(service: Service) -> set[tuple[str, IPAddress]]:
    return {(p.name.port, a) for p in service.ports for a in p.external_ips}


def test_the_rule_refuses_the_nodes_and_the_api_servers_addresses_or_all() -> None:
    rule = ExternalIPRule(False, frozenset({ip("192.0.2.7")}), frozenset({ip("192.0.2.8")}))
    service = _service("192.0.2.7", "192.0.2.8", "192.0.2.9")
    admitted, errors = admit(service, rule)
    assert _external(admitted) == {("http", ip("192.0.2.9")), ("https", ip("192.0.2.9"))}
    assert [(e.object, e.field, e.value, e.message) for e in errors] == [
        ("Service demo/ext", "spec.externalIPs", "192.0.2.7", NODE_IP),
        ("Service demo/ext", "spec.externalIPs", "192.0.2.8", API_SERVER_IP),
    ]
    admitted, errors = admit(service, ExternalIPRule(refuse_all=True))
    assert not _external(admitted) and {e.message for e in errors} == {REFUSED_ALL}
    assert admit(service, ExternalIPRule()) == (service, ())


def test_a_new_rule_applies_to_the_services_already_delivered() -> None:
    tracker = _Recorder()
    told = tracker.told
    external = ExternalIPFilter(tracker, ExternalIPRule())
    external.on_service_add(_service("192.0.2.7", "192.0.2.9"))
    assert tracker.stats.invalid["Service"] == 0
    external.set_rule(ExternalIPRule(node_ips=frozenset({ip("192.0.2.7")})))
    last = [v for v in told if isinstance(v, Service)][-1]
    assert _external(last) == {("http", ip("192.0.2.9")), ("https", ip("192.0.2.9"))}
    assert [str(e) for e in external.problems["demo", "ext"]] == [
        f"Service demo/ext: spec.externalIPs: {NODE_IP} (got '192.0.2.7')"
    ]
    assert sum(isinstance(v, InvalidObject) for v in told) == 1
    external.set_rule(ExternalIPRule(node_ips=frozenset({ip("192.0.2.7")})))  # unchanged
    assert sum(isinstance(v, InvalidObject) for v in told) == 1
    external.on_service_delete("demo", "ext")
    assert not external.problems


def test_the_api_server_address_is_its_host_or_what_its_name_resolves_to() -> None:
    assert asyncio.run(api_server_ips("10.96.0.1")) == {ip("10.96.0.1")}
    assert ip("127.0.0.1") in asyncio.run(api_server_ips("localhost"))
    assert asyncio.run(api_server_ips(None)) == frozenset()


class _Recorder(ChangeTracker):
    """The change tracker, keeping what it was told about Services."""

    def __init__(self) -> None:
        super().__init__()
        self.told: list[object] = []

    def on_service_add(self, service: Service) -> None:
        self.told.append(service)
        super().on_service_add(service)

    def on_service_update(self, service: Service) -> None:
        self.told.append(service)
        super().on_service_update(service)

    def on_error(self, problem: object) -> None:  # type: ignore[override]
        self.told.append(problem)
        super().on_error(problem)  # type: ignore[arg-type]
