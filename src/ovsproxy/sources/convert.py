"""Kubernetes objects (plain dicts, from YAML or the API) into the model, with validation.

Pure functions. ``convert_service`` and ``convert_endpoint_slice`` either return a model
value or raise ``InvalidObjectError`` listing every bad field of the object (kind,
namespace/name, field path, value, why), so ``ovsproxy check`` can show them all at once.

Semantics follow kube-proxy: one ``ServicePort`` per Service port, keyed by
(namespace, name, port name, protocol); EndpointSlice ports match Service ports by name and
protocol; ready and serving default to true, terminating to false; only an endpoint's first
address is used; FQDN slices, headless Services, ExternalName Services, Services labelled
``service.kubernetes.io/headless`` and Services meant for another proxy (kube-proxy's
``service.kubernetes.io/service-proxy-name`` rule, see ``proxy_label_selector``) are ignored
(not errors).
"""

from __future__ import annotations

import ipaddress
import logging
import re
import socket
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from ovsproxy.model import (
    Endpoint,
    EndpointSlice,
    IPAddress,
    IPFamily,
    IPNetwork,
    Protocol,
    Service,
    ServicePort,
    ServicePortName,
    ServiceType,
    SlicePort,
    TrafficDistribution,
    TrafficPolicy,
)
from ovsproxy.model.problems import (
    FieldPath,
    InvalidObjectError,
    SourceLocation,
    ValidationError,
)

SERVICE_PROXY_NAME_LABEL = "service.kubernetes.io/service-proxy-name"
HEADLESS_LABEL = "service.kubernetes.io/headless"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
# Set by the EndpointSlice controller: when the change a slice carries was triggered.
TRIGGER_TIME_ANNOTATION = "endpoints.kubernetes.io/last-change-trigger-time"

_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?\Z")


def check_service_proxy_name(name: str | None) -> str | None:
    """A ``service_proxy_name`` as the selectors use it: None or "" is none; anything else must
    be a valid label value (63 characters at most). Raises ``ValueError`` naming the value."""
    if not name:
        return None
    if len(name) > 63 or not _LABEL_VALUE.match(name):
        raise ValueError(
            f"{name!r} is not a label value (up to 63 letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit)"
        )
    return name


def proxy_label_selector(service_proxy_name: str | None = None) -> str:
    """The label selector of the Service and EndpointSlice informers, kube-proxy's rule: with
    no proxy name, only objects without ``service.kubernetes.io/service-proxy-name``; with one,
    only objects labelled with exactly that name. Never objects labelled
    ``service.kubernetes.io/headless`` (the EndpointSlice controller labels the slices of
    headless Services so)."""
    if service_proxy_name:
        return f"{SERVICE_PROXY_NAME_LABEL}={service_proxy_name},!{HEADLESS_LABEL}"
    return f"!{SERVICE_PROXY_NAME_LABEL},!{HEADLESS_LABEL}"


# What kube-proxy's informers select: Services (and their slices) meant for another proxy,
# and the slices of headless Services, never reach it.
PROXY_LABEL_SELECTOR = proxy_label_selector()

DEFAULT_AFFINITY_TIMEOUT = 10800  # the API server's default for ClientIP affinity
MAX_AFFINITY_TIMEOUT = 86400
DEFAULT_NAMESPACE = "default"

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?\Z")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_IANA_SVC_NAME = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?\Z")

# RFC 3339 as Go's time.RFC3339Nano writes it (the controller's format).
_RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?(Z|[+-]\d\d:\d\d)\Z")

log = logging.getLogger(__name__)

FAMILY_NAMES = {"IPv4": IPFamily.IPv4, "IPv6": IPFamily.IPv6}
PROTOCOLS = {p.value: p for p in Protocol}
SERVICE_TYPES = {t.value: t for t in ServiceType}
TRAFFIC_POLICIES = {p.value: p for p in TrafficPolicy}
TRAFFIC_DISTRIBUTIONS = {d.value: d for d in TrafficDistribution}


