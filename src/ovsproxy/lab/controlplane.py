"""A real Kubernetes control plane on loopback, for the tests, the lab and the benches.

etcd, kube-apiserver and kube-controller-manager of the release pinned in ``tools/kube`` and
``tools/etcd`` (built once per machine by ``scripts/build-kube.sh``), each a process of ours
with its data, certificates, tokens and logs in one work directory:

* etcd: a private data directory, ``--unsafe-no-fsync`` (test data, never kept);
* kube-apiserver: RBAC authorization, dual-stack Service CIDRs (``service_cidrs``), its own
  self-signed serving certificate, static tokens for the admin (group ``system:masters``,
  which bypasses RBAC and API priority and fairness, for bulk loads) and for
  ``system:kube-proxy`` (the user kube-proxy runs as), ServiceAccount tokens through the
  TokenRequest API, automatic etcd compaction off (a test compacts when it wants a 410);
* kube-controller-manager (``controllers=True``): the EndpointSlice, EndpointSlice mirroring,
  namespace, ServiceAccount and garbage-collector controllers; never node lifecycle, which
  would taint and evict the kubelet-less nodes' pods.

Everything listens on 127.0.0.1 (ports below the ephemeral range, ``lab.ports``). The API
server advertises 127.0.0.1, which an Endpoints object may not hold, so the ``default/kubernetes``
Service's endpoint reconciler is off: that Service has a ClusterIP and no endpoints.

A record under ``/run/ovsproxy/controlplanes/`` names the processes and the work directory
before they start; ``stop()`` removes both, and ``sweep_control_plane_leftovers`` removes
those of an owner that died.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import secrets
import ssl
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from ovsproxy.lab.ports import reserve_port
from ovsproxy.ovs import sandbox as sb
from ovsproxy.ovs.namespaces import load_record, save_record, start_time

try:  # lightkube >= 1.0 builds on httpx2, older releases on httpx
    import httpx2 as httpx
except ImportError:  # pragma: no cover - depends on the installed lightkube
    import httpx  # type: ignore[no-redef]

log = logging.getLogger(__name__)

Obj = dict[str, Any]
REGISTRY = Path(os.environ.get("OVSPROXY_CONTROLPLANE_REGISTRY", "/run/ovsproxy/controlplanes"))
REPO = Path(__file__).resolve().parents[3]
RBAC_MANIFEST = REPO / "deploy" / "base" / "rbac.yaml"
DEFAULT_SERVICE_CIDRS = ("10.96.0.0/16", "fd00:10:96::/108")
CONTROLLERS = (
    "endpointslice",
    "endpointslicemirroring",
    "namespace",
    "serviceaccount",
    "serviceaccount-token",
    "garbagecollector",
)
ADMIN_USER = "ovsproxy-admin"
KUBE_PROXY_USER = "system:kube-proxy"
READY_TIMEOUT = 120.0  # kube-apiserver's /readyz takes 5-35 s on a small busy machine


class ControlPlaneError(RuntimeError):
    pass


def kube_bin_dir() -> Path:
    """The folder holding the pinned components: ``$OVSPROXY_KUBE_BIN``, or what
    ``scripts/build-kube.sh --bin-dir`` names (built for the current pins)."""
    override = os.environ.get("OVSPROXY_KUBE_BIN")
    if override:
        return Path(override)
    script = REPO / "scripts" / "build-kube.sh"
    done = subprocess.run([str(script), "--bin-dir"], capture_output=True, text=True)
    if done.returncode != 0:
        raise ControlPlaneError(
            f"the Kubernetes components are not built ({done.stderr.strip()}); "
            f"run {script} (make setup does)"
        )
    return Path(done.stdout.strip())


def kube_binary(name: str) -> Path:
    path = kube_bin_dir() / name
    if not os.access(path, os.X_OK):
        raise ControlPlaneError(f"{path}: not an executable; run scripts/build-kube.sh")
    return path


# -- the record -----------------------------------------------------------------------------
@dataclass
class ControlPlaneRecord:
    """What a control plane owns; saved before its processes start."""

    name: str
    workdir: str
    owner_pid: int
    owner_started: int | None
    persistent: bool = False
    processes: dict[str, int] = field(default_factory=dict)  # component -> pid

    @property
    def path(self) -> Path:
        return REGISTRY / f"{self.name}.json"

    def save(self) -> None:
        save_record(self.path, self)

    @classmethod
    def load(cls, path: Path) -> ControlPlaneRecord | None:
        return load_record(cls, path)

    def is_leftover(self) -> bool:
        if self.persistent:
            return not any(sb.pid_alive(pid, self.workdir) for pid in self.processes.values())
        return start_time(self.owner_pid) != self.owner_started

    def remove(self) -> None:
        """Stop every process the record names (each only while its command line still
        names the work directory), then delete the work directory and the record. Last
        started, first stopped: kube-apiserver stops in about a second while etcd is there,
        and retries for tens of seconds once it is not."""
        for pid in reversed(self.processes.values()):
            sb.stop_process(pid, self.workdir, timeout=10.0)
        sb.remove_owned("control plane", self.name, (), self.workdir, self.path)


def list_control_plane_records() -> list[ControlPlaneRecord]:
    return sb.load_records(REGISTRY, ControlPlaneRecord.load)


def sweep_control_plane_leftovers() -> list[str]:
    """Remove the control planes of owners that died; returns their names."""
    cleaned = []
    for record in list_control_plane_records():
        if record.is_leftover():
            log.warning(
                "removing leftover control plane %s (pid %d)", record.name, record.owner_pid
            )
            record.remove()
            cleaned.append(record.name)
    return cleaned


# -- the control plane ----------------------------------------------------------------------
@dataclass(frozen=True)
class Identity:
    """A client of the API server: a bearer token and the name it authenticates as."""

    user: str
    token: str


class ControlPlane:
    """etcd + kube-apiserver (+ kube-controller-manager) of the pinned release, on loopback."""

    def __init__(
        self,
        name: str | None = None,
        *,
        service_cidrs: Sequence[str] = DEFAULT_SERVICE_CIDRS,
        controllers: bool = True,
        watch_cache: bool = True,
        persistent: bool = False,
        workdir: Path | None = None,
        extra_apiserver_args: Sequence[str] = (),
    ) -> None:
        self.name = name or f"ovsp-cp-{os.getpid()}-{secrets.token_hex(3)}"
        self.service_cidrs = tuple(service_cidrs)
        self.controllers = controllers
        self.watch_cache = watch_cache
        self.extra_apiserver_args = tuple(extra_apiserver_args)
        base = workdir or Path(tempfile.gettempdir())
        self.workdir = base / self.name
        self.record = ControlPlaneRecord(
            name=self.name,
            workdir=str(self.workdir),
            owner_pid=os.getpid(),
            owner_started=start_time(os.getpid()),
            persistent=persistent,
        )
        self.admin = Identity(ADMIN_USER, secrets.token_hex(16))
        self.kube_proxy = Identity(KUBE_PROXY_USER, secrets.token_hex(16))
        self.etcd_port = 0
        self.port = 0
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._client: httpx.Client | None = None

    # -- addresses and files
    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.etcd_port}"

    @property
    def ca_file(self) -> Path:
        """The API server's self-signed serving certificate (it is its own chain's root)."""
        return self.workdir / "certs" / "apiserver.crt"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    def log_file(self, component: str) -> Path:
        return self.workdir / f"{component}.log"

    def kubeconfig(self, path: Path, identity: Identity, *, namespace: str = "default") -> Path:
        """A kubeconfig file for ``identity`` (verifies the server's certificate)."""
        ca = self.ca_file.read_bytes()
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": self.name,
                    "cluster": {
                        "server": self.url,
                        "certificate-authority-data": base64.b64encode(ca).decode(),
                    },
                }
            ],
            "users": [{"name": identity.user, "user": {"token": identity.token}}],
            "contexts": [
                {
                    "name": self.name,
                    "context": {
                        "cluster": self.name,
                        "user": identity.user,
                        "namespace": namespace,
                    },
                }
            ],
            "current-context": self.name,
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(config, indent=2))
        path.chmod(0o600)
        return path

    # -- life
    def start(self) -> Self:
        sweep_control_plane_leftovers()
        self.record.save()
        try:
            self.workdir.mkdir(parents=True, exist_ok=False)
            self._write_credentials()
            self._start_etcd()
            self._start_apiserver()
            self.kubeconfig(self.admin_kubeconfig, self.admin)
            if self.controllers:
                self._start_controller_manager()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        for proc in reversed(self._procs.values()):  # as ControlPlaneRecord.remove
            sb.stop_process(proc.pid, str(self.workdir), timeout=10.0)
        self._procs.clear()
        self.record.remove()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _write_credentials(self) -> None:
        key = self.workdir / "sa.key"
        subprocess.run(
            ["openssl", "genrsa", "-out", str(key), "2048"], check=True, capture_output=True
        )
        key.chmod(0o600)
        tokens = self.workdir / "tokens.csv"
        tokens.write_text(
            f'{self.admin.token},{self.admin.user},uid-admin,"system:masters"\n'
            f"{self.kube_proxy.token},{self.kube_proxy.user},uid-kube-proxy\n"
        )
        tokens.chmod(0o600)

    def _spawn(self, component: str, argv: Sequence[str]) -> subprocess.Popen[bytes]:
        out = self.log_file(component).open("ab")
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C of the test run reaches us, not them
        )
        out.close()
        self._procs[component] = proc
        self.record.processes[component] = proc.pid
        self.record.save()
        return proc

    def _start_etcd(self) -> None:
        self.etcd_port = reserve_port()
        peer = reserve_port()
        self._spawn(
            "etcd",
            [
                str(kube_binary("etcd")),
                "--name=ovsp",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=ovsp=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        self._wait("etcd", self._etcd_healthy, timeout=30.0)

    def _etcd_healthy(self) -> bool:
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{self.etcd_url}/health", timeout=2).status_code == 200
        return False

    def apiserver_args(self) -> list[str]:
        key = self.workdir / "sa.key"
        args = [
            str(kube_binary("kube-apiserver")),
            f"--etcd-servers={self.etcd_url}",
            "--etcd-compaction-interval=0",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.port}",
            f"--cert-dir={self.workdir / 'certs'}",
            f"--service-cluster-ip-range={','.join(self.service_cidrs)}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={key}",
            f"--service-account-signing-key-file={key}",
            "--authorization-mode=RBAC",
            f"--token-auth-file={self.workdir / 'tokens.csv'}",
            "--endpoint-reconciler-type=none",
            # No kubelet runs the pods the tests create, and none of them mounts a token.
            "--disable-admission-plugins=ServiceAccount",
            "--allow-privileged=true",
            "--profiling=false",
            "--v=1",
        ]
        if not self.watch_cache:
            args.append("--watch-cache=false")
        args.extend(self.extra_apiserver_args)
        return args

    def _start_apiserver(self) -> None:
        if not self.port:
            self.port = reserve_port()
        self._spawn("kube-apiserver", self.apiserver_args())
        self._wait("kube-apiserver", self._apiserver_ready, timeout=READY_TIMEOUT)

    def _apiserver_ready(self) -> bool:
        with contextlib.suppress(httpx.HTTPError):
            # /readyz is readable anonymously (system:public-info-viewer).
            return httpx.get(f"{self.url}/readyz", verify=False, timeout=3).status_code == 200
        return False

    def _start_controller_manager(self) -> None:
        kubeconfig = self.kubeconfig(self.workdir / "kcm.kubeconfig", self.admin)
        self._spawn(
            "kube-controller-manager",
            [
                str(kube_binary("kube-controller-manager")),
                f"--kubeconfig={kubeconfig}",
                f"--controllers={','.join(CONTROLLERS)}",
                f"--service-account-private-key-file={self.workdir / 'sa.key'}",
                "--leader-elect=false",
                "--secure-port=0",
                "--v=1",
            ],
        )

    def _wait(self, component: str, ready: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        proc = self._procs[component]
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ControlPlaneError(
                    f"{component} exited with {proc.returncode}: {self._tail(component)}"
                )
            if ready():
                return
            time.sleep(0.2)
        raise ControlPlaneError(
            f"{component} not ready in {timeout:.0f} s: {self._tail(component)}"
        )

    def _tail(self, component: str, lines: int = 15) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_file(component).read_text().splitlines()[-lines:])
        return "(no log)"

    def restart_apiserver(self, *, down_for: float = 0.0) -> None:
        """Stop kube-apiserver (SIGTERM), wait ``down_for`` seconds, start it again on the
        same port and wait until it is ready."""
        proc = self._procs.pop("kube-apiserver")
        sb.stop_process(proc.pid, str(self.workdir), timeout=15.0)
        time.sleep(down_for)
        self._start_apiserver()

    def compact(self) -> int:
        """Compact etcd to its current revision (physically); returns that revision. A watch
        from an older resourceVersion then gets 410 Gone (with ``watch_cache=False``)."""
        head = httpx.post(f"{self.etcd_url}/v3/kv/range", json={"key": "AA=="}, timeout=10)
        head.raise_for_status()
        revision = int(head.json()["header"]["revision"])
        done = httpx.post(
            f"{self.etcd_url}/v3/kv/compaction",
            json={"revision": str(revision), "physical": True},
            timeout=30,
        )
        done.raise_for_status()
        return revision

    # -- the admin's client
    @property
    def client(self) -> httpx.Client:
        """An HTTP client of the API server as the admin (``system:masters``)."""
        if self._client is None:
            self._client = httpx.Client(
                base_url=self.url,
                verify=ssl.create_default_context(cafile=str(self.ca_file)),
                headers={"Authorization": f"Bearer {self.admin.token}"},
                timeout=30,
            )
        return self._client

    def request(
        self,
        method: str,
        path: str,
        body: Obj | None = None,
        *,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        ok: Sequence[int] = (200, 201, 202),
    ) -> Obj:
        """One API request as the admin; raises ``ApiError`` on a status not in ``ok``."""
        response = self.client.request(
            method,
            path,
            content=None if body is None else json.dumps(body).encode(),
            params=params,
            headers={"Content-Type": content_type},
        )
        if response.status_code not in ok:
            raise ApiError(method, path, response.status_code, response.text)
        return response.json() if response.content else {}

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        kubeconfig: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """kubectl of the pinned release against this control plane (as the admin)."""
        config = kubeconfig or self.admin_kubeconfig
        done = subprocess.run(
            [str(kube_binary("kubectl")), f"--kubeconfig={config}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check and done.returncode != 0:
            raise ControlPlaneError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
        return done

    def service_account_token(
        self, namespace: str, name: str, *, seconds: int = 3600, create: bool = True
    ) -> Identity:
        """A token of ServiceAccount ``namespace/name`` from the TokenRequest API."""
        if create:
            self.request(
                "POST",
                f"/api/v1/namespaces/{namespace}/serviceaccounts",
                {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}},
                ok=(201, 409),
            )
        answer = self.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": seconds},
            },
        )
        return Identity(f"system:serviceaccount:{namespace}:{name}", answer["status"]["token"])

    def ovsproxy_kubeconfig(self, path: Path, *, seconds: int = 86400) -> Path:
        """A kubeconfig for the agent as deployed: ``deploy/base/rbac.yaml`` applied (its
        ServiceAccount, ClusterRole and binding), a token of that ServiceAccount."""
        self.kubectl("apply", "-f", str(RBAC_MANIFEST))
        token = self.service_account_token("kube-system", "ovsproxy", seconds=seconds)
        return self.kubeconfig(path, token)

    def create_namespace(self, name: str) -> None:
        self.request(
            "POST",
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
            ok=(201, 409),
        )

    def processes(self) -> Iterator[tuple[str, int]]:
        for component, proc in self._procs.items():
            yield component, proc.pid


class ApiError(ControlPlaneError):
    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        self.status = status
        self.body = body
        reason = body
        with contextlib.suppress(ValueError, AttributeError):
            reason = json.loads(body).get("message", body)
        super().__init__(f"{method} {path}: {status} {reason}")
