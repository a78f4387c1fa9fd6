"""The shipped deployment exercised: the DaemonSet's container command, with each variant's
ConfigMap mounted as the kubelet would, run on a sandbox node against a (fake) Kubernetes API,
serves a ClusterIP with real HTTP from a pod and from the node.

The ConfigMap's file is used as shipped. Overridden with flags (which win over the file), and
only because this machine differs from a node: the OVS sockets (the sandbox's run directory
instead of /var/run/openvswitch), the API (a kubeconfig naming the fake instead of the pod's
service account), the node's network namespace (the agent runs in the test's namespace, not
in the node's as a hostNetwork pod does) and the HTTP ports (10256 on every address of this
machine's namespace may be taken: the health address is turned off and the metrics one moved;
the probes' port is checked by test_manifests). The sandbox
is built with the variant's bridge and gateway names, so those come from the file.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from support.k8s_fake import FakeKubeApi

from ovsproxy.config import load
from ovsproxy.lab import EXAMPLES, build_lab
from ovsproxy.ovs.sandbox import Sandbox
from ovsproxy.ovs.traffic import run_in_netns
from tests.deploy.kube import DEPLOY, container_args, kustomize_build
from tests.e2e import test_integrated
from tests.e2e.harness import free_port

pytestmark = [pytest.mark.slow, pytest.mark.ovs]

PLURALS = {"Service": "services", "EndpointSlice": "endpointslices"}
WEB = ("http://10.96.0.10/", {"web-1", "web-2"})  # src/ovsproxy/examples/web.yaml


@pytest.fixture(params=["standalone", "integrated"])
def variant(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, list[str]]:
    """The variant's name and its container's arguments (ConfigMap written under tmp_path)."""
    docs = kustomize_build(DEPLOY / request.param)
    args, _ = container_args(docs, tmp_path, {"NODE_NAME": "node-1"})
    return request.param, args


async def test_the_shipped_daemonset_serves_a_cluster_ip(
    variant: tuple[str, list[str]], tmp_path: Path
) -> None:
    name, args = variant
    async with FakeKubeApi() as api:
        for doc in yaml.safe_load_all((EXAMPLES / "web.yaml").read_text()):
            api.apply(PLURALS[doc["kind"]], doc)
        kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
        # The fake answers on this loop while the node and the agent run in a thread.
        await asyncio.to_thread(run_and_check, name, args, kubeconfig, tmp_path)


def run_and_check(name: str, args: list[str], kubeconfig: Path, tmp_path: Path) -> None:
    """A sandbox node as the variant needs it, the container's command on it, then HTTP to
    the example ClusterIP from a pod and from the node."""
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
        port = free_port()
        command = [
            *(sys.executable, "-m", "ovsproxy", *args),  # ENTRYPOINT ["ovsproxy"] + args
            *("--ovsdb", sandbox.ovsdb, "--openflow", sandbox.openflow),
            *("--kubeconfig", str(kubeconfig), "--netns", sandbox.netns),
            *("--metrics-address", f"127.0.0.1:{port}", "--health-address", ""),
        ]
        log = tmp_path / "agent.log"
        with log.open("wb") as out:
            agent = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        try:
            wait_healthy(agent, port, log)
            url, expected = WEB
            for netns in (pods["client"].netns, sandbox.netns):
                result = run_in_netns(netns, "http", url, "--count", "20", "--timeout", "2")
                assert result["failed"] == 0, (netns, result, log.read_text()[-2000:])
                assert set(result["counts"]) == expected, result
        finally:
            agent.terminate()
            agent.wait(20)


def wait_healthy(agent: subprocess.Popen[bytes], port: int, log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if agent.poll() is not None:
            raise AssertionError(f"agent exited {agent.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"agent not healthy after {timeout}s:\n{log.read_text()[-3000:]}")
