"""`ovsproxy cleanup` as an operator runs it: after an agent killed with SIGKILL (its own exit
cleanup never ran), the node is as it was before the agent started.

The snapshot, taken in the node namespace and of its OVS: every policy rule, every route of
every table and every permanent neighbour entry (``ip -d``, per family), the nftables ruleset,
the bridge's flows (without counters), groups and meters, and the bridge's external_ids.
Neighbour entries the kernel learns and ages (reachable, stale, ...) are its cache, not
anybody's configuration: only permanent ones are compared. Foreign state of every kind (a
flow, a meter, a rule, routes, a neighbour entry, an nftables table) is there before and must
be there after. Every part of the snapshot is shown to differ while the agent's state is in
place, so skipping any one removal fails the comparison.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from ovsproxy.datapath import pipeline as pl
from ovsproxy.lab import build_lab
from ovsproxy.ovs.sandbox import Sandbox
from tests.e2e.harness import AgentProcess, copy_examples, run_cleanup

pytestmark = [pytest.mark.slow, pytest.mark.ovs]

NODE_IPS = ("192.168.77.1", "fd00:77::1")
HOST_SNAT = ("10.244.0.254", "fd00:10:244::fffe")
NODE_PORT = 30080

# A NodePort Service with ClientIP affinity (learned flows) and one without endpoints (reject
# flows, metered).
MANIFEST = """\
apiVersion: v1
kind: Service
metadata: {name: np, namespace: demo}
spec:
  type: NodePort
  clusterIP: 10.96.0.80
  clusterIPs: [10.96.0.80, fd00:10:96::80]
  ipFamilies: [IPv4, IPv6]
  ipFamilyPolicy: RequireDualStack
  sessionAffinity: ClientIP
  ports:
    - {name: http, port: 80, targetPort: 8080, protocol: TCP, nodePort: 30080}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: np-v4
  namespace: demo
  labels: {kubernetes.io/service-name: np}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
  - addresses: [10.244.0.11]
    conditions: {ready: true}
    nodeName: node-1
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: np-v6
  namespace: demo
  labels: {kubernetes.io/service-name: np}
addressType: IPv6
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
  - addresses: ["fd00:10:244::11"]
    conditions: {ready: true}
    nodeName: node-1
---
apiVersion: v1
kind: Service
metadata: {name: nothing, namespace: demo}
spec:
  type: ClusterIP
  clusterIP: 10.96.0.90
  clusterIPs: [10.96.0.90]
  ports:
    - {name: http, port: 80, targetPort: 8080, protocol: TCP}
"""

FOREIGN_NFT = """table inet someone-else {
    chain input {
        type filter hook input priority 10; policy accept;
        tcp dport 9999 counter
    }
}
"""


def ip(sandbox: Sandbox, *args: str) -> str:
    return subprocess.run(
        ["ip", "-n", sandbox.netns, *args], capture_output=True, text=True, check=True
    ).stdout


def snapshot(sandbox: Sandbox) -> dict[str, str]:
    """Every part of the node the agent may change, as text."""
    parts: dict[str, str] = {}
    for family in ("-4", "-6"):
        parts[f"rules {family}"] = ip(sandbox, "-d", family, "rule", "show")
        parts[f"routes {family}"] = ip(sandbox, "-d", family, "route", "show", "table", "all")
        parts[f"neighbours {family}"] = ip(
            sandbox, "-d", family, "neigh", "show", "nud", "permanent"
        )
    parts["nftables"] = sandbox.exec("nft", "list", "ruleset").stdout
    parts["flows"] = sandbox.ofctl("dump-flows", "--no-stats")
    parts["groups"] = sandbox.ofctl("dump-groups")
    parts["meters"] = sandbox.ofctl("dump-meters")
    parts["bridge external_ids"] = sandbox.vsctl("get", "Bridge", sandbox.bridge, "external_ids")
    # Datapath records with their conntrack zones and timeout policies (the agent's zones)
    parts["datapaths"] = sandbox.vsctl("--columns=ct_zones,external_ids", "list", "Datapath")
    parts["conntrack zones"] = sandbox.vsctl("list", "CT_Zone") + sandbox.vsctl(
        "list", "CT_Timeout_Policy"
    )
    return parts


def addresses_settled(sandbox: Sandbox, timeout: float = 20) -> None:
    """IPv6 duplicate address detection done on every device (each has its link-local
    address, none is tentative): the kernel adds their local routes when it ends, and a
    snapshot taken earlier would see them appear later as if the agent had left them."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tentative = sandbox.exec("ip", "-6", "addr", "show", "tentative").stdout.strip()
        if not tentative:
            return
        time.sleep(0.1)
    raise AssertionError(f"IPv6 addresses still tentative after {timeout} s: {tentative}")


