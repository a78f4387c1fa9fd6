"""Conversion and validation of single objects (dicts as the API or YAML gives them)."""

from __future__ import annotations

import copy
import datetime
import ipaddress
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from ovsproxy.model import Protocol, ServiceType, TrafficPolicy
from ovsproxy.model.problems import InvalidObjectError, render_path
from ovsproxy.sources.convert import (
    HEADLESS_LABEL,
    SERVICE_PROXY_NAME_LABEL,
    TRIGGER_TIME_ANNOTATION,
    check_service_proxy_name,
    convert_endpoint_slice,
    convert_service,
    parse_ip,
    parse_time,
    proxy_label_selector,
    service_ignored_reason,
    special_ip,
)


def service(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"clusterIP": "10.96.0.10", "ports": [{"port": 80}]}
    base.update(spec)
    return {"metadata": {"name": "web", "namespace": "demo"}, "spec": base}


def endpoint_slice(**fields: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {
            "name": "web-1",
            "namespace": "demo",
            "labels": {"kubernetes.io/service-name": "web"},
        },
        "addressType": "IPv4",
        "ports": [{"name": "", "port": 8080}],
        "endpoints": [{"addresses": ["10.244.0.1"]}],
    }
    obj.update(fields)
    return obj


def frozen(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def errors_of(convert, obj) -> set[tuple[str, Any]]:
    with pytest.raises(InvalidObjectError) as info:
        convert(obj)
    return {(e.field, frozen(e.value)) for e in info.value.errors}


# (what, object, expected {(field, value)})
SERVICE_ERRORS = [
    ("no ClusterIP (nothing allocates one)", service(clusterIP=None), {("spec.clusterIP", None)}),
    (
        "IPv4 with a leading zero",
        service(clusterIP="10.96.0.010"),
        {("spec.clusterIP", "10.96.0.010")},
    ),
    ("IPv6 with a scope", service(clusterIP="fe80::1%eth0"), {("spec.clusterIP", "fe80::1%eth0")}),
    (
        "CIDR, not an address",
        service(clusterIP="10.96.0.1/32"),
        {("spec.clusterIP", "10.96.0.1/32")},
    ),
    (
        "clusterIPs[0] differs from clusterIP",
        service(clusterIPs=["10.96.0.11"]),
        {("spec.clusterIPs[0]", "10.96.0.11")},
    ),
    (
        "two ClusterIPs of one family",
        service(clusterIP=None, clusterIPs=["10.96.0.1", "10.96.0.2"]),
        {("spec.clusterIPs", ("10.96.0.1", "10.96.0.2"))},
    ),
    (
        "SingleStack with two ClusterIPs",
        service(clusterIP=None, clusterIPs=["10.96.0.1", "fd00::1"], ipFamilyPolicy="SingleStack"),
        {("spec.ipFamilyPolicy", "SingleStack")},
    ),
    ("unknown family", service(ipFamilies=["IPv5"]), {("spec.ipFamilies[0]", "IPv5")}),
    ("missing ports", service(ports=None), {("spec.ports", None)}),
    ("port as a string", service(ports=[{"port": "80"}]), {("spec.ports[0].port", "80")}),
    ("port as a YAML boolean", service(ports=[{"port": True}]), {("spec.ports[0].port", True)}),
    ("port zero", service(ports=[{"port": 0}]), {("spec.ports[0].port", 0)}),
    (
        "protocol in lower case",
        service(ports=[{"port": 80, "protocol": "tcp"}]),
        {("spec.ports[0].protocol", "tcp")},
    ),
    (
        "port name not a DNS label",
        service(ports=[{"port": 80, "name": "HTTP"}]),
        {("spec.ports[0].name", "HTTP")},
    ),
    (
        "duplicate port name",
        service(ports=[{"port": 80, "name": "a"}, {"port": 81, "name": "a"}]),
        {("spec.ports[1].name", "a")},
    ),
    (
        "bad named targetPort",
        service(ports=[{"port": 80, "targetPort": "not_a_name"}]),
        {("spec.ports[0].targetPort", "not_a_name")},
    ),
    (
        "targetPort out of range",
        service(ports=[{"port": 80, "targetPort": 65536}]),
        {("spec.ports[0].targetPort", 65536)},
    ),
    (
        "duplicate nodePort",
        service(
            type="NodePort",
            ports=[
                {"name": "a", "port": 80, "nodePort": 30000},
                {"name": "b", "port": 81, "nodePort": 30000},
            ],
        ),
        {("spec.ports[1].nodePort", 30000)},
    ),
    ("unknown type", service(type="Ingress"), {("spec.type", "Ingress")}),
    ("unknown affinity", service(sessionAffinity="Cookie"), {("spec.sessionAffinity", "Cookie")}),
    (
        "affinity timeout zero",
        service(
            sessionAffinity="ClientIP", sessionAffinityConfig={"clientIP": {"timeoutSeconds": 0}}
        ),
        {("spec.sessionAffinityConfig.clientIP.timeoutSeconds", 0)},
    ),
    (
        "unknown traffic policy",
        service(externalTrafficPolicy="Global"),
        {("spec.externalTrafficPolicy", "Global")},
    ),
    (
        "unknown distribution",
        service(trafficDistribution="Nearest"),
        {("spec.trafficDistribution", "Nearest")},
    ),
    (
        "bad external IP",
        service(externalIPs=["192.0.2.300"]),
        {("spec.externalIPs[0]", "192.0.2.300")},
    ),
    ("spec is a list", {"metadata": {"name": "web"}, "spec": []}, {("spec", ())}),
    (
        "source ranges on a ClusterIP Service",
        service(loadBalancerSourceRanges=["10.0.0.0/8"]),
        {("spec.loadBalancerSourceRanges", ("10.0.0.0/8",))},
    ),
    (
        "source range not a CIDR",
        service(type="LoadBalancer", loadBalancerSourceRanges=["10.0.0.0/8", "10.0.0.1", "x/8"]),
        {
            ("spec.loadBalancerSourceRanges[1]", "10.0.0.1"),
            ("spec.loadBalancerSourceRanges[2]", "x/8"),
        },
    ),
    (
        "source range prefix too long",
        service(type="LoadBalancer", loadBalancerSourceRanges=["fd00::/129"]),
        {("spec.loadBalancerSourceRanges[0]", "fd00::/129")},
    ),
    (
        "healthCheckNodePort with externalTrafficPolicy Cluster",
        service(type="LoadBalancer", healthCheckNodePort=32000),
        {("spec.healthCheckNodePort", 32000)},
    ),
    (
        "healthCheckNodePort out of range",
        service(type="LoadBalancer", externalTrafficPolicy="Local", healthCheckNodePort=70000),
        {("spec.healthCheckNodePort", 70000)},
    ),
]


@pytest.mark.parametrize("what,obj,expected", SERVICE_ERRORS, ids=[c[0] for c in SERVICE_ERRORS])
def test_invalid_service_names_field_and_value(what: str, obj: dict, expected: set) -> None:
    found = {
        (f, tuple(v) if isinstance(v, list) else v) for f, v in errors_of(convert_service, obj)
    }
    assert found == expected


def test_load_balancer_source_ranges_and_health_check_port() -> None:
    obj = service(
        type="LoadBalancer",
        externalTrafficPolicy="Local",
        healthCheckNodePort=32000,
        loadBalancerSourceRanges=[" 192.168.1.7/24", "fd00:1::/64", "192.168.1.0/24"],
        ports=[{"name": "a", "port": 80}, {"name": "b", "port": 81}],
    )
    ports = convert_service(obj).ports
    for port in ports:
        assert port.health_check_node_port == 32000
        # host bits masked, whitespace trimmed, duplicates dropped (as kube-proxy parses them)
        assert port.load_balancer_source_ranges == (
            ipaddress.ip_network("192.168.1.0/24"),
            ipaddress.ip_network("fd00:1::/64"),
        )
    plain = convert_service(service()).ports[0]
    assert plain.health_check_node_port == 0
    assert plain.load_balancer_source_ranges == ()


def test_error_names_object_and_path() -> None:
    with pytest.raises(InvalidObjectError) as info:
        convert_service(service(ports=[{"port": 80, "name": "a"}, {"port": 70000, "name": "b"}]))
    [error] = info.value.errors
    assert (error.kind, error.namespace, error.name) == ("Service", "demo", "web")
    assert error.path == ("spec", "ports", 1, "port")
    assert str(error) == (
        "Service demo/web: spec.ports[1].port: must be a port number between 1 and 65535 "
        "(got 70000)"
    )


def test_every_bad_field_is_reported_at_once() -> None:
    obj = service(clusterIP="nope", ports=[{"port": -1, "protocol": "ICMP"}], sessionAffinity="X")
    assert {f for f, _ in errors_of(convert_service, obj)} == {
        "spec.clusterIP",
        "spec.ports[0].port",
        "spec.ports[0].protocol",
        "spec.sessionAffinity",
    }


def test_service_defaults_follow_the_api_server() -> None:
    [port] = convert_service(service(sessionAffinity="ClientIP")).ports
    assert port.affinity_timeout == 10800
    assert port.protocol is Protocol.TCP and port.type is ServiceType.CLUSTER_IP
    assert port.internal_traffic_policy is TrafficPolicy.CLUSTER
    assert str(port.name) == "demo/web/TCP"
    # namespace defaults like kubectl's
    [port] = convert_service({"metadata": {"name": "x"}, "spec": service()["spec"]}).ports
    assert port.name.namespace == "default"


def test_dual_stack_keeps_the_primary_family_first() -> None:
    [port] = convert_service(
        service(
            clusterIP="fd00::a", clusterIPs=["fd00::a", "10.96.0.10"], ipFamilies=["IPv6", "IPv4"]
        )
    ).ports
    assert port.cluster_ips == (ipaddress.ip_address("fd00::a"), ipaddress.ip_address("10.96.0.10"))
    assert port.families == {4, 6}


@pytest.mark.parametrize(
    "obj,reason",
    [
        (service(clusterIP="None"), "headless"),
        (service(clusterIP=None, clusterIPs=["None"]), "headless"),
        (
            {"metadata": {"name": "x"}, "spec": {"type": "ExternalName", "externalName": "a.b"}},
            "ExternalName",
        ),
        (
            {
                "metadata": {
                    "name": "x",
                    "labels": {"service.kubernetes.io/service-proxy-name": "p"},
                },
                "spec": {"clusterIP": "garbage"},  # not ours: not validated either
            },
            "handled by proxy 'p'",
        ),
    ],
)
def test_ignored_services_convert_to_no_ports(obj: dict, reason: str) -> None:
    assert service_ignored_reason(obj) == reason
    assert convert_service(obj).ports == ()


def labelled(labels: dict[str, str]) -> dict[str, Any]:
    obj = service()
    obj["metadata"]["labels"] = labels
    return obj


@pytest.mark.parametrize(
    "labels,proxy_name,reason",
    [
        # kube-proxy's rule with no name: only unlabelled Services
        ({}, None, None),
        ({SERVICE_PROXY_NAME_LABEL: "foo-bar"}, None, "handled by proxy 'foo-bar'"),
        ({SERVICE_PROXY_NAME_LABEL: ""}, None, "handled by proxy ''"),  # present is present
        # with a name: only Services labelled with exactly that name
        ({}, "ovsproxy", f"not labelled {SERVICE_PROXY_NAME_LABEL}=ovsproxy"),
        ({SERVICE_PROXY_NAME_LABEL: "ovsproxy"}, "ovsproxy", None),
        ({SERVICE_PROXY_NAME_LABEL: "foo-bar"}, "ovsproxy", "handled by proxy 'foo-bar'"),
        # the headless label hides a Service whatever its proxy label says
        ({HEADLESS_LABEL: ""}, None, f"labelled {HEADLESS_LABEL}"),
        (
            {SERVICE_PROXY_NAME_LABEL: "ovsproxy", HEADLESS_LABEL: ""},
            "ovsproxy",
            f"labelled {HEADLESS_LABEL}",
        ),
    ],
)
def test_service_proxy_name_selects_services_as_kube_proxy(
    labels: dict[str, str], proxy_name: str | None, reason: str | None
) -> None:
    obj = labelled(labels)
    assert service_ignored_reason(obj, proxy_name) == reason
    ports = convert_service(obj, service_proxy_name=proxy_name).ports
    assert (ports == ()) == (reason is not None)


def test_proxy_label_selector_is_kube_proxys_with_and_without_a_name() -> None:
    assert proxy_label_selector() == f"!{SERVICE_PROXY_NAME_LABEL},!{HEADLESS_LABEL}"
    assert proxy_label_selector("ovsproxy") == (
        f"{SERVICE_PROXY_NAME_LABEL}=ovsproxy,!{HEADLESS_LABEL}"
    )


@pytest.mark.parametrize("name", ["-x", "x-", "a b", "x/y", "a" * 64])
def test_a_service_proxy_name_must_be_a_label_value(name: str) -> None:
    with pytest.raises(ValueError, match="is not a label value"):
        check_service_proxy_name(name)


@pytest.mark.parametrize("name,normal", [(None, None), ("", None), ("a.b_c-1", "a.b_c-1")])
def test_service_proxy_name_none_or_empty_means_none(name: str | None, normal: str | None):
    assert check_service_proxy_name(name) == normal


# --- EndpointSlices ----------------------------------------------------------------------

SLICE_ERRORS = [
    (
        "no service label",
        endpoint_slice(metadata={"name": "s", "namespace": "d"}),
        {("metadata.labels[kubernetes.io/service-name]", None)},
    ),
    ("unknown address type", endpoint_slice(addressType="IPv5"), {("addressType", "IPv5")}),
    (
        "no addresses",
        endpoint_slice(endpoints=[{"addresses": []}]),
        {("endpoints[0].addresses", ())},
    ),
    (
        "bad address",
        endpoint_slice(endpoints=[{"addresses": ["10.244.0.300"]}]),
        {("endpoints[0].addresses[0]", "10.244.0.300")},
    ),
    (
        "family mismatch",
        endpoint_slice(endpoints=[{"addresses": ["fd00::1"]}]),
        {("endpoints[0].addresses[0]", "fd00::1")},
    ),
    (
        "duplicate port name",
        endpoint_slice(ports=[{"name": "a", "port": 1}, {"name": "a", "port": 2}]),
        {("ports[1].name", "a")},
    ),
    (
        "condition not a bool",
        endpoint_slice(endpoints=[{"addresses": ["10.244.0.1"], "conditions": {"serving": "yes"}}]),
        {("endpoints[0].conditions.serving", "yes")},
    ),
    (
        "hint without a name",
        endpoint_slice(endpoints=[{"addresses": ["10.244.0.1"], "hints": {"forZones": [{}]}}]),
        {("endpoints[0].hints.forZones[0].name", None)},
    ),
    (
        "node name not a string",
        endpoint_slice(endpoints=[{"addresses": ["10.244.0.1"], "nodeName": False}]),
        {("endpoints[0].nodeName", False)},
    ),
]


@pytest.mark.parametrize("what,obj,expected", SLICE_ERRORS, ids=[c[0] for c in SLICE_ERRORS])
def test_invalid_slice_names_field_and_value(what: str, obj: dict, expected: set) -> None:
    found = {
        (f, tuple(v) if isinstance(v, list) else v)
        for f, v in errors_of(convert_endpoint_slice, obj)
    }
    assert found == expected


def test_a_slice_port_without_a_number_is_skipped_not_the_slice() -> None:
    """The API admits a port with no number ("all ports"; tests/e2e/test_admitted_objects.py
    creates one); kube-proxy skips that port and keeps the slice's others."""
    converted = convert_endpoint_slice(
        endpoint_slice(ports=[{"name": "all"}, {"name": "http", "port": 8080}])
    )
    assert [p.name for p in converted.ports] == ["http"]


def test_slice_gives_one_endpoint_per_port_with_conditions_and_hints() -> None:
    converted = convert_endpoint_slice(
        endpoint_slice(
            ports=[{"name": "http", "port": 8080}, {"name": "dns", "port": 53, "protocol": "UDP"}],
            endpoints=[
                {
                    "addresses": ["10.244.0.1", "10.244.0.99"],  # only the first counts
                    "conditions": {"ready": False, "terminating": True},
                    "nodeName": "node-1",
                    "zone": "zone-a",
                    "hints": {"forZones": [{"name": "zone-a"}], "forNodes": [{"name": "node-1"}]},
                }
            ],
        )
    )
    assert converted.service == "web"
    http, dns = converted.ports
    assert (http.name, http.protocol, dns.name, dns.protocol) == (
        "http",
        Protocol.TCP,
        "dns",
        Protocol.UDP,
    )
    [endpoint] = http.endpoints
    assert str(endpoint) == "10.244.0.1:8080" and str(dns.endpoints[0]) == "10.244.0.1:53"
    # ready false, serving absent -> true (kube-proxy), terminating true
    assert (endpoint.ready, endpoint.serving, endpoint.terminating) == (False, True, True)
    assert (endpoint.node_name, endpoint.zone) == ("node-1", "zone-a")
    assert endpoint.hint_zones == {"zone-a"} and endpoint.hint_nodes == {"node-1"}


def test_fqdn_slice_converts_to_no_ports() -> None:
    converted = convert_endpoint_slice(
        endpoint_slice(addressType="FQDN", endpoints=[{"addresses": ["a.example.com"]}])
    )
    assert converted.ports == () and converted.service == "web"


def test_render_path_uses_kubernetes_notation() -> None:
    assert render_path(("spec", "ports", 1, "port")) == "spec.ports[1].port"
    assert render_path(("metadata", "labels", "a.b/c")) == "metadata.labels[a.b/c]"


# --- properties ---------------------------------------------------------------------------

port_names = st.from_regex(r"[a-z][a-z0-9]{0,6}", fullmatch=True)
service_ports = st.lists(
    st.tuples(port_names, st.integers(1, 65535), st.sampled_from(["TCP", "UDP", "SCTP"])),
    min_size=1,
    max_size=5,
    unique_by=(lambda p: p[0], lambda p: (p[1], p[2])),
)
# Valid ClusterIPs: not special (loopback, link-local, ...), and an IPv6 one not IPv4-mapped
# (that one is IPv4).
v4 = (
    st.integers(1, 2**32 - 2)
    .map(ipaddress.IPv4Address)
    .filter(lambda ip: not special_ip(ip))
    .map(str)
)
v6 = (
    st.integers(1, 2**128 - 2)
    .map(ipaddress.IPv6Address)
    .filter(lambda ip: not special_ip(ip) and ip.ipv4_mapped is None)
    .map(str)
)


@given(service_ports, st.one_of(st.tuples(v4), st.tuples(v6), st.tuples(v4, v6), st.tuples(v6, v4)))
def test_valid_services_round_trip(ports, cluster_ips) -> None:
    obj = service(
        clusterIP=cluster_ips[0],
        clusterIPs=list(cluster_ips),
        ports=[{"name": n, "port": p, "protocol": proto} for n, p, proto in ports],
    )
    converted = convert_service(obj)
    assert [(p.name.port, p.port, p.protocol.value) for p in converted.ports] == list(ports)
    for port in converted.ports:
        assert port.cluster_ips == tuple(ipaddress.ip_address(ip) for ip in cluster_ips)
        assert (port.name.namespace, port.name.name, port.name.protocol) == (
            "demo",
            "web",
            port.protocol,
        )


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 70000) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)
service_fields = st.sampled_from(
    [
        "clusterIP",
        "clusterIPs",
        "ipFamilies",
        "ports",
        "type",
        "sessionAffinity",
        "sessionAffinityConfig",
        "externalIPs",
        "externalTrafficPolicy",
        "trafficDistribution",
    ]
)
slice_fields = st.sampled_from(["addressType", "ports", "endpoints", "metadata"])


