"""The Kubernetes objects the proxy reads, as msgspec Structs: the one schema of Services and
EndpointSlices, whatever they come from.

The API's JSON decodes straight into them (``kubejson``); a manifest's documents, whether
the fast YAML path's or PyYAML's dicts, go in through ``msgspec.convert``
(``convert.structure``, which also names every field of the wrong type). They declare only
the fields the converter reads, with the types a valid object has; unknown fields are skipped
(managedFields, targetRef, ownerReferences, and fields of newer API versions). Values are
checked by ``convert``, the one converter.

Two fields are ``Any`` because YAML gives more than JSON: ``creationTimestamp`` (an unquoted
time is a datetime to PyYAML) and ``annotations`` (only one of them is read, and a wrong
type elsewhere in them is no error).
"""

from __future__ import annotations

from typing import Any

import msgspec

DEFAULT_NAMESPACE = "default"


class ListMeta(
    msgspec.Struct,
    gc=False,
    rename={"resource_version": "resourceVersion", "continue_token": "continue"},
):
    resource_version: str = ""
    continue_token: str = ""


class ServiceMeta(msgspec.Struct, gc=False, rename="camel"):
    name: str | None = None
    namespace: str | None = DEFAULT_NAMESPACE
    resource_version: str = ""
    labels: dict[str, str] | None = None
    creation_timestamp: Any = None


class SliceMeta(msgspec.Struct, gc=False, rename="camel"):
    name: str | None = None
    namespace: str | None = DEFAULT_NAMESPACE
    resource_version: str = ""
    labels: dict[str, str] | None = None
    annotations: Any = None


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


class RawList(msgspec.Struct, gc=False):
    """A list page whose items did not all decode: each item's JSON, decoded one by one."""

    metadata: ListMeta | None = None
    items: list[msgspec.Raw] | None = None


class WatchEvent(msgspec.Struct, gc=False):
    type: str = ""
    object: msgspec.Raw = msgspec.Raw()  # the object's JSON, decoded by the event's kind


class KeyMeta(msgspec.Struct, gc=False, rename="camel"):
    name: str = ""
    namespace: str = DEFAULT_NAMESPACE
    resource_version: str = ""


class Keyed(msgspec.Struct, gc=False):
    metadata: KeyMeta | None = None
