"""The shipped deployment exercised: the DaemonSet's container command, with each variant's
ConfigMap mounted as the kubelet would, run on a sandbox node as the shipped ServiceAccount
against the real kube-apiserver, serves a ClusterIP with real HTTP from a pod and from the node.

The agent runs as the container runtime would run it: in the node's network namespace (a
hostNetwork pod; here the sandbox node's, entered before anything else), with the pod's
service account where a container has it (``/var/run/secrets/kubernetes.io/serviceaccount``:
a token of ``deploy/base/rbac.yaml``'s ServiceAccount, the server's CA, the namespace;
bind-mounted in a private mount namespace, as in tests/e2e/test_in_cluster.py), the
environment the DaemonSet gives it (``KUBERNETES_SERVICE_HOST``/``_PORT`` from the
``ovsproxy-apiserver`` ConfigMap, its placeholder host replaced as an operator does;
``NODE_NAME``), as root's uid with only the capabilities the container's securityContext
grants (``setpriv``: every other one out of the bounding set, none inheritable, no new
privileges).

How the agent in the node's namespace reaches the API server, which listens on 127.0.0.1 of
the machine's (root) namespace: a forwarder the test owns (``support.tcpcut.Forwarder``)
serving a listening socket made inside the node's namespace, on the port the ConfigMap ships
(6443, free there: the namespace is the test's), and relaying each connection to the server
from the test's thread, in the root namespace. A socket stays in the namespace it was made
in, so no address, route or veth is added to the root namespace and no traffic leaves
namespaces the test made or loopback; TLS passes through untouched (the agent verifies the
server's certificate, which names 127.0.0.1). A veth pair with routes would touch the root
namespace; a unix socket would need a second relay inside the node's namespace to give the
agent a TCP address.

The ConfigMap's file is used as shipped (``source: kubernetes``: in-cluster). Overridden with
flags (which win over the file), and only because this machine differs from a node: the OVS
sockets (the sandbox's run directory instead of /var/run/openvswitch) and the metrics port
(10256 may be taken; the probes' port is checked by test_manifests). The sandbox is built with
the variant's bridge and gateway names, so those come from the file.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest
from support.tcpcut import Forwarder

from ovsproxy.config import load
from ovsproxy.lab import EXAMPLES, build_lab
from ovsproxy.lab.controlplane import ControlPlane
from ovsproxy.netns import enter_netns
from ovsproxy.ovs.sandbox import Pod, Sandbox
from ovsproxy.ovs.traffic import run_in_netns
from tests.deploy.kube import DEPLOY, Doc, container_args, granted_capabilities, kustomize_build
from tests.e2e import test_integrated
from tests.e2e.harness import free_port
from tests.e2e.test_in_cluster import (  # noqa: F401  (secrets_mountpoint: a fixture)
    in_a_pods_mounts,
    secrets_mountpoint,
    service_account_dir,
)

pytestmark = [pytest.mark.slow, pytest.mark.ovs]

WEB = ("http://10.96.0.10/", {"web-1", "web-2"})  # src/ovsproxy/examples/web.yaml
API_HOST = "127.0.0.1"  # the ConfigMap's placeholder replaced: where the node reaches the server
T = TypeVar("T")


@dataclass(frozen=True)
class Variant:
    name: str
    args: list[str]  # the container's arguments (ConfigMap written under tmp_path)
    capabilities: list[str]  # what its securityContext grants
    env: dict[str, str]  # what the DaemonSet puts in the container's environment


def pod_env(docs: list[Doc], container: Doc, node_name: str) -> dict[str, str]:
    """The container's environment: its envFrom ConfigMaps, then its env (fieldRef
    ``spec.nodeName`` as the kubelet resolves it)."""
    configmaps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(configmaps[source["configMapRef"]["name"]]["data"])
    for entry in container.get("env", []):
        field = entry.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        assert "value" in entry or field == "spec.nodeName", entry
        env[entry["name"]] = entry.get("value", node_name)
    return env


@pytest.fixture(params=["standalone", "integrated"])
def variant(request: pytest.FixtureRequest, tmp_path: Path) -> Variant:
    docs = kustomize_build(DEPLOY / request.param)
    args, container = container_args(docs, tmp_path, {"NODE_NAME": "node-1"})
    env = pod_env(docs, container, "node-1")
    return Variant(request.param, args, list(granted_capabilities(container)), env)


@pytest.fixture(scope="module")
def web(control_plane: ControlPlane, demo_namespace: str) -> Iterator[None]:
    """The example Service and its EndpointSlice, created through the API (namespace demo)."""
    control_plane.kubectl("apply", "-f", str(EXAMPLES / "web.yaml"))
    yield


@pytest.mark.usefixtures("web", "secrets_mountpoint")
async def test_the_shipped_daemonset_serves_a_cluster_ip(
    variant: Variant, control_plane: ControlPlane, tmp_path: Path
) -> None:
    account = service_account_dir(control_plane, tmp_path / "serviceaccount")
    # The forwarder relays on this loop while the node and the agent run in a thread.
    loop = asyncio.get_running_loop()
    await asyncio.to_thread(run_and_check, variant, control_plane, account, loop, tmp_path)


def in_netns(netns: str, work: Callable[[], T]) -> T:
    """``work()`` on a thread of its own that joined ``netns`` (its sockets are the
    namespace's)."""
    outcome: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            enter_netns(netns)
            outcome.append(work())
        except BaseException as exc:  # re-raised in the caller
            failure.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return outcome[0]


def listening_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((host, port))
    sock.listen()
    return sock


def run_and_check(
    variant: Variant,
    api: ControlPlane,
    account: Path,
    loop: asyncio.AbstractEventLoop,
    tmp_path: Path,
) -> None:
    """A sandbox node as the variant needs it, the container's command on it with only the
    granted capabilities, then HTTP to the example ClusterIP from a pod and from the node."""
    args = variant.args
    shipped = load(Path(args[args.index("--config") + 1]))
    assert shipped.in_cluster and shipped.mode.value == variant.name
    with Sandbox(bridge=shipped.bridge, gateway=shipped.gateway) as sandbox:
        pods = build_lab(sandbox)
        if variant.name == "integrated":
            # The CNI's side of the contract: IP to first_table, forwarding in next_table.
            assert (shipped.first_table, shipped.next_table) == (
                test_integrated.FIRST,
                test_integrated.NEXT,
            )
            test_integrated.install_cni_pipeline(sandbox, pods)
        # The API server, on the node's loopback at the shipped port (see the docstring).
        port = int(variant.env["KUBERNETES_SERVICE_PORT"])
        sock = in_netns(sandbox.netns, lambda: listening_socket(API_HOST, port))
        forwarder = Forwarder("127.0.0.1", api.port, listen=sock)
        asyncio.run_coroutine_threadsafe(forwarder.__aenter__(), loop).result(10)
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        env.update(variant.env, KUBERNETES_SERVICE_HOST=API_HOST)
        try:
            run_agent(sandbox, pods, variant, env, account, tmp_path)
            assert forwarder.connections > 0  # the agent's requests went through it
        finally:
            asyncio.run_coroutine_threadsafe(forwarder.__aexit__(None, None, None), loop).result(10)


def restricted(netns: str, capabilities: list[str], mounts: tuple[str, ...] = ()) -> list[str]:
    """The command prefix that runs a command as a container runtime would with these
    capabilities: in the node's namespace (and under ``mounts``, a command that sets up the
    pod's mounts and execs the rest), every other capability out of the bounding set (root's
    uid gets only what the bounding set holds at exec), none inheritable or ambient, no new
    privileges (allowPrivilegeEscalation: false)."""
    caps = ",".join(f"+{c.lower()}" for c in capabilities)
    return [
        *("ip", "netns", "exec", netns, *mounts, "setpriv", "--no-new-privs"),
        f"--bounding-set=-all,{caps}",
        "--inh-caps=-all",
        "--ambient-caps=-all",
        "--",
    ]


def run_agent(
    sandbox: Sandbox,
    pods: dict[str, Pod],
    variant: Variant,
    env: dict[str, str],
    account: Path,
    tmp_path: Path,
) -> None:
    port = in_netns(sandbox.netns, free_port)
    capabilities = variant.capabilities
    command = [
        *restricted(sandbox.netns, capabilities, in_a_pods_mounts(account)),
        *(sys.executable, "-m", "ovsproxy", *variant.args),  # ENTRYPOINT ["ovsproxy"] + args
        *("--ovsdb", sandbox.ovsdb, "--openflow", sandbox.openflow),
        *("--metrics-address", f"127.0.0.1:{port}"),
    ]
    log = tmp_path / "agent.log"
    with log.open("wb") as out:
        agent = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
    try:
        held = effective_capabilities(agent.pid)
        assert held == {c.lower() for c in capabilities}, held
        wait_healthy(agent, sandbox.netns, port, log)
        assert "source: Kubernetes API (in-cluster service account)" in log.read_text()
        url, expected = WEB
        for netns in (pods["client"].netns, sandbox.netns):
            result = run_in_netns(netns, "http", url, "--count", "20", "--timeout", "2")
            assert result["failed"] == 0, (netns, result, log.read_text()[-2000:])
            assert set(result["counts"]) == expected, result
    finally:
        agent.terminate()
        agent.wait(20)


def effective_capabilities(pid: int, timeout: float = 10) -> set[str]:
    """The capabilities the agent's process holds once it runs Python (``setpriv`` has
    exec'd it), by name."""
    deadline = time.monotonic() + timeout
    while True:
        status = Path(f"/proc/{pid}/status").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        if cmdline.split(b"\0")[0] == sys.executable.encode():  # exec'd by setpriv
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"the agent did not start: {cmdline!r}")
        time.sleep(0.02)
    (mask,) = [
        int(line.split()[1], 16) for line in status.splitlines() if line.startswith("CapEff:")
    ]
    names = subprocess.run(
        ["capsh", f"--decode={mask:x}"], capture_output=True, text=True, check=True
    ).stdout
    decoded = names.strip().split("=", 1)[1]
    return {c.removeprefix("cap_") for c in decoded.split(",") if c}


def wait_healthy(
    agent: subprocess.Popen[bytes], netns: str, port: int, log: Path, timeout: float = 60
) -> None:
    def healthy() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if agent.poll() is not None:
            raise AssertionError(f"agent exited {agent.returncode}:\n{log.read_text()[-3000:]}")
        if in_netns(netns, healthy):
            return
        time.sleep(0.1)
    raise AssertionError(f"agent not healthy after {timeout}s:\n{log.read_text()[-3000:]}")
