"""The API server's JSON straight into model values: lists and watch events of Services and
EndpointSlices decoded by msgspec into Structs of only the fields the proxy reads, then
converted from those Structs, so no dict of a whole object is ever built.

Unknown fields are skipped by the decoder (managedFields, targetRef, ownerReferences, and
fields of newer API versions). The Structs declare every field ``convert`` reads, with the
types a valid object has. Anything else goes to ``convert``'s dict path, which stays the one
that says what is wrong (every bad field, named) and the reference for what is right:

* a page (or event) that does not decode into the Structs (a field of the wrong JSON type)
  is decoded again as plain JSON and every object of it converted by ``convert``;
* an object that decodes but that the converters here do not accept as plainly valid (a bad
  name, port, address, a value outside its choices) is converted by ``convert`` from its
  dict (the page decoded as plain JSON once, when the first such object is met).

So both paths give the same value for a valid object and the same errors for a bad one
(tests/sources/test_kubejson.py checks this against generated objects).

Repeated strings (namespaces, port names, node names, zones) are interned, so the model
values of a cluster share them instead of holding one decoded copy each.
"""

from __future__ import annotations

import sys
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec

from ovsproxy.model import (
    Endpoint,
    EndpointSlice,
    IPAddress,
    IPNetwork,
    Protocol,
    Service,
    ServicePort,
    ServicePortName,
    ServiceType,
    SlicePort,
    TrafficPolicy,
)
from ovsproxy.model.handler import ClusterObjectHandler
from ovsproxy.model.problems import InvalidObjectError, SourceError
from ovsproxy.sources import convert
from ovsproxy.sources.convert import (
    DEFAULT_AFFINITY_TIMEOUT,
    DEFAULT_NAMESPACE,
    HEADLESS_LABEL,
    MAX_AFFINITY_TIMEOUT,
    SERVICE_NAME_LABEL,
    SERVICE_PROXY_NAME_LABEL,
    TRIGGER_TIME_ANNOTATION,
    ParsedIPs,
    convert_endpoint_slice,
    convert_service,
    parse_ip_text,
    parse_ipv4,
)

ObjKey = tuple[str, str]  # (namespace, name); "" namespace for cluster-scoped objects
Obj = dict[str, Any]
# The API's JSON into plain dicts and lists (the dict path, and resources without Structs).
decode_json: Callable[[bytes | str], Any] = msgspec.json.Decoder().decode
intern = sys.intern


class Irregular(Exception):
    """Not plainly valid: left to ``convert``'s dict path (which names what is wrong)."""


# -- the Structs: the fields the proxy reads, as a valid object has them ----------------------


class ListMeta(
    msgspec.Struct,
    gc=False,
    rename={"resource_version": "resourceVersion", "continue_token": "continue"},
):
    resource_version: str = ""
    continue_token: str = ""


class ServiceMeta(msgspec.Struct, gc=False, rename="camel"):
    name: str = ""
    namespace: str = DEFAULT_NAMESPACE
    resource_version: str = ""
    labels: dict[str, str] | None = None
    creation_timestamp: str | None = None


class SliceMeta(msgspec.Struct, gc=False, rename="camel"):
    name: str = ""
    namespace: str = DEFAULT_NAMESPACE
    resource_version: str = ""
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class ClientIPConfig(msgspec.Struct, gc=False, rename="camel"):
    timeout_seconds: int | None = None


class AffinityConfig(msgspec.Struct, gc=False):
    client_ip: ClientIPConfig | None = msgspec.field(default=None, name="clientIP")


class ServicePortSpec(msgspec.Struct, gc=False, rename="camel"):
    name: str | None = None
    protocol: str | None = None
    port: int | None = None
    target_port: int | str | None = None
    node_port: int | None = None