@given(st.dictionaries(service_fields, json_values, max_size=4))
def test_garbage_service_fields_never_crash(garbage) -> None:
    obj = service(**garbage)
    try:
        convert_service(copy.deepcopy(obj))
    except InvalidObjectError as exc:
        assert exc.errors and all(e.kind == "Service" for e in exc.errors)


@given(st.dictionaries(slice_fields, json_values, max_size=3))
def test_garbage_slice_fields_never_crash(garbage) -> None:
    obj = endpoint_slice(**garbage)
    try:
        convert_endpoint_slice(obj)
    except InvalidObjectError as exc:
        assert exc.errors and all(e.kind == "EndpointSlice" for e in exc.errors)


@given(st.one_of(v4, v6))
def test_parse_ip_accepts_canonical_addresses(text: str) -> None:
    assert parse_ip(text) == ipaddress.ip_address(text)
    assert parse_ip(f" {text}") is None


def _annotated(value: object) -> dict[str, Any]:
    obj = endpoint_slice()
    obj["metadata"]["annotations"] = {TRIGGER_TIME_ANNOTATION: value}
    return obj


@pytest.mark.parametrize(
    "text,expected",
    [
        ("2024-05-01T10:00:00Z", 1714557600.0),
        ("2024-05-01T10:00:00.25Z", 1714557600.25),
        ("2024-05-01T10:00:00.123456789Z", 1714557600.123456),  # Go's RFC3339Nano
        ("2024-05-01T12:00:00+02:00", 1714557600.0),
    ],
)
def test_trigger_time_annotation_is_converted(text: str, expected: float) -> None:
    converted = convert_endpoint_slice(_annotated(text))
    assert converted.trigger_time == pytest.approx(expected, abs=1e-6)
    assert parse_time(text) == converted.trigger_time