def parse_ip(text: object) -> IPAddress | None:
    """A canonical address, or None for anything Kubernetes would reject.

    Rejected beyond what ``ipaddress`` rejects: IPv6 scope ids (``fe80::1%eth0``) and any
    surrounding whitespace. Leading zeros in IPv4 are already rejected by ``ipaddress``.
    """
    if not isinstance(text, str):
        return None
    return parse_ip_text(text)


class ParsedIPs:
    """``parse_ip`` with a memo, held by whoever converts many objects (a manifest source, a
    codec): endpoint addresses repeat across ports and updates, so a first list parses each
    once. Its misses must cost little: a plain dict, cleared when full, not an LRU."""

    __slots__ = ("_parsed",)

    MAX = 1 << 17

    def __init__(self) -> None:
        self._parsed: dict[str, IPAddress | None] = {}

    def __call__(self, text: object) -> IPAddress | None:
        if not isinstance(text, str):
            return None
        parsed = self._parsed
        ip = parsed.get(text, _MISSING)
        if ip is _MISSING:
            ip = parse_ip_text(text)
            if len(parsed) >= self.MAX:
                parsed.clear()  # no eviction order to keep: a miss must stay cheap
            parsed[text] = ip
        return ip  # type: ignore[return-value]


_MISSING = object()


def _ipv4_constructor() -> Callable[[int], ipaddress.IPv4Address]:
    """``IPv4Address(n)`` for an ``n`` known to be in range, without the constructor's type
    and range checks (a cold start makes one per endpoint): the instance with its one slot,
    ``_ip``, set. The plain constructor should ``ipaddress`` ever keep its value elsewhere."""
    new, cls = object.__new__, ipaddress.IPv4Address

    def construct(value: int) -> ipaddress.IPv4Address:
        ip = new(cls)
        ip._ip = value  # type: ignore[attr-defined]
        return ip

    sample = 0x0A600001
    try:
        made, reference = construct(sample), cls(sample)
        same = made == reference and hash(made) == hash(reference) and str(made) == "10.96.0.1"
    except Exception:  # pragma: no cover - an ipaddress laid out otherwise
        same = False
    return construct if same else cls


_ipv4_from_int = _ipv4_constructor()
_inet_pton = socket.inet_pton
_AF_INET = socket.AF_INET


def parse_ipv4(text: str) -> ipaddress.IPv4Address | None:
    """An IPv4 address as ``parse_ip`` reads it, or None (for an IPv6 one too), unmemoized.

    Through inet_pton: it rejects exactly what ipaddress rejects (not four decimal octets,
    an octet over 255, leading zeros) and any whitespace or scope, at a tenth of the cost."""
    if ":" in text:
        return None
    try:
        return _ipv4_from_int(int.from_bytes(_inet_pton(_AF_INET, text), "big"))
    except (OSError, ValueError, UnicodeError):
        return None


def parse_ip_text(text: str) -> IPAddress | None:
    """``parse_ip`` for a string, unmemoized."""
    if ":" not in text:
        return parse_ipv4(text)
    if text != text.strip() or "%" in text:
        return None
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