class ServiceSpec(msgspec.Struct, gc=False, rename="camel"):
    type: str | None = None
    cluster_ip: str | None = msgspec.field(default=None, name="clusterIP")
    cluster_ips: list[str] | None = msgspec.field(default=None, name="clusterIPs")
    ip_families: list[str] | None = None
    ip_family_policy: str | None = None
    external_ips: list[str] | None = msgspec.field(default=None, name="externalIPs")
    session_affinity: str | None = None
    session_affinity_config: AffinityConfig | None = None
    internal_traffic_policy: str | None = None
    external_traffic_policy: str | None = None
    traffic_distribution: str | None = None
    load_balancer_source_ranges: list[str] | None = None
    health_check_node_port: int | None = None
    ports: list[ServicePortSpec] | None = None


class Ingress(msgspec.Struct, gc=False, rename="camel"):
    ip: str | None = None
    ip_mode: str | None = None


class LoadBalancerStatus(msgspec.Struct, gc=False):
    ingress: list[Ingress] | None = None


class ServiceStatus(msgspec.Struct, gc=False, rename="camel"):
    load_balancer: LoadBalancerStatus | None = None


class ServiceObject(msgspec.Struct, gc=False):
    metadata: ServiceMeta | None = None
    spec: ServiceSpec | None = None
    status: ServiceStatus | None = None


class SlicePortSpec(msgspec.Struct, gc=False):
    name: str | None = None
    protocol: str | None = None
    port: int | None = None


class Conditions(msgspec.Struct, gc=False):
    ready: bool | None = None
    serving: bool | None = None
    terminating: bool | None = None


class Hint(msgspec.Struct, gc=False):
    name: str | None = None


class Hints(msgspec.Struct, gc=False, rename="camel"):
    for_zones: list[Hint] | None = None
    for_nodes: list[Hint] | None = None


class EndpointSpec(msgspec.Struct, gc=False, rename="camel"):
    addresses: list[str] | None = None
    conditions: Conditions | None = None
    node_name: str | None = None
    zone: str | None = None
    hints: Hints | None = None


class SliceObject(msgspec.Struct, gc=False, rename="camel"):
    metadata: SliceMeta | None = None
    address_type: str | None = None
    ports: list[SlicePortSpec] | None = None
    endpoints: list[EndpointSpec] | None = None


class ServiceList(msgspec.Struct, gc=False):
    metadata: ListMeta | None = None
    items: list[ServiceObject] | None = None


class SliceList(msgspec.Struct, gc=False):
    metadata: ListMeta | None = None
    items: list[SliceObject] | None = None


class WatchEvent(msgspec.Struct, gc=False):
    type: str = ""
    object: msgspec.Raw = msgspec.Raw()  # the object's JSON, decoded by the event's kind


# Looked up at call time (bench/agent_probe.py times them).
decode_service_list: Callable[[bytes], ServiceList] = msgspec.json.Decoder(ServiceList).decode
decode_slice_list: Callable[[bytes], SliceList] = msgspec.json.Decoder(SliceList).decode
decode_service: Callable[[bytes], ServiceObject] = msgspec.json.Decoder(ServiceObject).decode
decode_slice: Callable[[bytes], SliceObject] = msgspec.json.Decoder(SliceObject).decode
decode_event: Callable[[bytes | str], WatchEvent] = msgspec.json.Decoder(WatchEvent).decode


# -- shared checks -----------------------------------------------------------------------------


class Namespaces:
    """The namespaces a codec has found valid, each checked once (a cluster has few)."""

    __slots__ = ("_valid",)

    def __init__(self) -> None:
        self._valid: set[str] = set()

    def check(self, namespace: str) -> str:
        """``namespace``, interned; raises ``Irregular`` for an invalid one."""
        valid = self._valid
        if namespace in valid:
            return intern(namespace)
        if not (convert.DNS_LABEL.match(namespace) and len(namespace) <= 63):
            raise Irregular
        namespace = intern(namespace)
        if len(valid) < 4096:
            valid.add(namespace)
        return namespace


def _choice(value: str | None, choices: Mapping[str, Any], default: Any) -> Any:
    if value is None:
        return default
    found = choices.get(value)
    if found is None:
        raise Irregular
    return found


