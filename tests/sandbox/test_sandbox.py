"""The private OVS sandbox: real ovsdb-server/ovs-vswitchd, namespaces, veths, traffic."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ovsproxy.ovs.sandbox import REGISTRY, Sandbox, SandboxRecord, sweep_leftovers
from ovsproxy.ovs.traffic import run_in_netns

pytestmark = pytest.mark.ovs


def _netns() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] == "Z":
                continue
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{proc.name}: {cmdline}")
    return found


def _root_links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}


def test_two_sandboxes_side_by_side_and_nothing_left_after_teardown() -> None:
    links_before = _root_links()
    a, b = Sandbox(), Sandbox()
    with a, b:
        a.add_pod("x", http_ports=(80,))
        b.add_pod("x", http_ports=(80,))
        assert a.netns != b.netns and a.rundir != b.rundir
        for sb in (a, b):
            show = sb.ofctl("show")
            assert "dpid:0000000000000001" in show and "(gw0)" in show and "(p-x)" in show
            assert sb.vsctl("get", "bridge", "br0", "datapath_type").strip() == "netdev"
            assert sb.vsctl("get", "bridge", "br0", "protocols").strip() == "[OpenFlow15]"
            assert sb.vsctl("get", "bridge", "br0", "fail_mode").strip() == "secure"
        # Each bridge is its own: a flow added to one is absent from the other.
        a.ofctl("add-flow", "table=0,priority=7,actions=drop")
        assert "priority=7" in a.ofctl("dump-flows")
        assert "priority=7" not in b.ofctl("dump-flows")
        names = {
            a.netns,
            b.netns,
            *(p.netns for p in a.pods.values()),
            *(p.netns for p in b.pods.values()),
        }
        assert names <= _netns()
        rundirs = [str(a.rundir), str(b.rundir)]
    assert not (names & _netns())
    for rundir in rundirs:
        assert not Path(rundir).exists()
        assert _processes_mentioning(rundir) == []
    # Nothing leaked into the root namespace: no taps, veths or bridge devices.
    assert _root_links() - links_before == set()


def test_pods_talk_tcp_through_conntrack(sandbox: Sandbox) -> None:
    client = sandbox.add_pod("client", ipv6="fd00:10:244::10/64")
    server = sandbox.add_pod("server", ipv6="fd00:10:244::11/64", http_ports=(8080,))
    # Everything IP but ICMPv6 goes through conntrack; new connections are committed,
    # established ones pass; everything else (ARP, ND) is switched normally.
    for flow in (
        "table=0,priority=20,icmp6,actions=NORMAL",  # neighbour discovery
        "table=0,priority=10,ip,ct_state=-trk,actions=ct(table=1)",
        "table=0,priority=10,ipv6,ct_state=-trk,actions=ct(table=1)",
        "table=0,priority=1,actions=NORMAL",
        "table=1,priority=10,ip,ct_state=+trk+new,actions=ct(commit),NORMAL",
        "table=1,priority=10,ipv6,ct_state=+trk+new,actions=ct(commit),NORMAL",
        "table=1,priority=10,ct_state=+trk+est,actions=NORMAL",
        "table=1,priority=1,actions=drop",
    ):
        sandbox.ofctl("add-flow", flow)
    v4 = run_in_netns(client.netns, "http", f"http://{server.ipv4.ip}:8080/", "--count", "5")
    v6 = run_in_netns(client.netns, "http", f"http://[{server.ipv6.ip}]:8080/", "--count", "5")
    assert v4["counts"] == {"server": 5} and v4["failed"] == 0
    assert v6["counts"] == {"server": 5} and v6["failed"] == 0
    # Flow statistics reach OpenFlow only after a revalidator pass; the conntrack table is
    # exact: every connection was committed by the ct(commit) flows (5 per family).
    entries = sandbox.appctl("dpctl/dump-conntrack").splitlines()
    v4_entries = [e for e in entries if f"dst={server.ipv4.ip}," in e and "dport=8080" in e]
    v6_entries = [e for e in entries if f"dst={server.ipv6.ip}," in e and "dport=8080" in e]
    assert (len(v4_entries), len(v6_entries)) == (5, 5)


def test_node_namespace_reaches_pod_through_gateway(sandbox: Sandbox) -> None:
    server = sandbox.add_pod("server", http_ports=(80,))
    sandbox.ofctl("add-flow", "table=0,priority=1,actions=NORMAL")
    result = run_in_netns(sandbox.netns, "http", f"http://{server.ipv4.ip}/", "--count", "3")
    assert result["counts"] == {"server": 3}


def test_pod_is_recorded_in_ovsdb_like_a_cni(sandbox: Sandbox) -> None:
    pod = sandbox.add_pod("web", ipv6="fd00:10:244::20/64", namespace="shop")
    with sandbox.ovsdb_client() as db:
        ports = {p.name: p for p in db.pod_ports("br0")}
    assert set(ports) == {"web"}
    web = ports["web"]
    assert web.ofport == pod.ofport and web.mac == pod.mac and web.namespace == "shop"
    assert [str(ip) for ip in web.ips] == [str(pod.ipv4.ip), "fd00:10:244::20"]


def test_vswitchd_restart_loses_flows_keeps_gateway(sandbox: Sandbox) -> None:
    sandbox.ofctl("add-flow", "table=0,priority=9,actions=drop")
    old_pid = sandbox.record.pids["ovs-vswitchd"]
    sandbox.restart_vswitchd()
    assert sandbox.record.pids["ovs-vswitchd"] != old_pid
    assert "priority=9" not in sandbox.ofctl("dump-flows")
    addr = sandbox.exec("ip", "-o", "addr", "show", "dev", "gw0").stdout
    assert "10.244.0.1/24" in addr


def test_leftover_of_a_crashed_run_is_cleaned_not_reused(tmp_path: Path) -> None:
    # A child process brings a sandbox up and dies without tearing it down (a crash).
    script = (
        "import os; from ovsproxy.ovs.sandbox import Sandbox; "
        "sb = Sandbox('crashed1').up(); print(sb.rundir, flush=True); os._exit(1)"
    )
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", script], capture_output=True, text=True, timeout=60
    )
    rundir = out.stdout.strip()
    assert rundir and Path(rundir).exists(), out.stderr
    record = SandboxRecord.load(REGISTRY / "crashed1.json")
    assert record is not None and record.is_leftover()
    assert "ovsp-crashed1" in _netns()
    assert sweep_leftovers() == ["crashed1"]
    assert "ovsp-crashed1" not in _netns()
    assert not Path(rundir).exists() and _processes_mentioning(rundir) == []


def test_same_name_while_running_is_refused(sandbox: Sandbox) -> None:
    from ovsproxy.ovs.sandbox import SandboxError

    with pytest.raises(SandboxError, match="already up"):
        Sandbox(sandbox.name).up()
    # The refusal touched nothing of the running one.
    assert sandbox.record is not None and sandbox.record.processes_alive()


def test_cli_up_status_down() -> None:
    # A name of this run's own: another run on the machine (a second CI clone) must not meet it.
    name = f"cli{os.getpid() % 100000}"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    cli = [sys.executable, "-m", "ovsproxy", "sandbox"]
    up = subprocess.run(
        [*cli, "up", "--name", name], capture_output=True, text=True, env=env, timeout=60
    )
    try:
        assert up.returncode == 0, up.stderr
        status = subprocess.run(
            [*cli, "status", "--name", name, "--json"],
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
        )
        assert status.returncode == 0, status.stderr
        info = json.loads(status.stdout)
        assert info["running"] and info["bridge"] == "br0"
        assert info["openflow"].startswith("unix:") and info["openflow"].endswith("br0.mgmt")
        assert any("(gw0)" in port for port in info["ports"])
        text = subprocess.run(
            [*cli, "status", "--name", name],
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
        ).stdout
        assert "br0" in text and "gw0" in text and "br0.mgmt" in text
    finally:
        down = subprocess.run(
            [*cli, "down", "--name", name], capture_output=True, text=True, env=env, timeout=60
        )
    assert down.returncode == 0, down.stderr
    assert f"ovsp-{name}" not in _netns()
    assert not (REGISTRY / f"{name}.json").exists()
    assert _processes_mentioning(info["rundir"]) == []


def test_a_sandbox_being_started_by_a_live_owner_is_not_a_leftover(tmp_path: Path) -> None:
    from ovsproxy.ovs.namespaces import start_time

    me = os.getpid()
    starting = SandboxRecord(
        name="x",
        rundir=str(tmp_path),
        netns="ovsp-x",
        bridge="br0",
        gateway="gw0",
        owner_pid=me,
        persistent=False,
        owner_started=start_time(me),
    )
    assert not starting.is_leftover()  # no daemon pid recorded yet: still not another's to sweep
    recycled = SandboxRecord(
        name="y",
        rundir=str(tmp_path),
        netns="ovsp-y",
        bridge="br0",
        gateway="gw0",
        owner_pid=me,
        persistent=False,
        owner_started=1,
    )
    assert recycled.is_leftover()  # same pid, another process: the owner is gone


def test_remove_owned_deletes_namespaces_workdir_and_record(tmp_path: Path) -> None:
    from ovsproxy.ovs import sandbox as sb
    from ovsproxy.ovs.namespaces import NETNS_PREFIX, create_netns, netns_exists

    name = f"{NETNS_PREFIX}rm-{os.getpid()}"
    create_netns(name)
    workdir, record = tmp_path / "work", tmp_path / "x.json"
    workdir.mkdir()
    (workdir / "f").write_text("x")
    record.write_text("{}")
    sb.remove_owned("sandbox", "x", [name], workdir, record)
    assert not netns_exists(name)
    assert not workdir.exists() and not record.exists()


def test_remove_owned_keeps_the_record_while_a_namespace_is_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A namespace that cannot be deleted (busy): only its record lets a later sweep find it.
    from ovsproxy.ovs import sandbox as sb

    monkeypatch.setattr(sb, "delete_netns", lambda ns: ns != "ovsp-busy")
    workdir, record = tmp_path / "work", tmp_path / "x.json"
    workdir.mkdir()
    record.write_text("{}")
    sb.remove_owned("lab", "x", ["ovsp-gone", "ovsp-busy"], workdir, record)
    assert record.exists() and not workdir.exists()
    assert "lab x: a namespace is still there; its record is kept" in caplog.text


def test_load_records_skips_what_does_not_load(tmp_path: Path) -> None:
    from ovsproxy.ovs import sandbox as sb

    for name, text in (("b", "1"), ("a", "2"), ("c", "bad")):
        (tmp_path / f"{name}.json").write_text(text)
    (tmp_path / "d.txt").write_text("3")

    def load(path: Path) -> int | None:
        return int(path.read_text()) if path.read_text().isdigit() else None

    assert sb.load_records(tmp_path, load) == [2, 1]  # by file name; c does not load
    assert sb.load_records(tmp_path / "missing", load) == []
