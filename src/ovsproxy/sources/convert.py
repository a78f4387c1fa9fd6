"""The one converter: Services and EndpointSlices, as the Structs of ``schema``, into model
values, with validation.

Pure functions. ``service_value`` and ``slice_value`` run every check of an object and tell
each failure to a ``report.Report`` (field path, value, why), which refuses the object
(``InvalidObjectError``, naming kind, namespace/name and each field) at the first bad field
(the agent's API path) or with all of them (manifests, ``ovsproxy check``). Dicts (a
manifest's objects) go in through ``structure`` (``msgspec.convert``, every field of the
wrong type named): ``convert_service`` and ``convert_endpoint_slice`` report every bad
field at once.

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
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from sys import intern
from typing import Any, TypeVar

import msgspec

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
from ovsproxy.model.problems import FieldPath, SourceLocation
from ovsproxy.sources.report import Report
from ovsproxy.sources.schema import (
    DEFAULT_NAMESPACE,
    EndpointSpec,
    Hint,
    ServiceMeta,
    ServiceObject,
    ServiceSpec,
    ServiceStatus,
    SliceMeta,
    SliceObject,
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
    """``parse_ip`` for a string, unmemoized. An IPv4-mapped IPv6 address (``::ffff:1.2.3.4``)
    is the IPv4 address it maps, as Go's ``net.ParseIP`` reads it (kube-apiserver validates
    and kube-proxy programs it as IPv4): ``::ffff:127.0.0.1`` is loopback, not an IPv6 one."""
    if ":" not in text:
        return parse_ipv4(text)
    if text != text.strip() or "%" in text:
        return None
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    mapped = ip.ipv4_mapped  # type: ignore[union-attr]  # text with ":" is IPv6
    return mapped if mapped is not None else ip


def special_ip(ip: IPAddress) -> str | None:
    """Why kube-apiserver refuses ``ip`` as an endpoint address or an external IP
    (``ValidateNonSpecialIP`` in pkg/apis/core/validation, its messages), or None.

    Unspecified and loopback addresses are nonsensical as a destination, and link-local ones
    are the node's own (169.254.169.254 is the cloud metadata service): steered for a
    Service, they would take the node's own traffic."""
    if ip.version == 4:
        n = int(ip)
        if n == 0:
            return f"may not be unspecified ({ip})"
        if n >> 24 == 127:
            return LOOPBACK_RANGE
        if n >> 16 == 0xA9FE:
            return LINK_LOCAL_RANGE
        if n >> 8 == 0xE00000:
            return LINK_LOCAL_MULTICAST_RANGE
        return None
    if ip.is_unspecified:
        return f"may not be unspecified ({ip})"
    if ip.is_loopback:
        return LOOPBACK_RANGE
    if ip.is_link_local:
        return LINK_LOCAL_RANGE
    if int(ip) >> 112 & 0xFF0F == 0xFF02:  # Go's IsLinkLocalMulticast: ff02::/16, any flags
        return LINK_LOCAL_MULTICAST_RANGE
    return None


# -- why a field is wrong: one sentence per rule, for the converter and ``structure`` alike --

PORT_NUMBER = "must be a port number between 1 and 65535"
AFFINITY_TIMEOUT = f"must be between 1 and {MAX_AFFINITY_TIMEOUT} seconds"
NOT_AN_IP = "not a valid IP address"
LOOPBACK_RANGE = "may not be in the loopback range (127.0.0.0/8, ::1/128)"
LINK_LOCAL_RANGE = "may not be in the link-local range (169.254.0.0/16, fe80::/10)"
LINK_LOCAL_MULTICAST_RANGE = (
    "may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)"
)
NOT_A_CIDR = "not a valid CIDR (e.g. 10.0.0.0/8)"
A_FAMILY = "must be IPv4 or IPv6"
ADDRESS_TYPE = "must be IPv4, IPv6 or FQDN"
DNS_LABEL_WHY = "must be a DNS label"
OBJECT_NAME = "required, a lower-case DNS name"
LABELS = "must map strings to strings"
SPEC = "required, a mapping"
SERVICE_PORTS = "required, a list of at least one port"
HINT_NAME = "required, a string"
TARGET_PORT = "must be a port number or an IANA port name"
AFFINITIES = {"None": 0, "ClientIP": 1}
FAMILY_POLICIES = {"SingleStack": 1, "PreferDualStack": 0, "RequireDualStack": 2}
INGRESS_MODES = {"VIP": "VIP", "Proxy": "Proxy"}