def test_trigger_time_read_by_yaml_as_a_timestamp_is_taken() -> None:
    # An unquoted time in a manifest: YAML makes it a datetime.
    [obj] = yaml.safe_load_all("metadata: {annotations: {a: 2024-05-01T10:00:00.5Z}}")
    value = obj["metadata"]["annotations"]["a"]
    assert isinstance(value, datetime.datetime)
    converted = convert_endpoint_slice(_annotated(value))
    assert converted.trigger_time == 1714557600.5
    assert parse_time(datetime.datetime(2024, 5, 1, 10)) is None  # no offset: unknown


@pytest.mark.parametrize(
    "value", ["2024-05-01 10:00:00Z", "2024-05-01T10:00:00", "2024-13-01T10:00:00Z", "", 17, None]
)
def test_malformed_trigger_time_is_ignored_with_a_warning_the_slice_is_used(
    value: object, caplog: pytest.LogCaptureFixture
) -> None:
    converted = convert_endpoint_slice(_annotated(value))
    assert converted.trigger_time is None
    assert converted.ports  # the slice's endpoints are used all the same
    assert f"EndpointSlice demo/web-1: annotation {TRIGGER_TIME_ANNOTATION}" in caplog.text


def test_trigger_time_is_left_out_of_comparisons() -> None:
    plain = convert_endpoint_slice(endpoint_slice())
    annotated = convert_endpoint_slice(_annotated("2024-05-01T10:00:00Z"))
    assert plain.trigger_time is None and annotated.trigger_time is not None
    assert plain == annotated  # only the annotation differs: nothing to program


