"""The Service model: what the proxy knows about Services and their endpoints.

Frozen, hashable values. Only ``ovsproxy.sources`` converts Kubernetes objects (dicts from
manifests or the API) into these; every other package works on these types alone.

IP addresses are ``ipaddress`` objects, never strings: ``10.96.0.1`` and ``10.96.0.1/32`` can
not be confused once parsed (seed 000).

The bottom layer: it imports nothing else of ovsproxy. Beside the Service values here,
``model.node`` holds the node's own values (pod ports, the virtual Service address),
``model.problems`` what can go wrong in a source, and ``model.handler`` the interfaces sources
deliver to (the change tracker, the ServiceCIDR handler).
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
    # Only ingress IPs the nodes steer: an ``ipMode: Proxy`` ingress is left to the LB.
    load_balancer_ips: tuple[IPAddress, ...] = ()
    traffic_distribution: TrafficDistribution | None = None
    # The Service's healthCheckNodePort (LoadBalancer with externalTrafficPolicy Local); 0: none.
    health_check_node_port: int = 0
    # spec.loadBalancerSourceRanges: the clients allowed to reach the load-balancer IPs
    # (both families; empty = everyone). NodePorts and external IPs are not restricted.
    load_balancer_source_ranges: tuple[IPNetwork, ...] = ()
    # The Service's metadata.creationTimestamp (Unix seconds; None: not given, as in most
    # manifests): of two Services claiming one port, the older keeps it (``proxy.claims``).
    created: float | None = None

    @property
    def session_affinity(self) -> bool:
        return self.affinity_timeout > 0

    def cluster_ips_of(self, family: IPFamily) -> tuple[IPAddress, ...]:
        return tuple(ip for ip in self.cluster_ips if ip.version == family)

    @property
    def families(self) -> frozenset[IPFamily]:
        """The IP families this port is served in: those of its ClusterIPs."""
        return frozenset(IPFamily.of(ip) for ip in self.cluster_ips)

    # The four predicates below are kube-proxy's (pkg/proxy/serviceport.go), so that
    # endpoint categorisation decides exactly as kube-proxy does.

    @property
    def externally_accessible(self) -> bool:
        """Reachable from outside the cluster: a NodePort, a load-balancer IP or an external IP."""
        return self.node_port != 0 or bool(self.load_balancer_ips) or bool(self.external_ips)

    @property
    def internal_policy_local(self) -> bool:
        return self.internal_traffic_policy is TrafficPolicy.LOCAL

    @property
    def external_policy_local(self) -> bool:
        # externalTrafficPolicy only means something for traffic that can come from outside.
        return self.external_traffic_policy is TrafficPolicy.LOCAL and self.externally_accessible

    @property
    def uses_cluster_endpoints(self) -> bool:
        # External traffic needs the cluster set even with externalTrafficPolicy Local
        # (kube-proxy short-circuits in-cluster clients to the whole cluster).
        return not self.internal_policy_local or self.externally_accessible

    @property
    def uses_local_endpoints(self) -> bool:
        return self.internal_policy_local or self.external_policy_local


# No topology hints: the one empty set every Endpoint without hints shares.
NO_HINTS: frozenset[str] = frozenset()


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
    # One shared empty set by default: ``frozenset()`` is a new 216-byte object each call
    # (CPython 3.11), twice per endpoint of a cluster.
    hint_zones: frozenset[str] = NO_HINTS
    hint_nodes: frozenset[str] = NO_HINTS

    @property
    def family(self) -> IPFamily:
        return IPFamily.of(self.ip)

    def is_local(self, node_name: str) -> bool:
        """On the node called ``node_name`` (never when the node name is unknown)."""
        return bool(node_name) and self.node_name == node_name

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

    def endpoints_of(self, family: IPFamily) -> tuple[Endpoint, ...]:
        return tuple(ep for ep in self.endpoints if ep.ip.version == family)


@dataclass(frozen=True, slots=True)
class Service:
    """A Service as the proxy sees it: its ports, already validated.

    ``ports`` is empty for a Service the proxy ignores (headless, ExternalName, or one
    that names another proxy), so an update that makes a Service ignorable removes it.
    """

    namespace: str
    name: str
    ports: tuple[ServicePort, ...] = ()


@dataclass(frozen=True, slots=True)
class SlicePort:
    """One port of an EndpointSlice with the endpoints it gives, one ``Endpoint`` per address."""

    name: str  # matches ServicePortName.port
    protocol: Protocol
    endpoints: tuple[Endpoint, ...]


@dataclass(frozen=True, slots=True)
class EndpointSlice:
    """The part of a discovery.k8s.io/v1 EndpointSlice the proxy uses.

    A Service's endpoints are the merge of all its slices (``service`` names it), matched
    to its ports by port name and protocol. ``ports`` is empty for an FQDN slice.

    ``trigger_time`` is the annotation ``endpoints.kubernetes.io/last-change-trigger-time``
    (Unix seconds): when the change this slice carries began (a pod or Service change seen
    by the EndpointSlice controller), for the network programming latency. It is left out
    of comparisons, as kube-proxy leaves annotations out of its "did it change" test: a
    slice whose only change is this annotation changes nothing to program.
    """

    namespace: str
    name: str
    service: str
    ports: tuple[SlicePort, ...] = ()
    trigger_time: float | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class ServiceCIDR:
    """A networking.k8s.io/v1 ServiceCIDR: the ranges the API server allocates ClusterIPs
    from (cluster-scoped, so a name and no namespace). ``cidrs`` is canonical and sorted."""

    name: str
    cidrs: tuple[IPNetwork, ...] = ()
