"""docs/byhand.md's commands ("Beside an OVS you set up yourself"), run as written.

The blocks marked ``<!-- readme-test: NAME -->`` are taken from docs/byhand.md itself, so the
document and this test cannot drift. They run as a newcomer runs them in a root shell, except
that the "node" is a network namespace this test creates (entered with nsenter for the network only:
the pod namespaces the commands create must be visible to every later command), and $DEMO and
$NS point at this test's directory and namespace names.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ovsproxy.ovs.namespaces import create_netns, delete_netns, record_netns
from ovsproxy.ovs.sandbox import NETNS_PREFIX, Sandbox, netns_exists

DOCS = Path(__file__).resolve().parents[1] / "docs"
BYHAND = DOCS / "byhand.md"
BLOCK = re.compile(r"<!-- readme-test: (\w+) -->\n```sh\n(.*?)```", re.S)
PODS = ("web-1", "client", "outside")  # the namespaces the commands create (outside: a client)


def readme_blocks(text: str) -> dict[str, str]:
    blocks = {name: body for name, body in BLOCK.findall(text)}
    assert set(blocks) == {"setup", "run", "try", "nodeport", "teardown"}, sorted(blocks)
    return blocks


class Node:
    """A network namespace standing in for the node, and the environment of a root shell."""

    def __init__(self, tmp_path: Path) -> None:
        self.netns = f"{NETNS_PREFIX}rd{secrets.token_hex(3)}"
        self.demo = tmp_path / "demo"
        bindir = str(Path(sys.executable).parent)
        self.env = {
            "PATH": f"{bindir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": str(tmp_path),
            "LANG": "C.UTF-8",
            "DEMO": str(self.demo),
            "NS": self.netns,
        }
        if "PYTHONPATH" in os.environ:  # `ovsproxy` runs the code under test (a worktree's)
            self.env["PYTHONPATH"] = os.environ["PYTHONPATH"]

    def pod_netns(self) -> list[str]:
        return [f"{self.netns}-{pod}" for pod in PODS]

    def command(self, script: str) -> list[str]:
        enter = ["nsenter", f"--net=/run/netns/{self.netns}"]
        return [*enter, "bash", "-euo", "pipefail", "-c", script]

    def sh(self, script: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(script), env=self.env, capture_output=True, text=True, timeout=timeout
        )


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    node = Node(tmp_path)
    Sandbox.created_netns.update([node.netns, *node.pod_netns()])
    # Recorded first, the pods' too (the document's commands create those): a killed run's
    # namespaces are swept by the next sandbox start.
    for pod_ns in node.pod_netns():
        record_netns(pod_ns)
    create_netns(node.netns)
    subprocess.run(["ip", "netns", "exec", node.netns, "ip", "link", "set", "lo", "up"], check=True)
    try:
        yield node
    finally:
        _force_cleanup(node)


def _force_cleanup(node: Node) -> None:
    """Whatever the document's teardown left (it is asserted on separately): our daemons by
    pidfile, the pods' processes, the namespaces."""
    for pidfile in node.demo.glob("*.pid"):
        with contextlib.suppress(ValueError, OSError):
            pid = int(pidfile.read_text())
            if str(node.demo) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                os.kill(pid, signal.SIGKILL)
    for ns in [*node.pod_netns(), node.netns]:
        if netns_exists(ns):
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
            for pid in pids.stdout.split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
        delete_netns(ns)  # and its record