def _reference_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if text != text.strip() or "%" in text:
        return None
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


@given(
    st.one_of(
        st.text(alphabet="0123456789.", max_size=20),
        st.text(max_size=16),
        st.lists(st.integers(0, 300), min_size=1, max_size=5).map(
            lambda octets: ".".join(map(str, octets))
        ),
        st.lists(
            st.text(alphabet="0123456789", min_size=1, max_size=4), min_size=4, max_size=4
        ).map(".".join),
    )
)
def test_parse_ip_rejects_what_ipaddress_rejects(text: str) -> None:
    """The IPv4 fast path (inet_pton) accepts and rejects exactly what ipaddress does."""
    assert parse_ip(text) == _reference_ip(text)


def test_parse_ip_edge_cases() -> None:
    for text in (
        "010.0.0.1",
        "1.2.3",
        "1.2.3.4.5",
        "256.1.1.1",
        "1.2.3.4\x00",
        "\uff11.\uff12.\uff13.\uff14",  # fullwidth digits
        "0x1.2.3.4",
        "1.2.3.4 ",
        "",
        "1..2.3",
        "+1.2.3.4",
    ):
        assert parse_ip(text) is None, text
    assert parse_ip("0.0.0.0") == ipaddress.ip_address("0.0.0.0")
    assert parse_ip("255.255.255.255") == ipaddress.ip_address("255.255.255.255")


