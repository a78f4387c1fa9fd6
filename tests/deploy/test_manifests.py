"""deploy/ and the example manifests against Kubernetes' OpenAPI schemas (kubernetes-validate,
strict), the real kube-apiserver's server-side dry run, and what the agent itself accepts;
the Dockerfile against hadolint. Each check is also shown to fail on a broken input."""

from __future__ import annotations

import copy
import json
import math
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from ovsproxy.cli.run_cmd import run as run_command
from ovsproxy.config import AgentConfig, ConfigError, load
from ovsproxy.httpserver import is_loopback
from ovsproxy.lab.controlplane import ControlPlane
from tests.deploy.kube import (
    DEPLOY,
    KUBERNETES_VERSIONS,
    KUSTOMIZATION,
    REPO,
    Doc,
    KustomizeError,
    container_args,
    deployable_kustomizations,
    dry_run_lines,
    granted_capabilities,
    hadolint_findings,
    kubectl,
    kustomizations,
    kustomize_build,
    load_documents,
    manifest_files,
    resource_key,
    schema_errors,
    server_dry_run,
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


# -- the real kube-apiserver ------------------------------------------------------------------
def server_dry_run_findings(api: ControlPlane, args: list[str], docs: list[Doc]) -> list[str]:
    """What kube-apiserver refused of ``docs`` (rendered from ``args``), empty when it
    accepted every one of them (and kubectl named each)."""
    result = server_dry_run(api, *args)
    if result.returncode != 0:
        return [line for line in result.stderr.splitlines() if line.strip()]
    accepted = dry_run_lines(result)
    if len(accepted) != len(docs):
        return [f"{len(docs)} objects, the server dry run names {len(accepted)}: {accepted}"]
    return []


@pytest.mark.slow
def test_the_real_api_server_accepts_every_manifest_and_variant(
    control_plane: ControlPlane, demo_namespace: str
) -> None:
    """Every file in deploy/ (each alone, as `kubectl apply -f` takes it) and the examples,
    and both variants as `kubectl apply -k` renders them: decoded with strict field
    validation, defaulted, validated and admitted by kube-apiserver, nothing stored."""
    targets = [(["-f", str(p)], load_documents(p)) for p in manifest_files()]
    targets += [(["-k", str(d)], kustomize_build(d)) for d in deployable_kustomizations()]
    findings = {
        " ".join(args): found
        for args, docs in targets
        if (found := server_dry_run_findings(control_plane, args, docs))
    }
    assert not findings, findings


def _rendered_standalone() -> list[Doc]:
    return copy.deepcopy(kustomize_build(DEPLOY / "standalone"))


def _by_kind(docs: list[Doc], kind: str) -> Doc:
    return next(d for d in docs if d["kind"] == kind)


def _container(docs: list[Doc]) -> Doc:
    return _by_kind(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("breakage", "expected"),
    [
        # The schema (kubernetes-validate) passes these three: only the server refuses them.
        (lambda docs: _by_kind(docs, "DaemonSet")["spec"]["template"]["metadata"].update(
            labels={"app": "other"}), "selector` does not match template `labels`"),
        (lambda docs: _by_kind(docs, "ClusterRole")["rules"][0].update(verbs=[]),
         "verbs: Required value"),
        (lambda docs: _by_kind(docs, "ConfigMap")["data"].update({"A B": "x"}),
         "a valid config key must consist of"),
        (lambda docs: _container(docs).update(imagePullPolicyy="Always"),
         'unknown field "spec.template.spec.containers[0].imagePullPolicyy"'),
        (lambda docs: _container(docs)["ports"][0].update(containerPort=70000),
         "must be between 1 and 65535"),
    ],
    ids=["selector-mismatch", "no-verbs", "bad-configmap-key", "unknown-field", "port-range"],
)  # fmt: skip
def test_a_planted_error_fails_the_server_dry_run(
    control_plane: ControlPlane, tmp_path: Path, breakage: Any, expected: str
) -> None:
    """The standalone variant as rendered, with one error planted: the check above fails,
    naming it."""
    docs = _rendered_standalone()
    breakage(docs)
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump_all(docs))
    findings = server_dry_run_findings(control_plane, ["-f", str(broken)], docs)
    assert any(expected in f for f in findings), findings


@pytest.mark.parametrize("directory", deployable_kustomizations(), ids=lambda d: d.name)
def test_our_kustomize_loader_renders_what_kubectl_kustomize_renders(directory: Path) -> None:
    out = subprocess.run(
        [kubectl(), "kustomize", str(directory)], capture_output=True, text=True, check=True
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
    assert not params.pop("kube"), "the DaemonSet runs the agent, not the embedded default"
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


# -- least privilege -------------------------------------------------------------------------
def _agent_container() -> Doc:
    daemonset = next(d for d in load_documents(DEPLOY / "base" / "daemonset.yaml"))
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    return container


def test_the_agent_runs_with_least_privilege() -> None:
    """Not privileged, every capability dropped but NET_ADMIN (tests/deploy/test_shipped.py
    runs the agent with only what this grants), no privilege escalation, a read-only root
    file system and the runtime's default seccomp profile. Root's uid stays: the OVS sockets
    are root's (deploy/README.md)."""
    context = _agent_container()["securityContext"]
    assert context["privileged"] is False and context["allowPrivilegeEscalation"] is False
    assert granted_capabilities(_agent_container()) == ("NET_ADMIN",)
    assert context["capabilities"]["drop"] == ["ALL"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert context["runAsUser"] == 0 and context["runAsNonRoot"] is False


def memory_limit_rule(peak_rss_mib: float) -> str:
    """The container's memory limit from the agent's measured peak RSS at 10,000 Services:
    twice it, rounded up to a multiple of 64 Mi (headroom for a cluster that grows and for a
    full resync's transient state on top of the steady one)."""
    return f"{math.ceil(2 * peak_rss_mib / 64) * 64}Mi"


def test_the_memory_limit_follows_the_measured_peak_at_10000_services() -> None:
    newest = max(
        (p for p in (REPO / "bench" / "results").glob("*-scale.json")),
        key=lambda p: p.name,
    )
    sizes = json.loads(newest.read_text())["scale"]["sizes"]
    (at_10k,) = [s for s in sizes if s["services"] == 10_000]
    limit = _agent_container()["resources"]["limits"]["memory"]
    assert limit == memory_limit_rule(at_10k["peak_rss_mb"]), (newest.name, at_10k)
