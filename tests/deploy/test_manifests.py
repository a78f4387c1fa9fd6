"""deploy/ and the example manifests against Kubernetes' OpenAPI schemas (kubernetes-validate,
strict), kubectl's client-side dry run, and what the agent itself accepts; the Dockerfile
against hadolint. Each check is also shown to fail on a broken input."""

from __future__ import annotations

import copy
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from ovsproxy.cli.run_cmd import run as run_command
from ovsproxy.config import AgentConfig, ConfigError, load
from ovsproxy.httpserver import is_loopback
from tests.deploy.kube import (
    DEPLOY,
    KUBERNETES_VERSIONS,
    KUSTOMIZATION,
    REPO,
    Doc,
    KustomizeError,
    container_args,
    deployable_kustomizations,
    discovery_server,
    hadolint_findings,
    kubectl,
    kubectl_dry_run,
    kustomizations,
    kustomize_build,
    load_documents,
    manifest_files,
    resource_key,
    schema_errors,
)

DOCKERFILE = DEPLOY / "Dockerfile"


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def documents() -> list[tuple[str, Doc]]:
    """Every manifest document, from the files and from the rendered kustomizations."""
    docs = [(rel(p), d) for p in manifest_files() for d in load_documents(p)]
    for directory in deployable_kustomizations():
        docs += [(f"{rel(directory)} (rendered)", d) for d in kustomize_build(directory)]
    return docs


def doc_id(item: tuple[str, Doc]) -> str:
    where, doc = item
    return f"{where}:{doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"


def test_there_are_two_variants_and_examples() -> None:
    assert {d.name for d in deployable_kustomizations()} == {"integrated", "standalone"}
    assert len(manifest_files()) >= 6


def test_every_manifest_in_deploy_is_part_of_a_variant() -> None:
    used = {
        DEPLOY / resource_path
        for directory in kustomizations()
        for resource_path in _resources(directory)
    }
    loose = [rel(p) for p in DEPLOY.rglob("*.yaml") if p.name != KUSTOMIZATION and p not in used]
    assert not loose, f"not referenced by any kustomization: {loose}"


def _resources(directory: Path) -> list[Path]:
    spec = yaml.safe_load((directory / KUSTOMIZATION).read_text())
    return [(directory / r).resolve().relative_to(DEPLOY) for r in spec.get("resources", [])]


# -- schemas ---------------------------------------------------------------------------------
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("item", documents(), ids=doc_id)
def test_manifest_matches_the_kubernetes_schema_strictly(
    item: tuple[str, Doc], version: str
) -> None:
    where, doc = item
    assert schema_errors(doc, version) == [], where


@pytest.mark.parametrize(
    ("breakage", "expected"),
    [
        (lambda ds: ds["spec"]["template"]["spec"]["containers"][0].update(imagePullPolicyy="x"),
         "imagePullPolicyy"),
        (lambda ds: ds["spec"]["template"]["spec"].update(hostNetwork="yes"), "hostNetwork"),
        (lambda ds: ds["spec"].pop("selector"), "selector"),
    ],
    ids=["unknown-field", "wrong-type", "missing-required"],
)  # fmt: skip
def test_schema_check_fails_on_a_broken_daemonset(breakage: Any, expected: str) -> None:
    daemonset = next(d for d in load_documents(DEPLOY / "base" / "daemonset.yaml"))
    assert schema_errors(daemonset, KUBERNETES_VERSIONS[-1]) == []
    broken = copy.deepcopy(daemonset)
    breakage(broken)
    errors = schema_errors(broken, KUBERNETES_VERSIONS[-1])
    assert errors and expected in errors[0], errors


# -- kubectl ---------------------------------------------------------------------------------
needs_kubectl = pytest.mark.skipif(
    kubectl() is None, reason="kubectl is not installed: its client-side dry run is not run"
)


