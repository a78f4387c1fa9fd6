"""``ovsproxy check``: every problem with file, line, document, object and field; exit 1."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from ovsproxy.cli import main

MANIFESTS = Path(__file__).parent / "manifests"
EXAMPLES = Path(__file__).parents[2] / "src" / "ovsproxy" / "examples"


def run(*args: str):
    return CliRunner().invoke(main, ["check", *args])


def test_valid_manifests_pass_with_a_summary() -> None:
    result = run(str(MANIFESTS / "valid"))
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1] == (
        "6 file(s): 6 Service(s) and 10 EndpointSlice(s) valid; 3 Service(s) ignored "
        "(headless, ExternalName, other proxy); 1 object(s) of other kinds skipped. 0 problem(s)."
    )


def test_the_shipped_examples_are_valid() -> None:
    result = run(str(EXAMPLES))
    assert result.exit_code == 0, result.output


def test_every_problem_is_printed_and_the_exit_status_is_1() -> None:
    result = run(str(MANIFESTS / "broken"))
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    services = MANIFESTS / "broken" / "services.yaml"
    assert (
        f"{services}:18 (document 2): Service t/bad-port: spec.ports[1].port: "
        "must be a port number between 1 and 65535 (got 70000)"
    ) in lines
    slices = MANIFESTS / "broken" / "slices.yaml"
    assert any(
        line.startswith(f"{slices}:19 (document 2): EndpointSlice t/wrong-family: ")
        for line in lines
    )
    assert len(lines) == 14 + 1  # fourteen problems and the summary
    assert lines[-1].endswith("11 invalid object(s). 14 problem(s).")


def test_unparsable_file_and_missing_path(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: v1\nkind: Service\nmetadata:\n  name: x\n   namespace: y\n")
    result = run(str(bad), str(tmp_path / "missing.yaml"))
    assert result.exit_code == 1
    assert f"{bad}:5: YAML does not parse" in result.output
    assert f"{tmp_path / 'missing.yaml'}: no such file or directory" in result.output
    assert "1 file(s) do not parse" in result.output


def test_duplicates_across_files(tmp_path: Path) -> None:
    text = (MANIFESTS / "valid" / "terminating.yaml").read_text()
    (tmp_path / "a.yaml").write_text(text)
    (tmp_path / "b.yaml").write_text(text)
    result = run(str(tmp_path))
    assert result.exit_code == 1
    assert (
        f"Service shop/checkout is also defined at {tmp_path / 'a.yaml'}:3 (document 1)"
        in result.output
    )
    assert "2 problem(s)" in result.output  # the Service and its slice


CONFLICTING = {
    "a.yaml": """\
apiVersion: v1
kind: Service
metadata:
  name: old
  namespace: t
  creationTimestamp: "2026-01-01T00:00:00Z"
spec:
  type: LoadBalancer
  externalTrafficPolicy: Local
  healthCheckNodePort: 32000
  clusterIP: 10.96.0.10
  externalIPs: [192.0.2.10]
  ports:
  - {name: http, port: 80, nodePort: 30080}
  - {name: dns, port: 53, protocol: UDP, nodePort: 30053}
""",
    "b.yaml": """\
apiVersion: v1
kind: Service
metadata:
  name: nodeport
  namespace: t
  creationTimestamp: "2026-02-01T00:00:00Z"
spec:
  type: NodePort
  clusterIP: 10.96.0.11
  ports:
  - {name: http, port: 80, nodePort: 30080}
  - {name: other, port: 81, nodePort: 30053}
---
apiVersion: v1
kind: Service
metadata:
  name: cluster-ip
  namespace: t
spec:
  clusterIP: 10.96.0.10
  ports:
  - {port: 80}
---
apiVersion: v1
kind: Service
metadata:
  name: health
  namespace: t
spec:
  type: LoadBalancer
  externalTrafficPolicy: Local
  healthCheckNodePort: 32000
  clusterIP: 10.96.0.12
  ports:
  - {port: 80, nodePort: 30090}
---
apiVersion: v1
kind: Service
metadata:
  name: external
  namespace: t
spec:
  clusterIP: 10.96.0.13
  externalIPs: [192.0.2.10]
  ports:
  - {port: 80}
""",
}


def test_services_claiming_one_port_are_named_with_both_files_and_lines(tmp_path: Path) -> None:
    for name, text in CONFLICTING.items():
        (tmp_path / name).write_text(text)
    result = run(str(tmp_path))
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    owner = f"the older Service t/old (port {{}}, at {a}:1 (document 1)); this port is refused"
    assert lines[:-1] == [
        f"{b}:14 (document 2): Service t/cluster-ip: port TCP: 10.96.0.10:80/TCP is already "
        f"claimed by {owner.format('http/TCP')}",
        f"{b}:37 (document 4): Service t/external: port TCP: 192.0.2.10:80/TCP is already "
        f"claimed by {owner.format('http/TCP')}",
        f"{b}:24 (document 3): Service t/health: port TCP: healthCheckNodePort 32000 is "
        f"already claimed by {owner.format('dns/UDP')}",
        f"{b}:1 (document 1): Service t/nodeport: port http/TCP: nodePort 30080/TCP is "
        f"already claimed by {owner.format('http/TCP')}",
    ]  # (nodePort 30053 is UDP in t/old, TCP in t/nodeport: two claims, no conflict)
    assert lines[-1].endswith(". 4 problem(s).")


def test_special_external_ips_fail_the_check(tmp_path: Path) -> None:
    """Finding (issue 35): `ovsproxy check` exited 0 on externalIPs the API server refuses."""
    (tmp_path / "svc.yaml").write_text(
        "apiVersion: v1\nkind: Service\nmetadata: {name: grab, namespace: t}\n"
        "spec:\n  clusterIP: 10.96.0.50\n  ports: [{port: 80}]\n"
        "  externalIPs: [169.254.169.254, 127.0.0.1]\n"
    )
    result = run(str(tmp_path))
    assert result.exit_code == 1, result.output
    assert "Service t/grab: spec.externalIPs[0]: may not be in the link-local range" in (
        result.output
    )
    assert "Service t/grab: spec.externalIPs[1]: may not be in the loopback range" in (
        result.output
    )


def test_the_agents_refused_external_ips_fail_the_check(tmp_path: Path) -> None:
    """The node's and the API server's addresses as given, or every external IP with
    ``--refuse-external-ips`` (``proxy.external_ips``, the agent's rule): each a problem at
    the Service's line, the Service otherwise valid."""
    (tmp_path / "svc.yaml").write_text(
        "apiVersion: v1\nkind: Service\nmetadata: {name: grab, namespace: t}\n"
        "spec:\n  clusterIP: 10.96.0.50\n  ports: [{port: 80}]\n"
        "  externalIPs: [192.0.2.7, 192.0.2.8, 192.0.2.9]\n"
    )
    assert run(str(tmp_path)).exit_code == 0
    result = run(str(tmp_path), "--node-ip", "192.0.2.7", "--api-server-ip", "192.0.2.8")
    assert result.exit_code == 1, result.output
    where = f"{tmp_path / 'svc.yaml'}:1 (document 1): Service t/grab: spec.externalIPs: "
    assert (
        f"{where}is this node's own address: steering it would take the node's own traffic "
        "(got '192.0.2.7')\n"
    ) in result.output
    assert (
        f"{where}is the API server's address: the node's own API traffic would be taken "
        "(got '192.0.2.8')\n"
    ) in result.output
    assert "192.0.2.9" not in result.output
    refused = run(str(tmp_path), "--refuse-external-ips")
    assert refused.output.count("(refuse_external_ips)") == 3, refused.output
