"""Hostile manifest files beside good ones (issue 35): a real ``ovsproxy run`` on real files.

Each hostile file is one file's problem: it is reported, the good files' Services keep
serving (real HTTP from a pod), and a good file written after it is still applied (the scan
goes on). An unreadable file is made with ``/proc/self/mem`` behind a symlink: a regular file
whose every read at offset 0 fails with EIO, even for root (chmod 000 does not stop root).
"""

from __future__ import annotations

import os
import resource
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ovsproxy.ovs.sandbox import Pod, Sandbox
from tests.e2e.harness import AgentProcess, copy_examples

pytestmark = [pytest.mark.slow, pytest.mark.ovs, pytest.mark.shared_sandbox]

WEB = "http://10.96.0.10/"
LATE = "demo/late:http/TCP"
MAX_BYTES = 1_000_000  # the agent's manifest_max_bytes here
# Address space the agent may grow by once running: a file read without bound (today's
# /dev/zero) ends as a MemoryError in the agent, not in the machine's memory.
AGENT_MEMORY_HEADROOM = 2 << 30


def _service_yaml(name: str, cluster_ip: str) -> str:
    return f"""apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: demo}}
spec:
  clusterIP: {cluster_ip}
  ports: [{{name: http, port: 80, targetPort: 8080, protocol: TCP}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {name}-1
  namespace: demo
  labels: {{kubernetes.io/service-name: {name}}}
addressType: IPv4
ports: [{{name: http, port: 8080, protocol: TCP}}]
endpoints:
  - addresses: [10.244.0.11]
    conditions: {{ready: true}}
"""


def _alias_bomb() -> str:
    """A billion laughs (10**9 strings from 90 written) with one wrong-typed field."""
    levels = "    a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"    a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 9)
    )
    return (
        _service_yaml("bomb", "10.96.0.91").split("---")[0]
        + f"  selector: {{app: {{wrong: type}}}}\n  x-laughs:\n{levels}  externalIPs: *a8\n"
    )


def _wrong_typed(count: int) -> str:
    ports = "".join(f"  - {{name: p{i}, port: [x], protocol: TCP}}\n" for i in range(count))
    return (
        "apiVersion: v1\nkind: Service\nmetadata: {name: typed, namespace: demo}\n"
        f"spec:\n  clusterIP: 10.96.0.92\n  ports:\n{ports}"
    )


def _oversize() -> str:
    padding = "".join(f"# {'.' * 98}\n" for _ in range(MAX_BYTES // 100 + 10))
    return _service_yaml("big", "10.96.0.93") + padding


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _dev_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _text(text: Callable[[], str]) -> Callable[[Path], None]:
    return lambda path: path.write_text(text())


HOSTILE: dict[str, Callable[[Path], None]] = {
    "fifo": _fifo,
    "symlink to /dev/zero": _dev_zero,
    "alias bomb": _text(_alias_bomb),
    "over-size file": _text(_oversize),
    "1,200 wrong-typed values": _text(lambda: _wrong_typed(1200)),
}


@pytest.fixture
def agent(example_pods: dict[str, Pod], sandbox: Sandbox, tmp_path: Path) -> Iterator[AgentProcess]:
    manifests = copy_examples(tmp_path / "manifests")
    process = AgentProcess(
        sandbox, manifests, tmp_path / "agent.log", "--manifest-max-bytes", str(MAX_BYTES)
    )
    process.start()
    try:
        assert process.proc is not None
        soft = _address_space(process.proc.pid) + AGENT_MEMORY_HEADROOM
        resource.prlimit(process.proc.pid, resource.RLIMIT_AS, (soft, soft))
        yield process
    finally:
        process.stop()


def _address_space(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmSize")


def _names(agent: AgentProcess) -> set[str]:
    return {svc["name"] for svc in agent.status()["services"]}


def _web_serves(agent: AgentProcess, pods: dict[str, Pod]) -> None:
    web = agent.traffic(pods["client"].netns, "http", WEB, "--count", "20")
    assert web["failed"] == 0 and set(web["counts"]) == {"web-1", "web-2"}, web


def _then_a_good_file_applies(agent: AgentProcess) -> None:
    assert agent.manifests is not None
    (agent.manifests / "late.yaml").write_text(_service_yaml("late", "10.96.0.77"))
    agent.wait_for(lambda: LATE in _names(agent), timeout=15, what=f"{LATE} to be installed")


@pytest.mark.parametrize("hostile", list(HOSTILE))
def test_a_hostile_file_is_reported_and_the_others_keep_serving(
    agent: AgentProcess, example_pods: dict[str, Pod], hostile: str
) -> None:
    assert agent.manifests is not None
    path = agent.manifests / f"hostile-{hostile.split(maxsplit=1)[0].strip(',')}.yaml"
    HOSTILE[hostile](path)
    _then_a_good_file_applies(agent)
    assert agent.proc is not None and agent.proc.poll() is None, agent.log()[-3000:]
    assert str(path) in agent.log(), f"{path} not reported"
    names = _names(agent)
    assert "demo/web:http/TCP" in names
    assert not {"demo/bomb:http/TCP", "demo/big:http/TCP", "demo/typed:p0/TCP"} & names
    _web_serves(agent, example_pods)


def test_an_unreadable_file_keeps_its_last_good_content(
    agent: AgentProcess, example_pods: dict[str, Pod]
) -> None:
    """web.yaml becomes a file whose reads fail (EIO): its Service is not withdrawn."""
    assert agent.manifests is not None
    web = agent.manifests / "web.yaml"
    unreadable = agent.manifests / ".web.yaml.tmp"
    unreadable.symlink_to("/proc/self/mem")  # the agent's own: reads at offset 0 fail
    unreadable.replace(web)
    _then_a_good_file_applies(agent)  # (the scan that reads late.yaml met web.yaml's EIO)
    assert "demo/web:http/TCP" in _names(agent)
    assert f"{web}: cannot be read" in agent.log()
    _web_serves(agent, example_pods)


def test_the_agent_starts_with_hostile_files_in_place(
    example_pods: dict[str, Pod], sandbox: Sandbox, tmp_path: Path
) -> None:
    """At start-up: the first scan meets them all, and the agent comes up serving."""
    manifests = copy_examples(tmp_path / "manifests")
    for name, make in HOSTILE.items():
        if name != "symlink to /dev/zero":  # (unbounded before the fix: not before a limit)
            make(manifests / f"hostile-{name.split()[0].strip(',')}.yaml")
    agent = AgentProcess(
        sandbox, manifests, tmp_path / "agent.log", "--manifest-max-bytes", str(MAX_BYTES)
    )
    try:
        agent.start(timeout=30)
        _web_serves(agent, example_pods)
        _then_a_good_file_applies(agent)
    finally:
        agent.stop()
