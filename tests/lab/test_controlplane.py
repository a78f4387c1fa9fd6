"""The real control plane the tests, the lab and the benches use (``lab.controlplane``): the
pinned release, what it serves to whom, and that nothing of it outlives its owner."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ovsproxy.lab.controlplane import (
    ApiError,
    ControlPlane,
    ControlPlaneRecord,
    kube_binary,
    list_control_plane_records,
    sweep_control_plane_leftovers,
)
from ovsproxy.lab.kubelet import NOT_READY_TAINT, Kubelet
from ovsproxy.ovs.sandbox import pid_alive

pytestmark = [pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def _pinned_release() -> str:
    for line in (REPO / "tools" / "kube" / "go.mod").read_text().splitlines():
        parts = line.split()
        if parts[:1] == ["k8s.io/kubernetes"]:
            return parts[1]
    raise AssertionError("tools/kube/go.mod pins no k8s.io/kubernetes")


def test_the_components_report_the_pinned_release(control_plane: ControlPlane) -> None:
    release = _pinned_release()
    assert control_plane.request("GET", "/version")["gitVersion"] == release
    out = subprocess.run(
        [str(kube_binary("kube-apiserver")), "--version"], capture_output=True, text=True
    ).stdout
    assert out.strip() == f"Kubernetes {release}"
    client = control_plane.kubectl("version", "--client", "-o", "json").stdout
    assert f'"gitVersion": "{release}"' in client


def test_the_shipped_rbac_lets_the_agent_read_services_and_nothing_else(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    config = control_plane.ovsproxy_kubeconfig(tmp_path / "agent.kubeconfig")
    ok = control_plane.kubectl("get", "services", "-A", kubeconfig=config, check=False)
    assert ok.returncode == 0, ok.stderr
    for verb, resource in (("get", "pods"), ("get", "secrets"), ("delete", "services/x")):
        args = [verb, resource, "-A"] if verb == "get" else [verb, resource, "-n", "default"]
        refused = control_plane.kubectl(*args, kubeconfig=config, check=False)
        assert refused.returncode != 0 and "forbidden" in refused.stderr, (verb, resource)


def test_cluster_ips_and_slices_come_from_the_real_server(
    control_plane: ControlPlane, kube_namespace: str
) -> None:
    """Dual-stack ClusterIPs from --service-cluster-ip-range; an out-of-range one refused."""
    made = control_plane.request(
        "POST",
        f"/api/v1/namespaces/{kube_namespace}/services",
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web"},
            "spec": {
                "ipFamilyPolicy": "RequireDualStack",
                "ports": [{"port": 80, "targetPort": 8080}],
            },
        },
    )
    v4, v6 = made["spec"]["clusterIPs"]
    assert v4.startswith("10.96.") and v6.startswith("fd00:10:96::")
    with pytest.raises(ApiError) as refused:
        control_plane.request(
            "POST",
            f"/api/v1/namespaces/{kube_namespace}/services",
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "outside"},
                "spec": {"clusterIP": "172.30.0.1", "ports": [{"port": 80}]},
            },
        )
    assert refused.value.status == 422


def test_stop_leaves_nothing(tmp_path: Path) -> None:
    api = ControlPlane(workdir=tmp_path).start()
    pids = [pid for _component, pid in api.processes()]
    assert len(pids) == 3 and all(pid_alive(pid) for pid in pids)
    api.stop()
    assert not any(pid_alive(pid, str(api.workdir)) for pid in pids)
    assert not api.workdir.exists()
    assert api.name not in {r.name for r in list_control_plane_records()}


def test_a_dead_owners_control_plane_is_swept(tmp_path: Path) -> None:
    """An owner killed with SIGKILL leaves its processes running; the next start removes them."""
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from ovsproxy.lab.controlplane import ControlPlane\n"
        "api = ControlPlane(workdir=Path(sys.argv[1]), controllers=False).start()\n"
        "print(api.name, flush=True)\n"
        "time.sleep(600)\n"
    )
    owner = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert owner.stdout is not None
        name = owner.stdout.readline().strip()
        record = ControlPlaneRecord.load(
            next(r.path for r in list_control_plane_records() if r.name == name)
        )
        assert record is not None and not record.is_leftover()
    finally:
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
    pids = list(record.processes.values())
    assert all(pid_alive(pid, record.workdir) for pid in pids)
    time.sleep(0.1)
    assert record.is_leftover()
    assert name in sweep_control_plane_leftovers()
    assert not any(pid_alive(pid, record.workdir) for pid in pids)
    assert not Path(record.workdir).exists()


def test_a_registered_node_is_ready_and_untainted(control_plane: ControlPlane) -> None:
    """kube-apiserver taints every new Node not-ready; the lab's kubelet stand-in lifts it once
    the node reports Ready, as the node lifecycle controller (not run here) would."""
    name = f"node-{os.getpid()}-{time.monotonic_ns() % 10**6}"
    Kubelet(control_plane).register_node(name, addresses=["192.0.2.7"], zone="zone-9")
    try:
        node = control_plane.request("GET", f"/api/v1/nodes/{name}")
        taints = node["spec"].get("taints") or []
        assert NOT_READY_TAINT not in {t["key"] for t in taints}
        ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}
        assert ready["Ready"] == "True"
        assert {"type": "InternalIP", "address": "192.0.2.7"} in node["status"]["addresses"]
        assert node["metadata"]["labels"]["topology.kubernetes.io/zone"] == "zone-9"
    finally:
        control_plane.request("DELETE", f"/api/v1/nodes/{name}", ok=(200, 404))
