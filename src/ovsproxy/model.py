"""The Service model: what the proxy knows about Services and their endpoints.

Frozen, hashable values. Only ``ovsproxy.sources`` converts Kubernetes objects (dicts from
manifests or the API) into these; every other package works on these types alone.

IP addresses are ``ipaddress`` objects, never strings: ``10.96.0.1`` and ``10.96.0.1/32`` can
not be confused once parsed (seed 000).
"""

from __future__ import annotations

import enum
import ipaddress
from dataclasses import dataclass, field

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class Protocol(enum.StrEnum):
    TCP = "TCP"
    UDP = "UDP"
    SCTP = "SCTP"

    @property
    def ip_proto(self) -> int:
        """The IP protocol number (``ip_proto`` in OpenFlow)."""
        return _IP_PROTO[self]


_IP_PROTO = {Protocol.TCP: 6, Protocol.UDP: 17, Protocol.SCTP: 132}


class IPFamily(enum.IntEnum):
    IPv4 = 4
    IPv6 = 6

    @classmethod
    def of(cls, address: IPAddress | IPNetwork) -> IPFamily:
        return cls.IPv4 if address.version == 4 else cls.IPv6


class ServiceType(enum.StrEnum):
    CLUSTER_IP = "ClusterIP"
    NODE_PORT = "NodePort"
    LOAD_BALANCER = "LoadBalancer"


class TrafficPolicy(enum.StrEnum):
    CLUSTER = "Cluster"
    LOCAL = "Local"


class TrafficDistribution(enum.StrEnum):
    PREFER_CLOSE = "PreferClose"  # the older name of PreferSameZone
    PREFER_SAME_ZONE = "PreferSameZone"
    PREFER_SAME_NODE = "PreferSameNode"


@dataclass(frozen=True, slots=True, order=True)
class ServicePortName:
    """Identifies one port of one Service: the unit the proxy programs (one select group)."""

    namespace: str
    name: str
    port: str = ""  # the port's name; "" for the single unnamed port
    protocol: Protocol = Protocol.TCP

    @property
    def service(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    def __str__(self) -> str:
        suffix = f":{self.port}" if self.port else ""
        return f"{self.namespace}/{self.name}{suffix}/{self.protocol}"


@dataclass(frozen=True, slots=True)
class ServicePort:
    """One port of a Service, with everything the datapath needs to program it."""

    name: ServicePortName
    cluster_ips: tuple[IPAddress, ...]  # primary family first; empty for none
    port: int
    protocol: Protocol = Protocol.TCP
    # 0 means no session affinity; otherwise ClientIP affinity for this many seconds.
    affinity_timeout: int = 0
    internal_traffic_policy: TrafficPolicy = TrafficPolicy.CLUSTER
    external_traffic_policy: TrafficPolicy = TrafficPolicy.CLUSTER
    type: ServiceType = ServiceType.CLUSTER_IP
    node_port: int = 0  # 0 when none
    external_ips: tuple[IPAddress, ...] = ()
    load_balancer_ips: tuple[IPAddress, ...] = ()
    traffic_distribution: TrafficDistribution | None = None

    @property
    def session_affinity(self) -> bool:
        return self.affinity_timeout > 0

    def cluster_ips_of(self, family: IPFamily) -> tuple[IPAddress, ...]:
        return tuple(ip for ip in self.cluster_ips if ip.version == family)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One backend of a Service port, as an EndpointSlice describes it."""

    ip: IPAddress
    port: int
    ready: bool = True
    serving: bool = True
    terminating: bool = False
    node_name: str | None = None
    zone: str | None = None
    hint_zones: frozenset[str] = field(default_factory=frozenset)
    hint_nodes: frozenset[str] = field(default_factory=frozenset)

    @property
    def family(self) -> IPFamily:
        return IPFamily.of(self.ip)

    @property
    def sort_key(self) -> tuple[int, int, int]:
        """A total order across families (IPv4Address and IPv6Address do not compare)."""
        return (self.ip.version, int(self.ip), self.port)

    def __str__(self) -> str:
        if self.ip.version == 6:
            return f"[{self.ip}]:{self.port}"
        return f"{self.ip}:{self.port}"


@dataclass(frozen=True, slots=True)
class ServiceState:
    """A Service port together with all its endpoints (every state, before categorisation)."""

    port: ServicePort
    endpoints: tuple[Endpoint, ...] = ()  # sorted by Endpoint.sort_key, no duplicates

    @property
    def name(self) -> ServicePortName:
        return self.port.name
