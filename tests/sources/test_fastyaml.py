"""The manifests' fast path (rapidyaml) against PyYAML's SafeLoader, the reference: every file
it reads must come out exactly as PyYAML reads it (values, document numbers, lines), and every
file it cannot vouch for must go to PyYAML."""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import cluster

from ovsproxy.sources import fastyaml
from ovsproxy.sources.manifests import _parse_with_pyyaml, parse_manifest

MANIFESTS = Path(__file__).parent / "manifests"
EXAMPLES = Path(__file__).parents[2] / "src" / "ovsproxy" / "examples"


def reference(data: bytes) -> list[tuple[int, Any, int, tuple[int, ...]]]:
    """(document number, value, line, item lines) of each document, as PyYAML reads them."""
    loader = yaml.CSafeLoader(data)
    found = []
    try:
        number = 0
        while loader.check_node():
            node = loader.get_node()
            number += 1
            value = loader.construct_document(node)
            items: tuple[int, ...] = ()
            for key, child in node.value if isinstance(node, yaml.MappingNode) else ():
                if key.value == "items" and isinstance(child, yaml.SequenceNode):
                    items = tuple(item.start_mark.line + 1 for item in child.value)
                    break
            found.append((number, value, node.start_mark.line + 1, items))
    finally:
        loader.dispose()
    return found


def fast(data: bytes) -> list[tuple[int, Any, int, tuple[int, ...]]] | None:
    documents = fastyaml.documents(data)
    if documents is None:
        return None
    return [(d.number, d.value, d.line, d.item_lines) for d in documents]


def assert_same_as_pyyaml(text: str | bytes, path: str = "m.yaml") -> bool:
    """The fast path agrees with PyYAML, document by document and in ``parse_manifest``'s
    result; returns whether the fast path read it."""
    data = text.encode() if isinstance(text, str) else text
    got = fast(data)
    if got is not None:
        assert got == reference(data)
    assert parse_manifest(data, path) == _parse_with_pyyaml(data, path, None)
    return got is not None


SERVICE = """\
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: demo
spec:
  clusterIP: 10.96.0.10
  ports:
  - name: http
    port: {port}
    targetPort: 8080
"""

# kubectl get services,endpointslices -o yaml (server fields, an applied configuration as a
# block scalar, quoted timestamps and empty strings; managedFields are hidden by default).
KUBECTL_YAML = """\
apiVersion: v1
items:
- apiVersion: v1
  kind: Service
  metadata:
    annotations:
      kubectl.kubernetes.io/last-applied-configuration: |
        {"apiVersion":"v1","kind":"Service","metadata":{"annotations":{},"name":"web","namespace":"demo"},"spec":{"ports":[{"name":"http","port":80,"targetPort":8080}],"selector":{"app":"web"}}}
    creationTimestamp: "2024-05-01T10:00:00Z"
    labels:
      app: web
    name: web
    namespace: demo
    resourceVersion: "1234"
    uid: 6f1c2a4e-3b5d-4e8f-9a7b-0c1d2e3f4a5b
  spec:
    clusterIP: 10.96.0.10
    clusterIPs:
    - 10.96.0.10
    internalTrafficPolicy: Cluster
    ipFamilies:
    - IPv4
    ipFamilyPolicy: SingleStack
    ports:
    - name: http
      port: 80
      protocol: TCP
      targetPort: 8080
    selector:
      app: web
    sessionAffinity: None
    type: ClusterIP
  status:
    loadBalancer: {}
- addressType: IPv4
  apiVersion: discovery.k8s.io/v1
  endpoints:
  - addresses:
    - 10.244.1.5
    conditions:
      ready: true
      serving: true
      terminating: false
    nodeName: node-1
    targetRef:
      kind: Pod
      name: web-7d9f8b6c5-x2x9q
      namespace: demo
      uid: 0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d
  kind: EndpointSlice
  metadata:
    annotations:
      endpoints.kubernetes.io/last-change-trigger-time: "2024-05-01T10:00:05Z"
    generateName: web-
    labels:
      endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io
      kubernetes.io/service-name: web
    name: web-abcde
    namespace: demo
  ports:
  - name: http
    port: 8080
    protocol: TCP
kind: List
metadata:
  resourceVersion: ""
"""


MANAGED_FIELDS = """\
    managedFields:
    - apiVersion: v1
      fieldsType: FieldsV1
      fieldsV1:
        f:metadata:
          f:annotations:
            .: {}
            f:kubectl.kubernetes.io/last-applied-configuration: {}
        f:spec:
          f:ports:
            .: {}
            k:{"port":80,"protocol":"TCP"}:
              .: {}
              f:name: {}
      manager: kubectl-client-side-apply
      operation: Update
      time: "2024-05-01T10:00:00Z"
"""