def _port(value: int | None, *, required: bool) -> int:
    if value is None:
        if required:
            raise Irregular
        return 0
    if not 1 <= value <= 65535:
        raise Irregular
    return value


def _ip(text: str) -> IPAddress:
    ip = parse_ip_text(text)
    if ip is None:
        raise Irregular
    return ip


# -- Service ---------------------------------------------------------------------------------

_AFFINITIES = {"None": 0, "ClientIP": 1}
_FAMILY_POLICIES = {"SingleStack": 1, "PreferDualStack": 0, "RequireDualStack": 2}
_INGRESS_MODES = {"VIP": "VIP", "Proxy": "Proxy"}


def _ignored(obj: ServiceObject, labels: Mapping[str, str], proxy_name: str | None) -> bool:
    """``convert.service_ignored_reason`` is not None (the same rule, on the Structs)."""
    proxy = labels.get(SERVICE_PROXY_NAME_LABEL)
    if proxy_name and proxy != proxy_name:
        return True
    if not proxy_name and SERVICE_PROXY_NAME_LABEL in labels:
        return True
    if HEADLESS_LABEL in labels:
        return True
    spec = obj.spec
    if spec is None:
        return False
    if spec.type == "ExternalName":
        return True
    return spec.cluster_ip == "None" or bool(spec.cluster_ips and spec.cluster_ips[0] == "None")


def service_value(
    obj: ServiceObject, service_proxy_name: str | None, namespaces: Namespaces
) -> Service:
    """``convert.convert_service`` for a decoded ``ServiceObject``; raises ``Irregular`` for
    anything that is not plainly valid."""
    meta = obj.metadata
    if meta is None:
        raise Irregular
    namespace = namespaces.check(meta.namespace)
    name = meta.name
    if not (convert.DNS1035_LABEL.match(name) and len(name) <= 253):
        raise Irregular
    created = None
    if meta.creation_timestamp is not None:
        created = convert.parse_time(meta.creation_timestamp)
        if created is None:
            raise Irregular
    if _ignored(obj, meta.labels or {}, service_proxy_name):
        return Service(namespace, name)
    spec = obj.spec
    if spec is None:
        raise Irregular
    service_type = _choice(spec.type, convert.SERVICE_TYPES, ServiceType.CLUSTER_IP)
    cluster_ips = _cluster_ips(spec)
    external_ips = _unique_ips(spec.external_ips)
    lb_ips = _load_balancer_ips(obj.status)
    affinity = _choice(spec.session_affinity, _AFFINITIES, 0)
    if affinity:
        config = spec.session_affinity_config
        client_ip = config.client_ip if config is not None else None
        timeout = client_ip.timeout_seconds if client_ip is not None else None
        if timeout is None:
            affinity = DEFAULT_AFFINITY_TIMEOUT
        elif 0 < timeout <= MAX_AFFINITY_TIMEOUT:
            affinity = timeout
        else:
            raise Irregular
    policies = convert.TRAFFIC_POLICIES
    internal_policy = _choice(spec.internal_traffic_policy, policies, TrafficPolicy.CLUSTER)
    external_policy = _choice(spec.external_traffic_policy, policies, TrafficPolicy.CLUSTER)
    distribution = _choice(spec.traffic_distribution, convert.TRAFFIC_DISTRIBUTIONS, None)
    source_ranges = _source_ranges(spec.load_balancer_source_ranges, service_type)
    health_check_port = _port(spec.health_check_node_port, required=False)
    if health_check_port and not (
        service_type is ServiceType.LOAD_BALANCER and external_policy is TrafficPolicy.LOCAL
    ):
        raise Irregular

    raw_ports = spec.ports
    if not raw_ports:
        raise Irregular
    node_ports_allowed = service_type in (ServiceType.NODE_PORT, ServiceType.LOAD_BALANCER)
    several = len(raw_ports) > 1
    seen_names: set[str] = set()
    seen_ports: set[tuple[int, Protocol]] = set()
    seen_node_ports: set[tuple[int, Protocol]] = set()
    ports: list[ServicePort] = []
    for raw in raw_ports:
        port_name = raw.name or ""
        if port_name:
            if port_name in seen_names or not (
                len(port_name) <= 63 and convert.DNS_LABEL.match(port_name)
            ):
                raise Irregular
            seen_names.add(port_name)
            port_name = intern(port_name)
        elif several or "" in seen_names:
            raise Irregular
        else:
            seen_names.add("")
        protocol = _choice(raw.protocol, convert.PROTOCOLS, Protocol.TCP)
        port = _port(raw.port, required=True)
        if (port, protocol) in seen_ports:
            raise Irregular
        seen_ports.add((port, protocol))
        target = raw.target_port
        if target is not None:
            if type(target) is str:
                if not convert.valid_named_port(target):
                    raise Irregular
            else:
                _port(target, required=False)  # type: ignore[arg-type]
        node_port = _port(raw.node_port, required=False)
        if node_port:
            if not node_ports_allowed or (node_port, protocol) in seen_node_ports:
                raise Irregular
            seen_node_ports.add((node_port, protocol))
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
    return Service(namespace, name, tuple(ports))