# Endpoints as a list sends them, mostly valid, at most one field odd: each is converted as
# its fields say, or refused with errors of that endpoint only.
endpoint_fields = {
    "addresses": (
        st.one_of(st.tuples(v4).map(list), st.tuples(v4, v4).map(list)),
        st.one_of(
            st.tuples(v6).map(list),
            st.lists(st.sampled_from(["", " 10.0.0.1", "10.0.0.01", "fe80::1%e"]), max_size=2),
            json_values,
        ),
    ),
    "conditions": (
        st.dictionaries(
            st.sampled_from(["ready", "serving", "terminating"]),
            st.one_of(st.none(), st.booleans()),
        ),
        st.one_of(
            st.builds(
                lambda key, value: {key: value},
                st.sampled_from(["ready", "serving", "terminating"]),
                st.one_of(st.integers(0, 1), st.text(max_size=2)),
            ),
            json_values,
        ),
    ),
    "nodeName": (st.sampled_from(["", "node-1"]), json_values),
    "zone": (st.sampled_from(["", "zone-a"]), json_values),
    "hints": (
        st.one_of(
            st.just({}),
            st.builds(lambda z: {"forZones": [{"name": z}]}, st.sampled_from(["", "zone-a"])),
        ),
        json_values,
    ),
}


@st.composite
def one_endpoint(draw: Any) -> Any:
    if draw(st.integers(0, 9)) == 0:
        return draw(json_values)  # not even a mapping, perhaps
    odd = draw(st.sampled_from([None, *endpoint_fields]))
    endpoint = {}
    for key, (valid, garbage) in endpoint_fields.items():
        if key == odd:
            endpoint[key] = draw(garbage)
        elif key == "addresses" or draw(st.booleans()):
            endpoint[key] = draw(valid)
    return endpoint


