"""The proxier's fast path for the common Service port (``plain_selection``, ``_stage_plain``)
decides, stages and records exactly what the general path does.

Most ports of a cluster have one ClusterIP, ready endpoints without topology hints and no
external frontends; the fast path skips categorisation for them. Every case here runs both
ways: through the fast path, and with it switched off.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Callable

import pytest

from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath.datapath import Datapath
from ovsproxy.model import (
    Endpoint,
    Protocol,
    ServicePort,
    ServicePortName,
    ServiceState,
    ServiceType,
    TrafficPolicy,
)
from ovsproxy.proxy import proxier as px
from ovsproxy.proxy.proxier import Proxier, plain_selection, select_endpoints
from ovsproxy.proxy.tracker import ChangeTracker
from tests.fakes.switch import FakeSwitch

NODE = "node-a"
ip = ipaddress.ip_address


def _port(name: str, *vips: str, **kwargs: object) -> ServicePort:
    protocol = kwargs.pop("protocol", Protocol.TCP)
    assert isinstance(protocol, Protocol)
    return ServicePort(
        ServicePortName("ns", name, "", protocol),
        tuple(ip(v) for v in vips),
        80,
        protocol,
        **kwargs,  # type: ignore[arg-type]
    )


def _eps(*addresses: str, **kwargs: object) -> tuple[Endpoint, ...]:
    return tuple(Endpoint(ip(a), 8080, **kwargs) for a in addresses)  # type: ignore[arg-type]


PLAIN: dict[str, ServiceState] = {
    "v4": ServiceState(_port("v4", "10.96.0.1"), _eps("10.0.0.1", "10.0.0.2")),
    "v6": ServiceState(_port("v6", "fd00::1"), _eps("fd01::1", "fd01::2")),
    "no endpoints": ServiceState(_port("none", "10.96.0.2")),
    "udp": ServiceState(_port("udp", "10.96.0.3", protocol=Protocol.UDP), _eps("10.0.0.3")),
    "affinity": ServiceState(_port("aff", "10.96.0.4", affinity_timeout=600), _eps("10.0.0.4")),
    "on this node": ServiceState(_port("local", "10.96.0.5"), _eps("10.0.0.5", node_name=NODE)),
    "eTP Local, not external": ServiceState(
        _port("etp", "10.96.0.6", external_traffic_policy=TrafficPolicy.LOCAL), _eps("10.0.0.6")
    ),
}

NOT_PLAIN: dict[str, ServiceState] = {
    "dual-stack": ServiceState(
        _port("dual", "10.96.1.1", "fd00::11"), (*_eps("10.0.1.1"), *_eps("fd01::11"))
    ),
    "not ready": ServiceState(
        _port("nr", "10.96.1.2"), (*_eps("10.0.1.2"), *_eps("10.0.1.3", ready=False))
    ),
    "terminating only": ServiceState(
        _port("term", "10.96.1.3"), _eps("10.0.1.4", ready=False, serving=True, terminating=True)
    ),
    "zone hints": ServiceState(
        _port("zone", "10.96.1.4"), _eps("10.0.1.5", hint_zones=frozenset({"z1"}))
    ),
    "node hints": ServiceState(
        _port("hint", "10.96.1.5"), _eps("10.0.1.6", hint_nodes=frozenset({NODE}))
    ),
    "iTP Local": ServiceState(
        _port("itp", "10.96.1.6", internal_traffic_policy=TrafficPolicy.LOCAL),
        _eps("10.0.1.7", node_name=NODE),
    ),
    "NodePort": ServiceState(
        _port("np", "10.96.1.7", type=ServiceType.NODE_PORT, node_port=30080), _eps("10.0.1.8")
    ),
    "external IP": ServiceState(
        _port("ext", "10.96.1.8", external_ips=(ip("192.0.2.1"),)), _eps("10.0.1.9")
    ),
    "LB IP": ServiceState(
        _port("lb", "10.96.1.9", load_balancer_ips=(ip("192.0.2.2"),)), _eps("10.0.1.10")
    ),
    "no ClusterIP": ServiceState(_port("headless"), _eps("10.0.1.11")),
}


@pytest.mark.parametrize("case", list(PLAIN))
def test_plain_selection_is_select_endpoints(case: str) -> None:
    state = PLAIN[case]
    (family,) = state.port.families
    chosen = plain_selection(state)
    assert chosen is not None
    for node_ports, short_circuit in ((False, False), (True, True)):
        assert chosen == select_endpoints(
            state, family, NODE, "z1", node_ports=node_ports, short_circuit=short_circuit
        )


@pytest.mark.parametrize("case", list(NOT_PLAIN))
def test_other_ports_take_the_general_path(case: str) -> None:
    assert plain_selection(NOT_PLAIN[case]) is None


def _proxier(general_only: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[Proxier, FakeSwitch]:
    switch = FakeSwitch()
    proxier = Proxier(
        ChangeTracker(),
        Datapath(switch, pl.PipelineConfig(), 1),
        node_name=NODE,
        zone="z1",
        reject_action=(),
    )
    if general_only:
        original = px.plain_selection

        def off(state: ServiceState) -> None:
            original(state)  # (still called: the same work, no answer)
            return None

        monkeypatch.setattr(px, "plain_selection", off)
    return proxier, switch


def _recorded(proxier: Proxier) -> tuple[object, ...]:
    dp = proxier.datapath
    return (
        proxier.services,
        dict(proxier.groups._ids),
        sorted(proxier.groups._free),
        proxier.endpoint_count(),
        {o: (dp._owners[o].groups, dp._owners[o].flows) for o in dp.owners()},
    )


def _as_updates(*steps: dict[str, ServiceState]) -> list[list[ServiceState]]:
    return [list(step.values()) for step in steps]


# A port changing shape between the paths: the ids freed by one are the next one's.
_EXT = NOT_PLAIN["external IP"]
_EXT_PLAIN = ServiceState(dataclasses.replace(_EXT.port, external_ips=()), _EXT.endpoints)
_V4_AS_V6 = ServiceState(
    dataclasses.replace(PLAIN["v4"].port, cluster_ips=(ip("fd00::40"),)), _eps("fd01::40")
)
STEPS: list[Callable[[], list[ServiceState]]] = [
    lambda: [*PLAIN.values(), *NOT_PLAIN.values()],
    lambda: [_EXT_PLAIN, _V4_AS_V6, NOT_PLAIN["dual-stack"]],
    lambda: [_EXT, PLAIN["v4"], ServiceState(PLAIN["udp"].port)],
]


async def test_the_fast_path_stages_and_records_what_the_general_path_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runs = []
    for general_only in (False, True):
        with monkeypatch.context() as patch:
            proxier, switch = _proxier(general_only, patch)
            recorded = []
            for step in STEPS:
                for state in step():
                    proxier._stage_service(state)
                await proxier.datapath.commit()
                recorded.append(_recorded(proxier))
            runs.append((recorded, [[m.encode(0) for m in b] for b in switch.bundles]))
    fast, general = runs
    assert fast[0] == general[0]
    assert fast[1] == general[1]  # the same messages, in the same order
