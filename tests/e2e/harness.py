"""The agent as users run it: a real `ovsproxy run` process against a test's sandbox."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from ovsproxy.lab import EXAMPLES
from ovsproxy.lab.evidence import RigNode, probe
from ovsproxy.lab.ports import reserve_port
from ovsproxy.ovs.sandbox import Sandbox
from ovsproxy.ovs.traffic import TCP_TIMEOUT_S


def free_port() -> int:
    """Below the ephemeral range: no outgoing connection takes it before the agent binds it."""
    return reserve_port()


def copy_examples(target: Path) -> Path:
    target.mkdir(parents=True, exist_ok=True)
    for item in EXAMPLES.glob("*.yaml"):
        shutil.copy(item, target / item.name)
    return target


def run_cleanup(sandbox: Sandbox, *extra: str) -> subprocess.CompletedProcess[str]:
    """`ovsproxy cleanup` as an operator runs it on the sandbox node (``extra``: the flags
    the agent had that say where ours is: mode, group range)."""
    cmd = [
        *(sys.executable, "-m", "ovsproxy", "cleanup"),
        *("--ovsdb", sandbox.ovsdb, "--openflow", sandbox.openflow, "--netns", sandbox.netns),
        *extra,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


class AgentProcess:
    """``manifests`` None: no ``--manifests`` (give the source in ``extra``: ``--kubeconfig``)."""

    def __init__(
        self,
        sandbox: Sandbox,
        manifests: Path | None,
        log: Path,
        *extra: str,
        prefix: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.prefix = prefix  # a command the agent runs under (unshare ...)
        self.env = env  # the agent's environment [ours]
        self.sandbox = sandbox
        self.manifests = manifests
        self.log_path = log
        self.extra = extra
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30, *, wait: bool = True) -> AgentProcess:
        """Run the agent; ``wait``: until /healthz answers 200 (within ``timeout``)."""
        cmd = [
            *self.prefix,
            sys.executable,
            "-m",
            "ovsproxy",
            "run",
            "--ovsdb",
            self.sandbox.ovsdb,
            "--openflow",
            self.sandbox.openflow,
            "--netns",
            self.sandbox.netns,
            *(("--manifests", str(self.manifests)) if self.manifests is not None else ()),
            "--min-sync-interval",
            "0",
            "--metrics-address",
            f"127.0.0.1:{self.port}",
            "--health-address",
            "",  # several agents share this namespace (``extra`` may give one)
            "--node-name",
            "node-1",
            "--log-level",
            "debug",
            *self.extra,
        ]
        env = {**(os.environ if self.env is None else self.env), "PYTHONWARNINGS": "ignore"}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL
            )
        if wait:
            self.wait_healthy(timeout)
        return self

    def wait_healthy(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"agent exited {self.proc.returncode}:\n{self.log()[-3000:]}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except Exception as exc:
                last = str(exc)
            time.sleep(0.1)
        raise TimeoutError(f"agent not healthy after {timeout}s ({last}):\n{self.log()[-3000:]}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        code = self.proc.returncode
        self.proc = None
        return code

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def status(self) -> dict[str, Any]:
        code, body = self.get("/status")
        assert code == 200, body
        result: dict[str, Any] = json.loads(body)
        return result

    def metric(self, name: str, **labels: str) -> float:
        """One sample of /metrics (0 when absent)."""
        _, text = self.get("/metrics")
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        total = 0.0
        for line in text.splitlines():
            if line.startswith("#") or not line.startswith(name):
                continue
            metric, _, value = line.rpartition(" ")
            mname, _, mlabels = metric.partition("{")
            if mname != name:
                continue
            got = ",".join(sorted(mlabels.rstrip("}").split(","))) if mlabels else ""
            if all(f'{k}="{v}"' in got for k, v in labels.items()) or (not want and not got):
                total += float(value)
        return total

    def rig(self) -> tuple[RigNode, ...]:
        """The one node this agent runs, for ``ovsproxy.lab.evidence``."""
        return (RigNode("node-1", self.sandbox, self.url + "/status" if self.proc else ""),)

    def traffic(self, netns: str, *args: str, timeout: float = TCP_TIMEOUT_S) -> dict[str, Any]:
        """``python -m ovsproxy.ovs.traffic ARGS --timeout T`` in ``netns``: lost requests come
        with their evidence, unless ``timeout`` is shorter than one retransmission (then no
        answer is what the test expects, or it measures timing)."""
        return probe(
            self.rig(), netns, *args, "--timeout", str(timeout), explain=timeout >= TCP_TIMEOUT_S
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_for(self, predicate: Any, timeout: float = 10, what: str = "condition") -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(0.1)
        raise TimeoutError(f"timed out waiting for {what}")
