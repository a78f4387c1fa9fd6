"""`ovsproxy lab up --nodes 3`, then kubectl only (issue 34's acceptance).

The lab is started as a person starts it (the CLI, a real control plane by default) and used as
a person uses it: the pinned kubectl with the kubeconfig `lab status --json` names, Services
written as a person writes them (no ClusterIP or nodePort set by hand: the API server allocates
them), the lab's web pods selected by the label `lab status` names. Traffic comes from every
node's client pod, every node's own namespace and the external client on the underlay, over
IPv4 and IPv6. Then `kubectl delete` (how long until a new request is refused or times out,
measured from the delete's return) and `lab down` (nothing of the lab is left).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import ip_address
from pathlib import Path
from typing import Any

import pytest

from ovsproxy.lab.cluster import LAB_REGISTRY, LabRecord
from ovsproxy.lab.controlplane import REGISTRY as CONTROL_PLANE_REGISTRY
from ovsproxy.lab.controlplane import ControlPlaneRecord
from ovsproxy.lab.evidence import RigNode, attached_rig
from ovsproxy.lab.manifests import endpoint_text
from ovsproxy.netns import enter_netns
from ovsproxy.ovs.sandbox import netns_exists, pid_alive
from ovsproxy.ovs.traffic import RequestFailed, http_once

from .helpers import http, url

pytestmark = [pytest.mark.slow, pytest.mark.ovs]

OVSPROXY = [sys.executable, "-m", "ovsproxy"]
REQUESTS = 30
WEB_PODS = {"web-1", "web-2", "web-3"}
FAMILIES = [pytest.param("IPv4", id="IPv4"), pytest.param("IPv6", id="IPv6")]
STOPS_WITHIN_S = 1.0
PROBE_TIMEOUT_S = 0.3  # a request this slow counts as not answered (the delete test only)

# What a person writes: both Services select the lab's web pods by the label `lab status`
# names (app=web), dual-stack where the cluster is.
SERVICES_YAML = """\
apiVersion: v1
kind: Service
metadata:
  name: hello
spec:
  ipFamilyPolicy: PreferDualStack
  selector:
    app: web
  ports:
  - name: http
    port: 80
    targetPort: 8080
---
apiVersion: v1
kind: Service
metadata:
  name: hello-nodeport
spec:
  type: NodePort
  ipFamilyPolicy: PreferDualStack
  selector:
    app: web
  ports:
  - name: http
    port: 80
    targetPort: 8080
