"""The API server's JSON straight into model values: lists and watch events of Services and
EndpointSlices decoded by msgspec into the Structs of ``schema`` (only the fields the proxy
reads), then converted from those by ``convert``, so no dict of a whole object is built.

An object is refused at its first bad field (``Report(every=False)``), with an error naming
the object and the field; the others of its page go on. A page that does not decode into the
Structs (a field of the wrong JSON type) is decoded again item by item, and an item that
does not decode is read as plain JSON and put into its Struct by ``convert.structure``, which
names the field; both end in the same converter.

Repeated strings (namespaces, port names, node names, zones) are interned, so the model
values of a cluster share them instead of holding one decoded copy each.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec

from ovsproxy.model import EndpointSlice, Service
from ovsproxy.model.handler import ClusterObjectHandler
from ovsproxy.model.problems import InvalidObjectError, SourceError
from ovsproxy.sources.convert import (
    Namespaces,
    ParsedIPs,
    convert_endpoint_slice,
    convert_service,
    service_value,
    slice_value,
    structure,
)
from ovsproxy.sources.report import Report
from ovsproxy.sources.schema import (
    DEFAULT_NAMESPACE,
    Keyed,
    RawList,
    ServiceList,
    ServiceObject,
    SliceList,
    SliceObject,
    WatchEvent,
)

ObjKey = tuple[str, str]  # (namespace, name); "" namespace for cluster-scoped objects
Obj = dict[str, Any]
# The API's JSON into plain dicts and lists (the dict path, and resources without Structs).
decode_json: Callable[[bytes | str], Any] = msgspec.json.Decoder().decode


# Looked up at call time (bench/agent_probe.py times them).
decode_service_list: Callable[[bytes], ServiceList] = msgspec.json.Decoder(ServiceList).decode
decode_slice_list: Callable[[bytes], SliceList] = msgspec.json.Decoder(SliceList).decode
decode_service: Callable[[bytes], ServiceObject] = msgspec.json.Decoder(ServiceObject).decode
decode_slice: Callable[[bytes], SliceObject] = msgspec.json.Decoder(SliceObject).decode
decode_event: Callable[[bytes | str], WatchEvent] = msgspec.json.Decoder(WatchEvent).decode
decode_raw_list: Callable[[bytes], RawList] = msgspec.json.Decoder(RawList).decode


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


decode_keyed: Callable[[bytes], Keyed] = msgspec.json.Decoder(Keyed).decode


_Struct = TypeVar("_Struct", ServiceObject, SliceObject)


class TypedCodec(Generic[_Model, _Struct]):
    """Pages and watch events through the Structs into model values, or the
    ``InvalidObjectError`` that says why an object was refused (at its first bad field)."""

    _struct: type[_Struct]
    _decode_page: Callable[[bytes], ServiceList | SliceList]
    _decode_object: Callable[[bytes], _Struct]
    _value: Callable[[_Struct, Report], _Model]

    def __init__(
        self,
        kind: str,
        struct: type[_Struct],
        decode_page: Callable[[bytes], ServiceList | SliceList],
        decode_object: Callable[[bytes], _Struct],
        value: Callable[[_Struct, Report], _Model],
    ) -> None:
        self.kind = kind
        self._struct = struct
        self._decode_page = decode_page
        self._decode_object = decode_object
        self._value = value

    def _item(
        self, obj: _Struct, report: Report
    ) -> tuple[ObjKey, str, _Model | InvalidObjectError]:
        meta = obj.metadata
        try:
            converted = self._value(obj, report)
        except InvalidObjectError as exc:
            if meta is None:
                return (DEFAULT_NAMESPACE, ""), "", exc
            return (meta.namespace or "", meta.name or ""), meta.resource_version, exc
        # (the namespace of the value is the interned one)
        rv = meta.resource_version if meta is not None else ""
        return (converted.namespace, converted.name), rv, converted

    def _raw_item(self, raw: bytes) -> tuple[ObjKey, str, _Model | InvalidObjectError] | None:
        """An object that may not decode into its Struct (a field of the wrong JSON type):
        then read as plain JSON, the field named by ``convert.structure``. None for an item
        that is no JSON object."""
        report = Report(self.kind, every=False)
        try:
            obj = self._decode_object(raw)
        except msgspec.ValidationError:
            plain = decode_json(raw)
            if not isinstance(plain, dict):
                return None
            obj = structure(plain, self._struct, report)
        return self._item(obj, report)

    def page(self, body: bytes) -> Page[_Model | InvalidObjectError]:
        try:
            decoded = self._decode_page(body)
        except msgspec.ValidationError:  # a field of the wrong JSON type: item by item
            raw_page = decode_raw_list(body)
            found = [self._raw_item(raw) for raw in raw_page.items or ()]
            meta = raw_page.metadata
            items = [item for item in found if item is not None]
        else:
            item, report = self._item, Report(self.kind, every=False)
            objects = typing.cast(list[_Struct], decoded.items or [])
            items = [item(obj, report) for obj in objects]
            meta = decoded.metadata
        if meta is None:
            return Page(items, "", "")
        return Page(items, meta.resource_version, meta.continue_token)

    def event(self, line: bytes | str) -> Event[_Model | InvalidObjectError]:
        try:
            envelope = decode_event(line)
        except msgspec.ValidationError:
            return _plain_event(line)
        kind, raw = envelope.type, envelope.object
        if not raw or kind == "ERROR":
            return _plain_event(line)
        if kind in WATCHED:
            item = self._raw_item(raw)
            if item is None:
                return _plain_event(line)
            key, rv, value = item
            return Event(kind, key, rv, value)
        try:
            meta = decode_keyed(raw).metadata
        except msgspec.ValidationError:
            return _plain_event(line)
        if meta is None:
            return Event(kind)
        return Event(kind, (meta.namespace, meta.name), meta.resource_version)


def _plain_event(line: bytes | str) -> Event[Any]:
    """An event that is not a Service's or slice's: an ERROR's Status, the key of a deleted
    object whose metadata is odd, nothing for an object that is no JSON object."""
    return _KEYS_ONLY.event(line)


def _no_value(obj: Obj) -> None:
    return None


_KEYS_ONLY: DictCodec[None] = DictCodec(_no_value, namespaced=True)


# The codecs the Kubernetes source uses. (They take this module's functions as they are when
# the source starts: bench/agent_probe.py times and swaps them.)


def service_codec(
    service_proxy_name: str | None = None,
) -> Codec[Service | InvalidObjectError]:
    namespaces = Namespaces()
    return TypedCodec(
        "Service",
        ServiceObject,
        decode_service_list,
        decode_service,
        lambda obj, report: service_value(
            obj, report, service_proxy_name=service_proxy_name, namespaces=namespaces
        ),
    )


def endpoint_slice_codec() -> Codec[EndpointSlice | InvalidObjectError]:
    namespaces = Namespaces()
    return TypedCodec(
        "EndpointSlice",
        SliceObject,
        decode_slice_list,
        decode_slice,
        lambda obj, report: slice_value(obj, report, namespaces=namespaces),
    )


# Every object as plain JSON into ``convert``, every bad field named (the benches compare
# JSON decoders into dicts with it).


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
