"""`ovsproxy run --kube`: the embedded default on a real control plane.

The command as a person runs it: it starts etcd, kube-apiserver and kube-controller-manager,
applies the bundled examples through the API, and runs the agent in its private sandbox reading
the API server. The examples' ClusterIPs answer from the sandbox's pod; a change made with the
pinned kubectl (the kubeconfig the command logs) is followed; Ctrl-C (SIGINT) stops it and
removes the control plane (processes, record, work directory) and the sandbox.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from ovsproxy.lab.controlplane import REGISTRY as CONTROL_PLANE_REGISTRY
from ovsproxy.lab.controlplane import ControlPlaneRecord, kube_binary
from ovsproxy.lab.ports import reserve_port
from ovsproxy.ovs.sandbox import netns_exists, pid_alive
from ovsproxy.ovs.traffic import run_in_netns

pytestmark = [pytest.mark.slow, pytest.mark.ovs]

START_TIMEOUT_S = 180  # kube-apiserver alone takes 5-35 s here, more beside other work


def wait_log(proc: subprocess.Popen[str], log: Path, pattern: str, timeout: float) -> str:
    """The first match of ``pattern`` in the command's log (group 1), waiting for it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(pattern, log.read_text())
        if found:
            return found.group(1)
        assert proc.poll() is None, log.read_text()[-3000:]
        time.sleep(0.2)
    raise AssertionError(f"no {pattern!r} in the log after {timeout} s: {log.read_text()[-3000:]}")


def healthy(address: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{address}/healthz", timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def answers(netns: str, url: str, count: int = 20) -> dict[str, int]:
    out = run_in_netns(netns, "http", url, "--count", str(count))
    assert out["failed"] == 0, out
    counts: dict[str, int] = out["counts"]
    return counts


def test_run_kube_serves_the_examples_from_the_api_and_ctrl_c_removes_it_all(
    tmp_path: Path,
) -> None:
    if os.geteuid() != 0:
        pytest.skip("the embedded default needs root")
    address = f"127.0.0.1:{reserve_port()}"
    log = tmp_path / "run.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ovsproxy", "run", "--kube", "--metrics-address", address],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
            text=True,
        )
    workdir = None
    try:
        kubeconfig = wait_log(proc, log, r"export KUBECONFIG=(\S+)", START_TIMEOUT_S)
        workdir = Path(kubeconfig).parent
        record = CONTROL_PLANE_REGISTRY / f"{workdir.name}.json"
        assert record.exists()
        netns = wait_log(proc, log, r"node namespace (\S+),", 60)
        deadline = time.monotonic() + 60
        while not healthy(address):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        pod = f"{netns}-client"
        assert set(answers(pod, "http://10.96.0.10/")) == {"web-1", "web-2"}
        assert set(answers(pod, "http://[fd00:10:96::20]/")) == {"api-1", "api-2"}

        def kubectl(*args: str) -> str:
            done = subprocess.run(
                [str(kube_binary("kubectl")), *args],
                capture_output=True,
                text=True,
                timeout=60,
                env={**os.environ, "KUBECONFIG": kubeconfig},
            )
            assert done.returncode == 0, done.stderr
            return done.stdout

        # The objects are the API's: kubectl sees them, and a change made with it is served.
        assert "web-abc12" in kubectl("get", "endpointslices")  # the kubeconfig's ns: demo
        kubectl(
            "patch",
            "endpointslice",
            "web-abc12",
            "--type=json",
            "-p",
            '[{"op": "remove", "path": "/endpoints/1"}]',
        )
        deadline = time.monotonic() + 10
        while set(counts := answers(pod, "http://10.96.0.10/", 10)) != {"web-1"}:
            assert time.monotonic() < deadline, counts
            time.sleep(0.1)
        loaded = ControlPlaneRecord.load(record)
        assert loaded is not None
        assert set(loaded.processes) == {"etcd", "kube-apiserver", "kube-controller-manager"}
        pids = list(loaded.processes.values())
        # Ctrl-C: the agent stops, then the control plane and the sandbox go.
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0, log.read_text()[-3000:]
        assert "SIGINT: stopping" in log.read_text()
        ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
        assert str(workdir) not in ps, ps
        assert not [p for p in pids if pid_alive(p, str(workdir))], pids
        assert not record.exists() and not workdir.exists()
        assert not netns_exists(netns) and not netns_exists(pod)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.mark.parametrize(
    "flags",
    [
        ("--manifests", "/nonexistent"),
        ("--kubeconfig", "/nonexistent"),
        ("--ovsdb", "unix:/nonexistent/db.sock", "--openflow", "unix:/nonexistent/br0.mgmt"),
    ],
    ids=["manifests", "kubeconfig", "ovs"],
)
def test_run_kube_refuses_another_source_or_switch(flags: tuple[str, ...]) -> None:
    """--kube is the embedded default's: with another source or a real OVS it says so and
    starts nothing."""
    done = subprocess.run(
        [sys.executable, "-m", "ovsproxy", "run", "--kube", *flags],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert "--kube runs the embedded default" in done.stderr, done.stderr