"""


@dataclass(frozen=True)
class Cluster:
    """A lab `ovsproxy lab up` started, seen through what `lab status --json` says."""

    name: str
    status: dict[str, Any]

    @functools.cached_property
    def rig(self) -> tuple[RigNode, ...]:
        return attached_rig(self.name)

    @property
    def external(self) -> str:
        netns: str = self.status["external_client"]["netns"]
        return netns

    def kubectl(self, *args: str, input: str | None = None) -> str:
        kube = self.status["kubernetes"]
        done = subprocess.run(
            [kube["kubectl"], *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "KUBECONFIG": kube["kubeconfig"]},
        )
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
        return done.stdout

    def get(self, *args: str) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.kubectl("get", *args, "-o", "json"))
        return found

    def clients(self) -> list[tuple[str, str]]:
        """(label, namespace): every node's client pod and the node's own namespace."""
        found = []
        for node in self.status["nodes"]:
            pod = next(p for p in node["pods"] if p["name"].startswith("client-"))
            found.append((f"{node['name']} pod", pod["netns"]))
            found.append((f"{node['name']} node", node["netns"]))
        return found

    def node_ips(self, family: str) -> list[str]:
        return [
            ip
            for node in self.status["nodes"]
            for ip in node["node_ips"]
            if (":" in ip) == (family == "IPv6")
        ]


def cluster_ip(service: dict[str, Any], family: str) -> str:
    ips = dict(zip(service["spec"]["ipFamilies"], service["spec"]["clusterIPs"], strict=True))
    assert family in ips, f"{service['metadata']['name']}: no {family} ClusterIP: {ips}"
    return ips[family]


def node_port(service: dict[str, Any]) -> int:
    port: int = service["spec"]["ports"][0]["nodePort"]
    return port


def lab_up(name: str) -> dict[str, Any]:
    started = time.monotonic()
    up = subprocess.run(
        [*OVSPROXY, "lab", "up", "--nodes", "3", "--name", name, "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert up.returncode == 0, up.stdout + up.stderr
    status: dict[str, Any] = json.loads(up.stdout)
    print(
        f"\n`ovsproxy lab up --nodes 3` (control plane, 3 nodes): "
        f"{time.monotonic() - started:.1f} s (lab itself {status['started_in_s']} s)"
    )
    return status


def lab_down(name: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*OVSPROXY, "lab", "down", "--name", name], capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    name = f"k8s{os.getpid() % 100000}"
    try:
        yield Cluster(name, lab_up(name))
    finally:
        if (LAB_REGISTRY / f"{name}.json").exists():  # test_lab_down did not run or failed
            lab_down(name)


def wait_answers(cluster: Cluster, netns: str, target: str, timeout: float = 30) -> float:
    """Seconds until ``target`` (a URL) answers from ``netns``; fails after ``timeout``."""
    started = time.monotonic()
    while True:
        host, port = split(target)
        out = http(cluster.rig, netns, host, 1, port=port, timeout=0.5)
        if out["failed"] == 0:
            return time.monotonic() - started
        assert time.monotonic() - started < timeout, f"{target} from {netns}: {out}"
        time.sleep(0.1)


def split(target: str) -> tuple[str, int]:
    host, _, port = target.removeprefix("http://").rstrip("/").rpartition(":")
    return host.strip("[]"), int(port)


def programmed(cluster: Cluster, service: str, pods: set[str], timeout: float = 30) -> None:
    """Until every node's agent programs exactly ``pods`` (both families, port 8080) as the
    endpoints of ``lab/<service>:http/TCP``. Each agent follows the API server on its own: a
    test that waited for one node's answer (``wait_answers``) must not take the others' for
    granted (a full-suite run, two workers beside three agents, saw node-2's agent still
    rejecting a second after node-1's answered)."""
    want = {
        endpoint_text(ip_address(ip), 8080)
        for node in cluster.status["nodes"]
        for pod in node["pods"]
        if pod["name"] in pods
        for ip in pod["ips"]
    }
    deadline = time.monotonic() + timeout
    for node in cluster.status["nodes"]:
        while True:
            with urllib.request.urlopen(f"{node['agent']['metrics']}/status", timeout=10) as got:
                status = json.loads(got.read())
            have = next(
                (
                    set(entry["endpoints"])
                    for entry in status["services"]
                    if entry["name"] == f"lab/{service}:http/TCP"
                ),
                None,
            )
            if have == want:
                break
            assert time.monotonic() < deadline, (node["name"], service, have, want)
            time.sleep(0.05)


def all_answer(cluster: Cluster, netns: str, target: str, label: str, pods: set[str]) -> None:
    host, port = split(target)
    out = http(cluster.rig, netns, host, REQUESTS, port=port)
    # The rig's evidence (conntrack of a failed request, counter deltas, drop flows, every
    # agent's state) in full: pytest would cut it short in the dict it shows.
    evidence = json.dumps(out.get("evidence"), indent=1, default=str)
    assert out["failed"] == 0, (label, target, out["failures"], evidence)
    assert set(out["counts"]) == pods, (label, target, out["counts"])


def test_status_names_the_cluster(cluster: Cluster) -> None:
    """`lab status` names the kubeconfig and kubectl (and prints `export KUBECONFIG=…` for a
    person); with them, kubectl sees the nodes and the web pods the lab says it runs."""
    kube = cluster.status["kubernetes"]
    assert kube["server"].startswith("https://127.0.0.1:")
    assert Path(kube["kubeconfig"]).is_file() and os.access(kube["kubectl"], os.X_OK)
    assert kube["namespace"] == "lab" and kube["web_selector"] == {"app": "web"}
    text = subprocess.run(
        [*OVSPROXY, "lab", "status", "--name", cluster.name],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "400"},
    )
    assert text.returncode == 0, text.stderr
    assert f"export KUBECONFIG={kube['kubeconfig']}" in text.stdout, text.stdout
    nodes = cluster.get("nodes")["items"]
    assert sorted(n["metadata"]["name"] for n in nodes) == ["node-1", "node-2", "node-3"]
    web = cluster.get("pods", "-l", "app=web")["items"]  # the kubeconfig's namespace: lab
    assert {p["metadata"]["name"] for p in web} == WEB_PODS
    assert all(p["status"]["containerStatuses"][0]["ready"] for p in web)


