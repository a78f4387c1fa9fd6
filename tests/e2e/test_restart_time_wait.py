"""After an ovs-vswitchd restart (conntrack empty), a new connection can get the 4-tuple of a
connection whose endpoint still holds it in TIME_WAIT: the endpoint answers the SYN with the
old connection's ACK and the client's RST, invalid to Open vSwitch's conntrack (inexact
sequence number), must reach the endpoint to end the TIME_WAIT (pipeline.PRIORITY_INVALID_RST).

Made deterministic: two Services share one endpoint, the client binds the same source ports
for both (before the restart to A, after it to B: the same 4-tuple at the endpoint; before
the restart, conntrack would have moved the second connection to another source port), and
TCP timestamps are off in the client's namespace, so the endpoint's TIME_WAIT accepts a new
SYN only when its sequence number happens to be higher: about half the ports collide."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ovsproxy.datapath import pipeline as pl
from ovsproxy.lab import build_lab
from ovsproxy.model import IPFamily
from ovsproxy.ovs.sandbox import Pod, Sandbox
from ovsproxy.ovs.traffic import run_in_netns
from tests.e2e.harness import AgentProcess

pytestmark = [pytest.mark.slow, pytest.mark.ovs]

SERVICES = "\n---\n".join(
    f"""apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: demo}}
spec:
  clusterIP: {ip}
  ports: [{{name: http, port: 80, targetPort: 8080}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: {name}, namespace: demo, labels: {{kubernetes.io/service-name: {name}}}}}