def _cluster_ips(spec: ServiceSpec) -> tuple[IPAddress, ...]:
    single = spec.cluster_ip or ""
    listed = spec.cluster_ips or []
    if listed:
        if single and listed[0] != single:
            raise Irregular
        raw = listed
    elif single:
        raw = [single]
    else:
        raise Irregular
    if len(raw) > 2:
        raise Irregular
    ips = tuple([_ip(text) for text in raw])
    if len(ips) == 2 and ips[0].version == ips[1].version:
        raise Irregular
    families = spec.ip_families
    if families:
        if len(families) != len(raw):
            raise Irregular
        for family_name, ip in zip(families, ips, strict=True):
            family = convert.FAMILY_NAMES.get(family_name)
            if family is None or ip.version != family:
                raise Irregular
    policy = _choice(spec.ip_family_policy, _FAMILY_POLICIES, None)
    if (policy == 1 and len(raw) > 1) or (policy == 2 and len(raw) < 2):
        raise Irregular
    return ips


def _unique_ips(texts: list[str] | None) -> tuple[IPAddress, ...]:
    if not texts:
        return ()
    out: list[IPAddress] = []
    for text in texts:
        ip = _ip(text)
        if ip not in out:
            out.append(ip)
    return tuple(out)


def _source_ranges(texts: list[str] | None, service_type: ServiceType) -> tuple[IPNetwork, ...]:
    if not texts:
        return ()
    if service_type is not ServiceType.LOAD_BALANCER:
        raise Irregular
    out: list[IPNetwork] = []
    for text in texts:
        network = convert.parse_cidr(text)
        if network is None:
            raise Irregular
        if network not in out:
            out.append(network)
    return tuple(out)


def _load_balancer_ips(status: ServiceStatus | None) -> tuple[IPAddress, ...]:
    lb = status.load_balancer if status is not None else None
    if lb is None or not lb.ingress:
        return ()
    out: list[IPAddress] = []
    for ingress in lb.ingress:
        mode = _choice(ingress.ip_mode, _INGRESS_MODES, None)
        if ingress.ip is None:
            continue
        ip = _ip(ingress.ip)
        if mode != "Proxy" and ip not in out:
            out.append(ip)
    return tuple(out)


# -- EndpointSlice ---------------------------------------------------------------------------

_NO_NAMES = convert.NO_NAMES


