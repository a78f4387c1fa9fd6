"""A multi-node cluster on one machine: nodes with their own OVS and agent on an underlay.

::

              external client ns (192.168.50.100, fd00:192:168:50::100)
                          |
    underlay ns: Linux bridge "ul0"  ---------+--------------------+
          | 192.168.50.1                      | .2                 | .3   (+ fd00:192:168:50::N)
    node-1 ns (a Sandbox)                 node-2 ns            node-3 ns
    eth0 -- kernel routing (host-gw: 10.244.2.0/24 via .2, 10.244.3.0/24 via .3, IPv6 alike)
    gw0 (10.244.1.1, fd00:10:244:1::1) -- br0 (own ovsdb-server + ovs-vswitchd) -- pods
    agent: ovsproxy run --node-name node-1 --zone zone-1 ... (a process, own metrics port)

Every node is a :class:`~ovsproxy.ovs.sandbox.Sandbox` (its namespace, daemons, pods). The lab's
minimal "CNI" gives node N the pod CIDRs 10.244.N.0/24 and fd00:10:244:N::/64 (gateway .1 /
::1), attaches pods with the OVS Interface external_ids a CNI writes, routes the other nodes'
pod CIDRs via their node IPs (inside the node namespaces only), and nothing else: the agents
are started without per-node flags but their names, zones and node IPs, and set up the rest
themselves (host-SNAT addresses and their neighbour entries; see datapath/pipeline.py). Every
agent reads the same input: the lab's manifests directory, or whatever source arguments the
caller gives (the fake Kubernetes API in tests).

Everything is recorded in ``/run/ovsproxy/labs/<name>.json`` before it is created (as the
sandbox records itself): ``down()`` removes it, and a record whose owner process is gone (or, for
a persistent lab, whose parts are gone) is cleaned up by the next lab start or ``lab down``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ipaddress
import json
import logging
import os
import secrets
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from ovsproxy.lab.controlplane import (
    REGISTRY as CONTROL_PLANE_REGISTRY,
)
from ovsproxy.lab.controlplane import (
    ControlPlane,
    ControlPlaneRecord,
    kube_binary,
)
from ovsproxy.lab.kubelet import ContainerPort, Kubelet, PodSpec
from ovsproxy.lab.manifests import LabEndpoint, LabPort, LabService, addresses, write_service
from ovsproxy.lab.ports import reserve_port
from ovsproxy.model import IPAddress
from ovsproxy.ovs import sandbox as sb
from ovsproxy.ovs.namespaces import (
    NETNS_PREFIX,
    add_netns,
    load_record,
    netns_exists,
    save_record,
    start_time,
)
from ovsproxy.ovs.sandbox import Pod, Sandbox, SandboxRecord

log = logging.getLogger(__name__)

LAB_REGISTRY = Path(os.environ.get("OVSPROXY_LAB_REGISTRY", "/run/ovsproxy/labs"))
UNDERLAY_V4 = ipaddress.ip_network("192.168.50.0/24")
UNDERLAY_V6 = ipaddress.ip_network("fd00:192:168:50::/64")
EXTERNAL_HOST = 100  # the external client's host number on the underlay
MAX_NODES = 50  # node N is host N of the underlay, below the external client
SERVICE_CIDRS = ("10.96.0.0/16", "fd00:10:96::/108")
HTTP_PORT = 8080
UDP_PORT = 5353
WEB_CLUSTER_IPS = addresses("10.96.0.10", "fd00:10:96::10")
NAMESPACE = "lab"  # the lab's pods and its Service lab/web
# Every pod is labelled app=<its name without the node suffix>: a Service selecting the
# serving pods selects this.
WEB_SELECTOR = {"app": "web"}


class LabError(RuntimeError):
    pass


def pod_cidrs(index: int) -> tuple[ipaddress.IPv4Network, ipaddress.IPv6Network]:
    return (
        ipaddress.IPv4Network(f"10.244.{index}.0/24"),
        ipaddress.IPv6Network(f"fd00:10:244:{index:x}::/64"),
    )


def app_label(pod_name: str) -> str:
    """A lab pod's ``app`` label: its name without the node suffix (``web-2``, ``web-1b``:
    ``web``)."""
    return pod_name.rsplit("-", 1)[0]


def _host(network: ipaddress.IPv4Network | ipaddress.IPv6Network, n: int) -> str:
    return f"{network[n]}/{network.prefixlen}"


# -- the record ---------------------------------------------------------------------------
@dataclass
class LabRecord:
    """What a lab owns; saved before any of it is created."""

    name: str
    workdir: str
    owner_pid: int
    persistent: bool
    owner_started: int | None
    netns: list[str] = field(default_factory=list)  # underlay and external client
    sandboxes: list[str] = field(default_factory=list)
    agents: dict[str, int] = field(default_factory=dict)  # node -> pid
    agent_markers: dict[str, str] = field(default_factory=dict)  # node -> cmdline marker
    control_plane: str | None = None  # its ControlPlaneRecord's name (a lab with kube=True)
    status: dict[str, Any] = field(default_factory=dict)  # the last status() (for `lab status`)
    created: float = field(default_factory=time.time)

    @property
    def path(self) -> Path:
        return LAB_REGISTRY / f"{self.name}.json"

    def save(self) -> None:
        save_record(self.path, self)

    @classmethod
    def load(cls, path: Path) -> LabRecord | None:
        return load_record(cls, path)

    def is_leftover(self) -> bool:
        if not self.persistent:
            return start_time(self.owner_pid) != self.owner_started
        if not all(netns_exists(ns) for ns in self.netns):
            return True
        if self.control_plane is not None:
            cp = ControlPlaneRecord.load(CONTROL_PLANE_REGISTRY / f"{self.control_plane}.json")
            if cp is None or cp.is_leftover():
                return True
        for name in self.sandboxes:
            record = SandboxRecord.load(sb.REGISTRY / f"{name}.json")
            if record is None or record.is_leftover():
                return True
        return False


def cleanup_lab_record(record: LabRecord) -> None:
    """Remove everything a lab record names: agents (by pid), nodes, namespaces, files."""
    for node, pid in record.agents.items():
        sb.stop_process(pid, record.agent_markers.get(node))
    if record.control_plane is not None:
        cp = ControlPlaneRecord.load(CONTROL_PLANE_REGISTRY / f"{record.control_plane}.json")
        if cp is not None:
            cp.remove()
    for name in record.sandboxes:
        sandbox_record = SandboxRecord.load(sb.REGISTRY / f"{name}.json")
        if sandbox_record is not None:
            sb.cleanup_record(sandbox_record)
    sb.remove_owned("lab", record.name, record.netns, record.workdir, record.path)


def list_lab_records() -> list[LabRecord]:
    return sb.load_records(LAB_REGISTRY, LabRecord.load)


def sweep_lab_leftovers() -> list[str]:
    """Clean labs left by crashed runs; returns their names."""
    cleaned = []
    for record in list_lab_records():
        if record.is_leftover():
            log.warning("cleaning up leftover lab %s (from pid %d)", record.name, record.owner_pid)
            cleanup_lab_record(record)
            cleaned.append(record.name)
    return cleaned


# -- nodes --------------------------------------------------------------------------------
@dataclass
class LabNode:
    """One node: its sandbox (namespace, OVS, pods), addresses, zone and agent."""

    name: str
    index: int
    zone: str
    sandbox: Sandbox
    node_ips: tuple[IPAddress, ...]
    pod_cidrs: tuple[ipaddress.IPv4Network, ipaddress.IPv6Network]
    metrics_port: int = 0
    agent: subprocess.Popen[bytes] | None = None

    @property
    def netns(self) -> str:
        return self.sandbox.netns

    @property
    def pods(self) -> dict[str, Pod]:
        return self.sandbox.pods

    @property
    def metrics_address(self) -> str:
        return f"127.0.0.1:{self.metrics_port}"

    def exec(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.sandbox.exec(*cmd, check=check)


class Lab:
    """N nodes (zones assigned round-robin over K) with pods, on one underlay network.

    ``pods_per_node``: the pods each node gets at start-up, as (name prefix, serves) pairs:
    a serving pod answers HTTP on 8080 and UDP on 5353 with its name; pod names get the node
    number appended (``web-1`` on node-1). ``source_args`` replace the agents' default source
    (the lab's manifests directory), e.g. ``("--kubeconfig", path)``.

    ``kube=True`` makes it a cluster: a real control plane (``lab.controlplane``: etcd,
    kube-apiserver, kube-controller-manager) on loopback, every node a Node object, every pod
    a Pod object bound to its node (``lab.kubelet`` plays the kubelet's part), the shipped
    ``deploy/base/rbac.yaml`` applied, and the agents reading the API server with a token of
    that ServiceAccount. The control plane runs in the machine's namespace, on 127.0.0.1:
    that is where the agents run (they join their node's namespace only for netlink) and
    where an operator's kubectl runs, so neither needs a route toward a lab namespace.
    """

    def __init__(
        self,
        nodes: int = 3,
        *,
        zones: int = 1,
        name: str | None = None,
        persistent: bool = False,
        pods_per_node: Sequence[tuple[str, bool]] = (("web", True), ("client", False)),
        agents: bool = True,
        source_args: Sequence[str] = (),
        agent_args: Sequence[str] = (),
        kube: bool = False,
    ) -> None:
        if not 1 <= nodes <= MAX_NODES:
            raise LabError(f"nodes: {nodes} is not between 1 and {MAX_NODES}")
        if not 1 <= zones <= nodes:
            raise LabError(f"zones: {zones} is not between 1 and the number of nodes ({nodes})")
        self.name = name or f"l{secrets.token_hex(3)}"
        if not self.name.replace("-", "").isalnum() or len(self.name) > 12:
            raise LabError(f"lab name {self.name!r}: use up to 12 letters, digits and '-'")
        self.node_count = nodes
        self.zones = zones
        self.persistent = persistent
        self.pods_per_node = tuple(pods_per_node)
        self.run_agents = agents
        self.source_args = tuple(source_args)
        self.agent_args = tuple(agent_args)
        self.kube = kube
        self.control_plane: ControlPlane | None = None
        self.kubelet: Kubelet | None = None
        self.pod_specs: dict[str, PodSpec] = {}
        self.underlay_netns = f"{NETNS_PREFIX}{self.name}-ul"
        self.external_netns = f"{NETNS_PREFIX}{self.name}-ext"
        self.workdir = Path()
        self.nodes: dict[str, LabNode] = {}
        self.record: LabRecord | None = None
        self.started_in: float | None = None

    # -- paths --------------------------------------------------------------------------
    @property
    def manifests(self) -> Path:
        return self.workdir / "manifests"

    @property
    def agent_kubeconfig(self) -> Path:
        return self.workdir / "agent.kubeconfig"

    @property
    def kubeconfig(self) -> Path:
        """A person's kubeconfig: the admin, namespace ``lab`` by default."""
        return self.workdir / "kubeconfig"

    @property
    def external_ips(self) -> tuple[IPAddress, ...]:
        return (UNDERLAY_V4[EXTERNAL_HOST], UNDERLAY_V6[EXTERNAL_HOST])

    # -- lifecycle ----------------------------------------------------------------------
    def up(self) -> Self:
        if os.geteuid() != 0:
            raise LabError("the lab needs root (network namespaces, OVS sandboxes)")
        started = time.monotonic()
        sweep_lab_leftovers()
        sb.sweep_leftovers()
        if (LAB_REGISTRY / f"{self.name}.json").exists():
            raise LabError(f"lab {self.name!r} is already up; `ovsproxy lab down` removes it")
        self.workdir = Path(tempfile.mkdtemp(prefix=f"ovsproxy-lab-{self.name}-"))
        self.manifests.mkdir()
        self.record = LabRecord(
            name=self.name,
            workdir=str(self.workdir),
            owner_pid=os.getpid(),
            # Persistent only once complete: until then it is ours (a persistent record whose
            # parts are missing would be swept as a leftover by any other lab or sandbox start).
            persistent=False,
            owner_started=start_time(os.getpid()),
            netns=[self.underlay_netns, self.external_netns],
            sandboxes=[f"{self.name}-n{i}" for i in range(1, self.node_count + 1)],
        )
        if self.kube:
            self.control_plane = ControlPlane(
                f"ovsp-cp-{self.name}", workdir=self.workdir, service_cidrs=SERVICE_CIDRS
            )
            self.record.control_plane = self.control_plane.name
        self.record.save()
        try:
            self._start()
        except BaseException:
            self.down()
            raise
        if self.persistent:
            if self.control_plane is not None:
                self.control_plane.record.persistent = True
                self.control_plane.record.save()
            for node in self.nodes.values():
                assert node.sandbox.record is not None
                node.sandbox.persistent = node.sandbox.record.persistent = True
                node.sandbox.record.save()
            self.record.persistent = True
        self.started_in = time.monotonic() - started
        self._save_status()
        return self

    def _start(self) -> None:
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as background:
            # The control plane's start (mostly kube-apiserver's own, 5-30 s) overlaps the nodes'.
            cp_started = background.submit(self._start_control_plane) if self.kube else None
            self._underlay()
            indexes = range(1, self.node_count + 1)
            # Nodes come up in parallel: their daemons and `ip` calls mostly wait.
            with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, self.node_count)) as pool:
                for node in pool.map(self._node, indexes):
                    self.nodes[node.name] = node
            self._external_client()
            for node in self.nodes.values():
                self._routes(node)
            if cp_started is not None:
                cp_started.result()
        if self.kubelet is not None:
            for node in self.nodes.values():
                self.register_node(node)
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, self.node_count)) as pool:
            list(pool.map(self._default_pods, self.nodes.values()))
        if self.run_agents:
            for node in self.nodes.values():
                self.start_agent(node.name, wait=False)
            for node in self.nodes.values():
                self.wait_agent(node.name)

    def _start_control_plane(self) -> None:
        assert self.control_plane is not None
        api = self.control_plane.start()
        self.kubelet = Kubelet(api)
        api.create_namespace(NAMESPACE)
        api.kubeconfig(self.kubeconfig, api.admin, namespace=NAMESPACE)
        # The agents' identity is the shipped ServiceAccount with the shipped RBAC.
        api.ovsproxy_kubeconfig(self.agent_kubeconfig, seconds=7 * 86400)

    def register_node(self, node: LabNode) -> None:
        """The node's Node object: its name, zone, node IPs and pod CIDRs, Ready."""
        assert self.kubelet is not None
        self.kubelet.register_node(
            node.name,
            addresses=[str(ip) for ip in node.node_ips],
            pod_cidrs=[str(c) for c in node.pod_cidrs],
            zone=node.zone,
        )

    def _underlay(self) -> None:
        ns = self.underlay_netns
        Sandbox.created_netns.add(ns)
        add_netns(ns)
        sb._run(["ip", "link", "add", "ul0", "type", "bridge"], netns=ns)
        sb._run(["ip", "link", "set", "ul0", "up"], netns=ns)

    def _uplink(self, peer_netns: str, host: int) -> None:
        """A veth from the underlay bridge to ``eth0`` in ``peer_netns``, with host number
        ``host`` of both underlay networks."""
        ul = f"u{host}"
        sb._run(
            ["ip", "link", "add", ul, "type", "veth", "peer", "name", "eth0", "netns", peer_netns],
            netns=self.underlay_netns,
        )
        sb._run(["ip", "link", "set", ul, "master", "ul0", "up"], netns=self.underlay_netns)
        sb._run(["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=0"], netns=peer_netns)
        sb._run(["ethtool", "-K", "eth0", "tx", "off"], netns=peer_netns, check=False)
        sb._run(["ip", "addr", "add", _host(UNDERLAY_V4, host), "dev", "eth0"], netns=peer_netns)
        sb._run(
            ["ip", "addr", "add", _host(UNDERLAY_V6, host), "dev", "eth0", "nodad"],
            netns=peer_netns,
        )
        sb._run(["ip", "link", "set", "eth0", "up"], netns=peer_netns)

    def _node(self, index: int) -> LabNode:
        v4, v6 = pod_cidrs(index)
        sandbox = Sandbox(
            f"{self.name}-n{index}",
            gateway_ipv4=_host(v4, 1),
            gateway_ipv6=_host(v6, 1),
            datapath_id=index,
        )
        sandbox.up()
        ns = sandbox.netns
        for key in ("net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"):
            sb._run(["sysctl", "-qw", key], netns=ns)
        self._uplink(ns, index)
        zone = f"zone-{(index - 1) % self.zones + 1}"
        return LabNode(
            name=f"node-{index}",
            index=index,
            zone=zone,
            sandbox=sandbox,
            node_ips=(UNDERLAY_V4[index], UNDERLAY_V6[index]),
            pod_cidrs=(v4, v6),
        )

    def _routes(self, node: LabNode) -> None:
        """host-gw: the other nodes' pod CIDRs via their node IPs."""
        for other in self.nodes.values():
            if other is node:
                continue
            for cidr, via in zip(other.pod_cidrs, other.node_ips, strict=True):
                sb._run(
                    ["ip", "route", "replace", str(cidr), "via", str(via), "dev", "eth0"],
                    netns=node.netns,
                )

    def _external_client(self) -> None:
        ns = self.external_netns
        Sandbox.created_netns.add(ns)
        add_netns(ns)
        self._uplink(ns, EXTERNAL_HOST)

    def _default_pods(self, node: LabNode) -> None:
        for prefix, serves in self.pods_per_node:
            self.add_pod(node.name, f"{prefix}-{node.index}", serves=serves)

    def add_pod(
        self,
        node_name: str,
        pod_name: str,
        *,
        serves: bool = True,
        http_ports: Sequence[int] | None = None,
        udp_ports: Sequence[int] | None = None,
        namespace: str = NAMESPACE,
    ) -> Pod:
        """A pod on ``node_name`` with the next free address of the node's pod CIDRs.

        A serving pod answers HTTP on 8080 and UDP on 5353 with its name, or on ``http_ports``
        and ``udp_ports`` when given. With ``kube``, its Pod object (in ``namespace``) lists
        those as its container ports (the default ones named ``http`` and ``dns``)."""
        node = self.nodes[node_name]
        v4, v6 = node.pod_cidrs
        used = {int(p.ipv4.ip) for p in node.pods.values() if p.ipv4 is not None}
        host = next(h for h in range(10, 250) if int(v4[h]) not in used)
        custom = http_ports is not None or udp_ports is not None
        tcp = tuple(http_ports or ()) if custom else (HTTP_PORT,) if serves else ()
        udp = tuple(udp_ports or ()) if custom else (UDP_PORT,) if serves else ()
        pod = node.sandbox.add_pod(
            pod_name,
            ipv4=_host(v4, host),
            ipv6=_host(v6, host),
            namespace=namespace,
            http_ports=tcp,
            udp_ports=udp,
        )
        if self.kubelet is not None:
            names = {(HTTP_PORT, "TCP"): "http", (UDP_PORT, "UDP"): "dns"} if not custom else {}
            ports = tuple(
                ContainerPort(number, protocol, names.get((number, protocol)))
                for protocol, numbers in (("TCP", tcp), ("UDP", udp))
                for number in numbers
            )
            spec = PodSpec(
                name=pod_name,
                namespace=namespace,
                node=node_name,
                ips=tuple(str(ip) for ip in pod.ips),
                labels={"app": app_label(pod_name)},
                ports=ports,
            )
            self.kubelet.run_pod(spec)
            self.pod_specs[pod_name] = spec
        return pod

    def delete_pod(self, pod_name: str, *, drains: bool = False, wait: float = 0.0) -> None:
        """A pod's end as a cluster sees it: terminating (serving while it ``drains``) for
        ``wait`` seconds, then gone from the API and from its node."""
        node = self.node_of(pod_name)
        spec = self.pod_specs.pop(pod_name, None)
        if self.kubelet is not None and spec is not None:
            self.kubelet.terminate_pod(spec, drains=drains)
            time.sleep(wait)
            self.kubelet.remove_pod(spec.namespace, spec.name)
        node.sandbox.remove_pod(pod_name)

    def endpoints(self, *pod_names: str, **conditions: bool) -> tuple[LabEndpoint, ...]:
        """The named pods (default: every serving pod) as endpoints, with their node and zone."""
        found = []
        for node in self.nodes.values():
            for pod in node.pods.values():
                if (pod.name in pod_names) if pod_names else bool(pod.http_ports):
                    found.append(
                        LabEndpoint(pod.name, tuple(pod.ips), node.name, node.zone, **conditions)
                    )
        return tuple(found)

    def web_service(self) -> LabService:
        """The lab's default Service ``lab/web``: HTTP 80 and UDP 53 on every serving pod."""
        return LabService(
            "web",
            WEB_CLUSTER_IPS,
            (LabPort("http", 80, HTTP_PORT), LabPort("dns", 53, UDP_PORT, "UDP")),
            self.endpoints(),
        )

    def apply_web_service(self) -> LabService:
        """``lab/web`` served: through the API (a Service selecting ``app: web``, whose
        EndpointSlices kube-controller-manager makes) with ``kube``, else as a manifest."""
        service = self.web_service()
        if self.control_plane is None:
            write_service(self.manifests, service)
            return service
        self.control_plane.request(
            "POST",
            f"/api/v1/namespaces/{NAMESPACE}/services",
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": service.name, "namespace": NAMESPACE},
                "spec": {
                    "selector": WEB_SELECTOR,
                    "clusterIP": str(service.cluster_ips[0]),
                    "clusterIPs": [str(ip) for ip in service.cluster_ips],
                    "ipFamilyPolicy": "RequireDualStack",
                    "ipFamilies": ["IPv4", "IPv6"],
                    "ports": [
                        {
                            "name": p.name,
                            "port": p.port,
                            "targetPort": p.target_port,
                            "protocol": p.protocol,
                        }
                        for p in service.ports
                    ],
                },
            },
        )
        return service

    def pod(self, pod_name: str) -> Pod:
        for node in self.nodes.values():
            if pod_name in node.pods:
                return node.pods[pod_name]
        raise KeyError(pod_name)

    def node_of(self, pod_name: str) -> LabNode:
        for node in self.nodes.values():
            if pod_name in node.pods:
                return node
        raise KeyError(pod_name)

    # -- agents -------------------------------------------------------------------------
    def default_source_args(self) -> tuple[str, ...]:
        if self.kube:
            return ("--kubeconfig", str(self.agent_kubeconfig))
        return ("--manifests", str(self.manifests))

    def agent_command(self, node: LabNode) -> list[str]:
        source = self.source_args or self.default_source_args()
        cmd = [
            sys.executable,
            "-m",
            "ovsproxy",
            "run",
            "--ovsdb",
            node.sandbox.ovsdb,
            "--openflow",
            node.sandbox.openflow,
            "--netns",
            node.netns,
            *source,
            "--node-name",
            node.name,
            "--zone",
            node.zone,
            "--metrics-address",
            node.metrics_address,
            "--health-address",
            "",  # the lab's agents share this namespace: each has only its metrics port
            "--min-sync-interval",
            "0.1",
            "--log-level",
            "info",
        ]
        for cidr in SERVICE_CIDRS:
            cmd += ["--service-cidr", cidr]
        for ip in node.node_ips:
            cmd += ["--node-ip", str(ip)]
        return cmd + list(self.agent_args)

    def start_agent(self, node_name: str, *, wait: bool = True) -> None:
        node = self.nodes[node_name]
        if node.agent is not None and node.agent.poll() is None:
            raise LabError(f"{node_name}: its agent already runs (pid {node.agent.pid})")
        node.metrics_port = reserve_port()
        log_path = self.workdir / f"agent-{node.name}.log"
        env = {**os.environ, "PYTHONWARNINGS": "ignore"}
        with open(log_path, "ab") as out:
            node.agent = subprocess.Popen(
                self.agent_command(node),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # Ctrl-C on `lab up` must not stop a persistent lab
            )
        assert self.record is not None
        self.record.agents[node.name] = node.agent.pid
        # The OpenFlow socket path names this node's sandbox: a recycled pid is not ours.
        self.record.agent_markers[node.name] = node.sandbox.openflow
        self.record.save()
        if wait:
            self.wait_agent(node_name)

    def wait_agent(self, node_name: str, timeout: float = 60) -> None:
        """Until the node's agent answers /healthz with 200 (its first sync is done)."""
        node = self.nodes[node_name]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if node.agent is None or node.agent.poll() is not None:
                raise LabError(f"{node_name}: agent exited:\n{self.agent_log(node_name)[-3000:]}")
            try:
                with urllib.request.urlopen(
                    f"http://{node.metrics_address}/healthz", timeout=2
                ) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        raise LabError(f"{node_name}: agent not healthy after {timeout}s")

    def agent_log(self, node_name: str) -> str:
        path = self.workdir / f"agent-{node_name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def agent_status(self, node_name: str) -> dict[str, Any]:
        node = self.nodes[node_name]
        with urllib.request.urlopen(f"http://{node.metrics_address}/status", timeout=10) as resp:
            result: dict[str, Any] = json.loads(resp.read())
        return result

    def stop_agent(self, node_name: str) -> None:
        node = self.nodes[node_name]
        if node.agent is not None:
            sb.stop_process(node.agent.pid, None, timeout=10)
            with contextlib.suppress(Exception):
                node.agent.wait(timeout=5)
            node.agent = None
        if self.record is not None:
            self.record.agents.pop(node_name, None)
            self.record.agent_markers.pop(node_name, None)
            self.record.save()

    def wait_status(
        self, predicate: Callable[[str, dict[str, Any]], bool], timeout: float = 20
    ) -> None:
        """Until ``predicate(node name, agent status)`` holds for every running agent."""
        deadline = time.monotonic() + timeout
        for name, node in self.nodes.items():
            if node.agent is None:
                continue
            while True:
                status = self.agent_status(name)
                if predicate(name, status):
                    break
                if time.monotonic() > deadline:
                    raise LabError(f"{name}: condition not met after {timeout}s: {status}")
                time.sleep(0.05)

    def wait_endpoints(
        self, port_name: str, expected: Callable[[str], set[str]] | set[str], timeout: float = 20
    ) -> None:
        """Until every running agent programs ``expected`` (``IP:port`` strings, or a function
        of the node name) as the endpoints of the Service port ``ns/name:port/PROTO``."""

        def holds(node: str, status: dict[str, Any]) -> bool:
            want = expected(node) if callable(expected) else expected
            for service in status.get("services", []):
                if service["name"] == port_name:
                    return set(service["endpoints"]) == want
            return not want

        self.wait_status(holds, timeout)

    def remove_node(self, node_name: str) -> None:
        """The node leaves: its agent stopped, its namespace (daemons, pods) gone."""
        self.stop_agent(node_name)
        node = self.nodes.pop(node_name)
        node.sandbox.down()
        for other in self.nodes.values():
            for cidr in node.pod_cidrs:
                sb._run(["ip", "route", "del", str(cidr)], netns=other.netns, check=False)
        if self.record is not None:
            self.record.sandboxes.remove(node.sandbox.name)
            self.record.save()
        self._save_status()

    def down(self) -> None:
        for node in list(self.nodes.values()):
            if node.agent is not None:
                self.stop_agent(node.name)
            with contextlib.suppress(Exception):
                node.sandbox.down()
        self.nodes.clear()
        if self.control_plane is not None:
            self.control_plane.stop()
            self.control_plane = None
            self.kubelet = None
        record = self.record or LabRecord.load(LAB_REGISTRY / f"{self.name}.json")
        if record is not None:
            cleanup_lab_record(record)
        self.record = None

    def __enter__(self) -> Self:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    # -- status -------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "workdir": str(self.workdir),
            "manifests": str(self.manifests),
            "underlay": {
                "netns": self.underlay_netns,
                "bridge": "ul0",
                "networks": [str(UNDERLAY_V4), str(UNDERLAY_V6)],
            },
            "external_client": {
                "netns": self.external_netns,
                "ips": [str(ip) for ip in self.external_ips],
            },
            "service_cidrs": list(SERVICE_CIDRS),
            "kubernetes": self._kubernetes_status(),
            "started_in_s": round(self.started_in, 3) if self.started_in is not None else None,
            "nodes": [
                {
                    "name": node.name,
                    "zone": node.zone,
                    "netns": node.netns,
                    "node_ips": [str(ip) for ip in node.node_ips],
                    "pod_cidrs": [str(c) for c in node.pod_cidrs],
                    "gateway": node.sandbox.gateway,
                    "ovsdb": node.sandbox.ovsdb,
                    "openflow": node.sandbox.openflow,
                    "agent": {
                        "pid": node.agent.pid if node.agent is not None else None,
                        "metrics": f"http://{node.metrics_address}" if node.agent else None,
                        "log": str(self.workdir / f"agent-{node.name}.log"),
                    },
                    "pods": [
                        {
                            "name": pod.name,
                            "namespace": pod.namespace,
                            "netns": pod.netns,
                            "ips": [str(ip) for ip in pod.ips],
                            "mac": pod.mac,
                            "serves": {"http": list(pod.http_ports), "udp": list(pod.udp_ports)},
                        }
                        for pod in node.pods.values()
                    ],
                }
                for node in self.nodes.values()
            ],
        }

    def _kubernetes_status(self) -> dict[str, Any] | None:
        if self.control_plane is None:
            return None
        return {
            "server": self.control_plane.url,
            "kubeconfig": str(self.kubeconfig),
            "kubectl": str(kube_binary("kubectl")),
            "namespace": NAMESPACE,
            "web_selector": dict(WEB_SELECTOR),
            "agent_kubeconfig": str(self.agent_kubeconfig),
            "logs": str(self.control_plane.workdir),
        }

    def _save_status(self) -> None:
        if self.record is not None:
            self.record.status = self.status()
            self.record.save()