class _Checker:
    """Collects the validation errors of one object (``ip``: how it parses addresses)."""

    __slots__ = ("errors", "ip", "kind", "location", "name", "namespace")

    def __init__(
        self, kind: str, location: SourceLocation | None, ips: ParsedIPs | None = None
    ) -> None:
        self.ip: Callable[[object], IPAddress | None] = ips if ips is not None else parse_ip
        self.kind = kind
        self.namespace = ""
        self.name = ""
        self.location = location
        self.errors: list[ValidationError] = []

    def error(self, path: FieldPath, value: Any, message: str) -> None:
        self.errors.append(
            ValidationError(
                kind=self.kind,
                namespace=self.namespace,
                name=self.name or "<unnamed>",
                path=path,
                value=value,
                message=message,
                location=self.location,
            )
        )

    def raise_if_any(self) -> None:
        if self.errors:
            raise InvalidObjectError(tuple(self.errors))

    # typed getters: return the value, or the default after recording an error

    def mapping(self, parent: Mapping[str, Any], key: str, path: FieldPath) -> Mapping[str, Any]:
        value = parent.get(key)
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.error((*path, key), value, "must be a mapping")
            return {}
        return value

    def sequence(self, parent: Mapping[str, Any], key: str, path: FieldPath) -> list[Any]:
        value = parent.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            self.error((*path, key), value, "must be a list")
            return []
        return value

    def string(
        self, parent: Mapping[str, Any], key: str, path: FieldPath, default: str = ""
    ) -> str:
        value = parent.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            self.error((*path, key), value, "must be a string")
            return default
        return value

    def boolean(self, parent: Mapping[str, Any], key: str, path: FieldPath, default: bool) -> bool:
        value = parent.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            self.error((*path, key), value, "must be true or false")
            return default
        return value

    def port_number(
        self, parent: Mapping[str, Any], key: str, path: FieldPath, *, required: bool
    ) -> int:
        value = parent.get(key)
        if value is None:
            if required:
                self.error((*path, key), None, "required")
            return 0
        # bool is an int in Python; YAML's `port: yes` is not a port.
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 65535:
            self.error((*path, key), value, "must be a port number between 1 and 65535")
            return 0
        return value

    def choice(
        self, parent: Mapping[str, Any], key: str, path: FieldPath, choices: Mapping[str, Any]
    ) -> Any:
        value = parent.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or value not in choices:
            allowed = ", ".join(choices)
            self.error((*path, key), value, f"must be one of {allowed}")
            return None
        return choices[value]

    def metadata(self, obj: Mapping[str, Any], name_pattern: re.Pattern[str]) -> Mapping[str, Any]:
        meta = self.mapping(obj, "metadata", ())
        name = meta.get("name")
        namespace = meta.get("namespace", DEFAULT_NAMESPACE)
        if isinstance(namespace, str) and DNS_LABEL.match(namespace) and len(namespace) <= 63:
            self.namespace = namespace
        else:
            self.namespace = str(namespace)
            self.error(("metadata", "namespace"), namespace, "must be a DNS label")
        if isinstance(name, str) and name_pattern.match(name) and len(name) <= 253:
            self.name = name
        else:
            self.name = name if isinstance(name, str) and name else ""
            self.error(("metadata", "name"), name, "required, a lower-case DNS name")
        labels = meta.get("labels")
        if labels is not None and not (
            isinstance(labels, Mapping)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())
        ):
            self.error(("metadata", "labels"), labels, "must map strings to strings")
            return {**meta, "labels": {}}
        return meta