def _converted_or_errors(obj: dict[str, Any]) -> Any:
    try:
        return convert_endpoint_slice(obj)
    except InvalidObjectError as exc:
        return exc.errors


@given(one_endpoint(), st.sampled_from(["IPv4", "IPv4", "IPv6", "bogus"]))
def test_an_endpoint_converts_as_its_fields_say_or_is_named(endpoint, address_type) -> None:
    obj = endpoint_slice(endpoints=[endpoint], addressType=address_type)
    before = copy.deepcopy(obj)
    converted = _converted_or_errors(obj)
    assert obj == before  # (a broken object is mended in a copy)
    if isinstance(converted, tuple):
        assert converted
        for error in converted:
            assert (error.kind, error.namespace, error.name) == ("EndpointSlice", "demo", "web-1")
            assert error.path[:2] == ("endpoints", 0) or error.path == ("addressType",)
        return
    [port] = converted.ports
    [made] = port.endpoints
    conditions = endpoint.get("conditions") or {}
    assert made.ip == parse_ip(endpoint["addresses"][0])
    assert made.ip.version == (4 if address_type == "IPv4" else 6)
    assert (made.port, made.ready, made.serving, made.terminating) == (
        8080,
        conditions.get("ready") is not False,
        conditions.get("serving") is not False,
        conditions.get("terminating") is True,
    )
    assert (made.node_name, made.zone) == (
        endpoint.get("nodeName") or None,
        endpoint.get("zone") or None,
    )
    hints = endpoint.get("hints") or {}
    assert made.hint_zones == {h["name"] for h in hints.get("forZones", ())}


