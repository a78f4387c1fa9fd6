"""``--in-cluster`` as a pod has it: an ``ovsproxy run`` process whose service account is
mounted where a container runtime mounts it (``/var/run/secrets/kubernetes.io/serviceaccount``,
bind-mounted in a private mount namespace made with ``unshare -m``: the machine's own
filesystem never shows it) and whose server is ``$KUBERNETES_SERVICE_HOST``/``_PORT``, reading
the real kube-apiserver with the token of the shipped RBAC's ServiceAccount. ``--in-cluster``
means that configuration and nothing else: never ``$KUBECONFIG``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ovsproxy.lab.controlplane import ControlPlane, Identity
from ovsproxy.ovs.sandbox import Sandbox
from tests.e2e.harness import AgentProcess

pytestmark = [pytest.mark.slow, pytest.mark.ovs]

SECRETS = Path("/run/secrets")  # /var/run is /run here
MOUNTED = "/var/run/secrets/kubernetes.io/serviceaccount"


@pytest.fixture
def secrets_mountpoint() -> Iterator[Path]:
    """``/run/secrets``, an empty directory to mount a private tmpfs on (made if missing,
    removed after if we made it)."""
    made = not SECRETS.exists()
    SECRETS.mkdir(exist_ok=True)
    yield SECRETS
    if made:
        with contextlib.suppress(OSError):
            SECRETS.rmdir()


def service_account_dir(api: ControlPlane, path: Path) -> Path:
    """What the kubelet projects: the ServiceAccount's token, the cluster's CA, the namespace."""
    api.kubectl("apply", "-f", str(Path(__file__).parents[2] / "deploy/base/rbac.yaml"))
    token = api.service_account_token("kube-system", "ovsproxy", create=False)
    path.mkdir()
    (path / "token").write_text(token.token)
    shutil.copy(api.ca_file, path / "ca.crt")
    (path / "namespace").write_text("kube-system")
    return path


def pod_environment(api: ControlPlane, kubeconfig: Path) -> dict[str, str]:
    return {
        **os.environ,
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": str(api.port),
        "KUBECONFIG": str(kubeconfig),
    }


def in_a_pods_mounts(account: Path) -> tuple[str, ...]:
    """``unshare -m``: a private tmpfs on /run/secrets holding the account where a pod has it."""
    script = (
        "mount --make-rprivate / && mount -t tmpfs -o mode=0755 tmpfs /run/secrets && "
        f"mkdir -p {MOUNTED} && mount --bind {account} {MOUNTED} && "
        f'mount -o remount,bind,ro {MOUNTED} && exec "$@"'
    )
    return ("unshare", "-m", "sh", "-c", script, "sh")


def other_kubeconfig(api: ControlPlane, path: Path, token: str) -> Path:
    return api.kubeconfig(path, Identity("nobody", token))


async def test_in_cluster_reads_the_pods_service_account_and_nothing_else(
    kube_api: ControlPlane, sandbox: Sandbox, tmp_path: Path, secrets_mountpoint: Path
) -> None:
    account = service_account_dir(kube_api, tmp_path / "serviceaccount")
    # $KUBECONFIG names a token the server refuses: were it read, nothing would sync.
    decoy = other_kubeconfig(kube_api, tmp_path / "decoy.kubeconfig", "not-a-valid-token")
    agent = AgentProcess(
        sandbox,
        None,
        tmp_path / "agent.log",
        "--in-cluster",
        prefix=in_a_pods_mounts(account),
        env=pod_environment(kube_api, decoy),
    )
    try:
        await asyncio.to_thread(agent.start, 60)
        status = agent.status()
        assert "default/kubernetes:https/TCP" in {s["name"] for s in status["services"]}
        assert "source: Kubernetes API (in-cluster service account)" in agent.log()
        assert not await asyncio.to_thread(
            os.path.exists, MOUNTED
        )  # the machine's own mounts never had it
    finally:
        await asyncio.to_thread(agent.stop)


async def test_in_cluster_without_a_service_account_is_an_error_not_kubeconfig(
    kube_api: ControlPlane, sandbox: Sandbox, tmp_path: Path
) -> None:
    """No account mounted, $KUBECONFIG valid (the admin's): --in-cluster must not fall back
    to it, and says what is missing."""
    env = pod_environment(kube_api, kube_api.admin_kubeconfig)
    agent = AgentProcess(sandbox, None, tmp_path / "agent.log", "--in-cluster", env=env)
    with contextlib.suppress(Exception):
        await asyncio.to_thread(agent.start, 20)
    try:
        deadline = time.monotonic() + 20
        while agent.proc is not None and agent.proc.poll() is None:
            assert time.monotonic() < deadline, "the agent ran on $KUBECONFIG:\n" + agent.log()
            await asyncio.sleep(0.2)
        log = agent.log()
        assert f"in-cluster: {MOUNTED}/token, {MOUNTED}/ca.crt, {MOUNTED}/namespace missing" in log
    finally:
        await asyncio.to_thread(agent.stop)
