"""The API's JSON through msgspec Structs (``kubejson``) and the one converter: plain objects
never become dicts, a bad object is refused at its first bad field (the one ``convert``
names first when it names them all) and the others of its page go on."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ovsproxy.model import EndpointSlice, Service
from ovsproxy.model.problems import InvalidObjectError
from ovsproxy.sources import kubejson
from ovsproxy.sources.convert import (
    HEADLESS_LABEL,
    SERVICE_NAME_LABEL,
    SERVICE_PROXY_NAME_LABEL,
    TRIGGER_TIME_ANNOTATION,
    convert_endpoint_slice,
    convert_service,
)

# -- objects as the API server sends them ------------------------------------------------


def api_service(i: int, **spec: Any) -> dict[str, Any]:
    """A Service with the server's own fields and fields the Structs do not declare (kind and
    apiVersion too, as a watch or kubectl sends it)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": f"web-{i}",
            "namespace": "demo",
            "uid": f"uid-{i}",
            "resourceVersion": str(100 + i),
            "creationTimestamp": "2026-11-30T10:00:00Z",
            "labels": {"app": "web"},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"},
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {"f:ports": {}}}}],
        },
        "spec": {
            "clusterIP": f"10.96.0.{i}",
            "clusterIPs": [f"10.96.0.{i}"],
            "ipFamilies": ["IPv4"],
            "ipFamilyPolicy": "SingleStack",
            "type": "ClusterIP",
            "selector": {"app": "web"},
            "sessionAffinity": "None",
            "internalTrafficPolicy": "Cluster",
            "ports": [
                {"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080},
                {
                    "name": "grpc",
                    "port": 9090,
                    "protocol": "TCP",
                    "appProtocol": "kubernetes.io/h2c",
                },
            ],
            **spec,
        },
        "status": {"loadBalancer": {}, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def api_slice(i: int, *addresses: str, **fields: Any) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"web-{i}-abcde",
            "namespace": "demo",
            "resourceVersion": str(200 + i),
            "generateName": f"web-{i}-",
            "labels": {SERVICE_NAME_LABEL: f"web-{i}", "app": "web"},
            "annotations": {TRIGGER_TIME_ANNOTATION: "2026-11-30T10:00:00Z"},
            "ownerReferences": [{"kind": "Service", "name": f"web-{i}", "controller": True}],
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [
            {
                "addresses": [address],
                "conditions": {"ready": True, "serving": True, "terminating": False},
                "targetRef": {"kind": "Pod", "namespace": "demo", "name": f"web-{i}-{j}"},
                "nodeName": f"node-{j % 2}",
                "zone": "zone-a",
                "hints": {"forZones": [{"name": "zone-a"}]},
            }
            for j, address in enumerate(addresses or (f"10.244.{i}.1", f"10.244.{i}.2"))
        ],
        **fields,
    }


def page(kind: str, objects: list[Any], token: str = "") -> bytes:
    meta = {"resourceVersion": "7", **({"continue": token} if token else {})}
    return json.dumps(
        {"kind": kind, "apiVersion": "v1", "metadata": meta, "items": objects}
    ).encode()


def comparable(items: list[tuple[Any, str, Any]]) -> list[Any]:
    """Items with errors as their ValidationErrors and slices with their trigger time (left out
    of EndpointSlice's own equality)."""
    out = []
    for key, rv, value in items:
        if isinstance(value, InvalidObjectError):
            value = ("invalid", value.errors)
        elif isinstance(value, EndpointSlice):
            value = (value, value.trigger_time)
        out.append((key, rv, value))
    return out


@pytest.fixture
def dict_path_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail if anything reads an object as plain JSON (plain objects must not)."""

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("an object was read as plain JSON")

    monkeypatch.setattr(kubejson, "decode_json", refused)
    monkeypatch.setattr(kubejson, "structure", refused)
    monkeypatch.setattr(kubejson, "convert_service", refused)
    monkeypatch.setattr(kubejson, "convert_endpoint_slice", refused)


def test_plain_api_objects_take_no_dict_path(dict_path_refused: None) -> None:
    services = kubejson.service_codec().page(page("ServiceList", [api_service(1)], token="t"))
    slices = kubejson.endpoint_slice_codec().page(page("EndpointSliceList", [api_slice(1)]))
    assert (services.resource_version, services.continue_token) == ("7", "t")
    [(key, rv, service)] = services.items
    assert key == ("demo", "web-1") and rv == "101"
    assert isinstance(service, Service)
    assert [(p.name.port, p.port) for p in service.ports] == [("http", 80), ("grpc", 9090)]
    [(key, rv, endpoint_slice)] = slices.items
    assert key == ("demo", "web-1-abcde") and rv == "201"
    assert isinstance(endpoint_slice, EndpointSlice)
    assert [str(e) for e in endpoint_slice.ports[0].endpoints] == [
        "10.244.1.1:8080",
        "10.244.1.2:8080",
    ]
    assert endpoint_slice.trigger_time is not None


def test_json_and_dicts_give_the_same_values() -> None:
    """The Structs decoded from JSON and converted from dicts (``msgspec.convert``, as
    manifests go in) are one schema."""
    body = page("ServiceList", [api_service(i) for i in range(1, 4)])
    typed = kubejson.service_codec().page(body)
    plain = kubejson.dict_service_codec().page(body)
    assert comparable(typed.items) == comparable(plain.items)
    body = page("EndpointSliceList", [api_slice(i) for i in range(1, 4)])
    typed_slices = kubejson.endpoint_slice_codec().page(body)
    plain_slices = kubejson.dict_endpoint_slice_codec().page(body)
    assert comparable(typed_slices.items) == comparable(plain_slices.items)


def test_repeated_strings_are_shared_across_objects(dict_path_refused: None) -> None:
    body = page("EndpointSliceList", [api_slice(1), api_slice(2)])
    first, second = (value for _, _, value in kubejson.endpoint_slice_codec().page(body).items)
    a, b = first.ports[0].endpoints[0], second.ports[0].endpoints[0]
    assert a.node_name == b.node_name == "node-0"
    assert a.node_name is b.node_name and a.zone is b.zone
    assert first.namespace is second.namespace
    assert first.ports[0].name is second.ports[0].name


@pytest.mark.parametrize(
    "bad,field,value",
    [
        # a JSON type the Structs do not take: named by ``convert.structure``
        ({"ports": [{"name": "http", "port": "80"}]}, "spec.ports[0].port", "80"),
        ({"clusterIPs": "10.96.0.9"}, "spec.clusterIPs", "10.96.0.9"),
        # a value the converter does not take
        ({"ports": [{"name": "http", "port": 70000}]}, "spec.ports[0].port", 70000),
        ({"externalTrafficPolicy": "Global"}, "spec.externalTrafficPolicy", "Global"),
    ],
)
def test_a_bad_service_is_named_and_the_others_of_its_page_kept(
    bad: dict[str, Any], field: str, value: Any
) -> None:
    objects = [api_service(1), api_service(2, **bad), api_service(3)]
    items = kubejson.service_codec().page(page("ServiceList", objects)).items
    assert [key for key, _, _ in items] == [("demo", "web-1"), ("demo", "web-2"), ("demo", "web-3")]
    good, rejected, also_good = (value for _, _, value in items)
    assert isinstance(good, Service) and isinstance(also_good, Service)
    assert isinstance(rejected, InvalidObjectError)
    [error] = rejected.errors
    assert (error.kind, error.namespace, error.name) == ("Service", "demo", "web-2")
    assert (error.field, error.value) == (field, value)


@pytest.mark.parametrize(
    "bad,field,value",
    [
        ({"addressType": 4}, "addressType", 4),  # (wrong JSON type)
        ({"addressType": "IPv5"}, "addressType", "IPv5"),
    ],
)
def test_a_bad_slice_is_named_and_the_others_of_its_page_kept(
    bad: dict[str, Any], field: str, value: Any
) -> None:
    objects = [api_slice(1), api_slice(2, **bad)]
    items = kubejson.endpoint_slice_codec().page(page("EndpointSliceList", objects)).items
    good, rejected = (value for _, _, value in items)
    assert isinstance(good, EndpointSlice) and isinstance(rejected, InvalidObjectError)
    [error] = rejected.errors
    assert (error.kind, error.name, error.field, error.value) == (
        "EndpointSlice",
        "web-2-abcde",
        field,
        value,
    )


def test_a_bad_endpoint_address_is_named_by_its_path() -> None:
    body = page("EndpointSliceList", [api_slice(1, "10.244.1.1", "10.244.1.300")])
    [(_, _, rejected)] = kubejson.endpoint_slice_codec().page(body).items
    assert isinstance(rejected, InvalidObjectError)
    assert [(e.field, e.value) for e in rejected.errors] == [
        ("endpoints[1].addresses[0]", "10.244.1.300")
    ]


def test_watch_events(dict_path_refused: None) -> None:
    codec = kubejson.service_codec()
    added = codec.event(json.dumps({"type": "ADDED", "object": api_service(1)}).encode())
    assert (added.type, added.key, added.resource_version) == ("ADDED", ("demo", "web-1"), "101")
    assert isinstance(added.value, Service) and added.value.name == "web-1"
    deleted = codec.event(json.dumps({"type": "DELETED", "object": api_service(2)}).encode())
    assert (deleted.type, deleted.key, deleted.value) == ("DELETED", ("demo", "web-2"), None)
    bookmark = {
        "type": "BOOKMARK",
        "object": {"kind": "Service", "metadata": {"resourceVersion": "9"}},
    }
    assert codec.event(json.dumps(bookmark)).resource_version == "9"


def test_watch_events_that_do_not_fit_the_structs() -> None:
    codec = kubejson.service_codec()
    error = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}}
    assert codec.event(json.dumps(error)).status == error["object"]
    bad = api_service(1, ports=[{"port": "80"}])
    modified = codec.event(json.dumps({"type": "MODIFIED", "object": bad}))
    assert modified.key == ("demo", "web-1")
    assert isinstance(modified.value, InvalidObjectError)
    assert [e.field for e in modified.value.errors] == ["spec.ports[0].port"]
    # A deleted object whose name is no string: its key as the dict path reads it.
    broken = {"metadata": {"name": 5, "namespace": "demo"}}
    deleted = codec.event(json.dumps({"type": "DELETED", "object": broken}))
    assert (deleted.type, deleted.key) == ("DELETED", ("demo", ""))


# -- generated objects: the agent's first error is the first of every error ---------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 70000) | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=6), inner, max_size=2)
    ),
    max_leaves=6,
)
ips = st.sampled_from(
    ["10.96.0.10", "10.96.0.11", "fd00::10", "fd00::11", "None", "", "10.96.0.010", " 10.96.0.1"]
)


def maybe(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Plausible values of a field (valid or nearly), now and then garbage."""
    return st.one_of(values, values, values, json_values)


# What a mutation may set a field to: valid values, near misses, garbage.
SERVICE_PORT_FIELDS = {
    "name": maybe(st.sampled_from(["", "http", "dns", "HTTP", "a" * 64, "-x"])),
    "protocol": maybe(st.sampled_from(["TCP", "UDP", "SCTP", "tcp"])),
    "port": maybe(st.sampled_from([80, 53, 0, 65536, True])),
    "targetPort": maybe(st.sampled_from([8080, 0, 70000, "http", "not_a_name", "1234", ""])),
    "nodePort": maybe(st.sampled_from([30000, 30001, 0, 70000])),
}
SPEC_FIELDS = {
    "type": maybe(st.sampled_from(["ClusterIP", "NodePort", "LoadBalancer", "ExternalName", "X"])),
    "clusterIP": maybe(ips),
    "clusterIPs": maybe(st.lists(ips, max_size=3)),
    "ipFamilies": maybe(st.lists(st.sampled_from(["IPv4", "IPv6", "IPv5"]), max_size=3)),
    "ipFamilyPolicy": maybe(
        st.sampled_from(["SingleStack", "PreferDualStack", "RequireDualStack", "x"])
    ),
    "externalIPs": maybe(st.lists(ips, max_size=3)),
    "sessionAffinity": maybe(st.sampled_from(["None", "ClientIP", "Cookie"])),
    "sessionAffinityConfig": maybe(
        st.fixed_dictionaries(
            {},
            optional={
                "clientIP": maybe(
                    st.fixed_dictionaries(
                        {},
                        optional={
                            "timeoutSeconds": maybe(st.sampled_from([0, 1, 86400, 86401, -1]))
                        },
                    )
                )
            },
        )
    ),
    "internalTrafficPolicy": maybe(st.sampled_from(["Cluster", "Local", "Global"])),
    "externalTrafficPolicy": maybe(st.sampled_from(["Cluster", "Local", "Global"])),
    "trafficDistribution": maybe(st.sampled_from(["PreferClose", "PreferSameNode", "Nearest"])),
    "loadBalancerSourceRanges": maybe(
        st.lists(st.sampled_from(["10.0.0.0/8", "10.0.0.1", "x/8", "fd00::/129", " 1.0.0.0/8"]))
    ),
    "healthCheckNodePort": maybe(st.sampled_from([32000, 0, 70000])),
    "ports": maybe(st.lists(st.fixed_dictionaries({}, optional=SERVICE_PORT_FIELDS), max_size=3)),
}
LABEL_KEYS = [SERVICE_PROXY_NAME_LABEL, HEADLESS_LABEL, SERVICE_NAME_LABEL, "app"]
META_FIELDS = {
    "name": maybe(st.sampled_from(["web", "web-1.x", "Web", "1web", "", "a" * 254])),
    "namespace": maybe(st.sampled_from(["demo", "Demo", "", "a" * 64])),
    "labels": maybe(
        st.dictionaries(
            st.sampled_from(LABEL_KEYS), maybe(st.sampled_from(["web", "other", ""])), max_size=3
        )
    ),
    "annotations": maybe(
        st.dictionaries(
            st.sampled_from([TRIGGER_TIME_ANNOTATION, "x"]),
            st.sampled_from(["2026-11-30T10:00:00.5Z", "yesterday", ""]),
            max_size=2,
        )
    ),
    "creationTimestamp": maybe(
        st.sampled_from(["2026-11-30T10:00:00Z", "2026-11-30T10:00:00.5+01:00", "2026-13-01"])
    ),
}
INGRESS_FIELDS = {
    "ip": maybe(ips),
    "ipMode": maybe(st.sampled_from(["VIP", "Proxy", "x"])),
}
ENDPOINT_FIELDS = {
    "addresses": maybe(
        st.lists(st.sampled_from(["10.244.0.1", "10.244.0.2", "fd00::1", "x"]), max_size=2)
    ),
    "conditions": maybe(
        st.fixed_dictionaries(
            {}, optional={k: maybe(st.booleans()) for k in ("ready", "serving", "terminating")}
        )
    ),
    "nodeName": maybe(st.sampled_from(["node-1", ""])),
    "zone": maybe(st.sampled_from(["zone-a", ""])),
    "hints": maybe(
        st.fixed_dictionaries(
            {},
            optional={
                k: maybe(
                    st.lists(
                        st.fixed_dictionaries(
                            {}, optional={"name": maybe(st.sampled_from(["a", ""]))}
                        ),
                        max_size=2,
                    )
                )
                for k in ("forZones", "forNodes")
            },
        )
    ),
}
SLICE_PORT_FIELDS = {
    "name": maybe(st.sampled_from(["", "http", "dns"])),
    "protocol": maybe(st.sampled_from(["TCP", "UDP", "tcp"])),
    "port": maybe(st.sampled_from([8080, 53, 0, 70000])),
}
SLICE_FIELDS = {
    "addressType": maybe(st.sampled_from(["IPv4", "IPv6", "FQDN", "IPv5"])),
    "ports": maybe(st.lists(st.fixed_dictionaries({}, optional=SLICE_PORT_FIELDS), max_size=2)),
    "endpoints": maybe(st.lists(st.fixed_dictionaries({}, optional=ENDPOINT_FIELDS), max_size=3)),
}


def _mutate(draw: Any, target: dict[str, Any], fields: dict[str, Any]) -> None:
    """Set, or now and then remove, one field of ``target``."""
    field = draw(st.sampled_from(sorted(fields)))
    if draw(st.integers(0, 5)) == 0:
        target.pop(field, None)
    else:
        target[field] = draw(fields[field])


DUAL = [
    ("10.96.0.10", ["10.96.0.10"], ["IPv4"], "SingleStack"),
    ("fd00::10", ["fd00::10"], ["IPv6"], None),
    ("10.96.0.10", ["10.96.0.10", "fd00::10"], ["IPv4", "IPv6"], "RequireDualStack"),
    ("10.96.0.10", None, None, None),
    (None, ["fd00::10", "10.96.0.10"], None, "PreferDualStack"),
]


@st.composite
def services(draw: Any) -> dict[str, Any]:
    """A valid Service (of every type and option), then up to three fields mutated."""
    service_type = draw(st.sampled_from(["ClusterIP", "NodePort", "LoadBalancer", None]))
    node_ports = service_type in ("NodePort", "LoadBalancer")
    single, listed, families, policy = draw(st.sampled_from(DUAL))
    names = draw(st.lists(st.sampled_from(["http", "dns", "grpc"]), min_size=1, unique=True))
    ports = []
    for index, name in enumerate(names):
        port: dict[str, Any] = {"port": 80 + index}
        if len(names) > 1 or draw(st.booleans()):
            port["name"] = name
        port["protocol"] = draw(st.sampled_from(["TCP", "UDP", "SCTP", None]))
        port["targetPort"] = draw(st.sampled_from([8080, "http", None]))
        if node_ports and draw(st.booleans()):
            port["nodePort"] = 30000 + index
        ports.append({k: v for k, v in port.items() if v is not None})
    spec: dict[str, Any] = {"ports": ports, "clusterIP": single, "clusterIPs": listed}
    spec.update(type=service_type, ipFamilies=families, ipFamilyPolicy=policy)
    if draw(st.booleans()):
        spec["externalIPs"] = draw(st.lists(st.sampled_from(["192.0.2.1", "2001:db8::1"])))
    if draw(st.booleans()):
        spec["sessionAffinity"] = "ClientIP"
        if draw(st.booleans()):
            # (with the limits and just past them)
            timeout = draw(st.sampled_from([0, 1, 86400, 86401]) | st.integers(1, 86400))
            spec["sessionAffinityConfig"] = {"clientIP": {"timeoutSeconds": timeout}}
    for policy_field in ("internalTrafficPolicy", "externalTrafficPolicy"):
        spec[policy_field] = draw(st.sampled_from(["Cluster", "Local", None]))
    spec["trafficDistribution"] = draw(st.sampled_from(["PreferClose", "PreferSameNode", None]))
    status: dict[str, Any] = {}
    if service_type == "LoadBalancer":
        spec["loadBalancerSourceRanges"] = draw(
            st.lists(st.sampled_from(["10.0.0.0/8", "10.1.2.3/8", "fd00::/64"]), max_size=2)
        )
        if spec["externalTrafficPolicy"] == "Local" and draw(st.booleans()):
            spec["healthCheckNodePort"] = 32000
        ingress = [{"ip": "198.51.100.1"}, {"ip": "198.51.100.2", "ipMode": "Proxy"}]
        status = {"loadBalancer": {"ingress": draw(st.lists(st.sampled_from(ingress)))}}
    spec = {k: v for k, v in spec.items() if v is not None}
    labels = draw(st.dictionaries(st.sampled_from(LABEL_KEYS), st.sampled_from(["web", "other"])))
    meta = {"name": "web", "namespace": "demo", "resourceVersion": "1", "labels": labels}
    obj: dict[str, Any] = {"metadata": meta, "spec": spec, "status": status}
    for _ in range(draw(st.integers(0, 3))):
        where = draw(st.sampled_from(["meta", "spec", "spec", "port", "ingress", "object"]))
        if where == "meta":
            _mutate(draw, meta, META_FIELDS)
        elif where == "spec":
            _mutate(draw, spec, SPEC_FIELDS)
        elif where == "port" and isinstance(spec.get("ports"), list) and spec["ports"]:
            target = spec["ports"][0]
            if isinstance(target, dict):
                _mutate(draw, target, SERVICE_PORT_FIELDS)
        elif where == "ingress" and status.get("loadBalancer", {}).get("ingress"):
            _mutate(draw, status["loadBalancer"]["ingress"][0], INGRESS_FIELDS)
        elif where == "object":
            _mutate(
                draw, obj, {"metadata": json_values, "spec": json_values, "status": json_values}
            )
    return obj


def _last(items: object) -> object:
    return items[-1] if isinstance(items, list) and items else None


@st.composite
def slices(draw: Any) -> dict[str, Any]:
    """A valid EndpointSlice, then up to three fields mutated."""
    v6 = draw(st.booleans())
    ports = [
        {"name": name, "port": 8080 + i, "protocol": draw(st.sampled_from(["TCP", "UDP"]))}
        for i, name in enumerate(draw(st.lists(st.sampled_from(["", "http", "dns"]), unique=True)))
    ]
    endpoints = []
    for i in range(draw(st.integers(0, 3))):
        endpoint: dict[str, Any] = {"addresses": [f"fd00::{i + 1}" if v6 else f"10.244.0.{i + 1}"]}
        if draw(st.booleans()):
            endpoint["conditions"] = {
                k: draw(st.sampled_from([True, False, None]))
                for k in ("ready", "serving", "terminating")
            }
        endpoint["nodeName"] = draw(st.sampled_from(["node-1", "node-2", None]))
        endpoint["zone"] = draw(st.sampled_from(["zone-a", None]))
        if draw(st.booleans()):
            endpoint["hints"] = {"forZones": [{"name": "zone-a"}], "forNodes": [{"name": "n"}]}
        endpoints.append(endpoint)
    labels = {SERVICE_NAME_LABEL: "web"}
    meta: dict[str, Any] = {"name": "web-x", "namespace": "demo", "resourceVersion": "1"}
    meta["labels"] = labels
    if draw(st.booleans()):
        meta["annotations"] = {TRIGGER_TIME_ANNOTATION: "2026-11-30T10:00:00.25Z"}
    obj: dict[str, Any] = {
        "metadata": meta,
        "addressType": "IPv6" if v6 else "IPv4",
        "ports": ports,
        "endpoints": endpoints,
    }
    for _ in range(draw(st.integers(0, 3))):
        where = draw(st.sampled_from(["meta", "slice", "port", "endpoint", "endpoint"]))
        if where == "meta":
            _mutate(draw, meta, META_FIELDS)
        elif where == "slice":
            _mutate(draw, obj, SLICE_FIELDS)
        elif where == "port" and isinstance(obj.get("ports"), list) and obj["ports"]:
            if isinstance(obj["ports"][0], dict):
                _mutate(draw, obj["ports"][0], SLICE_PORT_FIELDS)
        elif where == "endpoint" and isinstance(_last(obj.get("endpoints")), dict):
            _mutate(draw, obj["endpoints"][-1], ENDPOINT_FIELDS)
    return obj


SLOW = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _refusals(value: Any) -> Any:
    return value.errors if isinstance(value, InvalidObjectError) else value


def _agree(codec: Any, convert_object: Any, kind: str, objects: list[Any]) -> None:
    """The codec's page and watch event give each object what ``convert_object`` (every bad
    field reported) gives it, except that a refusal names only the first bad field."""
    body = page(kind, objects)
    items = codec.page(body).items
    assert len(items) == len(objects)
    for obj, (key, rv, value) in zip(objects, items, strict=True):
        line = json.dumps({"type": "MODIFIED", "object": obj})
        event = codec.event(line)
        assert (event.key, event.resource_version) == (key, rv)
        assert comparable([(key, rv, event.value)]) == comparable([(key, rv, value)])
        try:
            every: Any = convert_object(json.loads(json.dumps(obj)))
        except InvalidObjectError as exc:
            every = exc
        if isinstance(every, InvalidObjectError):
            assert isinstance(value, InvalidObjectError)
            assert value.errors == every.errors[:1]
        else:
            assert comparable([(key, rv, value)]) == comparable([(key, rv, every)])
            assert key == (every.namespace, every.name)


@SLOW
@given(st.lists(services(), min_size=1, max_size=3), st.sampled_from([None, "other"]))
def test_the_agent_refuses_a_service_at_its_first_bad_field(
    objects: list[Any], proxy_name: str | None
) -> None:
    _agree(
        kubejson.service_codec(proxy_name),
        lambda obj: convert_service(obj, service_proxy_name=proxy_name),
        "ServiceList",
        objects,
    )


@SLOW
@given(st.lists(slices(), min_size=1, max_size=3))
def test_the_agent_refuses_a_slice_at_its_first_bad_field(objects: list[Any]) -> None:
    _agree(kubejson.endpoint_slice_codec(), convert_endpoint_slice, "EndpointSliceList", objects)
