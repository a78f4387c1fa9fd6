"""Integrated mode: ovsproxy owns five tables in a bridge another controller (a CNI) runs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ovsproxy.lab import build_lab
from ovsproxy.ovs.sandbox import Pod, Sandbox
from tests.e2e.harness import AgentProcess, copy_examples, run_cleanup

pytestmark = [pytest.mark.slow, pytest.mark.ovs]

FIRST, NEXT = 100, 70  # the CNI's forwarding table comes *before* ours
GROUP_MIN, GROUP_MAX = 0x10000000, 0x1FFFFFFF


def install_cni_pipeline(sandbox: Sandbox, pods: dict[str, Pod]) -> list[str]:
    """A minimal CNI: ARP/ND switched normally, IP to ovsproxy's first table, and its own
    forwarding table delivering to pods (cookie 0xc0ffee: not ours)."""
    flows = [
        "table=0,priority=200,arp,actions=NORMAL",
        "table=0,priority=200,icmp6,icmp_type=135,actions=NORMAL",
        "table=0,priority=200,icmp6,icmp_type=136,actions=NORMAL",
        f"table=0,priority=10,ip,actions=resubmit(,{FIRST})",
        f"table=0,priority=10,ipv6,actions=resubmit(,{FIRST})",
        "table=0,priority=0,actions=NORMAL",
        f"table={NEXT},priority=0,actions=NORMAL",
    ]
    for pod in pods.values():
        for ip in pod.ips:
            match = f"ip,nw_dst={ip}" if ip.version == 4 else f"ipv6,ipv6_dst={ip}"
            flows.append(
                f"table={NEXT},priority=100,{match},"
                f"actions=set_field:{pod.mac}->eth_dst,output:{pod.ofport}"
            )
    for flow in flows:
        sandbox.ofctl("add-flow", "cookie=0xc0ffee," + flow)
    return flows


@pytest.fixture
def integrated(
    sandbox: Sandbox, tmp_path: Path
) -> Iterator[tuple[Sandbox, dict[str, Pod], AgentProcess, int]]:
    pods = build_lab(sandbox)
    cni_flows = len(install_cni_pipeline(sandbox, pods))
    agent = AgentProcess(
        sandbox,
        copy_examples(tmp_path / "manifests"),
        tmp_path / "agent.log",
        "--mode",
        "integrated",
        "--first-table",
        str(FIRST),
        "--next-table",
        str(NEXT),
        "--group-id-min",
        str(GROUP_MIN),
        "--group-id-max",
        str(GROUP_MAX),
    )
    agent.start()
    try:
        yield sandbox, pods, agent, cni_flows
    finally:
        agent.stop()


def test_integrated_mode_balances_and_leaves_the_cni_alone(integrated) -> None:  # type: ignore[no-untyped-def]
    sandbox, pods, agent, cni_flows = integrated
    for url, expected in (
        ("http://10.96.0.10/", {"web-1", "web-2"}),
        ("http://[fd00:10:96::20]/", {"api-1", "api-2"}),
    ):
        for netns in (pods["client"].netns, sandbox.netns):
            result = agent.traffic(netns, "http", url, "--count", "40")
            assert result["failed"] == 0 and set(result["counts"]) == expected, result
    flows = [line for line in sandbox.ofctl("dump-flows").splitlines() if "cookie=" in line]
    ours = [f for f in flows if "cookie=0x5e71" in f]
    theirs = [f for f in flows if "cookie=0xc0ffee" in f]
    assert len(theirs) == cni_flows  # untouched
    tables = {int(f.split("table=")[1].split(",")[0]) for f in ours}
    assert tables <= set(range(FIRST, FIRST + 5)), tables  # only our five tables
    groups = [line for line in sandbox.ofctl("dump-groups").splitlines() if "group_id=" in line]
    ids = {int(g.split("group_id=")[1].split(",")[0]) for g in groups}
    assert ids and all(GROUP_MIN <= gid <= GROUP_MAX for gid in ids)
    assert "meter=24177 " in sandbox.ofctl("dump-meters")  # the reject limiter
    # Stopping with --cleanup removes ours and only ours.
    agent.stop()
    agent.extra = (*agent.extra, "--cleanup")
    agent.start()
    agent.stop()
    flows = [line for line in sandbox.ofctl("dump-flows").splitlines() if "cookie=" in line]
    assert not [f for f in flows if "cookie=0x5e71" in f]
    assert len([f for f in flows if "cookie=0xc0ffee" in f]) == cni_flows
    assert not [line for line in sandbox.ofctl("dump-groups").splitlines() if "group_id" in line]
    assert "meter=" not in sandbox.ofctl("dump-meters")
    routes = sandbox.exec("ip", "route").stdout + sandbox.exec("ip", "-6", "route").stdout
    assert "via 169.254.0.253" not in routes and "via fc01::aabb:ccdd:eeff" not in routes
    # `ovsproxy cleanup` takes what --cleanup leaves of ours, the next hop's host routes; the
    # neighbour entries to the virtual MAC stay in integrated mode (the CNI's as much as ours).
    mode = (
        "--mode",
        "integrated",
        "--group-id-min",
        str(GROUP_MIN),
        "--group-id-max",
        str(GROUP_MAX),
    )
    result = run_cleanup(sandbox, *mode)
    assert result.returncode == 0, result.stdout + result.stderr
    removed = [line for line in result.stdout.splitlines() if line.startswith("removed:")]
    assert removed == [
        "removed: route 169.254.0.253/32 dev gw0 proto 155",
        "removed: route fc01::aabb:ccdd:eeff/128 dev gw0 proto 155",
    ], result.stdout
    assert "left on purpose: permanent neighbour entries on gw0" in result.stdout
    assert not sandbox.exec("ip", "route", "show", "proto", "155").stdout
    neighbours = sandbox.exec("ip", "neigh", "show", "nud", "permanent").stdout
    assert "169.254.0.253" in neighbours, neighbours
    again = run_cleanup(sandbox, *mode)
    assert again.returncode == 0 and "nothing of ours to remove" in again.stdout, again.stdout
    assert (
        len([f for f in sandbox.ofctl("dump-flows").splitlines() if "0xc0ffee" in f]) == cni_flows
    )