def one_of(choices: Mapping[str, Any]) -> str:
    return f"must be one of {', '.join(choices)}"


# -- dicts into the Structs, naming every field of the wrong type ---------------------------

_Struct = TypeVar("_Struct", ServiceObject, SliceObject)

# Why a field of the wrong type is wrong, by its key (the same words the converter uses for
# a bad value of the right type), else by the type expected.
_WHY_BY_KEY = {
    "port": PORT_NUMBER,
    "nodePort": PORT_NUMBER,
    "targetPort": PORT_NUMBER,
    "healthCheckNodePort": PORT_NUMBER,
    "timeoutSeconds": AFFINITY_TIMEOUT,
    "type": one_of(SERVICE_TYPES),
    "protocol": one_of(PROTOCOLS),
    "sessionAffinity": one_of(AFFINITIES),
    "internalTrafficPolicy": one_of(TRAFFIC_POLICIES),
    "externalTrafficPolicy": one_of(TRAFFIC_POLICIES),
    "trafficDistribution": one_of(TRAFFIC_DISTRIBUTIONS),
    "ipFamilyPolicy": one_of(FAMILY_POLICIES),
    "ipMode": one_of(INGRESS_MODES),
    "addressType": ADDRESS_TYPE,
    "labels": LABELS,
    "spec": SPEC,
    "ip": NOT_AN_IP,
}
_WHY_BY_LIST = {  # an item of these lists
    "clusterIPs": NOT_AN_IP,
    "externalIPs": NOT_AN_IP,
    "addresses": NOT_AN_IP,
    "ipFamilies": A_FAMILY,
    "loadBalancerSourceRanges": NOT_A_CIDR,
}
_WHY_BY_TYPE = {
    "object": "must be a mapping",
    "array": "must be a list",
    "bool": "must be true or false",
    "str": "must be a string",
}
_ERROR_AT = re.compile(
    r"Expected `([^`| ]*)[^`]*`(?:, got `[^`]*`)?(?: - at (`key` in )?`\$([^`]*)`)?\Z"
)
_PATH_PART = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")
# How often one value is converted again after mending: each round mends one of its fields,
# or every item of one of its lists, for good, and a Struct here has at most 15 fields.
_MEND_ROUNDS = 100


def structure(obj: Mapping[str, Any], cls: type[_Struct], report: Report) -> _Struct:
    """``obj`` (a YAML or JSON object as dicts) as a ``cls``. A field of the wrong type is
    left to ``report`` (``typed``, reported when the converter comes to it) and read as
    missing (an item of a list: as an empty one), so every such field is named at once.

    Linear in the object's size however many fields are wrong: msgspec names one error per
    conversion, so once an error lies in a list, every item of that list is converted (and
    mended) on its own, and the whole is converted again once per mended field or list, not
    once per bad item (which made 20,000 bad endpoints quadratic)."""
    try:
        return msgspec.convert(obj, cls)
    except msgspec.ValidationError:
        pass
    box: list[Any] = [_copied(obj)]  # (only a broken object is copied)
    mend = _Mending(report.kind)
    mend(box, 0, cls, ())
    report.typed.extend(mend.typed)
    report.covered = frozenset(mend.covered)
    return msgspec.convert(box[0], cls)