@pytest.fixture(scope="module")
def hello(cluster: Cluster) -> dict[str, dict[str, Any]]:
    """The person's two Services, applied with kubectl and answering from node-1's pod."""
    applied = time.monotonic()
    cluster.kubectl("apply", "-f", "-", input=SERVICES_YAML)
    services = {name: cluster.get("service", name) for name in ("hello", "hello-nodeport")}
    client = cluster.clients()[0][1]
    for name, service in services.items():
        for family in ("IPv4", "IPv6"):
            wait_answers(cluster, client, url(cluster_ip(service, family)))
        print(f"\n{name}: answering {time.monotonic() - applied:.2f} s after kubectl apply")
    return services


@pytest.mark.parametrize("family", FAMILIES)
def test_kubectl_clusterip_answers_from_every_node(
    cluster: Cluster, hello: dict[str, dict[str, Any]], family: str
) -> None:
    for name in ("hello", "hello-nodeport"):
        programmed(cluster, name, WEB_PODS)
        target = url(cluster_ip(hello[name], family))
        for label, netns in cluster.clients():
            all_answer(cluster, netns, target, f"{name} from {label}", WEB_PODS)


@pytest.mark.parametrize("family", FAMILIES)
def test_kubectl_nodeport_answers_on_every_node_ip(
    cluster: Cluster, hello: dict[str, dict[str, Any]], family: str
) -> None:
    """The API server allocated the nodePort; the external client reaches it on every node's
    IP, and so does every node's pod."""
    port = node_port(hello["hello-nodeport"])
    assert 30000 <= port <= 32767, port
    programmed(cluster, "hello-nodeport", WEB_PODS)
    for ip in cluster.node_ips(family):
        target = url(ip, port)
        all_answer(cluster, cluster.external, target, "external client", WEB_PODS)
        for label, netns in cluster.clients():
            if label.endswith("pod"):
                all_answer(cluster, netns, target, label, WEB_PODS)


def test_service_without_selector_and_its_endpointslices(cluster: Cluster) -> None:
    """A Service without a selector and the EndpointSlices a person writes for it (web-1 and
    web-3 only, each family its own slice): served from every node with exactly those."""
    pods = {p["metadata"]["name"]: p for p in cluster.get("pods", "-l", "app=web")["items"]}
    chosen = ("web-1", "web-3")
    docs = [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "by-hand"},
            "spec": {
                "ipFamilyPolicy": "RequireDualStack",
                "ports": [{"name": "http", "port": 80, "targetPort": 8080}],
            },
        }
    ]
    for family in ("IPv4", "IPv6"):
        docs.append(
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": f"by-hand-{family.lower()}",
                    "labels": {
                        "kubernetes.io/service-name": "by-hand",
                        "endpointslice.kubernetes.io/managed-by": "a-person",
                    },
                },
                "addressType": family,
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                "endpoints": [
                    {
                        "addresses": [
                            ip["ip"]
                            for ip in pods[name]["status"]["podIPs"]
                            if (":" in ip["ip"]) == (family == "IPv6")
                        ],
                        "conditions": {"ready": True},
                        "nodeName": pods[name]["spec"]["nodeName"],
                    }
                    for name in chosen
                ],
            }
        )
    listed = {"apiVersion": "v1", "kind": "List", "items": docs}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(listed))
    try:
        service = cluster.get("service", "by-hand")
        programmed(cluster, "by-hand", set(chosen))
        for family in ("IPv4", "IPv6"):
            target = url(cluster_ip(service, family))
            wait_answers(cluster, cluster.clients()[0][1], target)
            for label, netns in cluster.clients():
                all_answer(cluster, netns, target, label, set(chosen))
    finally:
        cluster.kubectl("delete", "service", "by-hand", "--ignore-not-found")
        cluster.kubectl("delete", "endpointslices", "-l", "kubernetes.io/service-name=by-hand")


class Prober:
    """New requests to ``target`` from ``netns``, one after another on a thread of its own,
    from before a change until ``after_s`` past the first one refused or timed out
    (``PROBE_TIMEOUT_S``): when each answered or failed request started (CLOCK_MONOTONIC)."""

    def __init__(self, netns: str, target: str, limit_s: float = 20.0) -> None:
        self.netns, self.target = netns, target
        self.answered: list[float] = []
        self.failed: list[tuple[float, str]] = []  # (started, error kind)
        self.answering = threading.Event()
        self.limit_s = limit_s
        self.thread = threading.Thread(target=self._run, name=f"probe {target} in {netns}")

    def _run(self, after_s: float = 0.5) -> None:
        enter_netns(self.netns)
        end = time.monotonic() + self.limit_s
        while time.monotonic() < end:
            started = time.monotonic()
            try:
                http_once(self.target, PROBE_TIMEOUT_S)
                self.answered.append(started)
                self.answering.set()
            except RequestFailed as exc:
                self.failed.append((started, type(exc.cause).__name__))
                end = min(end, self.failed[0][0] + after_s)
            time.sleep(0.01)

    def __enter__(self) -> Prober:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.thread.join(self.limit_s + 5)

    def stopped(self) -> float | None:
        """When the first unanswered request started, or None."""
        return self.failed[0][0] if self.failed else None