def slice_value(obj: SliceObject, namespaces: Namespaces) -> EndpointSlice:
    """``convert.convert_endpoint_slice`` for a decoded ``SliceObject``; raises ``Irregular``
    for anything that is not plainly valid."""
    meta = obj.metadata
    if meta is None:
        raise Irregular
    namespace = namespaces.check(meta.namespace)
    name = meta.name
    if not (len(name) <= 253 and convert.DNS_SUBDOMAIN.match(name)):
        raise Irregular
    labels = meta.labels
    service = labels.get(SERVICE_NAME_LABEL) if labels is not None else None
    if not service:
        raise Irregular
    address_type = obj.address_type
    if address_type == "FQDN":
        return EndpointSlice(namespace, name, service)
    family = convert.FAMILY_NAMES.get(address_type) if address_type is not None else None
    if family is None:
        raise Irregular

    port_specs: list[tuple[str, Protocol, int]] = []
    seen: set[tuple[str, Protocol]] = set()
    for raw_port in obj.ports or ():
        port_name = intern(raw_port.name or "")
        protocol = _choice(raw_port.protocol, convert.PROTOCOLS, Protocol.TCP)
        if (port_name, protocol) in seen:
            raise Irregular
        seen.add((port_name, protocol))
        port_specs.append((port_name, protocol, _port(raw_port.port, required=True)))

    # One Endpoint per port and address; every endpoint is checked, with or without ports.
    built: list[tuple[int, list[Endpoint]]] = [(port, []) for _, _, port in port_specs]
    v4 = family == 4
    for raw in obj.endpoints or ():
        addresses = raw.addresses
        if not addresses:
            raise Irregular
        # (kube-proxy uses the first address only)
        ip = parse_ipv4(addresses[0]) if v4 else parse_ip_text(addresses[0])
        if ip is None or (not v4 and ip.version != 6):
            raise Irregular
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
            hint_zones = hint_nodes = _NO_NAMES
        else:
            hint_zones, hint_nodes = _hint_names(hints.for_zones), _hint_names(hints.for_nodes)
        for port, endpoints in built:
            endpoints.append(
                Endpoint(
                    ip, port, ready, serving, terminating, node_name, zone, hint_zones, hint_nodes
                )
            )
    slice_ports = tuple(
        SlicePort(port_name, protocol, tuple(endpoints))
        for (port_name, protocol, _), (_, endpoints) in zip(port_specs, built, strict=True)
    )
    return EndpointSlice(namespace, name, service, slice_ports, _trigger_time(meta, namespace))


def _hint_names(entries: list[Hint] | None) -> frozenset[str]:
    if not entries:
        return _NO_NAMES
    names = []
    for entry in entries:
        if not entry.name:
            raise Irregular
        names.append(intern(entry.name))
    return frozenset(names)


def _trigger_time(meta: SliceMeta, namespace: str) -> float | None:
    annotations = meta.annotations
    if not annotations or TRIGGER_TIME_ANNOTATION not in annotations:
        return None
    return convert.trigger_time(namespace, meta.name, annotations[TRIGGER_TIME_ANNOTATION])


# -- codecs: list pages and watch events into keys, resourceVersions and values -------------

_Value = TypeVar("_Value")
_Model = TypeVar("_Model", Service, EndpointSlice)
WATCHED = ("ADDED", "MODIFIED")


@dataclass(frozen=True, slots=True)
class Page(Generic[_Value]):
    """One list page: (key, resourceVersion, value) per object, and where the list goes on."""

    items: list[tuple[ObjKey, str, _Value]]
    resource_version: str
    continue_token: str


@dataclass(frozen=True, slots=True)
class Event(Generic[_Value]):
    """One watch event: ADDED and MODIFIED carry the object's value, DELETED its key only (a
    deleted object is not converted), BOOKMARK the resourceVersion, ERROR the Status."""

    type: str
    key: ObjKey = ("", "")
    resource_version: str = ""
    value: _Value | None = None
    status: Mapping[str, Any] | None = None


class Codec(typing.Protocol[_Value]):
    """What the informer needs of a resource's wire format."""

    def page(self, body: bytes) -> Page[_Value]: ...

    def event(self, line: bytes | str) -> Event[_Value]: ...


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