addressType: IPv4
ports: [{{name: http, port: 8080, protocol: TCP}}]
endpoints: [{{addresses: [10.244.0.11], conditions: {{ready: true}}}}]"""
    for name, ip in (("tw-a", "10.96.0.61"), ("tw-b", "10.96.0.62"))
)

PORTS = ",".join(str(41000 + 2 * i) for i in range(12))


@pytest.fixture
def node(sandbox: Sandbox, tmp_path: Path) -> Iterator[tuple[Sandbox, Pod, AgentProcess]]:
    pods = build_lab(sandbox)
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "tw.yaml").write_text(SERVICES)
    agent = AgentProcess(sandbox, manifests, tmp_path / "agent.log").start()
    try:
        yield sandbox, pods["client"], agent
    finally:
        agent.stop()


def _connect(client: Pod, host: str, timeout: float) -> dict[str, object]:
    """One HTTP/1.0 request per bound source port (traffic's bound mode): the server closes
    first, so the endpoint holds each 4-tuple in TIME_WAIT. {port: seconds or error}."""
    assert client.ipv4 is not None
    args = ("bound", host, "80", "--source-ports", PORTS, "--timeout", str(timeout))
    return run_in_netns(client.netns, *args, "--bind-address", str(client.ipv4.ip), timeout=120)


def _seq_check_failures(sandbox: Sandbox) -> int:
    out = sandbox.appctl("coverage/read-counter", "conntrack_tcp_seq_chk_failed")
    return int(out.strip() or 0)


def test_new_connection_on_an_endpoint_time_wait_tuple_after_vswitchd_restart(
    node: tuple[Sandbox, Pod, AgentProcess],
) -> None:
    sandbox, client, agent = node
    subprocess.run(
        ["ip", "netns", "exec", client.netns, "sysctl", "-qw", "net.ipv4.tcp_timestamps=0"],
        check=True,
    )
    before = _connect(client, "10.96.0.61", 5)
    assert all(isinstance(v, float) for v in before.values()), before
    sandbox.restart_vswitchd()  # conntrack is empty now; the endpoint's TIME_WAITs are not
    agent.wait_for(
        lambda: (
            _seq_check_failures(sandbox) == 0
            and "10.96.0.62" in sandbox.ofctl("dump-flows", "table=13")
        ),
        timeout=15,
        what="the agent's replay after the restart",
    )
    after = _connect(client, "10.96.0.62", 5)
    failed = {p: v for p, v in after.items() if not isinstance(v, float)}
    collided = _seq_check_failures(sandbox)
    # The scenario happened (RSTs conntrack calls invalid)...
    assert collided > 0, (after, "no 4-tuple collided: the test proved nothing")
    # ...and no connection was lost: each colliding one costs at most a SYN retransmission.
    assert not failed, (failed, after, collided)
    assert all(isinstance(v, float) and v < 2.5 for v in after.values()), after
    flushes = agent.status().get("invalid_rst") or {}
    assert flushes == {} or flushes.get("flushes", 0) > 0


def test_a_time_wait_collision_recovers_while_the_agent_is_down(
    node: tuple[Sandbox, Pod, AgentProcess],
) -> None:
    """The same collision without the agent (an agent restart): nobody flushes the entry the
    endpoint's stray ACK spoiled, so the switch itself must let the client's SYN
    retransmission through (PRIORITY_INVALID_SYN_ACK). Open vSwitch forgets a closed
    connection after 30 s, the endpoint its TIME_WAIT after 60 s: flushing the Service zone
    here stands for a reuse in between, as in a long run of short connections."""
    sandbox, client, agent = node
    subprocess.run(
        ["ip", "netns", "exec", client.netns, "sysctl", "-qw", "net.ipv4.tcp_timestamps=0"],
        check=True,
    )
    before = _connect(client, "10.96.0.61", 5)
    assert all(isinstance(v, float) for v in before.values()), before
    agent.wait_for(lambda: "10.96.0.62" in sandbox.ofctl("dump-flows", "table=13"), timeout=15)
    agent.stop()  # flows and groups stay; no agent answers packet-ins now
    sandbox.appctl("dpctl/flush-conntrack", f"zone={pl.ct_zone(IPFamily.IPv4)}")
    failures_before = _seq_check_failures(sandbox)
    after = _connect(client, "10.96.0.62", 5)
    failed = {p: v for p, v in after.items() if not isinstance(v, float)}
    collided = _seq_check_failures(sandbox) - failures_before
    assert collided > 0, (after, "no 4-tuple collided: the test proved nothing")
    # Each colliding connection costs one SYN retransmission (1 s), none is lost.
    assert not failed, (failed, after, collided)
    assert all(isinstance(v, float) and v < 1.8 for v in after.values()), after


def test_closed_connections_outlive_the_endpoints_time_wait(
    node: tuple[Sandbox, Pod, AgentProcess],
) -> None:
    """The agent gives our conntrack zones Linux conntrack's TIME_WAIT timeout (120 s), so
    Open vSwitch remembers a closed Service connection for longer than its endpoint holds the
    4-tuple (60 s): conntrack's NAT then moves a reused client port to another source port
    instead of handing the endpoint a 4-tuple it still holds (pipeline.CT_TIMEOUT_POLICY).
    With Open vSwitch's default (30 s) the entries below would expire before the endpoint's
    TIME_WAIT does."""
    sandbox, client, agent = node
    agent.wait_for(
        lambda: agent.status()["ovsdb"].get("zone_timeouts") == "tcp_close=120 tcp_time_wait=120",
        timeout=15,
        what="the zone timeout policy in /status",
    )
    policies = sandbox.vsctl("list-zone-tp", "netdev")
    for zone in pl.CT_ZONES:
        assert f"Zone:{zone}, Timeout Policies: tcp_close=120 tcp_time_wait=120" in policies
    before = _connect(client, "10.96.0.61", 5)
    assert all(isinstance(v, float) for v in before.values()), before
    zone = pl.ct_zone(IPFamily.IPv4)

    def entries() -> list[str]:
        dump = sandbox.appctl("dpctl/dump-conntrack", "-s", f"zone={zone}")
        return [line for line in dump.splitlines() if "dst=10.96.0.61" in line]

    # A client has its answer before the close is over: the last ACKs may still be on their
    # way (CI saw an entry in CLOSING, the FINs crossed, right after the connects returned).
    deadline = time.monotonic() + 5
    closed = entries()
    while not all("state=TIME_WAIT" in line for line in closed) and time.monotonic() < deadline:
        time.sleep(0.1)
        closed = entries()
    assert len(closed) == len(PORTS.split(",")), closed
    for line in closed:
        assert "state=TIME_WAIT" in line, line
        remaining = int(line.split("timeout=")[1].split(",")[0])
        assert remaining > 60, line  # longer than the endpoint's TIME_WAIT
    # A reuse of the same client ports for the other Service (same endpoint) right away:
    # conntrack remembers the 4-tuples and moves every connection to another source port.
    failures_before = _seq_check_failures(sandbox)
    after = _connect(client, "10.96.0.62", 5)
    assert all(isinstance(v, float) and v < 0.9 for v in after.values()), after
    assert _seq_check_failures(sandbox) == failures_before
