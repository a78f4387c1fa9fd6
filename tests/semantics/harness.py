"""A small agent for end-to-end semantics tests: the agent's core (``agent.core.build_core``)
over a channel to the real sandbox OVS, fed with model values, and real clients in pod
namespaces."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ovsproxy.agent.core import NodeFacts, build_core
from ovsproxy.config import AgentConfig
from ovsproxy.datapath.semantics import SemanticsHelpers
from ovsproxy.datapath.switch_sync import SwitchSync
from ovsproxy.lab.evidence import RigNode, probe
from ovsproxy.model import (
    Endpoint,
    EndpointSlice,
    IPAddress,
    Protocol,
    Service,
    ServicePort,
    ServicePortName,
    SlicePort,
    TrafficPolicy,
)
from ovsproxy.model.handler import SYNC_ENDPOINT_SLICES, SYNC_SERVICES
from ovsproxy.model.node import PodPort
from ovsproxy.openflow.connection import Channel
from ovsproxy.ovs.sandbox import Pod, Sandbox
from ovsproxy.ovs.traffic import TCP_TIMEOUT_S
from ovsproxy.proxy.proxier import Proxier
from ovsproxy.proxy.tracker import ChangeTracker

NODE = "node-a"
NS = "default"


def ip(text: str) -> IPAddress:
    return ipaddress.ip_address(text)


@dataclass
class World:
    sandbox: Sandbox
    channel: Channel
    datapath: SwitchSync
    tracker: ChangeTracker
    proxier: Proxier
    semantics: SemanticsHelpers
    synced: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rig(self) -> tuple[RigNode, ...]:
        """This one switch, for ``ovsproxy.lab.evidence`` (the proxier runs in-process)."""
        return (RigNode("node", self.sandbox),)

    # -- Kubernetes objects ---------------------------------------------------------------
    def service(
        self,
        name: str,
        cluster_ips: Sequence[str],
        port: int = 80,
        *,
        protocol: Protocol = Protocol.TCP,
        affinity: int = 0,
        itp: TrafficPolicy = TrafficPolicy.CLUSTER,
        external_ips: Sequence[str] = (),
    ) -> ServicePortName:
        spn = ServicePortName(NS, name, "p", protocol)
        sp = ServicePort(
            spn,
            tuple(ip(a) for a in cluster_ips),
            port,
            protocol,
            affinity_timeout=affinity,
            internal_traffic_policy=itp,
            external_ips=tuple(ip(a) for a in external_ips),
        )
        self.tracker.on_service_update(Service(NS, name, (sp,)))
        return spn

    def endpoints(
        self, name: str, endpoints: Sequence[Endpoint], protocol: Protocol = Protocol.TCP
    ) -> None:
        self.tracker.on_endpoint_slice_update(
            EndpointSlice(NS, f"{name}-slice", name, (SlicePort("p", protocol, tuple(endpoints)),))
        )

    def delete_service(self, name: str) -> None:
        self.tracker.on_service_delete(NS, name)

    async def sync(self) -> None:
        if not self.synced:
            self.tracker.on_synced(SYNC_SERVICES)
            self.tracker.on_synced(SYNC_ENDPOINT_SLICES)
            self.synced = True
        await self.proxier.sync()

    # -- pods and traffic -------------------------------------------------------------------
    def pod(self, name: str, **kw: Any) -> Pod:
        return self.sandbox.add_pod(name, **kw)

    async def http(
        self,
        client: Pod,
        url: str,
        count: int = 20,
        timeout: float = TCP_TIMEOUT_S,
        *,
        source_port: int = 0,
    ) -> dict:
        """Lost requests come with their evidence (``ovsproxy.lab.evidence``) unless the
        timeout is shorter than one retransmission (no answer expected, or timing measured)."""
        args: tuple[str, ...] = ("http", url, "--count", str(count), "--timeout", str(timeout))
        if source_port:
            args += ("--source-port", str(source_port))
        return await asyncio.to_thread(
            probe, self.rig, client.netns, *args, explain=timeout >= TCP_TIMEOUT_S
        )

    async def udp(
        self,
        client: Pod,
        host: str,
        port: int,
        count: int = 3,
        timeout: float = 1.0,
        *,
        interval: float = 0.0,
        new_socket: bool = False,
        source_port: int = 0,
    ) -> dict:
        args = ["udp", host, str(port), "--count", str(count), "--timeout", str(timeout)]
        if interval:
            args += ["--interval", str(interval)]
        if new_socket:
            args.append("--new-socket")
        if source_port:
            args += ["--source-port", str(source_port)]
        return await asyncio.to_thread(probe, self.rig, client.netns, *args, explain=timeout >= 1)

    def learned_flows(self) -> list[str]:
        table = self.datapath.tables.session_affinity
        out = self.sandbox.ofctl("dump-flows", f"table={table}")
        return [
            line.strip()
            for line in out.splitlines()
            if "cookie=" in line and "priority=0" not in line
        ]


def endpoint(
    pod: Pod, port: int = 8080, *, v6: bool = False, node: str = NODE, **kw: Any
) -> Endpoint:
    address = pod.ipv6.ip if v6 else pod.ipv4.ip  # type: ignore[union-attr]
    return Endpoint(address, port, node_name=node, **kw)


async def make_world(sandbox: Sandbox, generation: int = 1, **tuning: Any) -> World:
    """The agent's core (``agent.core.build_core``, the Service semantics live) over a channel
    to the sandbox's switch, started; ``generation``: its cookie generation (another one for
    an agent restarted onto the switch); ``tuning``: ``build_core``'s (e.g.
    ``max_ovs_timeout``). The affinity sweeper runs every hour: a test sweeps when it means to."""

    async def pods() -> list[PodPort]:
        return [
            PodPort(p.interface, p.ofport, p.name, p.namespace, tuple(p.ips), p.mac)
            for p in sandbox.pods.values()
        ]

    channel = Channel(sandbox.openflow)
    config = AgentConfig(node_name=NODE, node_ports=False)
    tuning.setdefault("sweep_interval", 3600.0)
    core = build_core(config, channel, NodeFacts(generation, pods=pods), **tuning)
    assert core.semantics is not None and core.semantics.conntrack.appctl is not None
    await channel.start()
    return World(sandbox, channel, core.datapath, core.tracker, core.proxier, core.semantics)