def test_every_field_of_the_wrong_type_is_named_once_with_its_value() -> None:
    port = {"name": "a", "port": "80"}  # one object in two places, as a YAML alias gives it
    obj = service(ports=[port, port, 5], clusterIPs=[7], sessionAffinity=["ClientIP"])
    obj["metadata"]["labels"] = {"app": 1}
    with pytest.raises(InvalidObjectError) as info:
        convert_service(obj)
    # The fields of the wrong type first (in the object's order), then the converter's
    # errors; where it would say more of a field read as missing (item 5 has no name and no
    # port, clusterIPs[0] does not equal clusterIP), it says nothing.
    assert [(e.field, e.value, e.message) for e in info.value.errors] == [
        ("metadata.labels", {"app": 1}, "must map strings to strings"),
        ("spec.ports[0].port", "80", "must be a port number between 1 and 65535"),
        ("spec.ports[1].port", "80", "must be a port number between 1 and 65535"),
        ("spec.ports[2]", 5, "must be a mapping"),
        ("spec.clusterIPs[0]", 7, "not a valid IP address"),
        ("spec.sessionAffinity", ["ClientIP"], "must be one of None, ClientIP"),
        ("spec.ports[1].name", "a", "duplicate of spec.ports[0].name"),
    ]


def test_a_wrong_type_is_not_reported_where_it_is_not_read() -> None:
    # A Service for another proxy: its spec is not validated, whatever its types.
    obj = service(ports=[{"port": "80"}])
    obj["metadata"]["labels"] = {SERVICE_PROXY_NAME_LABEL: "p"}
    assert convert_service(obj).ports == ()
    # sessionAffinityConfig counts only with ClientIP affinity
    assert convert_service(service(sessionAffinityConfig=[])).ports
    assert errors_of(convert_service, service(sessionAffinity="ClientIP", sessionAffinityConfig=[]))


