"""The shipped deployment exercised: the DaemonSet's container command, with each variant's
ConfigMap mounted as the kubelet would, run on a sandbox node against a (fake) Kubernetes API,
serves a ClusterIP with real HTTP from a pod and from the node.

The agent runs as the container runtime would run it: in the node's network namespace (a
hostNetwork pod; here the sandbox node's, entered before anything else), as root's uid with
only the capabilities the container's securityContext grants (``setpriv``: every other one
out of the bounding set, none inheritable, no new privileges). So it reaches the fake API, and
the test its health port, through sockets made in that namespace.

The ConfigMap's file is used as shipped. Overridden with flags (which win over the file), and
only because this machine differs from a node: the OVS sockets (the sandbox's run directory
instead of /var/run/openvswitch), the API (a kubeconfig naming the fake instead of the pod's
service account) and the metrics port (10256 may be taken; the probes' port is checked by
test_manifests). The sandbox is built with the variant's bridge and gateway names, so those
come from the file.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
import yaml
from support.k8s_fake import FakeKubeApi

from ovsproxy.config import load
from ovsproxy.lab import EXAMPLES, build_lab
from ovsproxy.netns import enter_netns
from ovsproxy.ovs.sandbox import Pod, Sandbox
from ovsproxy.ovs.traffic import run_in_netns
from tests.deploy.kube import DEPLOY, container_args, granted_capabilities, kustomize_build
from tests.e2e import test_integrated
from tests.e2e.harness import free_port

pytestmark = [pytest.mark.slow, pytest.mark.ovs]

PLURALS = {"Service": "services", "EndpointSlice": "endpointslices"}
WEB = ("http://10.96.0.10/", {"web-1", "web-2"})  # src/ovsproxy/examples/web.yaml
T = TypeVar("T")


@pytest.fixture(params=["standalone", "integrated"])
def variant(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, list[str], list[str]]:
    """The variant's name, its container's arguments (ConfigMap written under tmp_path) and
    the capabilities its securityContext grants."""
    docs = kustomize_build(DEPLOY / request.param)
    args, container = container_args(docs, tmp_path, {"NODE_NAME": "node-1"})
    return request.param, args, list(granted_capabilities(container))


async def test_the_shipped_daemonset_serves_a_cluster_ip(
    variant: tuple[str, list[str], list[str]], tmp_path: Path
) -> None:
    async with FakeKubeApi() as api:
        for doc in yaml.safe_load_all((EXAMPLES / "web.yaml").read_text()):
            api.apply(PLURALS[doc["kind"]], doc)
        # The fake answers on this loop while the node and the agent run in a thread.
        loop = asyncio.get_running_loop()
        await asyncio.to_thread(run_and_check, variant, api, loop, tmp_path)


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


def listening_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def run_and_check(
    variant: tuple[str, list[str], list[str]],
    api: FakeKubeApi,
    loop: asyncio.AbstractEventLoop,
    tmp_path: Path,
) -> None:
    """A sandbox node as the variant needs it, the container's command on it with only the
    granted capabilities, then HTTP to the example ClusterIP from a pod and from the node."""
    name, args, capabilities = variant
    shipped = load(Path(args[args.index("--config") + 1]))
    assert shipped.in_cluster and shipped.mode.value == name
    with Sandbox(bridge=shipped.bridge, gateway=shipped.gateway) as sandbox:
        pods = build_lab(sandbox)
        if name == "integrated":
            # The CNI's side of the contract: IP to first_table, forwarding in next_table.
            assert (shipped.first_table, shipped.next_table) == (
                test_integrated.FIRST,
                test_integrated.NEXT,
            )
            test_integrated.install_cni_pipeline(sandbox, pods)
        # The fake API, also on the node's loopback (where the agent is).
        sock = in_netns(sandbox.netns, listening_socket)
        port = sock.getsockname()[1]
        server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(api._on_connection, sock=sock), loop
        ).result(10)
        kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
        kubeconfig.write_text(kubeconfig.read_text().replace(api.url, f"http://127.0.0.1:{port}"))
        try:
            run_agent(sandbox, pods, args, capabilities, kubeconfig, tmp_path)
        finally:
            server.close()
            asyncio.run_coroutine_threadsafe(server.wait_closed(), loop).result(10)


def restricted(netns: str, capabilities: list[str]) -> list[str]:
    """The command prefix that runs a command as a container runtime would with these
    capabilities: in the node's namespace, every other capability out of the bounding set
    (root's uid gets only what the bounding set holds at exec), none inheritable or ambient,
    no new privileges (allowPrivilegeEscalation: false)."""
    caps = ",".join(f"+{c.lower()}" for c in capabilities)
    return [
        *("ip", "netns", "exec", netns, "setpriv", "--no-new-privs"),
        f"--bounding-set=-all,{caps}",
        "--inh-caps=-all",
        "--ambient-caps=-all",
        "--",
    ]


def run_agent(
    sandbox: Sandbox,
    pods: dict[str, Pod],
    args: list[str],
    capabilities: list[str],
    kubeconfig: Path,
    tmp_path: Path,
) -> None:
    port = in_netns(sandbox.netns, free_port)
    command = [
        *restricted(sandbox.netns, capabilities),
        *(sys.executable, "-m", "ovsproxy", *args),  # ENTRYPOINT ["ovsproxy"] + args
        *("--ovsdb", sandbox.ovsdb, "--openflow", sandbox.openflow),
        *("--kubeconfig", str(kubeconfig)),
        *("--metrics-address", f"127.0.0.1:{port}"),
    ]
    log = tmp_path / "agent.log"
    with log.open("wb") as out:
        agent = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    try:
        held = effective_capabilities(agent.pid)
        assert held == {c.lower() for c in capabilities}, held
        wait_healthy(agent, sandbox.netns, port, log)
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