def object_key(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """(namespace, name) of an object when both are usable strings, else None."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        return None
    name = meta.get("name")
    namespace = meta.get("namespace", DEFAULT_NAMESPACE)
    if isinstance(name, str) and name and isinstance(namespace, str) and namespace:
        return (namespace, name)
    return None


def service_ignored_reason(
    obj: Mapping[str, Any], service_proxy_name: str | None = None
) -> str | None:
    """Why a proxy named ``service_proxy_name`` (None: kube-proxy's default, no name) would
    not program this Service, or None when it would (``proxy_label_selector``'s rule)."""
    meta = obj.get("metadata")
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    labels = labels if isinstance(labels, Mapping) else {}
    proxy = labels.get(SERVICE_PROXY_NAME_LABEL)
    if service_proxy_name and proxy != service_proxy_name:
        if proxy is None:
            return f"not labelled {SERVICE_PROXY_NAME_LABEL}={service_proxy_name}"
        return f"handled by proxy {proxy!r}"
    if not service_proxy_name and SERVICE_PROXY_NAME_LABEL in labels:
        return f"handled by proxy {proxy!r}"
    if HEADLESS_LABEL in labels:
        return f"labelled {HEADLESS_LABEL}"
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return None
    if spec.get("type") == "ExternalName":
        return "ExternalName"
    cluster_ips = spec.get("clusterIPs")
    first = cluster_ips[0] if isinstance(cluster_ips, list) and cluster_ips else None
    if spec.get("clusterIP") == "None" or first == "None":
        return "headless"
    return None


def convert_service(
    obj: Mapping[str, Any],
    *,
    location: SourceLocation | None = None,
    service_proxy_name: str | None = None,
    ips: ParsedIPs | None = None,
) -> Service:
    """A v1 Service into a ``Service`` with one ``ServicePort`` per port.

    Raises ``InvalidObjectError`` with every bad field. An ignored Service (see
    ``service_ignored_reason``) converts to one with no ports after its metadata is checked.
    """
    check = _Checker("Service", location, ips)
    meta = check.metadata(obj, DNS1035_LABEL)
    created = _creation_time(check, meta)
    if service_ignored_reason(obj, service_proxy_name) is not None:
        check.raise_if_any()
        return Service(check.namespace, check.name)
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        check.error(("spec",), spec, "required, a mapping")
        check.raise_if_any()
        raise AssertionError  # unreachable: an error was just recorded

    service_type = check.choice(spec, "type", ("spec",), SERVICE_TYPES) or ServiceType.CLUSTER_IP
    cluster_ips = _cluster_ips(check, spec)
    external_ips = _ip_list(check, spec, "externalIPs", ("spec",))
    lb_ips = _load_balancer_ips(check, obj)

    affinity = check.choice(spec, "sessionAffinity", ("spec",), {"None": 0, "ClientIP": 1}) or 0
    if affinity:
        config = check.mapping(spec, "sessionAffinityConfig", ("spec",))
        client_ip = check.mapping(config, "clientIP", ("spec", "sessionAffinityConfig"))
        timeout = client_ip.get("timeoutSeconds")
        if timeout is None:
            affinity = DEFAULT_AFFINITY_TIMEOUT
        elif (
            isinstance(timeout, int)
            and not isinstance(timeout, bool)
            and 0 < timeout <= MAX_AFFINITY_TIMEOUT
        ):
            affinity = timeout
        else:
            check.error(
                ("spec", "sessionAffinityConfig", "clientIP", "timeoutSeconds"),
                timeout,
                f"must be between 1 and {MAX_AFFINITY_TIMEOUT} seconds",
            )
    policies = TRAFFIC_POLICIES
    internal_policy = (
        check.choice(spec, "internalTrafficPolicy", ("spec",), policies) or TrafficPolicy.CLUSTER
    )
    external_policy = (
        check.choice(spec, "externalTrafficPolicy", ("spec",), policies) or TrafficPolicy.CLUSTER
    )
    distribution = check.choice(spec, "trafficDistribution", ("spec",), TRAFFIC_DISTRIBUTIONS)
    source_ranges = _source_ranges(check, spec, service_type)
    health_check_port = check.port_number(spec, "healthCheckNodePort", ("spec",), required=False)
    if health_check_port and not (
        service_type is ServiceType.LOAD_BALANCER and external_policy is TrafficPolicy.LOCAL
    ):
        # The API server's rule; kube-proxy serves it only for such a Service.
        check.error(
            ("spec", "healthCheckNodePort"),
            health_check_port,
            "may only be set for type LoadBalancer with externalTrafficPolicy Local",
        )
        health_check_port = 0

    raw_ports = spec.get("ports")
    if not isinstance(raw_ports, list) or not raw_ports:
        check.error(("spec", "ports"), raw_ports, "required, a list of at least one port")
        raw_ports = []
    node_ports_allowed = service_type in (ServiceType.NODE_PORT, ServiceType.LOAD_BALANCER)
    seen_names: dict[str, int] = {}
    seen_ports: dict[tuple[int, Protocol], int] = {}
    seen_node_ports: dict[tuple[int, Protocol], int] = {}
    parsed: list[tuple[str, Protocol, int, int]] = []
    for index, raw in enumerate(raw_ports):
        path: FieldPath = ("spec", "ports", index)
        if not isinstance(raw, Mapping):
            check.error(path, raw, "must be a mapping")
            continue
        name = check.string(raw, "name", path)
        if len(raw_ports) > 1 and not name:
            check.error((*path, "name"), None, "required when the Service has several ports")
        elif name and not (DNS_LABEL.match(name) and len(name) <= 63):
            check.error((*path, "name"), name, "must be a DNS label")
        elif name in seen_names:
            check.error((*path, "name"), name, f"duplicate of spec.ports[{seen_names[name]}].name")
        seen_names.setdefault(name, index)
        protocol = check.choice(raw, "protocol", path, PROTOCOLS) or Protocol.TCP
        port = check.port_number(raw, "port", path, required=True)
        if port and (port, protocol) in seen_ports:
            other = seen_ports[port, protocol]
            check.error((*path, "port"), port, f"duplicate of spec.ports[{other}] ({protocol})")
        seen_ports.setdefault((port, protocol), index)
        _check_target_port(check, raw, path)
        node_port = check.port_number(raw, "nodePort", path, required=False)
        if node_port and not node_ports_allowed:
            check.error(
                (*path, "nodePort"),
                node_port,
                f"may not be set for a Service of type {service_type}",
            )
            node_port = 0
        if node_port and (node_port, protocol) in seen_node_ports:
            other = seen_node_ports[node_port, protocol]
            check.error(
                (*path, "nodePort"), node_port, f"duplicate of spec.ports[{other}].nodePort"
            )
        if node_port:
            seen_node_ports.setdefault((node_port, protocol), index)
        parsed.append((name, protocol, port, node_port))

    check.raise_if_any()
    ports = tuple(
        ServicePort(
            name=ServicePortName(check.namespace, check.name, name, protocol),
            cluster_ips=cluster_ips,
            port=port,
            protocol=protocol,
            affinity_timeout=affinity,
            internal_traffic_policy=internal_policy,
            external_traffic_policy=external_policy,
            type=service_type,
            node_port=node_port,
            external_ips=external_ips,
            load_balancer_ips=lb_ips,
            traffic_distribution=distribution,
            health_check_node_port=health_check_port,
            load_balancer_source_ranges=source_ranges,
            created=created,
        )
        for name, protocol, port, node_port in parsed
    )
    return Service(check.namespace, check.name, ports)


def _cluster_ips(check: _Checker, spec: Mapping[str, Any]) -> tuple[IPAddress, ...]:
    """spec.clusterIP / clusterIPs / ipFamilies / ipFamilyPolicy, checked against each other."""
    single = check.string(spec, "clusterIP", ("spec",))
    listed = check.sequence(spec, "clusterIPs", ("spec",))
    if listed and single and listed[0] != single:
        check.error(("spec", "clusterIPs", 0), listed[0], f"must equal spec.clusterIP {single!r}")
    paths: list[FieldPath]
    if listed:
        raw, paths = listed, [("spec", "clusterIPs", i) for i in range(len(listed))]
    elif single:
        raw, paths = [single], [("spec", "clusterIP")]
    else:
        # The API server allocates one; from a manifest, nothing ever will.
        check.error(("spec", "clusterIP"), None, "required (no allocator assigns one here)")
        return ()
    ips: list[IPAddress] = []
    for text, path in zip(raw, paths, strict=True):
        ip = check.ip(text)
        if ip is None:
            check.error(path, text, "not a valid IP address")
        else:
            ips.append(ip)
    if len(raw) > 2:
        check.error(("spec", "clusterIPs"), raw, "at most two, one per IP family")
    elif len(ips) == 2 and ips[0].version == ips[1].version:
        check.error(("spec", "clusterIPs"), raw, "a dual-stack pair needs one IPv4 and one IPv6")

    families = check.sequence(spec, "ipFamilies", ("spec",))
    for index, family_name in enumerate(families):
        family = FAMILY_NAMES.get(family_name) if isinstance(family_name, str) else None
        path = ("spec", "ipFamilies", index)
        if family is None:
            check.error(path, family_name, "must be IPv4 or IPv6")
        elif index < len(raw) and (ip := check.ip(raw[index])) is not None and ip.version != family:
            check.error(
                path, family_name, f"family mismatch: ClusterIP {raw[index]} is IPv{ip.version}"
            )
    if families and len(families) != len(raw):
        check.error(
            ("spec", "ipFamilies"), families, f"must list one family per ClusterIP ({len(raw)})"
        )
    policy = check.choice(
        spec,
        "ipFamilyPolicy",
        ("spec",),
        {"SingleStack": 1, "PreferDualStack": 0, "RequireDualStack": 2},
    )
    if policy == 1 and len(raw) > 1:
        check.error(("spec", "ipFamilyPolicy"), "SingleStack", "SingleStack with two ClusterIPs")
    elif policy == 2 and len(raw) < 2:
        check.error(("spec", "ipFamilyPolicy"), "RequireDualStack", "needs two ClusterIPs")
    return tuple(ips)


def _ip_list(
    check: _Checker, parent: Mapping[str, Any], key: str, path: FieldPath
) -> tuple[IPAddress, ...]:
    out: list[IPAddress] = []
    for index, text in enumerate(check.sequence(parent, key, path)):
        ip = check.ip(text)
        if ip is None:
            check.error((*path, key, index), text, "not a valid IP address")
        elif ip not in out:
            out.append(ip)
    return tuple(out)


def _source_ranges(
    check: _Checker, spec: Mapping[str, Any], service_type: ServiceType
) -> tuple[IPNetwork, ...]:
    """spec.loadBalancerSourceRanges: CIDRs (host bits allowed and masked, surrounding
    whitespace trimmed, as the API server and kube-proxy parse them), for type LoadBalancer."""
    raw = check.sequence(spec, "loadBalancerSourceRanges", ("spec",))
    if raw and service_type is not ServiceType.LOAD_BALANCER:
        check.error(
            ("spec", "loadBalancerSourceRanges"), raw, "may only be set for type LoadBalancer"
        )
        return ()
    out: list[IPNetwork] = []
    for index, text in enumerate(raw):
        network = parse_cidr(text)
        if network is None:
            check.error(
                ("spec", "loadBalancerSourceRanges", index),
                text,
                "not a valid CIDR (e.g. 10.0.0.0/8)",
            )
        elif network not in out:
            out.append(network)
    return tuple(out)


def parse_cidr(text: object) -> IPNetwork | None:
    if not isinstance(text, str) or "/" not in text or "%" in text:
        return None
    address, _, length = text.strip().partition("/")
    if parse_ip(address) is None or not length.isdigit():
        return None
    try:
        return ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        return None


def _load_balancer_ips(check: _Checker, obj: Mapping[str, Any]) -> tuple[IPAddress, ...]:
    status = check.mapping(obj, "status", ())
    lb = check.mapping(status, "loadBalancer", ("status",))
    out: list[IPAddress] = []
    for index, ingress in enumerate(check.sequence(lb, "ingress", ("status", "loadBalancer"))):
        path: FieldPath = ("status", "loadBalancer", "ingress", index)
        if not isinstance(ingress, Mapping):
            check.error(path, ingress, "must be a mapping")
            continue
        mode = check.choice(ingress, "ipMode", path, {"VIP": "VIP", "Proxy": "Proxy"})
        text = ingress.get("ip")
        if text is None:
            continue  # a hostname-only ingress has no address to program
        ip = check.ip(text)
        if ip is None:
            check.error((*path, "ip"), text, "not a valid IP address")
        elif mode != "Proxy" and ip not in out:
            # ipMode Proxy: the load balancer proxies, so nodes must not capture the VIP.
            out.append(ip)
    return tuple(out)


def _check_target_port(check: _Checker, raw: Mapping[str, Any], path: FieldPath) -> None:
    target = raw.get("targetPort")
    if target is None:
        return
    if isinstance(target, str):
        if not valid_named_port(target):
            check.error((*path, "targetPort"), target, "must be a port number or an IANA port name")
    else:
        check.port_number(raw, "targetPort", path, required=False)


def valid_named_port(name: str) -> bool:
    """An IANA service name, as a named targetPort must be."""
    return len(name) <= 15 and bool(_IANA_SVC_NAME.match(name)) and bool(_HAS_LETTER.search(name))


_HAS_LETTER = re.compile("[a-z]")


def convert_endpoint_slice(
    obj: Mapping[str, Any],
    *,
    location: SourceLocation | None = None,
    ips: ParsedIPs | None = None,
) -> EndpointSlice:
    """A discovery.k8s.io/v1 EndpointSlice into an ``EndpointSlice`` of per-port endpoints.

    Raises ``InvalidObjectError`` with every bad field. An FQDN slice converts to one
    without ports (nothing to program).
    """
    check = _Checker("EndpointSlice", location, ips)
    meta = check.metadata(obj, DNS_SUBDOMAIN)
    labels = meta.get("labels") or {}
    service = labels.get(SERVICE_NAME_LABEL)
    if not isinstance(service, str) or not service:
        check.error(
            ("metadata", "labels", SERVICE_NAME_LABEL), service, "required: the Service name"
        )
        service = ""
    address_type = obj.get("addressType")
    family: IPFamily | None = None
    if address_type == "FQDN":
        check.raise_if_any()
        return EndpointSlice(check.namespace, check.name, service)
    if isinstance(address_type, str) and address_type in FAMILY_NAMES:
        family = FAMILY_NAMES[address_type]
    else:
        check.error(("addressType",), address_type, "must be IPv4, IPv6 or FQDN")

    port_specs: list[tuple[str, Protocol, int]] = []
    seen: dict[tuple[str, Protocol], int] = {}
    for index, raw in enumerate(check.sequence(obj, "ports", ())):
        path: FieldPath = ("ports", index)
        if not isinstance(raw, Mapping):
            check.error(path, raw, "must be a mapping")
            continue
        name = check.string(raw, "name", path)
        protocol = check.choice(raw, "protocol", path, PROTOCOLS) or Protocol.TCP
        port = check.port_number(raw, "port", path, required=True)
        if (name, protocol) in seen:
            check.error((*path, "name"), name, f"duplicate of ports[{seen[name, protocol]}]")
        seen.setdefault((name, protocol), index)
        port_specs.append((name, protocol, port))

    # Each endpoint without its port: (ip, ready, serving, terminating, node, zone, hints).
    bases: list[tuple[Any, ...]] = []
    for index, raw in enumerate(check.sequence(obj, "endpoints", ())):
        base = _plain_endpoint(raw, family, check.ip)
        if base is not None:
            bases.append(base)
            continue
        path = ("endpoints", index)
        if not isinstance(raw, Mapping):
            check.error(path, raw, "must be a mapping")
            continue
        addresses = check.sequence(raw, "addresses", path)
        if not addresses:
            check.error(
                (*path, "addresses"), raw.get("addresses"), "at least one address is required"
            )
            continue
        # kube-proxy uses the first address only; the API requires exactly one.
        text = addresses[0]
        ip = check.ip(text)
        if ip is None:
            check.error((*path, "addresses", 0), text, "not a valid IP address")
            continue
        if family is not None and ip.version != family:
            check.error(
                (*path, "addresses", 0), text, f"family mismatch: addressType is {address_type}"
            )
            continue
        conditions = check.mapping(raw, "conditions", path)
        cpath = (*path, "conditions")
        ready = check.boolean(conditions, "ready", cpath, True)
        serving = check.boolean(conditions, "serving", cpath, True)
        terminating = check.boolean(conditions, "terminating", cpath, False)
        node_name = check.string(raw, "nodeName", path) or None
        zone = check.string(raw, "zone", path) or None
        hints = check.mapping(raw, "hints", path)
        hint_zones = _hint_names(check, hints, "forZones", (*path, "hints"))
        hint_nodes = _hint_names(check, hints, "forNodes", (*path, "hints"))
        bases.append((ip, ready, serving, terminating, node_name, zone, hint_zones, hint_nodes))

    check.raise_if_any()
    slice_ports = tuple(
        SlicePort(name, protocol, tuple(Endpoint(base[0], port, *base[1:]) for base in bases))
        for name, protocol, port in port_specs
    )
    return EndpointSlice(
        check.namespace, check.name, service, slice_ports, _trigger_time(check, meta)
    )


NO_NAMES: frozenset[str] = frozenset()


def _plain_endpoint(
    raw: object, family: IPFamily | None, parse: Callable[[object], IPAddress | None]
) -> tuple[Any, ...] | None:
    """The endpoint's base tuple (as the checked loop of ``convert_endpoint_slice`` makes
    it) when it is plainly valid: plain dicts, an address of the slice's family, booleans
    and strings where they belong, no hints. None for anything else, which the checked
    loop then examines and reports. (Most endpoints of a list look like this; going
    through the checker's getters costs several times more.)"""
    if type(raw) is not dict:
        return None
    addresses = raw.get("addresses")
    if type(addresses) is not list or not addresses:
        return None
    ip = parse(addresses[0])
    if ip is None or family is None or ip.version != family:
        return None
    conditions = raw.get("conditions")
    ready: object = True
    serving: object = True
    terminating: object = False
    if type(conditions) is dict:
        ready = conditions.get("ready", True)
        serving = conditions.get("serving", True)
        terminating = conditions.get("terminating", False)
        # (an explicit null is left to the checker, which reads it as the default)
        if type(ready) is not bool or type(serving) is not bool or type(terminating) is not bool:
            return None
    elif conditions is not None:
        return None
    node_name = raw.get("nodeName")
    zone = raw.get("zone")
    if node_name is not None and type(node_name) is not str:
        return None
    if zone is not None and type(zone) is not str:
        return None
    hints = raw.get("hints")
    if hints is not None and (type(hints) is not dict or hints):
        return None
    return (ip, ready, serving, terminating, node_name or None, zone or None, NO_NAMES, NO_NAMES)


def parse_time(text: object) -> float | None:
    """Unix seconds of an RFC 3339 time (``2024-05-01T10:00:00.123456789Z``), else None.

    YAML reads an unquoted time as a timestamp (kubectl turns it back into the string): one
    with its offset is taken as well."""
    if isinstance(text, datetime):
        return text.timestamp() if text.tzinfo is not None else None
    if not isinstance(text, str) or not _RFC3339.match(text):
        return None
    try:  # (nanoseconds are cut to Python's microseconds)
        return datetime.fromisoformat(text).timestamp()
    except ValueError:  # a well-formed but impossible date (month 13)
        return None


def _creation_time(check: _Checker, meta: Mapping[str, Any]) -> float | None:
    """metadata.creationTimestamp as Unix seconds (None when not given): it decides which of
    two Services claiming one port keeps it, so a malformed one is an error."""
    value = meta.get("creationTimestamp")
    if value is None:
        return None
    created = parse_time(value)
    if created is None:
        check.error(
            ("metadata", "creationTimestamp"), value, "must be an RFC 3339 time with an offset"
        )
    return created


def _trigger_time(check: _Checker, meta: Mapping[str, Any]) -> float | None:
    """The slice's trigger time; a malformed one is logged and ignored, as kube-proxy does:
    it feeds a metric only, so the slice's endpoints are used all the same."""
    annotations = meta.get("annotations")
    if not isinstance(annotations, Mapping) or TRIGGER_TIME_ANNOTATION not in annotations:
        return None
    return trigger_time(check.namespace, check.name, annotations[TRIGGER_TIME_ANNOTATION])


def trigger_time(namespace: str, name: str, value: object) -> float | None:
    """The trigger-time annotation's ``value`` of slice namespace/name as Unix seconds; None
    (and a warning) for a malformed one."""
    parsed = parse_time(value)
    if parsed is None:
        log.warning(
            "EndpointSlice %s/%s: annotation %s=%r is not an RFC 3339 time; ignored",
            namespace,
            name,
            TRIGGER_TIME_ANNOTATION,
            value,
        )
    return parsed


def _hint_names(
    check: _Checker, hints: Mapping[str, Any], key: str, path: FieldPath
) -> frozenset[str]:
    names = []
    for index, entry in enumerate(check.sequence(hints, key, path)):
        name = entry.get("name") if isinstance(entry, Mapping) else None
        if not isinstance(name, str) or not name:
            check.error((*path, key, index, "name"), name, "required, a string")
        else:
            names.append(name)
    # Most endpoints have no hints: one shared empty set (each frozenset() is a new
    # collector-tracked object, two per endpoint)
    return frozenset(names) if names else NO_NAMES