class DictCodec(Generic[_Value]):
    """Objects decoded as plain JSON (``decode_json``), each made a value by
    ``convert_object``: for resources without Structs, and the dict path of the typed codecs.
    ``namespaced``: a missing namespace is the default one (as ``convert`` reads it)."""

    def __init__(self, convert_object: Callable[[Obj], _Value], *, namespaced: bool) -> None:
        self.convert_object = convert_object
        self._default_namespace = DEFAULT_NAMESPACE if namespaced else ""

    def key(self, obj: Mapping[str, Any]) -> tuple[ObjKey, str]:
        """(namespace, name) and resourceVersion of an object, as they are ("" for a value
        that is not a string)."""
        meta = obj.get("metadata")
        if not isinstance(meta, Mapping):
            return ("", ""), ""
        namespace = _text(meta.get("namespace", self._default_namespace))
        return (namespace, _text(meta.get("name"))), _text(meta.get("resourceVersion"))

    def item(self, obj: Obj) -> tuple[ObjKey, str, _Value]:
        key, rv = self.key(obj)
        return key, rv, self.convert_object(obj)

    def page(self, body: bytes) -> Page[_Value]:
        decoded = decode_json(body)
        if not isinstance(decoded, dict):
            raise ValueError(f"a list that is a JSON {type(decoded).__name__}, not an object")
        meta = decoded.get("metadata")
        meta = meta if isinstance(meta, dict) else {}
        items = decoded.get("items") or ()
        return Page(
            [self.item(obj) for obj in items if isinstance(obj, dict)],
            _text(meta.get("resourceVersion")),
            _text(meta.get("continue")),
        )

    def event(self, line: bytes | str) -> Event[_Value]:
        decoded = decode_json(line)
        if not isinstance(decoded, dict):
            raise ValueError(f"a watch event that is a JSON {type(decoded).__name__}")
        kind = _text(decoded.get("type"))
        obj = decoded.get("object")
        obj = obj if isinstance(obj, dict) else {}
        if kind == "ERROR":
            return Event(kind, status=obj)
        key, rv = self.key(obj)
        if kind in WATCHED:
            return Event(kind, key, rv, self.convert_object(obj))
        return Event(kind, key, rv)


class ClusterObjectEvents(Generic[_Value]):
    """The events of an informer of a cluster-scoped kind, its objects as decoded JSON, made
    model values by ``convert`` for a ``model.handler.ClusterObjectHandler`` (deletes by name:
    the informer keys such an object ("", name))."""

    __slots__ = ("convert", "handler")

    def __init__(
        self, handler: ClusterObjectHandler[_Value], convert: Callable[[Obj], _Value]
    ) -> None:
        self.handler = handler
        self.convert = convert

    def on_add(self, obj: Obj) -> None:
        self.handler.on_add(self.convert(obj))

    def on_update(self, obj: Obj) -> None:
        self.handler.on_update(self.convert(obj))

    def on_delete(self, key: ObjKey) -> None:
        self.handler.on_delete(key[1])

    def on_synced(self) -> None:
        self.handler.on_synced()

    def on_error(self, problem: SourceError) -> None:
        self.handler.on_error(problem)


class KeyMeta(msgspec.Struct, gc=False, rename="camel"):
    name: str = ""
    namespace: str = DEFAULT_NAMESPACE
    resource_version: str = ""


class Keyed(msgspec.Struct, gc=False):
    metadata: KeyMeta | None = None


decode_keyed: Callable[[bytes], Keyed] = msgspec.json.Decoder(Keyed).decode


