"""NodePort, external IP and load-balancer IP Services across a 3-node dual-stack lab (issue
14's acceptance): the external client reaches node IPs and LB IPs, the nodes steer that
traffic into OVS (nftables table + policy routes) and select endpoints as for ClusterIPs.

One lab for the module: web-N serves on node N; client-N is a client pod on node N; the
external client namespace sits on the underlay with the node IPs, and routes the test's LB and
external IPs via node-1.
"""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ovsproxy.datapath import pipeline as pl
from ovsproxy.lab.cluster import HTTP_PORT, UDP_PORT, Lab
from ovsproxy.lab.manifests import LabPort, LabService, addresses
from ovsproxy.model import IPFamily
from ovsproxy.netns import enter_netns
from ovsproxy.ovs.traffic import TCP_TIMEOUT_S, run_in_netns

from .conftest import start_lab
from .helpers import http, install, udp

pytestmark = [pytest.mark.slow, pytest.mark.ovs]

REQUESTS = 60
FAMILIES = [pytest.param(0, id="IPv4"), pytest.param(1, id="IPv6")]
Client = Callable[..., dict[str, Any]]  # helpers.http or helpers.udp


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    yield from start_lab(3)


def nodeport_service(
    lab: Lab,
    name: str,
    octet: int,
    node_port: int,
    pods: tuple[str, ...] = ("web-1", "web-2", "web-3"),
    **kwargs: object,
) -> LabService:
    ports = (
        LabPort("http", 80, HTTP_PORT, node_port=node_port),
        LabPort("dns", 53, UDP_PORT, "UDP", node_port=node_port),
    )
    return LabService(
        name,
        addresses(f"10.96.2.{octet}", f"fd00:10:96::2:{octet:x}"),
        ports,
        lab.endpoints(*pods),
        type=str(kwargs.pop("type", "NodePort")),
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module")
def cluster_np(lab: Lab) -> LabService:
    """NodePort 30080 (TCP and UDP), externalTrafficPolicy Cluster, endpoints on every node."""
    svc = nodeport_service(lab, "np-cluster", 10, 30080)
    install(lab, svc)
    return svc


def node_ip(lab: Lab, node: str, family: int) -> str:
    return str(lab.nodes[node].node_ips[family])


def assert_every_endpoint_answered(out: dict[str, Any], pods: set[str], where: object) -> None:
    """None of the requests failed, and each of ``pods`` answered one or more."""
    assert out["failed"] == 0, (where, out["failures"], out)
    assert set(out["counts"]) == pods, (where, out["counts"])


# http opens a connection per request, udp a socket per datagram: each a new conntrack entry.
CLIENTS = [pytest.param(http, id="tcp"), pytest.param(udp, id="udp")]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("send", CLIENTS)
def test_nodeport_from_outside_on_every_node(
    lab: Lab, cluster_np: LabService, send: Client, family: int
) -> None:
    pods = {ep.pod for ep in cluster_np.endpoints}
    for node in lab.nodes:
        out = send(lab, lab.external_netns, node_ip(lab, node, family), REQUESTS, port=30080)
        assert_every_endpoint_answered(out, pods, node)


@pytest.mark.parametrize("family", FAMILIES)
def test_nodeport_from_the_node_itself_to_its_own_ip(
    lab: Lab, cluster_np: LabService, family: int
) -> None:
    pods = {ep.pod for ep in cluster_np.endpoints}
    for node in lab.nodes.values():
        for send in (http, udp):
            out = send(lab, node.netns, str(node.node_ips[family]), REQUESTS, port=30080)
            assert_every_endpoint_answered(out, pods, (node.name, send.__name__))


# -- externalTrafficPolicy Local and health checks --------------------------------------------
LB_V4, LB_V6 = "203.0.113.10", "2001:db8:113::10"
EXT_V4, EXT_V6 = "198.51.100.10", "2001:db8:100::10"
PROXY_V4, PROXY_V6 = "203.0.113.20", "2001:db8:113::20"
OTHER_V4, OTHER_V6 = "192.168.50.200", "fd00:192:168:50::200"  # a second external client IP


def sh(*args: str, check: bool = True) -> str:
    done = subprocess.run(args, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


@pytest.fixture(scope="module")
def external_routes(lab: Lab) -> Iterator[None]:
    """The external client (the lab's namespace) routes the test's LB and external IPs via
    node-1, and has a second address for source-range checks."""
    ns = lab.external_netns
    via4, via6 = (str(ip) for ip in lab.nodes["node-1"].node_ips)
    for ip in (LB_V4, EXT_V4, PROXY_V4):
        sh("ip", "-n", ns, "route", "add", ip, "via", via4)
    for ip in (LB_V6, EXT_V6, PROXY_V6):
        sh("ip", "-n", ns, "-6", "route", "add", ip, "via", via6)
    sh("ip", "-n", ns, "addr", "add", f"{OTHER_V4}/24", "dev", "eth0")
    # deprecated (preferred_lft 0): never picked as a source unless asked for
    sh(
        "ip",
        "-n",
        ns,
        "addr",
        "add",
        f"{OTHER_V6}/64",
        "dev",
        "eth0",
        "nodad",
        "preferred_lft",
        "0",
    )
    yield
    for ip in (LB_V4, EXT_V4, PROXY_V4, LB_V6, EXT_V6, PROXY_V6):
        sh("ip", "-n", ns, "route", "del", ip, check=False)
    sh("ip", "-n", ns, "addr", "del", f"{OTHER_V4}/24", "dev", "eth0", check=False)
    sh("ip", "-n", ns, "addr", "del", f"{OTHER_V6}/64", "dev", "eth0", check=False)


def get(netns: str, ip: str, port: int, source: str | None = None, timeout: float = 2) -> dict:
    """One HTTP GET with curl: {"status", "body", "headers"}; status 0 when it failed."""
    host = f"[{ip}]" if ":" in ip else ip
    args = ["ip", "netns", "exec", netns, "curl", "-s", "-m", str(timeout), "-D", "-"]
    if source:
        args += ["--interface", source]
    done = subprocess.run([*args, f"http://{host}:{port}/"], capture_output=True, text=True)
    if done.returncode != 0:
        return {"status": 0, "body": "", "headers": {}, "error": done.returncode}
    head, _, body = done.stdout.partition("\n\n")  # (text mode: CRLF read as LF)
    lines = head.split("\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return {"status": int(lines[0].split()[1]), "body": body, "headers": headers}


def lb_service(
    lab: Lab,
    name: str,
    octet: int,
    node_port: int,
    pods: tuple[str, ...],
    *,
    local: bool,
    health_port: int = 0,
    ingress: tuple[tuple[str, str | None], ...] = (),
    **spec: object,
) -> LabService:
    extra: dict[str, object] = dict(spec)
    if local:
        extra["externalTrafficPolicy"] = "Local"
        if health_port:
            extra["healthCheckNodePort"] = health_port
    return nodeport_service(
        lab,
        name,
        octet,
        node_port,
        pods,
        type="LoadBalancer",
        extra_spec=extra,
        load_balancer_ingress=ingress,
    )


def wait_health(
    lab: Lab, port: int, want: dict[str, tuple[int, int]], timeout: float = 10
) -> dict[str, dict]:
    """Until each node's health check (node name -> (status, localEndpoints)) answers as
    wanted, asked from the external client; returns the last answers."""
    deadline = time.monotonic() + timeout
    while True:
        answers = {node: get(lab.external_netns, node_ip(lab, node, 0), port) for node in lab.nodes}
        seen = {
            node: (a["status"], json.loads(a["body"])["localEndpoints"] if a["body"] else -1)
            for node, a in answers.items()
        }
        if seen == want or time.monotonic() > deadline:
            assert seen == want, answers
            return answers
        time.sleep(0.1)


@pytest.fixture(scope="module")
def local_lb(lab: Lab, external_routes: None) -> Iterator[LabService]:
    """LoadBalancer, externalTrafficPolicy Local, healthCheckNodePort 32100, its only
    endpoint web-2 (node-2); LB IPs routed via node-1."""
    svc = lb_service(
        lab,
        "lb-local",
        20,
        30090,
        ("web-2",),
        local=True,
        health_port=32100,
        ingress=((LB_V4, None), (LB_V6, None)),
    )
    install(lab, svc)
    yield svc


@pytest.mark.parametrize("family", FAMILIES)
def test_etp_local_only_nodes_with_a_local_endpoint_answer_and_keep_the_client_ip(
    lab: Lab, local_lb: LabService, family: int
) -> None:
    client = str(lab.external_ips[family])
    out = http(lab, lab.external_netns, node_ip(lab, "node-2", family), REQUESTS, port=30090)
    assert out["failed"] == 0, out
    assert out["counts"] == {"web-2": REQUESTS}, out
    assert out["seen_as"] == {client: REQUESTS}, out  # the endpoint sees the client itself
    for node in ("node-1", "node-3"):
        out = http(lab, lab.external_netns, node_ip(lab, node, family), 3, port=30090, timeout=1)
        assert out["failed"] == 3, (node, out)  # no local endpoint: dropped


def test_health_check_port_200_where_the_endpoint_is_503_elsewhere_and_moves(
    lab: Lab, local_lb: LabService
) -> None:
    answers = wait_health(lab, 32100, {"node-1": (503, 0), "node-2": (200, 1), "node-3": (503, 0)})
    body = json.loads(answers["node-2"]["body"])
    assert body["service"] == {"namespace": "lab", "name": "lb-local"}
    assert body["serviceProxyHealthy"] is True
    assert answers["node-2"]["headers"]["X-Load-Balancing-Endpoint-Weight"] == "1"
    assert answers["node-1"]["headers"]["X-Load-Balancing-Endpoint-Weight"] == "0"
    # status, dump and metrics show the health-check port
    checks = lab.agent_status("node-2")["node_ports"]["health_checks"]
    assert {"service": "lab/lb-local", "port": 32100, "status": 200} in checks, checks
    address = lab.nodes["node-2"].metrics_address
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as resp:
        metrics = resp.read().decode()
    assert "ovsproxy_health_check_servers 1.0" in metrics, metrics
    with urllib.request.urlopen(f"http://{address}/dump", timeout=5) as resp:
        dump = resp.read().decode()
    assert "health-check lab/lb-local port 32100" in dump
    assert "capture nodeports-v4 TCP 30090" in dump
    # The endpoint moves to node-3: the 200 moves with the sync that installs it.
    moved = lb_service(
        lab,
        "lb-local",
        20,
        30090,
        ("web-3",),
        local=True,
        health_port=32100,
        ingress=((LB_V4, None), (LB_V6, None)),
    )
    try:
        install(lab, moved)
        wait_health(
            lab, 32100, {"node-1": (503, 0), "node-2": (503, 0), "node-3": (200, 1)}, timeout=2
        )
    finally:
        install(lab, local_lb)
    wait_health(lab, 32100, {"node-1": (503, 0), "node-2": (200, 1), "node-3": (503, 0)})


@pytest.mark.parametrize("family", FAMILIES)
def test_lb_ip_from_outside_and_in_cluster_short_circuit(
    lab: Lab, local_lb: LabService, family: int
) -> None:
    """The LB IP is routed via node-1, which has no local endpoint: eTP Local drops the
    external client there; a pod on node-1 and node-1 itself (in-cluster) are short-circuited
    to the Service's cluster endpoints and reach web-2, at the LB IP and at node-1's
    NodePort."""
    lb = (LB_V4, LB_V6)[family]
    out = http(lab, lab.external_netns, lb, 3, timeout=1)
    assert out["failed"] == 3, out
    client_1 = lab.nodes["node-1"].pods["client-1"].netns
    out = http(lab, client_1, lb, REQUESTS)
    assert out["failed"] == 0 and out["counts"] == {"web-2": REQUESTS}, out
    out = http(lab, client_1, node_ip(lab, "node-1", family), REQUESTS, port=30090)
    assert out["failed"] == 0 and out["counts"] == {"web-2": REQUESTS}, out
    # the node itself (its own IP as source) is in-cluster too
    out = http(lab, lab.nodes["node-1"].netns, node_ip(lab, "node-1", family), REQUESTS, port=30090)
    assert out["failed"] == 0 and out["counts"] == {"web-2": REQUESTS}, out


@pytest.fixture(scope="module")
def cluster_lb(lab: Lab, external_routes: None) -> LabService:
    """LoadBalancer eTP Cluster with an external IP, an LB IP (VIP) and an ipMode Proxy LB
    IP; loadBalancerSourceRanges: the external client's first address only."""
    svc = lb_service(
        lab,
        "lb-cluster",
        30,
        30091,
        ("web-1", "web-2", "web-3"),
        local=False,
        ingress=((LB_V4, None), (LB_V6, None), (PROXY_V4, "Proxy"), (PROXY_V6, "Proxy")),
        externalIPs=[EXT_V4, EXT_V6],
        loadBalancerSourceRanges=[f"{lab.external_ips[0]}/32", f"{lab.external_ips[1]}/128"],
    )
    # lb-local holds LB_V4/LB_V6 on port 80 too: this Service listens on 8081 instead.
    svc = LabService(
        svc.name,
        svc.cluster_ips,
        tuple(LabPort(p.name, 8081, p.target_port, p.protocol, p.node_port) for p in svc.ports),
        svc.endpoints,
        type=svc.type,
        extra_spec=svc.extra_spec,
        load_balancer_ingress=svc.load_balancer_ingress,
    )
    install(lab, svc)
    return svc


@pytest.mark.parametrize("family", FAMILIES)
def test_external_ip_and_lb_ip_answer_from_outside_and_from_a_pod(
    lab: Lab, cluster_lb: LabService, family: int
) -> None:
    pods = {ep.pod for ep in cluster_lb.endpoints}
    client_3 = lab.nodes["node-3"].pods["client-3"].netns
    for ip in ((EXT_V4, LB_V4), (EXT_V6, LB_V6))[family]:
        for label, netns in (("external", lab.external_netns), ("pod", client_3)):
            out = http(lab, netns, ip, REQUESTS, port=8081)
            assert_every_endpoint_answered(out, pods, (label, ip))


@pytest.mark.parametrize("family", FAMILIES)
def test_load_balancer_source_ranges_allow_and_deny(
    lab: Lab, cluster_lb: LabService, family: int
) -> None:
    lb, ext = ((LB_V4, EXT_V4), (LB_V6, EXT_V6))[family]
    allowed, denied = str(lab.external_ips[family]), (OTHER_V4, OTHER_V6)[family]
    assert get(lab.external_netns, lb, 8081, source=allowed)["status"] == 200
    assert get(lab.external_netns, lb, 8081, source=denied, timeout=1)["status"] == 0
    # kube-proxy: source ranges restrict the LB IPs only, not external IPs or NodePorts.
    assert get(lab.external_netns, ext, 8081, source=denied)["status"] == 200
    node1 = node_ip(lab, "node-1", family)
    assert get(lab.external_netns, node1, 30091, source=denied)["status"] == 200


@pytest.mark.parametrize("family", FAMILIES)
def test_ip_mode_proxy_is_not_steered(lab: Lab, cluster_lb: LabService, family: int) -> None:
    proxy = (PROXY_V4, PROXY_V6)[family]
    assert get(lab.external_netns, proxy, 8081, timeout=1)["status"] == 0
    for node in lab.nodes.values():
        listing = sh("ip", "netns", "exec", node.netns, "nft", "list", "table", "inet", "ovsproxy")
        assert LB_V4 in listing and proxy not in listing, listing


# -- local pods to this node's NodePort ---------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_a_pod_reaches_its_own_nodes_nodeport(
    lab: Lab, cluster_np: LabService, family: int
) -> None:
    pods = {ep.pod for ep in cluster_np.endpoints}
    for node in lab.nodes.values():
        client = node.pods[f"client-{node.index}"].netns
        out = http(lab, client, str(node.node_ips[family]), REQUESTS, port=30080)
        assert_every_endpoint_answered(out, pods, node.name)


def _two_paths_one_port(
    netns: str, family: int, nodeport: tuple[str, int], cluster_ip: tuple[str, int], sport: int
) -> dict[str, str]:
    """From one client source port, two connections at once: first to ``nodeport``
    (established, its request not yet sent), then to ``cluster_ip``; each then sends its
    request. {path: "<pod that answered> <client address it saw>", or the error}."""
    out: dict[str, str] = {}

    def work() -> None:
        enter_netns(netns)
        af = socket.AF_INET if family == 0 else socket.AF_INET6
        socks: dict[str, socket.socket] = {}
        try:
            for path, address in (("nodeport", nodeport), ("clusterip", cluster_ip)):
                sock = socket.socket(af, socket.SOCK_STREAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.settimeout(TCP_TIMEOUT_S)
                sock.bind(("", sport))
                socks[path] = sock
                try:
                    sock.connect(address)
                except OSError as exc:
                    out[path] = f"error: connect: {exc!r}"
            for path in ("clusterip", "nodeport"):
                if path in out:
                    continue
                try:
                    socks[path].sendall(b"GET / HTTP/1.0\r\n\r\n")
                    data = b""
                    while chunk := socks[path].recv(4096):
                        data += chunk
                    head, _, body = data.decode(errors="replace").partition("\r\n\r\n")
                    seen = [
                        h.split(":", 1)[1].strip()
                        for h in head.split("\r\n")[1:]
                        if h.lower().startswith("x-client:")
                    ]
                    out[path] = f"{body} {seen[0].removeprefix('::ffff:') if seen else '?'}"
                except OSError as exc:
                    out[path] = f"error: request: {exc!r}"
        finally:
            for sock in socks.values():
                sock.close()

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(60)
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_one_client_port_for_a_clusterip_and_a_nodeport_of_one_endpoint_at_once(
    lab: Lab, family: int
) -> None:
    """A client may use one source port for two destinations at once. Here: client-1 (node-1)
    to node-2's NodePort, and to the ClusterIP, whose only endpoint web-2 is on node-2. The
    ClusterIP connection is DNATed on node-1 and reaches node-2 as a plain connection; the
    NodePort one is DNATed on node-2. Had both kept the client's address and port, web-2 would
    see one 4-tuple for two connections (the soak's last losses, docs/DESIGN.md). With
    externalTrafficPolicy Cluster the NodePort connection is masqueraded (kube-proxy's
    semantics): web-2 sees node-2's gateway for it, the client itself for the other, and both
    are answered. Fails without the steering table's masquerade (the second connect times
    out)."""
    svc = nodeport_service(lab, "np-two-paths", 60, 30120, pods=("web-2",))
    install(lab, svc)
    node2 = lab.nodes["node-2"]
    client = lab.nodes["node-1"].pods["client-1"]
    client_ip = str((client.ipv4, client.ipv6)[family].ip)  # type: ignore[union-attr]
    gateway = node2.sandbox.gateway_ipv4 if family == 0 else node2.sandbox.gateway_ipv6
    try:
        for sport in (61301, 61303, 61305):
            out = _two_paths_one_port(
                client.netns,
                family,
                (node_ip(lab, "node-2", family), 30120),
                (str(svc.cluster_ips[family]), 80),
                sport,
            )
            want = {
                "nodeport": f"web-2 {gateway.ip}",  # type: ignore[union-attr]
                "clusterip": f"web-2 {client_ip}",
            }
            assert out == want, sport
    finally:
        remove(lab, svc)


# -- the NodePort conformance behaviours ----------------------------------------------------------
def test_conformance_a_functioning_nodeport_service(lab: Lab) -> None:
    """[sig-network] Services should be able to create a functioning NodePort service."""
    svc = nodeport_service(lab, "np-functioning", 40, 30100)
    install(lab, svc)
    try:
        for node in lab.nodes:
            for family in (0, 1):
                out = http(lab, lab.external_netns, node_ip(lab, node, family), 10, port=30100)
                assert out["failed"] == 0, (node, out)
    finally:
        remove(lab, svc)


def affinity_counts(lab: Lab, family: int, port: int, count: int = 30) -> dict[str, int]:
    out = http(lab, lab.external_netns, node_ip(lab, "node-1", family), count, port=port)
    assert out["failed"] == 0, out
    counts: dict[str, int] = out["counts"]
    return counts


@pytest.mark.parametrize("family", FAMILIES)
def test_conformance_session_affinity_over_nodeport(lab: Lab, family: int) -> None:
    """[sig-network] Services should have session affinity work for NodePort service."""
    svc = nodeport_service(lab, "np-affinity", 41, 30101, session_affinity_timeout=300)
    install(lab, svc)
    try:
        counts = affinity_counts(lab, family, 30101)
        assert len(counts) == 1, counts  # every connection to one endpoint
    finally:
        remove(lab, svc)


def test_conformance_switching_session_affinity_over_nodeport(lab: Lab) -> None:
    """[sig-network] Services should be able to switch session affinity for NodePort service."""
    plain = nodeport_service(lab, "np-switch", 42, 30102)
    sticky = nodeport_service(lab, "np-switch", 42, 30102, session_affinity_timeout=300)
    try:
        install(lab, plain)
        assert len(affinity_counts(lab, 0, 30102)) > 1
        install(lab, sticky)
        wait_for(lambda: len(affinity_counts(lab, 0, 30102)) == 1, "affinity on")
        install(lab, plain)
        wait_for(lambda: len(affinity_counts(lab, 0, 30102)) > 1, "affinity off")
    finally:
        remove(lab, plain)


def test_conformance_change_type_from_external_name_to_nodeport(lab: Lab) -> None:
    """[sig-network] Services should be able to change the type from ExternalName to
    NodePort."""
    path = lab.manifests / "lab-np-extname.yaml"
    path.write_text(
        "apiVersion: v1\nkind: Service\nmetadata: {name: np-extname, namespace: lab}\n"
        "spec: {type: ExternalName, externalName: example.com}\n"
    )
    try:
        time.sleep(0.5)  # the agents read it (and program nothing for an ExternalName)
        out = http(lab, lab.external_netns, node_ip(lab, "node-1", 0), 1, port=30103, timeout=1)
        assert out["failed"] == 1, out
        svc = nodeport_service(lab, "np-extname", 43, 30103)
        install(lab, svc)  # the same file name: the Service becomes type NodePort
        for node in lab.nodes:
            out = http(lab, lab.external_netns, node_ip(lab, node, 0), 10, port=30103)
            assert out["failed"] == 0, (node, out)
    finally:
        path.unlink(missing_ok=True)


def remove(lab: Lab, svc: LabService) -> None:
    from ovsproxy.lab.manifests import remove_service

    remove_service(lab.manifests, svc)
    name = f"{svc.namespace}/{svc.name}:{svc.ports[0].name}/{svc.ports[0].protocol}"
    lab.wait_endpoints(name, set())


def wait_for(condition: object, what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {timeout}s")
        time.sleep(0.2)


# -- nodePortAddresses -----------------------------------------------------------------------------
def test_node_port_addresses_select_the_node_ips_per_family(
    lab: Lab, cluster_np: LabService
) -> None:
    """node-3 restarted with ``--node-port-addresses 10.0.0.0/8``: no IPv4 node IP of node-3
    is in it, so its IPv4 NodePorts close; IPv6 lists no CIDR, so every IPv6 node IP stays
    open (kube-proxy's per-family rule)."""
    saved = lab.agent_args
    lab.stop_agent("node-3")
    lab.agent_args = (*saved, "--node-port-addresses", "10.0.0.0/8")
    try:
        lab.start_agent("node-3")
        out = http(lab, lab.external_netns, node_ip(lab, "node-3", 0), 2, port=30080, timeout=1)
        assert out["failed"] == 2, out
        out = http(lab, lab.external_netns, node_ip(lab, "node-3", 1), 10, port=30080)
        assert out["failed"] == 0, out
        status = lab.agent_status("node-3")["node_ports"]
        assert status["node_port_ips"] == [node_ip(lab, "node-3", 1)], status
    finally:
        lab.stop_agent("node-3")
        lab.agent_args = saved
        lab.start_agent("node-3")
    out = http(lab, lab.external_netns, node_ip(lab, "node-3", 0), 10, port=30080)
    assert out["failed"] == 0, out


# -- restarts, the rest of the ruleset, --cleanup --------------------------------------------------
FOREIGN = """table inet someone-else {
    chain input {
        type filter hook input priority 10; policy accept;
        tcp dport 9999 counter
    }
}
table ip legacy {
    chain pre {
        type nat hook prerouting priority -90; policy accept;
    }
}
"""


def foreign_ruleset(netns: str) -> str:
    """Every table of the namespace but ours, listed."""
    tables = json.loads(sh("ip", "netns", "exec", netns, "nft", "-j", "list", "tables"))
    out = []
    for item in tables["nftables"]:
        table = item.get("table")
        if table and not (table["family"] == "inet" and table["name"] == "ovsproxy"):
            out.append(
                sh(
                    "ip",
                    "netns",
                    "exec",
                    netns,
                    "nft",
                    "list",
                    "table",
                    table["family"],
                    table["name"],
                )
            )
    return "".join(out)


def steering_state(netns: str) -> tuple[bool, str, str]:
    """(our table present, our policy rules, our table's routes) in ``netns``."""
    tables = sh("ip", "netns", "exec", netns, "nft", "list", "tables")
    rules = sh("ip", "-n", netns, "rule") + sh("ip", "-n", netns, "-6", "rule")
    routes = sh("ip", "-n", netns, "route", "show", "table", "155", check=False)
    routes += sh("ip", "-n", netns, "-6", "route", "show", "table", "155", check=False)
    ours = [line for line in rules.splitlines() if "lookup 155" in line]
    return "inet ovsproxy" in tables, "\n".join(ours), routes


def permanent_neighbours(netns: str) -> set[str]:
    """The addresses of the permanent neighbour entries on the node's gateway."""
    out = sh("ip", "-n", netns, "neigh", "show", "dev", "gw0", "nud", "permanent")
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def test_the_rest_of_the_ruleset_across_restart_syncs_and_cleanup(
    lab: Lab, cluster_np: LabService
) -> None:
    """``nft list`` of every table but ours is byte-identical before a restart, after it,
    after syncs, after ``--cleanup`` (which removes our table, rules and routes) and after a
    first start that creates our table."""
    node = lab.nodes["node-2"]
    subprocess.run(
        ["ip", "netns", "exec", node.netns, "nft", "-f", "-"],
        input=FOREIGN,
        text=True,
        check=True,
    )
    before = foreign_ruleset(node.netns)
    assert "someone-else" in before and "legacy" in before
    lab.stop_agent("node-2")
    assert foreign_ruleset(node.netns) == before
    lab.start_agent("node-2")
    assert foreign_ruleset(node.netns) == before
    # The new agent adopted the table (a rebuild would replace the NAT chains under the
    # connections in flight): its first sync patched it, or had nothing to do.
    last = lab.agent_status("node-2")["node_ports"]["last_sync"]
    assert last is not None and last["kind"] != "rebuild", last
    install(lab, nodeport_service(lab, "np-more", 44, 30104))  # a sync that patches the table
    assert foreign_ruleset(node.netns) == before
    assert steering_state(node.netns)[0]
    saved = lab.agent_args
    hops = {str(pl.VIRTUAL_SERVICE_IP[f]) for f in IPFamily}
    lab.stop_agent("node-2")
    lab.agent_args = (*saved, "--cleanup")
    try:
        lab.start_agent("node-2")
        lab.stop_agent("node-2")
        assert steering_state(node.netns) == (False, "", "")
        assert foreign_ruleset(node.netns) == before
        # The host-SNAT addresses' neighbour entries went; the virtual next hop's stay.
        assert permanent_neighbours(node.netns) == hops
        # A first start on a node without our table (the rebuild path) leaves the rest alone.
        lab.agent_args = saved
        lab.start_agent("node-2")
        assert steering_state(node.netns)[0]
        assert foreign_ruleset(node.netns) == before
    finally:
        lab.agent_args = saved
        if node.agent is None:
            lab.start_agent("node-2")
        sh("ip", "netns", "exec", node.netns, "nft", "delete", "table", "inet", "someone-else")
        sh("ip", "netns", "exec", node.netns, "nft", "delete", "table", "ip", "legacy")
        remove(lab, nodeport_service(lab, "np-more", 44, 30104))
    assert steering_state(node.netns)[0]
    snat = set(lab.agent_status("node-2")["ovs"]["host_snat_ips"])
    assert snat == {"10.244.2.254", "fd00:10:244:2:ffff:ffff:ffff:fffe"}  # made again
    assert permanent_neighbours(node.netns) == hops | snat
    out = http(lab, lab.external_netns, node_ip(lab, "node-2", 0), 10, port=30080)
    assert out["failed"] == 0, out


SOURCE_PORTS = ",".join(str(61100 + 2 * i) for i in range(16))  # above the ephemeral range


def bound_requests(lab: Lab, ip: str, port: int, timeout: float) -> dict[str, object]:
    """One HTTP/1.0 request per bound source port (traffic's bound mode): the endpoint then
    holds each 4-tuple in TIME_WAIT. {port: seconds or error}."""
    args = ("bound", ip, str(port), "--source-ports", SOURCE_PORTS, "--timeout", str(timeout))
    return run_in_netns(lab.external_netns, *args, timeout=180)


def seq_check_failures(lab: Lab) -> int:
    return sum(
        int(node.sandbox.appctl("coverage/read-counter", "conntrack_tcp_seq_chk_failed") or 0)
        for node in lab.nodes.values()
    )


def test_a_time_wait_collision_across_nodes_recovers_with_both_agents_down(lab: Lab) -> None:
    """What lost requests around an agent restart: a new connection reaches an endpoint
    with the 4-tuple of one of its TIME_WAIT sockets; the endpoint answers with the old
    connection's ACK, which spoils the conntrack entries on both nodes (the client's and the
    endpoint's), and nobody is there to flush them (datapath.stale_reset). The switches must
    recover alone: each connection costs at most one SYN retransmission. Open vSwitch forgets
    a closed connection after 30 s, the endpoint its TIME_WAIT after 60 s: flushing the zones
    stands for a reuse in between (as the module's long runs of short connections do)."""
    node1, node2 = lab.nodes["node-1"], lab.nodes["node-2"]
    ip = node_ip(lab, "node-2", 0)
    first = nodeport_service(lab, "np-tw-a", 50, 30110, pods=("web-1",))
    second = nodeport_service(lab, "np-tw-b", 51, 30111, pods=("web-1",))
    install(lab, first)
    install(lab, second)
    try:
        before = bound_requests(lab, ip, 30110, 5)
        assert all(isinstance(v, float) for v in before.values()), before
        lab.stop_agent("node-1")
        lab.stop_agent("node-2")
        zones = (
            (node1, pl.ct_zone(IPFamily.IPv4)),
            (node2, pl.ct_zone(IPFamily.IPv4)),
            (node2, pl.host_snat_ct_zone(IPFamily.IPv4)),
        )
        for node, zone in zones:
            node.sandbox.appctl("dpctl/flush-conntrack", f"zone={zone}")
        failures_before = seq_check_failures(lab)
        after = bound_requests(lab, ip, 30111, 5)
        collided = seq_check_failures(lab) - failures_before
    finally:
        for name in ("node-1", "node-2"):
            if lab.nodes[name].agent is None:
                lab.start_agent(name)
        remove(lab, first)
        remove(lab, second)
    assert collided > 0, (after, "no 4-tuple collided: the test proved nothing")
    # One SYN retransmission (1 s), under the 2 s a client waits in the restart test below.
    assert all(isinstance(v, float) and v < 1.8 for v in after.values()), (after, collided)


def test_agent_restart_under_nodeport_traffic(lab: Lab, cluster_np: LabService) -> None:
    """No request is lost while node-2's agent stops and starts (flows, groups, the steering
    table and its routes stay). After the module's other traffic, source ports get reused
    within the endpoints' TIME_WAIT: the switch recovers those connections alone (above)."""
    target = [
        *("ip", "netns", "exec", lab.external_netns, *TRAFFIC, "http"),
        f"http://{node_ip(lab, 'node-2', 0)}:30080/",
        *("--duration", "8", "--timeout", "2"),
    ]
    load = subprocess.Popen(target, stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(1.5)
        lab.stop_agent("node-2")
        lab.start_agent("node-2")
    finally:
        stdout, _ = load.communicate(timeout=60)
    out = json.loads(stdout)
    assert out["sent"] > 20 and out["failed"] == 0, (out["failures"], out["failure_times"], out)


TRAFFIC = [__import__("sys").executable, "-m", "ovsproxy.ovs.traffic"]


def test_a_strict_rp_filter_is_loosened_on_the_gateway(
    lab: Lab, cluster_np: LabService, cluster_lb: LabService
) -> None:
    """node-1 as a distribution may set it up: strict reverse-path filtering (all=1) and a
    default route. The restarted agent makes gw0's rp_filter loose (2), so the replies of
    steered connections (source: the virtual NodePort IP, the LB IP, the external IP) that
    leave OVS through gw0 are not dropped: from outside, every endpoint answers."""
    node = lab.nodes["node-1"]
    ext_v4 = str(lab.external_ips[0])

    def rp_filter(device: str) -> str:
        return node.exec("sysctl", "-n", f"net.ipv4.conf.{device}.rp_filter").stdout.strip()

    node.exec("sysctl", "-qw", "net.ipv4.conf.all.rp_filter=1")
    node.exec("ip", "route", "add", "default", "via", ext_v4, "dev", "eth0")
    try:
        lab.stop_agent("node-1")
        lab.start_agent("node-1")
        assert (rp_filter("all"), rp_filter("gw0")) == ("1", "2")
        status = lab.agent_status("node-1")
        assert status["node_ports"]["rp_filter"] == {"all": 1, "gw0": 2, "effective": 2}
        assert status["unserved_paths"] == [], status["unserved_paths"]
        assert "net.ipv4.conf.gw0.rp_filter was 0 (all: 1), strict" in lab.agent_log("node-1")
        out = http(lab, lab.external_netns, node_ip(lab, "node-1", 0), REQUESTS, port=30080)
        assert_every_endpoint_answered(out, {ep.pod for ep in cluster_np.endpoints}, "NodePort")
        for ip in (EXT_V4, LB_V4):
            out = http(lab, lab.external_netns, ip, REQUESTS, port=8081)
            assert_every_endpoint_answered(out, {ep.pod for ep in cluster_lb.endpoints}, ip)
    finally:
        node.exec("sysctl", "-qw", "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.gw0.rp_filter=0")
        node.exec("ip", "route", "del", "default", "via", ext_v4, check=False)
        lab.stop_agent("node-1")
        lab.start_agent("node-1")