class _Mending:
    """One object's mending: the fields of the wrong type found, reported later (``typed``)
    and read as missing (``covered``)."""

    __slots__ = ("covered", "field_types", "kind", "typed")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.typed: list[tuple[FieldPath, Any, str]] = []
        self.covered: list[FieldPath] = []
        # Each Struct's fields by their names in the object (``msgspec.structs.fields``
        # evaluates annotations: too slow to ask once per bad item).
        self.field_types: dict[Any, dict[str, Any]] = {}

    def __call__(self, parent: Any, key: str | int, tp: Any, path: FieldPath) -> None:
        """Make ``parent[key]`` (at ``path``) convert as ``tp``."""
        for _ in range(_MEND_ROUNDS):
            try:
                msgspec.convert(parent[key], tp)
            except msgspec.ValidationError as exc:
                error = str(exc)
            else:
                return
            found = _ERROR_AT.match(error)
            if found is None:
                raise ValueError(f"{self.kind} does not fit its schema: {error}")
            expected, in_key, text = found.groups()
            rel: list[str | int] = []
            for name, index in _PATH_PART.findall(text or ""):
                if name:
                    rel.append(name)
                elif index == "...":  # a value in a map: the map (only labels are typed maps)
                    break
                else:
                    rel.append(int(index))
            value = parent[key]
            where: FieldPath = (*path, *rel)
            if in_key and (not where or where[-1] != "labels"):
                # A key that is no string: no field the Structs declare, so ignored.
                target = _walk(value, rel)
                for name in [name for name in target if not isinstance(name, str)]:
                    del target[name]
            elif not rel:
                if not path:
                    raise ValueError(f"{self.kind} does not fit its schema: {error}")
                self._wrong(parent, key, path, value, expected)
                return
            elif (first := _first_index(rel)) is None:
                self(_walk(value, rel[:-1]), rel[-1], self._type_at(tp, rel), where)
            else:
                items = _walk(value, rel[:first])
                item_type = self._type_at(tp, rel[: first + 1])
                for index in range(len(items)):
                    self(items, index, item_type, (*path, *rel[:first], index))
        raise ValueError(f"{self.kind} does not fit its schema: {error}")  # pragma: no cover

    def _wrong(
        self, parent: Any, key: str | int, path: FieldPath, value: Any, expected: str
    ) -> None:
        """``parent[key]`` is of the wrong type: told, and read as missing (an item of a
        list as an empty one)."""
        if type(key) is int and path[-2] in ("forZones", "forNodes"):
            self.typed.append(((*path, "name"), None, HINT_NAME))  # as the API says
        else:
            self.typed.append((path, value, _why(path, expected)))
        self.covered.append(path)
        if type(key) is int:
            parent[key] = {} if expected == "object" else ""
        else:
            del parent[key]

    def _type_at(self, tp: Any, path: Sequence[str | int]) -> Any:
        """The type the schema gives the field at ``path`` of a ``tp``."""
        for part in path:
            if typing.get_origin(tp) in (typing.Union, types.UnionType):  # X | None
                tp = next(arg for arg in typing.get_args(tp) if arg is not type(None))
            if isinstance(part, int):
                (tp,) = typing.get_args(tp)  # list[X]
                continue
            fields = self.field_types.get(tp)
            if fields is None:
                fields = {f.encode_name: f.type for f in msgspec.structs.fields(tp)}
                self.field_types[tp] = fields
            tp = fields[part]
        return tp


def _first_index(path: Sequence[str | int]) -> int | None:
    return next((at for at, part in enumerate(path) if type(part) is int), None)


def _walk(value: Any, path: Sequence[str | int]) -> Any:
    for part in path:
        value = value[part]
    return value