@needs_kubectl
def test_kubectl_dry_run_accepts_every_manifest_and_variant(tmp_path: Path) -> None:
    targets = [["-f", str(p)] for p in manifest_files()]
    targets += [["-k", str(d)] for d in deployable_kustomizations()]
    with discovery_server(tmp_path) as env:
        for args in targets:
            result = kubectl_dry_run(env, *args)
            assert result.returncode == 0, f"kubectl apply {args}: {result.stderr}"
            created = [line for line in result.stdout.splitlines() if "(dry run)" in line]
            docs = (
                load_documents(Path(args[1])) if args[0] == "-f" else kustomize_build(Path(args[1]))
            )
            assert len(created) == len(docs), result.stdout


@needs_kubectl
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("apiVersion: apps/v1\nkind: DaemonSett\nmetadata: {name: x}\n", "no matches for kind"),
        ("apiVersion: v1\nkind: ConfigMap\nmetadata: {namespace: x}\n", "name may not be empty"),
        ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: [x}\n", "error"),
    ],
    ids=["unknown-kind", "no-name", "bad-yaml"],
)
def test_kubectl_dry_run_fails_on_a_broken_manifest(
    tmp_path: Path, text: str, expected: str
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with discovery_server(tmp_path) as env:
        result = kubectl_dry_run(env, "-f", str(bad))
    assert result.returncode != 0
    assert expected in result.stderr, result.stderr


@needs_kubectl
@pytest.mark.parametrize("directory", deployable_kustomizations(), ids=lambda d: d.name)
def test_our_kustomize_loader_renders_what_kubectl_kustomize_renders(directory: Path) -> None:
    import subprocess

    binary = kubectl()
    assert binary is not None
    out = subprocess.run(
        [binary, "kustomize", str(directory)], capture_output=True, text=True, check=True
    ).stdout
    theirs = {resource_key(d): d for d in yaml.safe_load_all(out)}
    ours = {resource_key(d): d for d in kustomize_build(directory)}
    assert ours == theirs


def test_kustomize_loader_refuses_what_it_does_not_implement(tmp_path: Path) -> None:
    (tmp_path / KUSTOMIZATION).write_text("resources: []\nnamePrefix: x-\n")
    with pytest.raises(KustomizeError, match="namePrefix"):
        kustomize_build(tmp_path)
    (tmp_path / KUSTOMIZATION).write_text("resources: [missing.yaml]\n")
    with pytest.raises(KustomizeError, match=r"missing\.yaml"):
        kustomize_build(tmp_path)


# -- what the agent reads --------------------------------------------------------------------
def agent_config_of(docs: list[Doc], tmp_path: Path) -> tuple[AgentConfig, Doc]:
    """The configuration the DaemonSet's container would run with: its args parsed by the
    real `ovsproxy run` command, the ConfigMap's file where the container mounts it."""
    args, container = container_args(docs, tmp_path, {"NODE_NAME": "node-1"})
    assert args[0] == "run", args
    context = run_command.make_context("run", args[1:])
    params = dict(context.params)
    config = load(params.pop("config_file"), **params)
    return config, container


def container_env(docs: list[Doc], container: Doc) -> dict[str, str]:
    """The container's environment from envFrom ConfigMaps and plain values (env wins)."""
    configmaps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        name = source["configMapRef"]["name"]
        assert name in configmaps, f"envFrom: no ConfigMap {name}"
        env.update(configmaps[name]["data"])
    env.update({e["name"]: e["value"] for e in container.get("env", []) if "value" in e})
    return env


@pytest.mark.parametrize("directory", deployable_kustomizations(), ids=lambda d: d.name)
def test_the_agent_reaches_the_api_server_directly(
    directory: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not through the `kubernetes` ClusterIP, which only this agent would program: the
    in-cluster client the agent uses (lightkube) must read the address from the env."""
    from lightkube.config.kubeconfig import KubeConfig

    docs = kustomize_build(directory)
    _, container = agent_config_of(docs, tmp_path)
    env = container_env(docs, container)
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("token")
    (account / "ca.crt").write_text("")
    (account / "namespace").write_text("kube-system")
    for name in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        assert name in env, f"the container does not set {name}"
        monkeypatch.setenv(name, env[name])
    cluster = KubeConfig.from_service_account(account).get().cluster
    assert cluster.server == f"https://{env['KUBERNETES_SERVICE_HOST']}:6443"
    daemonset = next(d for d in docs if d["kind"] == "DaemonSet")
    # Cluster DNS is behind a ClusterIP too: the node's resolver.
    assert daemonset["spec"]["template"]["spec"]["dnsPolicy"] == "Default"


@pytest.mark.parametrize("directory", deployable_kustomizations(), ids=lambda d: d.name)
def test_the_agent_accepts_the_daemonset_args_and_config(directory: Path, tmp_path: Path) -> None:
    config, container = agent_config_of(kustomize_build(directory), tmp_path)
    assert config.mode.value == directory.name
    assert config.in_cluster and not config.manifests
    assert config.node_name == "node-1"
    # The OVS sockets are inside the mounted OVS run directory.
    ovs_mount = next(m for m in container["volumeMounts"] if m["name"] == "ovs-run")
    for endpoint in (config.ovsdb, config.openflow):
        assert endpoint is not None and endpoint.startswith(f"unix:{ovs_mount['mountPath']}/")
    assert config.openflow == f"unix:{ovs_mount['mountPath']}/{config.bridge}.mgmt"
    # The probes are where the agent serves the health paths, on the node's addresses; the
    # only port the pod declares is that one.
    assert config.health_host_port is not None
    host, port = config.health_host_port
    assert host == "0.0.0.0"
    assert [p["containerPort"] for p in container["ports"]] == [port]
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] == port
        assert container[probe]["httpGet"]["path"] in ("/healthz", "/readyz", "/livez")


@pytest.mark.parametrize("directory", deployable_kustomizations(), ids=lambda d: d.name)
def test_only_the_health_paths_are_on_the_node_addresses(directory: Path, tmp_path: Path) -> None:
    """/metrics, /status and /dump (every Service, endpoint and node address) stay on the
    node's loopback: a host-network pod's port is open to every pod of the cluster."""
    docs = kustomize_build(directory)
    config, _container = agent_config_of(docs, tmp_path)
    assert is_loopback(config.metrics_host_port[0]), config.metrics_address
    daemonset = next(d for d in docs if d["kind"] == "DaemonSet")
    annotations = daemonset["spec"]["template"]["metadata"].get("annotations") or {}
    # a scrape annotation would name a port that serves no /metrics to the pod network
    assert not any(key.startswith("prometheus.io/") for key in annotations), annotations


def test_a_typo_in_the_configmap_fails_the_agent_check(tmp_path: Path) -> None:
    docs = kustomize_build(DEPLOY / "standalone")
    configmap = next(d for d in docs if d["metadata"]["name"] == "ovsproxy-config")
    configmap["data"]["config.yaml"] += "bridg: br0\n"
    with pytest.raises(ConfigError, match="bridg"):
        agent_config_of(docs, tmp_path)


def test_dockerfile_command_is_what_the_daemonset_runs() -> None:
    text = DOCKERFILE.read_text()
    entrypoint = json.loads(re.search(r"^ENTRYPOINT (.*)$", text, re.M).group(1))  # type: ignore[union-attr]
    cmd = json.loads(re.search(r"^CMD (.*)$", text, re.M).group(1))  # type: ignore[union-attr]
    assert entrypoint == ["ovsproxy"]
    daemonset = next(d for d in load_documents(DEPLOY / "base" / "daemonset.yaml"))
    args = daemonset["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[: len(cmd)] == cmd, shlex.join(args)


# -- hadolint --------------------------------------------------------------------------------
def test_dockerfile_passes_hadolint(tmp_path: Path) -> None:
    result = hadolint_findings(DOCKERFILE, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_fails_on_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    # Our Dockerfile with its ignore pragmas dropped and an unpinned base image.
    text = DOCKERFILE.read_text().replace("# hadolint ignore=", "# ")
    bad.write_text(text.replace("python:3.11-slim-bookworm", "python"))
    result = hadolint_findings(bad, tmp_path)
    assert result.returncode != 0
    for rule in ("DL3006", "DL3008", "DL3002"):
        assert rule in result.stdout, result.stdout