def foreign_state(sandbox: Sandbox) -> None:
    """Someone else's state of every kind the cleanup looks at."""
    # The node's uplink with its IPs (a veth pair inside the namespace: the kernel here has
    # no dummy devices), without link-local addresses: they would appear after the snapshot.
    sandbox.exec("ip", "link", "add", "ext0", "type", "veth", "peer", "name", "ext1")
    for device in ("ext0", "ext1"):
        sandbox.exec("ip", "link", "set", device, "addrgenmode", "none")
        sandbox.exec("ip", "link", "set", device, "up")
    sandbox.exec("ip", "addr", "add", f"{NODE_IPS[0]}/24", "dev", "ext0")
    sandbox.exec("ip", "addr", "add", f"{NODE_IPS[1]}/64", "dev", "ext0", "nodad")
    sandbox.exec("ip", "rule", "add", "fwmark", "0x99", "lookup", "99", "priority", "300")
    sandbox.exec("ip", "route", "add", "10.99.0.0/16", "dev", "gw0", "proto", "static")
    sandbox.exec("ip", "route", "add", "default", "dev", "gw0", "table", "99", "proto", "static")
    sandbox.exec(
        *("ip", "neigh", "replace", "10.244.0.250", "lladdr", "02:00:00:00:00:fa"),
        *("dev", "gw0", "nud", "permanent"),
    )
    subprocess.run(
        ["ip", "netns", "exec", sandbox.netns, "nft", "-f", "-"],
        input=FOREIGN_NFT,
        text=True,
        check=True,
    )
    sandbox.ofctl("add-flow", "cookie=0xc0ffee,table=250,priority=5,ip,actions=drop")
    sandbox.ofctl("add-meter", "meter=1,pktps,bands=type=drop,rate=10")
    sandbox.vsctl("set", "Bridge", sandbox.bridge, "external_ids:someone=else")


def cleanup(sandbox: Sandbox, log: Path) -> subprocess.CompletedProcess[str]:
    result = run_cleanup(sandbox)
    with log.open("a") as out:
        out.write(f"$ ovsproxy cleanup\n{result.stdout}{result.stderr}")
    return result


def test_cleanup_after_a_killed_agent_restores_the_node(sandbox: Sandbox, tmp_path: Path) -> None:
    pods = build_lab(sandbox)
    foreign_state(sandbox)
    addresses_settled(sandbox)
    before = snapshot(sandbox)
    # The host-SNAT addresses' neighbour entries, as docs/byhand.md has operators make them
    # today (and the agent itself with zero-config host SNAT): ours by their virtual MAC.
    for address in HOST_SNAT:
        sandbox.exec(
            *("ip", "neigh", "replace", address, "lladdr", pl.VIRTUAL_MAC),
            *("dev", "gw0", "nud", "permanent"),
        )
    manifests = copy_examples(tmp_path / "manifests")
    (manifests / "np.yaml").write_text(MANIFEST)
    agent = AgentProcess(
        sandbox,
        manifests,
        tmp_path / "agent.log",
        *("--service-cidr", "10.96.0.0/16", "--service-cidr", "fd00:10:96::/108"),
        *(arg for address in NODE_IPS for arg in ("--node-ip", address)),
        *(arg for address in HOST_SNAT for arg in ("--host-snat-ip", address)),
    )
    agent.start()
    try:
        # Traffic through the Services: a learned affinity flow, the NodePort from the node.
        client = pods["client"].netns
        out = agent.traffic(client, "http", "http://10.96.0.80/", "--count", "3", timeout=5)
        assert out["failed"] == 0, out
        out = agent.traffic(
            sandbox.netns, "http", f"http://{NODE_IPS[0]}:{NODE_PORT}/", "--count", "3"
        )
        assert out["failed"] == 0, out
        assert agent.status()["node_ports"]["elements"] > 0
    finally:
        assert agent.proc is not None
        agent.proc.send_signal(signal.SIGKILL)  # its exit cleanup must not run
        agent.proc.wait(10)
        agent.proc = None
    during = snapshot(sandbox)
    # Every part of the snapshot holds some of the agent's state now: skipping any one removal
    # leaves the comparison below unequal.
    unchanged = [part for part in before if during[part] == before[part]]
    assert not unchanged, f"the agent left no trace in {unchanged}: the check would be blind"
    assert "learn(" in during["flows"] and "meter_id=" in during["flows"], during["flows"]
    assert f"meter={pl.REJECT_METER_ID}" in during["meters"], during["meters"]

    result = cleanup(sandbox, tmp_path / "agent.log")
    assert result.returncode == 0, result.stdout + result.stderr
    after = snapshot(sandbox)
    differing = {
        part: (before[part], after[part]) for part in before if after[part] != before[part]
    }
    assert not differing, f"{differing}\n{result.stdout}"
    report = result.stdout
    lines = report.splitlines()
    for removed in (
        "flow(s) with cookie 0x5e71000000000000/0xffff000000000000",
        "group(s) on br0",
        f"meter {pl.REJECT_METER_ID} (the reject limiter)",
        "external_ids ovsproxy-generation, ovsproxy-group-ids of bridge br0",
        "route 10.96.0.0/16 via 169.254.0.253 dev gw0",
        "route fd00:10:96::/108 via fc01::aabb:ccdd:eeff dev gw0",
        f"neighbour {HOST_SNAT[0]} lladdr {pl.VIRTUAL_MAC} dev gw0 permanent",
        "nftables table inet ovsproxy",
        "lookup 155 (IPv4)",
        "conntrack timeout policies of zones",
    ):
        assert any(line.startswith("removed: ") and removed in line for line in lines), report
    assert "left on purpose: conntrack entries" in report, report

    again = cleanup(sandbox, tmp_path / "agent.log")
    assert again.returncode == 0, again.stdout + again.stderr
    assert not [line for line in again.stdout.splitlines() if line.startswith("removed:")]
    assert "nothing of ours to remove" in again.stdout, again.stdout
    assert snapshot(sandbox) == before