def _copied(value: Any) -> Any:
    """``value``'s dicts and lists, copied; unlike deepcopy, a YAML alias's one object read
    twice is copied twice (each place is checked, and mended, on its own)."""
    if isinstance(value, dict):
        return {key: _copied(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copied(item) for item in value]
    return value


def _why(path: FieldPath, expected: str) -> str:
    last = path[-1]
    if type(last) is int:
        why = _WHY_BY_LIST.get(str(path[-2]))
    elif last == "name" and path[0] == "metadata":
        why = OBJECT_NAME
    elif last == "namespace":
        why = DNS_LABEL_WHY
    elif last == "ports" and path[0] == "spec":
        why = SERVICE_PORTS
    else:
        why = _WHY_BY_KEY.get(str(last))
    return why or _WHY_BY_TYPE.get(expected, f"must be of type {expected}")


# -- the one converter: Structs into model values, every check reported to ``report`` --------


class Namespaces:
    """The namespaces a codec has found valid, each checked once (a cluster has few)."""

    __slots__ = ("_valid",)

    def __init__(self) -> None:
        self._valid: set[str] = set()

    def valid(self, namespace: str) -> bool:
        valid = self._valid
        if namespace in valid:
            return True
        if not (DNS_LABEL.match(namespace) and len(namespace) <= 63):
            return False
        if len(valid) < 4096:
            valid.add(intern(namespace))
        return True


_NO_SERVICE_META = ServiceMeta()
_NO_SLICE_META = SliceMeta()
_IPFn = Callable[[str], IPAddress | None]


def _metadata(
    meta: ServiceMeta | SliceMeta,
    report: Report,
    name_pattern: re.Pattern[str],
    namespaces: Namespaces | None,
) -> tuple[str, str]:
    """The object's (namespace, name), checked; told to ``report`` for its errors."""
    name, namespace = meta.name, meta.namespace
    report.name = name or ""
    report.namespace = namespace if namespace is not None else ""
    if report.typed:
        report.typed_bad(("metadata",))
    if namespace is not None and (
        namespaces.valid(namespace)
        if namespaces is not None
        else DNS_LABEL.match(namespace) and len(namespace) <= 63
    ):
        namespace = report.namespace = intern(namespace)
    else:
        report.namespace = str(namespace)
        report.bad(("metadata", "namespace"), namespace, DNS_LABEL_WHY)
        namespace = report.namespace
    if name is None or not (name_pattern.match(name) and len(name) <= 253):
        report.bad(("metadata", "name"), name, OBJECT_NAME)
        name = name or ""
    return namespace, name


def ignored_reason(obj: ServiceObject, service_proxy_name: str | None = None) -> str | None:
    """Why a proxy named ``service_proxy_name`` (None: kube-proxy's default, no name) would
    not program this Service, or None when it would (``proxy_label_selector``'s rule)."""
    meta = obj.metadata
    labels = meta.labels if meta is not None and meta.labels is not None else {}
    if labels:
        proxy = labels.get(SERVICE_PROXY_NAME_LABEL)
        if service_proxy_name and proxy != service_proxy_name:
            if proxy is None:
                return f"not labelled {SERVICE_PROXY_NAME_LABEL}={service_proxy_name}"
            return f"handled by proxy {proxy!r}"
        if not service_proxy_name and SERVICE_PROXY_NAME_LABEL in labels:
            return f"handled by proxy {proxy!r}"
        if HEADLESS_LABEL in labels:
            return f"labelled {HEADLESS_LABEL}"
    elif service_proxy_name:
        return f"not labelled {SERVICE_PROXY_NAME_LABEL}={service_proxy_name}"
    spec = obj.spec
    if spec is None:
        return None
    if spec.type == "ExternalName":
        return "ExternalName"
    if spec.cluster_ip == "None" or (spec.cluster_ips and spec.cluster_ips[0] == "None"):
        return "headless"
    return None


def _choice(value: str | None, choices: Mapping[str, Any], report: Report, path: FieldPath) -> Any:
    """The choice ``value`` names; None when not given (or not one of them: reported)."""
    if value is None:
        return None
    found = choices.get(value)
    if found is None:
        report.bad(path, value, one_of(choices))
    return found


def service_value(
    obj: ServiceObject,
    report: Report,
    *,
    service_proxy_name: str | None = None,
    namespaces: Namespaces | None = None,
    ip: _IPFn = parse_ip_text,
) -> Service:
    """A v1 Service into a ``Service`` with one ``ServicePort`` per port; its bad fields told
    to ``report``, which refuses it (``InvalidObjectError``). An ignored Service (see
    ``ignored_reason``) converts to one with no ports after its metadata is checked."""
    meta = obj.metadata or _NO_SERVICE_META
    namespace, name = _metadata(meta, report, DNS1035_LABEL, namespaces)
    created = None
    if meta.creation_timestamp is not None:
        # It decides which of two Services claiming one port keeps it: a malformed one is
        # an error.
        created = parse_time(meta.creation_timestamp)
        if created is None:
            report.bad(
                ("metadata", "creationTimestamp"),
                meta.creation_timestamp,
                "must be an RFC 3339 time with an offset",
            )
    if ignored_reason(obj, service_proxy_name) is not None:
        report.done()
        return Service(namespace, name)
    spec = obj.spec
    if report.typed:
        if spec is None or spec.session_affinity != "ClientIP":
            report.drop_typed(("spec", "sessionAffinityConfig"))
        report.typed_bad()
    if spec is None:
        report.bad(("spec",), None, SPEC)
        report.done()
        raise AssertionError  # unreachable: an error was just reported

    service_type = (
        _choice(spec.type, SERVICE_TYPES, report, ("spec", "type")) or ServiceType.CLUSTER_IP
    )
    cluster_ips = _cluster_ips(spec, report, ip)
    external_ips = _ip_list(spec.external_ips, report, ("spec", "externalIPs"), ip, special=True)
    lb_ips = _load_balancer_ips(obj.status, report, ip)
    affinity = _choice(spec.session_affinity, AFFINITIES, report, ("spec", "sessionAffinity"))
    if affinity:
        config = spec.session_affinity_config
        client_ip = config.client_ip if config is not None else None
        timeout = client_ip.timeout_seconds if client_ip is not None else None
        if timeout is None:
            affinity = DEFAULT_AFFINITY_TIMEOUT
        elif 0 < timeout <= MAX_AFFINITY_TIMEOUT:
            affinity = timeout
        else:
            report.bad(
                ("spec", "sessionAffinityConfig", "clientIP", "timeoutSeconds"),
                timeout,
                AFFINITY_TIMEOUT,
            )
    affinity = affinity or 0
    policies = TRAFFIC_POLICIES
    internal_policy = (
        _choice(spec.internal_traffic_policy, policies, report, ("spec", "internalTrafficPolicy"))
        or TrafficPolicy.CLUSTER
    )
    external_policy = (
        _choice(spec.external_traffic_policy, policies, report, ("spec", "externalTrafficPolicy"))
        or TrafficPolicy.CLUSTER
    )
    distribution = _choice(
        spec.traffic_distribution, TRAFFIC_DISTRIBUTIONS, report, ("spec", "trafficDistribution")
    )
    source_ranges = _source_ranges(spec.load_balancer_source_ranges, service_type, report)
    health_check_port = spec.health_check_node_port or 0
    if health_check_port:
        if not 1 <= health_check_port <= 65535:
            report.bad(("spec", "healthCheckNodePort"), health_check_port, PORT_NUMBER)
            health_check_port = 0
        elif not (
            service_type is ServiceType.LOAD_BALANCER and external_policy is TrafficPolicy.LOCAL
        ):
            # The API server's rule; kube-proxy serves it only for such a Service.
            report.bad(
                ("spec", "healthCheckNodePort"),
                health_check_port,
                "may only be set for type LoadBalancer with externalTrafficPolicy Local",
            )
            health_check_port = 0

    raw_ports = spec.ports
    if not raw_ports:
        report.bad(("spec", "ports"), raw_ports, SERVICE_PORTS)
        raw_ports = []
    node_ports_allowed = service_type in (ServiceType.NODE_PORT, ServiceType.LOAD_BALANCER)
    several = len(raw_ports) > 1
    seen_names: dict[str, int] = {}
    seen_ports: dict[tuple[int, Protocol], int] = {}
    seen_node_ports: dict[tuple[int, Protocol], int] = {}
    ports: list[ServicePort] = []
    for index, raw in enumerate(raw_ports):
        port_name = raw.name or ""
        if not port_name:
            if several:
                report.bad(
                    ("spec", "ports", index, "name"),
                    None,
                    "required when the Service has several ports",
                )
        elif not (len(port_name) <= 63 and DNS_LABEL.match(port_name)):
            report.bad(("spec", "ports", index, "name"), port_name, DNS_LABEL_WHY)
        elif port_name in seen_names:
            report.bad(
                ("spec", "ports", index, "name"),
                port_name,
                f"duplicate of spec.ports[{seen_names[port_name]}].name",
            )
        else:
            port_name = intern(port_name)
        seen_names.setdefault(port_name, index)
        protocol = PROTOCOLS.get(raw.protocol or "TCP")
        if protocol is None:
            report.bad(("spec", "ports", index, "protocol"), raw.protocol, one_of(PROTOCOLS))
            protocol = Protocol.TCP
        port = raw.port
        if port is None:
            report.bad(("spec", "ports", index, "port"), None, "required")
            port = 0
        elif not 1 <= port <= 65535:
            report.bad(("spec", "ports", index, "port"), port, PORT_NUMBER)
            port = 0
        elif (port, protocol) in seen_ports:
            other = seen_ports[port, protocol]
            report.bad(
                ("spec", "ports", index, "port"),
                port,
                f"duplicate of spec.ports[{other}] ({protocol})",
            )
        seen_ports.setdefault((port, protocol), index)
        target = raw.target_port
        if target is not None:
            if type(target) is str:
                if not valid_named_port(target):
                    report.bad(("spec", "ports", index, "targetPort"), target, TARGET_PORT)
            elif not 1 <= target <= 65535:  # type: ignore[operator]
                report.bad(("spec", "ports", index, "targetPort"), target, PORT_NUMBER)
        node_port = raw.node_port or 0
        if node_port:
            if not 1 <= node_port <= 65535:
                report.bad(("spec", "ports", index, "nodePort"), node_port, PORT_NUMBER)
                node_port = 0
            elif not node_ports_allowed:
                report.bad(
                    ("spec", "ports", index, "nodePort"),
                    node_port,
                    f"may not be set for a Service of type {service_type}",
                )
                node_port = 0
            elif (node_port, protocol) in seen_node_ports:
                other = seen_node_ports[node_port, protocol]
                report.bad(
                    ("spec", "ports", index, "nodePort"),
                    node_port,
                    f"duplicate of spec.ports[{other}].nodePort",
                )
            else:
                seen_node_ports[node_port, protocol] = index
        ports.append(
            ServicePort(
                name=ServicePortName(namespace, name, port_name, protocol),
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
        )
    report.done()
    return Service(namespace, name, tuple(ports))


def _cluster_ips(spec: ServiceSpec, report: Report, parse: _IPFn) -> tuple[IPAddress, ...]:
    """spec.clusterIP / clusterIPs / ipFamilies / ipFamilyPolicy, checked against each other."""
    single = spec.cluster_ip or ""
    listed = spec.cluster_ips or []
    if listed and single and listed[0] != single:
        report.bad(("spec", "clusterIPs", 0), listed[0], f"must equal spec.clusterIP {single!r}")
    if listed:
        raw = listed
    elif single:
        raw = [single]
    else:
        # The API server allocates one; from a manifest, nothing ever will.
        report.bad(("spec", "clusterIP"), None, "required (no allocator assigns one here)")
        return ()
    parsed = [parse(text) for text in raw]
    for index, ip in enumerate(parsed):
        path: FieldPath = ("spec", "clusterIPs", index) if listed else ("spec", "clusterIP")
        if ip is None:
            report.bad(path, raw[index], NOT_AN_IP)
        elif (why := special_ip(ip)) is not None:
            # No allocator hands one out (none is in a Service range), and from the node's
            # own namespace it would take the node's traffic: refused as an external IP is.
            report.bad(path, raw[index], why)
            parsed[index] = None
    ips = tuple([ip for ip in parsed if ip is not None])
    if len(raw) > 2:
        report.bad(("spec", "clusterIPs"), raw, "at most two, one per IP family")
    elif len(ips) == 2 and ips[0].version == ips[1].version:
        report.bad(("spec", "clusterIPs"), raw, "a dual-stack pair needs one IPv4 and one IPv6")
    families = spec.ip_families
    if families:
        for index, family_name in enumerate(families):
            family = FAMILY_NAMES.get(family_name)
            if family is None:
                report.bad(("spec", "ipFamilies", index), family_name, A_FAMILY)
            elif index < len(raw) and (ip := parsed[index]) is not None and ip.version != family:
                report.bad(
                    ("spec", "ipFamilies", index),
                    family_name,
                    f"family mismatch: ClusterIP {raw[index]} is IPv{ip.version}",
                )
        if len(families) != len(raw):
            report.bad(
                ("spec", "ipFamilies"), families, f"must list one family per ClusterIP ({len(raw)})"
            )
    policy = _choice(spec.ip_family_policy, FAMILY_POLICIES, report, ("spec", "ipFamilyPolicy"))
    if policy == 1 and len(raw) > 1:
        report.bad(("spec", "ipFamilyPolicy"), "SingleStack", "SingleStack with two ClusterIPs")
    elif policy == 2 and len(raw) < 2:
        report.bad(("spec", "ipFamilyPolicy"), "RequireDualStack", "needs two ClusterIPs")
    return ips


def _ip_list(
    texts: list[str] | None, report: Report, path: FieldPath, parse: _IPFn, *, special: bool
) -> tuple[IPAddress, ...]:
    """Addresses, each once; with ``special``, refused as ``special_ip`` says."""
    if not texts:
        return ()
    out: list[IPAddress] = []
    for index, text in enumerate(texts):
        ip = parse(text)
        if ip is None:
            report.bad((*path, index), text, NOT_AN_IP)
        elif special and (why := special_ip(ip)) is not None:
            report.bad((*path, index), text, why)
        elif ip not in out:
            out.append(ip)
    return tuple(out)


def _source_ranges(
    texts: list[str] | None, service_type: ServiceType, report: Report
) -> tuple[IPNetwork, ...]:
    """spec.loadBalancerSourceRanges: CIDRs (host bits allowed and masked, surrounding
    whitespace trimmed, as the API server and kube-proxy parse them), for type LoadBalancer."""
    if not texts:
        return ()
    if service_type is not ServiceType.LOAD_BALANCER:
        report.bad(
            ("spec", "loadBalancerSourceRanges"), texts, "may only be set for type LoadBalancer"
        )
        return ()
    out: list[IPNetwork] = []
    for index, text in enumerate(texts):
        network = parse_cidr(text)
        if network is None:
            report.bad(("spec", "loadBalancerSourceRanges", index), text, NOT_A_CIDR)
        elif network not in out:
            out.append(network)
    return tuple(out)


def _load_balancer_ips(
    status: ServiceStatus | None, report: Report, parse: _IPFn
) -> tuple[IPAddress, ...]:
    lb = status.load_balancer if status is not None else None
    if lb is None or not lb.ingress:
        return ()
    out: list[IPAddress] = []
    for index, ingress in enumerate(lb.ingress):
        mode = None
        if ingress.ip_mode is not None:
            path = ("status", "loadBalancer", "ingress", index, "ipMode")
            mode = _choice(ingress.ip_mode, INGRESS_MODES, report, path)
        text = ingress.ip
        if text is None:
            continue  # a hostname-only ingress has no address to program
        ip = parse(text)
        if ip is None:
            report.bad(("status", "loadBalancer", "ingress", index, "ip"), text, NOT_AN_IP)
        elif mode != "Proxy" and ip not in out:
            # ipMode Proxy: the load balancer proxies, so nodes must not steer the VIP.
            out.append(ip)
    return tuple(out)


def slice_value(
    obj: SliceObject,
    report: Report,
    *,
    namespaces: Namespaces | None = None,
    ip: _IPFn | None = None,
) -> EndpointSlice:
    """A discovery.k8s.io/v1 EndpointSlice into an ``EndpointSlice`` of per-port endpoints;
    its bad fields told to ``report``, which refuses it (``InvalidObjectError``). An FQDN
    slice converts to one without ports (nothing to program)."""
    meta = obj.metadata or _NO_SLICE_META
    namespace, name = _metadata(meta, report, DNS_SUBDOMAIN, namespaces)
    labels = meta.labels
    service = labels.get(SERVICE_NAME_LABEL) if labels is not None else None
    if not service:
        report.bad(
            ("metadata", "labels", SERVICE_NAME_LABEL), service, "required: the Service name"
        )
        service = ""
    address_type = obj.address_type
    if address_type == "FQDN":
        report.done()
        return EndpointSlice(namespace, name, service)
    if report.typed:
        report.typed_bad()
    family = FAMILY_NAMES.get(address_type) if address_type is not None else None
    if family is None:
        report.bad(("addressType",), address_type, ADDRESS_TYPE)

    port_specs: list[tuple[str, Protocol, int]] = []
    seen: dict[tuple[str, Protocol], int] = {}
    for index, raw_port in enumerate(obj.ports or ()):
        port_name = intern(raw_port.name or "")
        protocol = PROTOCOLS.get(raw_port.protocol or "TCP")
        if protocol is None:
            report.bad(("ports", index, "protocol"), raw_port.protocol, one_of(PROTOCOLS))
            protocol = Protocol.TCP
        port = raw_port.port
        if port is None:
            # The API admits it ("all ports"); kube-proxy skips such a port, not the slice.
            continue
        if not 1 <= port <= 65535:
            report.bad(("ports", index, "port"), port, PORT_NUMBER)
            port = 0
        if (port_name, protocol) in seen:
            report.bad(
                ("ports", index, "name"),
                port_name,
                f"duplicate of ports[{seen[port_name, protocol]}]",
            )
        seen.setdefault((port_name, protocol), index)
        port_specs.append((port_name, protocol, port))

    # One Endpoint per port and address; every endpoint is checked, with or without ports.
    built: list[tuple[int, list[Endpoint]]] = [(port, []) for _, _, port in port_specs]
    parse: _IPFn = ip if ip is not None else parse_ipv4 if family == 4 else parse_ip_text
    # The family of each address is checked unless the parser gives no other.
    family_to_check = None if family is None or parse is parse_ipv4 else int(family)
    raw_endpoints = obj.endpoints or ()
    position = _Positions(raw_endpoints)
    for raw in raw_endpoints:
        addresses = raw.addresses
        if not addresses:
            path: FieldPath = ("endpoints", position(raw), "addresses")
            report.bad(path, addresses, "at least one address is required")
            continue
        # kube-proxy uses the first address only; the API requires exactly one.
        text = addresses[0]
        address = parse(text)
        if address is None or (family_to_check is not None and address.version != family_to_check):
            # (the IPv4 parser refuses an IPv6 address too: which is it?)
            if address is None and (family is None or parse_ip_text(text) is None):
                why = NOT_AN_IP
            else:
                why = f"family mismatch: addressType is {address_type}"
            report.bad(("endpoints", position(raw), "addresses", 0), text, why)
            continue
        if (special := special_ip(address)) is not None:
            report.bad(("endpoints", position(raw), "addresses", 0), text, special)
            continue
        conditions = raw.conditions
        if conditions is None:
            ready, serving, terminating = True, True, False
        else:
            ready = True if conditions.ready is None else conditions.ready
            serving = True if conditions.serving is None else conditions.serving
            terminating = False if conditions.terminating is None else conditions.terminating
        node_name = raw.node_name
        node_name = intern(node_name) if node_name else None
        zone = raw.zone
        zone = intern(zone) if zone else None
        hints = raw.hints
        if hints is None:
            hint_zones = hint_nodes = NO_NAMES
        else:
            hint_zones = _hint_names(hints.for_zones, report, position, raw, "forZones")
            hint_nodes = _hint_names(hints.for_nodes, report, position, raw, "forNodes")
        for port, endpoints in built:
            endpoints.append(
                Endpoint(
                    address,
                    port,
                    ready,
                    serving,
                    terminating,
                    node_name,
                    zone,
                    hint_zones,
                    hint_nodes,
                )
            )
    report.done()
    slice_ports = tuple(
        SlicePort(port_name, protocol, tuple(endpoints))
        for (port_name, protocol, _), (_, endpoints) in zip(port_specs, built, strict=True)
    )
    return EndpointSlice(
        namespace, name, service, slice_ports, _trigger_time(meta, namespace, name)
    )


class _Positions:
    """Where each item of ``items`` is, for an error's path only: the loop over many
    endpoints keeps no count, and the first error indexes the list once (a search per error
    made 20,000 bad endpoints quadratic)."""

    __slots__ = ("_at", "_items")

    def __init__(self, items: Sequence[object]) -> None:
        self._items = items
        self._at: dict[int, int] | None = None

    def __call__(self, item: object) -> int:
        if self._at is None:
            self._at = {id(other): index for index, other in enumerate(self._items)}
        return self._at[id(item)]


# Most endpoints have no hints: one shared empty set (each frozenset() is a new
# collector-tracked object, two per endpoint)
NO_NAMES: frozenset[str] = frozenset()


def _hint_names(
    entries: list[Hint] | None,
    report: Report,
    position: _Positions,
    endpoint: EndpointSpec,
    key: str,
) -> frozenset[str]:
    if not entries:
        return NO_NAMES
    names = []
    for index, entry in enumerate(entries):
        if entry.name:
            names.append(intern(entry.name))
        else:
            path = ("endpoints", position(endpoint), "hints", key, index, "name")
            report.bad(path, entry.name, HINT_NAME)
    return frozenset(names) if names else NO_NAMES


def _trigger_time(meta: SliceMeta, namespace: str, name: str) -> float | None:
    """The slice's trigger time; a malformed one is logged and ignored, as kube-proxy does:
    it feeds a metric only, so the slice's endpoints are used all the same."""
    annotations = meta.annotations
    if not isinstance(annotations, Mapping) or TRIGGER_TIME_ANNOTATION not in annotations:
        return None
    return trigger_time(namespace, name, annotations[TRIGGER_TIME_ANNOTATION])


# -- dicts (a manifest's objects): into the Structs, then the one converter ------------------


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
    """``ignored_reason`` of a Service given as dicts."""
    return ignored_reason(
        structure(obj, ServiceObject, Report("Service", every=True)), service_proxy_name
    )


def convert_service(
    obj: Mapping[str, Any],
    *,
    location: SourceLocation | None = None,
    service_proxy_name: str | None = None,
    ips: ParsedIPs | None = None,
) -> Service:
    """``service_value`` of a Service given as dicts, every bad field reported at once:
    raises ``InvalidObjectError`` with all of them."""
    report = Report("Service", every=True, location=location)
    return service_value(
        structure(obj, ServiceObject, report),
        report,
        service_proxy_name=service_proxy_name,
        ip=ips if ips is not None else parse_ip_text,
    )


def convert_endpoint_slice(
    obj: Mapping[str, Any],
    *,
    location: SourceLocation | None = None,
    ips: ParsedIPs | None = None,
) -> EndpointSlice:
    """``slice_value`` of an EndpointSlice given as dicts, every bad field reported at once:
    raises ``InvalidObjectError`` with all of them."""
    report = Report("EndpointSlice", every=True, location=location)
    return slice_value(structure(obj, SliceObject, report), report, ip=ips)


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


def valid_named_port(name: str) -> bool:
    """An IANA service name, as a named targetPort must be."""
    return len(name) <= 15 and bool(_IANA_SVC_NAME.match(name)) and bool(_HAS_LETTER.search(name))


_HAS_LETTER = re.compile("[a-z]")


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
