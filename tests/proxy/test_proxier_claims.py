"""The proxier refuses a Service port that claims what an older Service holds (a nodePort, a
healthCheckNodePort, an address:port): nothing of it is staged, the node ingress is told it is
gone, and it is served once the older one goes. Against a recording switch; the lab's
tests/lab/test_port_conflicts.py sends the traffic."""

from __future__ import annotations

from ovsproxy.agent.core import NodeFacts, Semantics, build_core
from ovsproxy.config import AgentConfig
from ovsproxy.model import ServicePortName, ServiceState, ServiceType
from ovsproxy.model.handler import SYNC_ENDPOINT_SLICES, SYNC_SERVICES
from ovsproxy.proxy.followers import Committed
from tests.proxy.test_proxier_semantics import NODE, Recorder, apply, ep, ip, port

NODE_IP = ip("192.168.50.1")


class Rig:
    """The agent's core on a recording switch, with NodePorts on ``NODE_IP``; it follows
    each commit as the node ingress does."""

    def __init__(self) -> None:
        config = AgentConfig(node_name=NODE, node_ip=(str(NODE_IP),))
        self.touched: list[dict[ServicePortName, ServiceState | None]] = []
        self.conflicts_seen: list[int] = []  # published conflicts while the node ingress followed
        core = build_core(
            config, Recorder(), NodeFacts(), semantics=Semantics.NONE, followers=[self]
        )
        self.tracker, self.proxier = core.tracker, core.proxier
        assert self.proxier.node_ports and self.proxier.node_port_ips == (NODE_IP,)
        self.tracker.on_synced(SYNC_SERVICES)
        self.tracker.on_synced(SYNC_ENDPOINT_SLICES)

    async def after_commit(self, committed: Committed) -> None:
        self.touched.append(dict(committed.touched))
        self.conflicts_seen.append(len(self.proxier.conflicts))

    def flows(self) -> str:
        return "\n".join(self.proxier.datapath.dump())

    def served(self) -> set[str]:
        return {n.name for n in self.proxier.services}


OLD = port("10.96.0.1", name="old", type=ServiceType.NODE_PORT, node_port=30080, created=100.0)
NEW = port("10.96.0.2", name="new", type=ServiceType.NODE_PORT, node_port=30080, created=200.0)


async def test_a_node_port_taken_is_refused_whole_and_served_once_the_older_goes() -> None:
    rig = Rig()
    apply(rig.tracker, OLD, [ep("10.0.0.1")])
    await rig.proxier.sync()
    apply(rig.tracker, NEW, [ep("10.0.0.2")])
    await rig.proxier.sync()
    assert rig.served() == {"old"}
    assert "10.96.0.2" not in rig.flows() and "10.0.0.2" not in rig.flows()
    assert rig.touched[-1] == {NEW.name: None}  # the steering and health checks never see it
    # published with the sync that applied it (as status and the metric read it), not before
    assert rig.conflicts_seen == [0, 0] and rig.proxier.conflicts_refused == 1
    assert [str(c) for c in rig.proxier.conflicts] == [
        "Service ns/new: port p/TCP: nodePort 30080/TCP is already claimed by the older "
        "Service ns/old (port p/TCP); this port is refused"
    ]
    rig.tracker.on_service_delete("ns", "old")
    await rig.proxier.sync()
    assert rig.served() == {"new"} and rig.proxier.conflicts == ()
    assert "10.96.0.2" in rig.flows() and "10.0.0.2" in rig.flows()
    assert set(rig.touched[-1]) == {OLD.name, NEW.name}
    assert rig.touched[-1][NEW.name] is not None


async def test_an_older_service_arriving_late_takes_its_claim_back() -> None:
    rig = Rig()
    apply(rig.tracker, NEW, [ep("10.0.0.2")])
    await rig.proxier.sync()
    assert rig.served() == {"new"}
    apply(rig.tracker, OLD, [ep("10.0.0.1")])
    await rig.proxier.sync()
    assert rig.served() == {"old"}
    assert "10.96.0.2" not in rig.flows() and "10.0.0.2" not in rig.flows()
    assert rig.touched[-1][NEW.name] is None
    # an endpoint change of the refused port stages nothing of it
    apply(rig.tracker, NEW, [ep("10.0.0.3")])
    await rig.proxier.sync()
    assert "10.0.0.3" not in rig.flows()


async def test_every_kind_of_claim_and_a_full_sync_decide_alike() -> None:
    rig = Rig()
    lb = ServiceType.LOAD_BALANCER
    old = port("10.96.0.1", name="old", type=lb, node_port=30080, created=1.0,
               external_ips=(ip("192.0.2.1"),), health_check_node_port=32000)  # fmt: skip
    same_ip = port("10.96.0.1", name="same-ip", created=2.0)
    external = port("10.96.0.3", name="external", external_ips=(ip("192.0.2.1"),))
    health = port("10.96.0.4", name="health", type=lb, health_check_node_port=32000)
    free = port("10.96.0.5", name="free", type=lb, node_port=30081)
    for each in (same_ip, external, health, free, old):
        apply(rig.tracker, each, [ep("10.0.0.9")])
    for full in (False, True):
        await rig.proxier.sync(full=full)
        assert rig.served() == {"old", "free"}, full
        assert {(c.refused.name, c.claim) for c in rig.proxier.conflicts} == {
            ("same-ip", "10.96.0.1:80/TCP"),
            ("external", "192.0.2.1:80/TCP"),
            ("health", "healthCheckNodePort 32000"),
        }
        assert "10.96.0.3" not in rig.flows() and "10.96.0.4" not in rig.flows()