def lab_record(name: str) -> LabRecord:
    """The record of a running lab (e.g. one started by `ovsproxy lab up`)."""
    record = LabRecord.load(LAB_REGISTRY / f"{name}.json")
    if record is None:
        raise LabError(f"no lab named {name!r} (`ovsproxy lab up` starts one)")
    return record


def lab_status(name: str) -> dict[str, Any]:
    """The status of a running lab by name, with its agents' liveness checked now."""
    record = lab_record(name)
    status = dict(record.status)
    status["leftover"] = record.is_leftover()
    for node in status.get("nodes", []):
        pid = record.agents.get(node["name"])
        node["agent"]["running"] = pid is not None and sb.pid_alive(
            pid, record.agent_markers.get(node["name"])
        )
    return status


def lab_down(name: str | None = None) -> list[str]:
    """Remove the named lab (or every lab of the registry); returns the names removed."""
    removed = []
    for record in list_lab_records():
        if name is None or record.name == name:
            cleanup_lab_record(record)
            removed.append(record.name)
    if name is not None and not removed:
        raise LabError(f"no lab named {name!r}")
    return removed


__all__ = [
    "LAB_REGISTRY",
    "Lab",
    "LabError",
    "LabNode",
    "LabRecord",
    "cleanup_lab_record",
    "lab_down",
    "lab_record",
    "lab_status",
    "sweep_lab_leftovers",
]