@pytest.mark.parametrize("family", FAMILIES)
def test_kubectl_delete_stops_answering_within_a_second(cluster: Cluster, family: str) -> None:
    """A NodePort Service answering everywhere, then `kubectl delete service`: from every
    node's pod (its ClusterIP) and from the external client (every node's IP, its nodePort),
    the first new request refused or timed out starts within a second of the delete's return,
    and none answers after it. The clients send from before the delete to after the stop."""
    name = f"doomed-{family.lower()}"
    cluster.kubectl("create", "service", "nodeport", name, "--tcp=80:8080")
    # `create service` selects app=<name>: point it at the web pods, as a person would.
    cluster.kubectl("set", "selector", f"service/{name}", "app=web")
    if family == "IPv6":  # `create service` makes a single-stack Service: ask for both
        cluster.kubectl(
            "patch", f"service/{name}", "-p", '{"spec":{"ipFamilyPolicy":"PreferDualStack"}}'
        )
    service = cluster.get("service", name)
    targets = [
        (netns, url(cluster_ip(service, family)))
        for label, netns in cluster.clients()
        if label.endswith("pod")
    ] + [(cluster.external, url(ip, node_port(service))) for ip in cluster.node_ips(family)]
    for netns, target in targets:
        wait_answers(cluster, netns, target)
    with contextlib.ExitStack() as stack:
        probers = [stack.enter_context(Prober(netns, target)) for netns, target in targets]
        for prober in probers:
            assert prober.answering.wait(10), (prober.target, prober.netns, prober.failed)
        delete_started = time.monotonic()
        cluster.kubectl("delete", "service", name)
        deleted = time.monotonic()
    print(
        f"\n`kubectl delete service` ({family}) took {deleted - delete_started:.3f} s; "
        "the first unanswered request started, after its return:"
    )
    for p in probers:
        stop = p.stopped()
        print(
            f"  {p.target} from {p.netns}: "
            + (f"{stop - deleted:+.3f} s ({p.failed[0][1]})" if stop else "never")
            + f", {len(p.answered)} answered before"
        )
    for p in probers:
        stop = p.stopped()
        where = (p.target, p.netns, p.failed[:3])
        assert stop is not None, where
        assert delete_started <= stop <= deleted + STOPS_WITHIN_S, where
        assert not [t for t in p.answered if t > stop], where


def test_lab_down_leaves_nothing(cluster: Cluster) -> None:
    """`lab down`: no process (etcd, kube-apiserver, kube-controller-manager, agents), no
    namespace, no record and no work directory of the lab is left."""
    record = LabRecord.load(LAB_REGISTRY / f"{cluster.name}.json")
    assert record is not None and record.control_plane is not None
    cp = ControlPlaneRecord.load(CONTROL_PLANE_REGISTRY / f"{record.control_plane}.json")
    assert cp is not None
    assert set(cp.processes) == {"etcd", "kube-apiserver", "kube-controller-manager"}
    pids = [*cp.processes.values(), *record.agents.values()]
    assert all(pid_alive(pid) for pid in pids), (cp.processes, record.agents)
    down = lab_down(cluster.name)
    assert down.returncode == 0, down.stderr
    assert not [pid for pid in pids if pid_alive(pid)], (cp.processes, record.agents)
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert record.workdir not in ps and cp.workdir not in ps
    namespaces = [*record.netns, *(f"ovsp-{name}" for name in record.sandboxes)]
    assert not [ns for ns in namespaces if netns_exists(ns)], namespaces
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"ovsp-{cluster.name}-" not in listed, listed
    assert not Path(record.workdir).exists() and not Path(cp.workdir).exists()
    assert not (LAB_REGISTRY / f"{cluster.name}.json").exists()
    assert not (CONTROL_PLANE_REGISTRY / f"{cp.name}.json").exists()