class TypedCodec(Generic[_Model]):
    """Pages and watch events through the Structs; what does not fit, through ``dict_codec``
    (see the module docstring). Values are model values, or the ``InvalidObjectError`` that
    says why an object was rejected."""

    _decode_page: Callable[[bytes], ServiceList | SliceList]
    _decode_object: Callable[[bytes], ServiceObject | SliceObject]
    _value: Callable[[Any], _Model]
    dict_codec: DictCodec[_Model | InvalidObjectError]

    def __init__(
        self,
        decode_page: Callable[[bytes], ServiceList | SliceList],
        decode_object: Callable[[bytes], ServiceObject | SliceObject],
        value: Callable[[Any], _Model],
        dict_codec: DictCodec[_Model | InvalidObjectError],
    ) -> None:
        self._decode_page = decode_page
        self._decode_object = decode_object
        self._value = value
        self.dict_codec = dict_codec

    def page(self, body: bytes) -> Page[_Model | InvalidObjectError]:
        try:
            decoded = self._decode_page(body)
        except msgspec.ValidationError:  # a field of the wrong JSON type: named there
            return self.dict_codec.page(body)
        value = self._value
        as_dicts: list[Any] | None = None
        items: list[tuple[ObjKey, str, _Model | InvalidObjectError]] = []
        objects = typing.cast(list[ServiceObject | SliceObject], decoded.items or [])
        for index, obj in enumerate(objects):
            try:
                converted = value(obj)
            except Irregular:
                if as_dicts is None:
                    as_dicts = decode_json(body)["items"]
                items.append(self.dict_codec.item(as_dicts[index]))
                continue
            # (value() checked the metadata; its namespace is the interned one)
            rv = obj.metadata.resource_version if obj.metadata is not None else ""
            items.append(((converted.namespace, converted.name), rv, converted))
        meta = decoded.metadata
        if meta is None:
            return Page(items, "", "")
        return Page(items, meta.resource_version, meta.continue_token)

    def event(self, line: bytes | str) -> Event[_Model | InvalidObjectError]:
        try:
            envelope = decode_event(line)
        except msgspec.ValidationError:
            return self.dict_codec.event(line)
        kind, raw = envelope.type, envelope.object
        if not raw or kind == "ERROR":
            return self.dict_codec.event(line)
        try:
            if kind in WATCHED:
                obj = self._decode_object(raw)
                converted = self._value(obj)
                rv = obj.metadata.resource_version if obj.metadata is not None else ""
                return Event(kind, (converted.namespace, converted.name), rv, converted)
            meta = decode_keyed(raw).metadata
        except (msgspec.ValidationError, Irregular):
            return self.dict_codec.event(line)
        if meta is None:
            return Event(kind)
        return Event(kind, (meta.namespace, meta.name), meta.resource_version)


# The codecs the Kubernetes source uses, and their dict paths. (They take this module's
# functions as they are when the source starts: bench/agent_probe.py times and swaps them.)


def dict_service_codec(
    service_proxy_name: str | None = None,
) -> DictCodec[Service | InvalidObjectError]:
    ips = ParsedIPs()

    def convert_object(obj: Obj) -> Service | InvalidObjectError:
        try:
            return convert_service(obj, service_proxy_name=service_proxy_name, ips=ips)
        except InvalidObjectError as exc:
            return exc

    return DictCodec(convert_object, namespaced=True)


def dict_endpoint_slice_codec() -> DictCodec[EndpointSlice | InvalidObjectError]:
    ips = ParsedIPs()

    def convert_object(obj: Obj) -> EndpointSlice | InvalidObjectError:
        try:
            return convert_endpoint_slice(obj, ips=ips)
        except InvalidObjectError as exc:
            return exc

    return DictCodec(convert_object, namespaced=True)


def service_codec(service_proxy_name: str | None = None) -> Codec[Service | InvalidObjectError]:
    namespaces = Namespaces()
    return TypedCodec(
        decode_service_list,
        decode_service,
        lambda obj: service_value(obj, service_proxy_name, namespaces),
        dict_service_codec(service_proxy_name),
    )


def endpoint_slice_codec() -> Codec[EndpointSlice | InvalidObjectError]:
    namespaces = Namespaces()
    return TypedCodec(
        decode_slice_list,
        decode_slice,
        lambda obj: slice_value(obj, namespaces),
        dict_endpoint_slice_codec(),
    )