def kubectl_json(applied: bool = False) -> str:
    """The same as kubectl get -o json prints it (4-space indent), with or without the applied
    configuration (JSON in a JSON string)."""
    listed = yaml.safe_load(KUBECTL_YAML)
    if not applied:
        del listed["items"][0]["metadata"]["annotations"][
            "kubectl.kubernetes.io/last-applied-configuration"
        ]
    return json.dumps(listed, indent=4) + "\n"


# Files the fast path must read itself (else its speed silently goes), and equal PyYAML.
FAST = {
    "kubectl -o yaml": KUBECTL_YAML,
    "kubectl -o json": kubectl_json().replace(
        "kubectl.kubernetes.io/last-applied-configuration", "x"
    ),
    "kubectl -o yaml, managedFields shown": KUBECTL_YAML.replace(
        "    name: web\n    namespace: demo\n    resourceVersion",
        MANAGED_FIELDS + "    name: web\n    namespace: demo\n    resourceVersion",
    ),
    "multi-document with separators and comments": (
        "# leading comment\n---\n" + SERVICE.format(port=80) + "--- # next\n"
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {k: v}\n"
    ),
    "block scalars and quoted numbers": SERVICE.format(port='"80"').replace(
        "metadata:\n",
        "metadata:\n  annotations:\n    a: |\n      one\n\n      two\n    b: >-\n      folded\n"
        "      text\n    c: '010'\n    d: \"yes\"\n",
    ),
    "flow style": (
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: demo}\n"
        "spec: {clusterIP: 10.96.0.10, ports: [{name: http, port: 80}], selector: {}}\n"
    ),
    "document end marker": SERVICE.format(port=80) + "...\n",
    "ServiceList": "kind: ServiceList\napiVersion: v1\nitems:\n"
    + "".join(
        f"  - {line}\n" if i == 0 else f"    {line}\n"
        for i, line in enumerate(SERVICE.format(port=81).splitlines())
    ),
}

# Files PyYAML must read (YAML 1.1 meanings, features the fast path leaves alone).
PYYAML = {
    "bool yes": SERVICE.format(port=80) + "  publishNotReadyAddresses: yes\n",
    "octal port": SERVICE.format(port="010"),
    "hex port": SERVICE.format(port="0x50"),
    "sexagesimal port": SERVICE.format(port="1:20"),
    "exponent port": SERVICE.format(port="8e1"),
    "port with underscores": SERVICE.format(port="8_0"),
    "plain timestamp": SERVICE.format(port=80).replace(
        "  name: web\n", "  name: web\n  t: 2024-05-01\n"
    ),
    "tilde null": SERVICE.format(port=80) + "  externalName: ~\n",
    "capital bool": SERVICE.format(port=80) + "  allocateLoadBalancerNodePorts: True\n",
    "plain inf": SERVICE.format(port="inf"),
    "anchors and merge keys": (
        "apiVersion: v1\nkind: Service\nmetadata: &m {name: web, namespace: demo}\n"
        "spec:\n  clusterIP: 10.96.0.10\n  ports:\n  - &p {name: http, port: 80}\n"
        "  - <<: *p\n    name: alt\n    port: 81\n"
    ),
    "tag": SERVICE.format(port="!!str 80"),
    # JSON in a JSON string: ":{" in a flow collection could be libyaml's error; not worth telling
    "kubectl -o json with an applied configuration": kubectl_json(applied=True),
    "flow indicator after a colon": SERVICE.format(port=80) + "  selector: {app:?}\n",
    "odd block scalar header": SERVICE.format(port=80).replace("name: web", "name: > -\n    web"),
    "tab": SERVICE.format(port=80).replace("port: 80", "port:\t80"),
    "CRLF": SERVICE.format(port=80).replace("\n", "\r\n"),
    "non-ASCII": SERVICE.format(port=80).replace("name: web", "name: wéb"),
    "escape": SERVICE.format(port='"\\x38\\x30"'),
    "trailing separator": SERVICE.format(port=80) + "---\n",
    "empty document": "---\n---\n" + SERVICE.format(port=80),
    "scalar document": "just text\n",
    "stray closing brace": SERVICE.format(port=80).replace("targetPort: 8080", "targetPort: }"),
    "reserved indicator": SERVICE.format(port=80).replace("name: web", "name: `web"),
    "not YAML": SERVICE.format(port=80).replace("clusterIP: 10.96.0.10", "clusterIP: [10.96"),
    "two colons": SERVICE.format(port=80).replace("name: web", "name: web: x"),
}

# Files with problems: read again by PyYAML, for the line of each bad field.
PROBLEMS = {
    "bad port": SERVICE.format(port=0),
    "duplicate object": SERVICE.format(port=80) + "---\n" + SERVICE.format(port=81),
    "no kind": SERVICE.format(port=80).replace("kind: Service\n", ""),
    "bad item in a List": KUBECTL_YAML.replace("      port: 80\n", "      port: 0\n"),
}