def _wait_healthy(node: Node, agent: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if agent.poll() is not None:
            pytest.fail(f"the agent exited {agent.returncode}:\n{log.read_text()[-3000:]}")
        if node.sh("curl -sf -m 2 http://127.0.0.1:10256/healthz").returncode == 0:
            return
        time.sleep(0.2)
    pytest.fail(f"the agent did not become healthy:\n{log.read_text()[-3000:]}")


@pytest.mark.slow
@pytest.mark.ovs
def test_readme_commands_beside_an_ovs_set_up_by_hand(node: Node, tmp_path: Path) -> None:
    blocks = readme_blocks(BYHAND.read_text())

    setup = node.sh(blocks["setup"])
    assert setup.returncode == 0, setup.stderr
    for ns in node.pod_netns():
        assert netns_exists(ns), ns

    log = tmp_path / "agent.log"
    with open(log, "wb") as out:
        agent = subprocess.Popen(
            node.command(blocks["run"]),
            env=node.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        _wait_healthy(node, agent, log)
        tried = node.sh(blocks["try"])
        assert tried.returncode == 0, tried.stderr + tried.stdout
        # Three requests through the ClusterIPs (pod IPv4, pod IPv6, node), each answered.
        assert tried.stdout.count("hello from web-1") == 3, tried.stdout
        assert "10.96.0.10 via 169.254.0.253 dev gw0" in tried.stdout, tried.stdout
        assert "169.254.0.253 dev gw0 scope link" in tried.stdout, tried.stdout
        # No host-SNAT step in the document: the agent made the neighbour entries itself.
        for neighbour in ("10.244.0.254", "fd00:10:244:0:ffff:ffff:ffff:fffe"):
            assert f"{neighbour} lladdr aa:bb:cc:dd:ee:ff PERMANENT" in tried.stdout, tried.stdout
        assert "demo/web:http/TCP" in tried.stdout, tried.stdout

        # NodePort 30080: from outside (both families), the node and a pod, each answered.
        nodeport = node.sh(blocks["nodeport"])
        assert nodeport.returncode == 0, nodeport.stderr + nodeport.stdout
        assert nodeport.stdout.count("hello from web-1") == 4, nodeport.stdout
        assert "nodePort: 30080" in nodeport.stdout, nodeport.stdout
        assert re.search(r"tcp \. 30080", nodeport.stdout), nodeport.stdout
        assert "fwmark 0x2000000/0x2000000 lookup 155" in nodeport.stdout, nodeport.stdout
    finally:
        os.killpg(agent.pid, signal.SIGINT)  # the document's Ctrl-C
        try:
            agent.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()
    assert agent.returncode == 0, log.read_text()[-3000:]

    # The document's teardown removes everything it set up.
    teardown = node.sh(blocks["teardown"])
    assert teardown.returncode == 0, teardown.stderr
    assert not [ns for ns in node.pod_netns() if netns_exists(ns)]
    assert not node.demo.exists()
    # Daemons exit, and the kernel frees deleted namespaces (and their veths), shortly after.
    deadline = time.monotonic() + 10
    while True:
        left = node.sh(
            "ip -o link show; ip route show proto 155; ip -6 route show proto 155; "
            "ip rule show priority 155; ip -6 rule show priority 155; nft list tables"
        )
        daemons = subprocess.run(["pgrep", "-f", str(node.demo)], capture_output=True, text=True)
        remaining = [line for line in left.stdout.splitlines() if ": lo:" not in line]
        if (not remaining and not daemons.stdout) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert remaining == [], left.stdout
    assert daemons.stdout == "", daemons.stdout


def test_the_marked_blocks_are_the_step_by_step_sections_commands() -> None:
    text = BYHAND.read_text()
    section = text[text.index("\n## Step by step\n") :]
    assert readme_blocks(section) == readme_blocks(text)


def test_the_contract_states_the_agents_own_intervals() -> None:
    """The documents' numbers are the code's constants, not typed-in guesses."""
    from ovsproxy.agent.pods import POD_POLL_INTERVAL
    from ovsproxy.config import AgentConfig
    from ovsproxy.healthcheck import ProxyHealth

    byhand = " ".join(BYHAND.read_text().split())
    assert f"Interfaces every {POD_POLL_INTERVAL:g} s" in byhand
    assert f"`--min-sync-interval`, {AgentConfig().min_sync_interval:g} s" in byhand
    observability = " ".join((DOCS / "observability.md").read_text().split())
    timeout = ProxyHealth().health_timeout
    assert f"longer than the health timeout ({timeout:g} s)" in observability
