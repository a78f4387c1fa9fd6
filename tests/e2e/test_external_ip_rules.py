"""External IPs the agent refuses (issue 35), on a real ``ovsproxy run`` over manifests: the
Service is served without them (real HTTP to its ClusterIP from a pod), they are neither in
the steering table (nftables set ``external-v4``) nor in the flows (``/dump``), and the
problem names the Service and ``spec.externalIPs``.

* ``--refuse-external-ips``: every external IP;
* without it: one that is this node's own address (found on the node's devices, as the
  agent finds it), while another external IP of the same Service is steered and served.

The rule itself is ``proxy.external_ips`` (tests/proxy/test_external_ips.py); ``ovsproxy
check`` applies it too (tests/sources/test_check_cmd.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from ovsproxy.ovs.sandbox import Pod, Sandbox
from tests.e2e.harness import AgentProcess, copy_examples

pytestmark = [pytest.mark.slow, pytest.mark.ovs, pytest.mark.shared_sandbox]

EXT = "demo/ext:http/TCP"
OTHER_IP = "192.0.2.50"  # an external IP no rule refuses
NODE_IP, NODE_DEVICE = "198.51.100.7", "extnode0"


def _ext_service(external_ips: list[str]) -> str:
    return f"""apiVersion: v1
kind: Service
metadata: {{name: ext, namespace: demo}}
spec:
  clusterIP: 10.96.0.50
  externalIPs: [{", ".join(external_ips)}]
  ports: [{{name: http, port: 80, targetPort: 8080, protocol: TCP}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: ext-1
  namespace: demo
  labels: {{kubernetes.io/service-name: ext}}
addressType: IPv4
ports: [{{name: http, port: 8080, protocol: TCP}}]
endpoints:
  - addresses: [10.244.0.11]
    conditions: {{ready: true}}
"""


@pytest.fixture
def manifests(example_pods: dict[str, Pod], tmp_path: Path) -> Path:
    return copy_examples(tmp_path / "manifests")


@pytest.fixture
def start(sandbox: Sandbox, manifests: Path, tmp_path: Path) -> Iterator[type[AgentProcess]]:
    started: list[AgentProcess] = []

    def run(*flags: str) -> AgentProcess:
        agent = AgentProcess(sandbox, manifests, tmp_path / "agent.log", *flags)
        started.append(agent)
        return agent.start()

    yield run  # type: ignore[misc]
    for agent in started:
        agent.stop()


def _served(agent: AgentProcess) -> dict[str, object]:
    ports = {svc["name"]: svc for svc in agent.status()["services"]}
    return ports.get(EXT, {})


def _steered(sandbox: Sandbox) -> str:
    return sandbox.exec("nft", "list", "set", "inet", "ovsproxy", "external-v4").stdout


def _flows_to(agent: AgentProcess, ip: str) -> list[str]:
    _, dump = agent.get("/dump")
    return [line for line in dump.splitlines() if f"nw_dst={ip}," in line and "tp_dst=80" in line]


def _clusterip_serves(agent: AgentProcess, pods: dict[str, Pod]) -> None:
    web = agent.traffic(pods["client"].netns, "http", "http://10.96.0.50/", "--count", "5")
    assert web["failed"] == 0, web


def test_refuse_external_ips_serves_the_service_without_them(
    start: type[AgentProcess],
    manifests: Path,
    sandbox: Sandbox,
    example_pods: dict[str, Pod],
) -> None:
    (manifests / "ext.yaml").write_text(_ext_service([OTHER_IP]))
    agent = start("--refuse-external-ips")
    agent.wait_for(lambda: _served(agent), timeout=15, what=f"{EXT} served")
    assert _served(agent)["external_ips"] == []
    problem = (
        "Service demo/ext: spec.externalIPs: external IPs are refused on this node "
        f"(refuse_external_ips) (got '{OTHER_IP}')"
    )
    assert problem in agent.status()["problems"]
    assert problem in agent.log()
    assert OTHER_IP not in _steered(sandbox)
    assert not _flows_to(agent, OTHER_IP)
    _clusterip_serves(agent, example_pods)


@pytest.fixture
def node_address(sandbox: Sandbox) -> Iterator[str]:
    """An address of the node's own, on a device of the node's namespace (the sandbox has
    none but the gateway's; no dummy devices in this kernel: a veth pair, both ends in it)."""
    sandbox.exec(
        "ip", "link", "add", NODE_DEVICE, "type", "veth", "peer", "name", f"{NODE_DEVICE}p"
    )
    try:
        sandbox.exec("ip", "addr", "add", f"{NODE_IP}/24", "dev", NODE_DEVICE)
        sandbox.exec("ip", "link", "set", NODE_DEVICE, "up")
        yield NODE_IP
    finally:
        sandbox.exec("ip", "link", "del", NODE_DEVICE)


def test_the_nodes_own_address_is_refused_as_an_external_ip(
    start: type[AgentProcess],
    manifests: Path,
    sandbox: Sandbox,
    example_pods: dict[str, Pod],
    node_address: str,
) -> None:
    agent = start()
    found = re.search(r"node IPs \(from the node's devices\): ([0-9.]+)", agent.log())
    assert found, agent.log()[-2000:]
    node_ip = found.group(1)
    assert node_ip == node_address
    (manifests / "ext.yaml").write_text(_ext_service([OTHER_IP, node_ip]))
    agent.wait_for(
        lambda: OTHER_IP in _steered(sandbox) and _flows_to(agent, OTHER_IP),
        timeout=15,
        what=f"{OTHER_IP} steered and in the flows",
    )
    assert _served(agent)["external_ips"] == [OTHER_IP]
    assert node_ip not in _steered(sandbox)
    assert not _flows_to(agent, node_ip)
    problem = (
        f"Service demo/ext: spec.externalIPs: is this node's own address: steering it would "
        f"take the node's own traffic (got '{node_ip}')"
    )
    assert problem in agent.status()["problems"]
    _clusterip_serves(agent, example_pods)