@pytest.mark.parametrize("name", list(FAST))
def test_fast_path_reads_these_exactly_as_pyyaml(name: str) -> None:
    assert assert_same_as_pyyaml(FAST[name]), "went to PyYAML"


@pytest.mark.parametrize("name", list(PYYAML))
def test_yaml_11_meanings_and_the_rest_go_to_pyyaml(name: str) -> None:
    assert not assert_same_as_pyyaml(PYYAML[name]), "the fast path read it"


@pytest.mark.parametrize("name", list(PROBLEMS))
def test_files_with_problems_are_reported_by_pyyaml(name: str) -> None:
    assert fast(PROBLEMS[name].encode()) is not None  # readable: it is the problem that sends it
    assert_same_as_pyyaml(PROBLEMS[name])
    assert parse_manifest(PROBLEMS[name], "m.yaml").problems


@pytest.mark.parametrize(
    "path", sorted(MANIFESTS.glob("*/*.yaml")) + sorted(EXAMPLES.glob("*.yaml")), ids=str
)
def test_project_manifests_read_the_same(path: Path) -> None:
    assert_same_as_pyyaml(path.read_bytes(), str(path))


def test_bench_manifests_take_the_fast_path(tmp_path: Path) -> None:
    [path] = cluster.manifest_files(tmp_path, 20, 10)
    assert assert_same_as_pyyaml(path.read_bytes(), str(path))


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def test_reading_a_file_again_and_again_holds_no_memory(tmp_path: Path) -> None:
    """rapidyaml's emit_json never frees its buffer (the file's JSON, every time):
    the fast path must not leak it."""
    [path] = cluster.manifest_files(tmp_path, 300, 10)  # 1 MB of YAML, 3 MB as JSON
    data = path.read_bytes()
    for _ in range(5):  # the heap settles (glibc raises its mmap threshold, keeps arenas)
        assert fastyaml.documents(data) is not None
    gc.collect()
    before = rss_mb()
    for _ in range(30):
        assert fastyaml.documents(data) is not None
    gc.collect()
    assert rss_mb() - before < 15  # leaking the JSON: over 40 MB


def test_problems_name_file_document_line_and_field() -> None:
    text = SERVICE.format(port=80) + "---\n" + SERVICE.format(port=0).replace("web", "api")
    parsed = parse_manifest(text, "two.yaml")
    [problem] = parsed.problems
    assert (problem.location.file, problem.location.document, problem.location.line) == (
        "two.yaml",
        2,
        22,
    )
    assert problem.field == "spec.ports[0].port"
    assert [o.location.line for o in parsed.objects] == [1, 13]


# Plain tokens of the kinds YAML 1.1 and 1.2 read differently, in every position.
TOKEN = st.text("0123456789.-+_:eExXoObB~yYnNtTfFaAlLsSuUiI@`=", min_size=1, max_size=8)
QUOTED = TOKEN.map(lambda t: f'"{t}"') | TOKEN.map(lambda t: f"'{t}'")
SCALAR = TOKEN | QUOTED | st.sampled_from(["{}", "[]", "", "web", "10.0.0.1"])


@settings(
    max_examples=400, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    st.lists(st.tuples(TOKEN | QUOTED, SCALAR), min_size=1, max_size=4),
    st.booleans(),
)
def test_plain_tokens_resolve_as_pyyaml_does(pairs: list[tuple[str, str]], flow: bool) -> None:
    if flow:
        body = "data: {" + ", ".join(f"{k}: {v}" for k, v in pairs) + "}\n"
    else:
        body = "data:\n" + "".join(f"  {k}: {v}\n" for k, v in pairs)
    text = "kind: ConfigMap\n" + body + "more: [" + ", ".join(v for _, v in pairs) + "]\n"
    try:
        reference(text.encode())
    except yaml.YAMLError:
        assert fast(text.encode()) is None  # PyYAML refuses it: so must the fast path
        return
    assert_same_as_pyyaml(text)


@settings(
    max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(st.data())
def test_edited_manifests_read_as_pyyaml_reads_them(data: st.DataObject) -> None:
    """Realistic files with random edits (as a person editing them makes): whatever PyYAML
    makes of them, parse_manifest makes of them too."""
    text = bytearray(FAST[data.draw(st.sampled_from(sorted(FAST)))].encode())
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(text)))
        if data.draw(st.booleans()) and at < len(text):
            del text[at : at + data.draw(st.integers(1, 3))]
        else:
            text[at:at] = data.draw(
                st.sampled_from(
                    [
                        b" ",
                        b"\n",
                        b":",
                        b"- ",
                        b"{",
                        b"]",
                        b'"',
                        b"'",
                        b"#",
                        b",",
                        b"---\n",
                        b"  ",
                        b"yes",
                        b"0",
                    ]
                )
            )
    assert_same_as_pyyaml(bytes(text))