def test_creation_timestamp_is_unix_seconds_on_every_port_and_a_bad_one_is_named() -> None:
    obj = service(ports=[{"name": "a", "port": 80}, {"name": "b", "port": 81}])
    assert {p.created for p in convert_service(obj).ports} == {None}  # not given
    obj["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    assert {p.created for p in convert_service(obj).ports} == {1767225600.0}
    # unquoted in YAML, a timestamp PyYAML constructs
    obj["metadata"]["creationTimestamp"] = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    assert convert_service(obj).ports[0].created == 1767225600.0
    obj["metadata"]["creationTimestamp"] = "yesterday"
    assert errors_of(convert_service, obj) == {("metadata.creationTimestamp", "yesterday")}


# -- special addresses (issue 35): what kube-apiserver's ValidateNonSpecialIP refuses ----------

LOOPBACK = "may not be in the loopback range (127.0.0.0/8, ::1/128)"
LINK_LOCAL = "may not be in the link-local range (169.254.0.0/16, fe80::/10)"
LL_MULTICAST = "may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)"


def messages_of(convert, obj) -> dict[str, str]:
    with pytest.raises(InvalidObjectError) as info:
        convert(obj)
    return {e.field: e.message for e in info.value.errors}


def test_special_external_ips_are_refused_with_the_field_and_kube_apiservers_message() -> None:
    """Finding: externalIPs 127.0.0.1, 169.254.169.254 and 0.0.0.0 were accepted and
    steered, for the node's own traffic too; `ovsproxy check` passed them."""
    obj = service(
        externalIPs=[
            "127.0.0.1",
            "169.254.169.254",
            "0.0.0.0",
            "224.0.0.251",
            "::1",
            "fe80::1",
            "ff02::fb",
            "::",
            "::ffff:127.0.0.1",
            "192.0.2.10",
        ]
    )
    assert messages_of(convert_service, obj) == {
        "spec.externalIPs[0]": LOOPBACK,
        "spec.externalIPs[1]": LINK_LOCAL,
        "spec.externalIPs[2]": "may not be unspecified (0.0.0.0)",
        "spec.externalIPs[3]": LL_MULTICAST,
        "spec.externalIPs[4]": LOOPBACK,
        "spec.externalIPs[5]": LINK_LOCAL,
        "spec.externalIPs[6]": LL_MULTICAST,
        "spec.externalIPs[7]": "may not be unspecified (::)",
        "spec.externalIPs[8]": LOOPBACK,  # IPv4-mapped: the IPv4 address, as Go reads it
    }


def test_special_cluster_ips_are_refused() -> None:
    assert messages_of(convert_service, service(clusterIP="127.0.0.1")) == {
        "spec.clusterIP": LOOPBACK
    }
    obj = service(clusterIP="169.254.169.254", clusterIPs=["169.254.169.254", "fe80::1"])
    assert messages_of(convert_service, obj) == {
        "spec.clusterIPs[0]": LINK_LOCAL,
        "spec.clusterIPs[1]": LINK_LOCAL,
    }


def test_special_endpoint_addresses_are_refused() -> None:
    obj = endpoint_slice(endpoints=[{"addresses": ["10.244.0.1"]}, {"addresses": ["127.0.0.1"]}])
    assert messages_of(convert_endpoint_slice, obj) == {"endpoints[1].addresses[0]": LOOPBACK}


def test_an_ipv4_mapped_ipv6_address_is_ipv4_as_go_reads_it() -> None:
    """Finding: ``::ffff:10.96.0.10`` was taken as IPv6 (Go, and so kube-apiserver and
    kube-proxy, take it as IPv4)."""
    (port,) = convert_service(service(clusterIP="::ffff:10.96.0.10")).ports
    assert port.cluster_ips == (ipaddress.IPv4Address("10.96.0.10"),)
    assert parse_ip("::ffff:192.0.2.1") == ipaddress.IPv4Address("192.0.2.1")
