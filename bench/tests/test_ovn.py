"""The OVN peer's pure parts (``bench.ovn``): the NB transactions built from our cluster, the
OpenFlow counter of the tap, and the OVSDB client against a real NB ovsdb-server (the
transactions must be valid for OVN's own schema)."""

from __future__ import annotations

import shutil
import signal
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench import dp, ovn

CLUSTER = dp.cluster(3, 2)


def test_a_service_is_one_load_balancer_with_its_endpoints_as_backends() -> None:
    port, endpoints = CLUSTER[1]
    row = ovn.lb_row(port, endpoints)
    assert row["name"] == "Service_bench/svc-1_TCP_cluster"
    assert row["protocol"] == "tcp"
    assert row["vips"] == ["map", [["172.16.0.2:80", "10.0.1.2:8080,10.0.1.3:8080"]]]
    assert dict(row["options"][1]) == ovn.LB_OPTIONS


def test_a_load_is_inserts_added_to_the_group_and_bumps_nb_cfg_only_when_asked() -> None:
    ops = ovn.load_ops(CLUSTER[1:], 1, bump=False)
    inserts = [op for op in ops if op["op"] == "insert"]
    assert [op["uuid-name"] for op in inserts] == ["lb1", "lb2"]
    (group,) = [op for op in ops if op["table"] == "Load_Balancer_Group"]
    assert group["mutations"] == [
        ["load_balancer", "insert", ["set", [["named-uuid", "lb1"], ["named-uuid", "lb2"]]]]
    ]
    assert not [op for op in ops if op["table"] == "NB_Global"]
    assert ovn.load_ops(CLUSTER, 0, bump=True)[-1] == ovn.bump_nb_cfg()


def _message(kind: int, body: bytes) -> bytes:
    return struct.pack("!BBHI", 6, kind, 8 + len(body), 7) + body


def _bundle_add(inner: bytes) -> bytes:
    return _message(ovn.OFPT_BUNDLE_ADD_MESSAGE, struct.pack("!IHH", 1, 0, 0) + inner)


messages = st.lists(
    st.tuples(st.sampled_from([14, 15, 20, 33]), st.binary(max_size=40), st.booleans()),
    max_size=12,
)


@given(messages, st.lists(st.integers(min_value=1, max_value=64), max_size=20))
def test_the_tap_counts_each_message_by_type_however_the_stream_is_cut(
    sent: list[tuple[int, bytes, bool]], cuts: list[int]
) -> None:
    stream = b""
    expected: dict[str, list[int]] = {}

    def count(name: str, size: int) -> None:
        row = expected.setdefault(name, [0, 0])
        row[0] += 1
        row[1] += size

    for kind, body, bundled in sent:
        data = _message(kind, body)
        if bundled:
            data_in = data
            data = _bundle_add(data_in)
            count("bundled " + ovn.OF_TYPES[kind], len(data_in))
            count("BUNDLE_ADD_MESSAGE", len(data))
        else:
            count(ovn.OF_TYPES[kind], len(data))
        stream += data
    counter = ovn.OpenFlowCount()
    offset = 0
    for cut in cuts:  # the stream as the socket may deliver it: in pieces anywhere
        counter.feed(stream[offset : offset + cut])
        offset += cut
    counter.feed(stream[offset:])
    assert counter.snapshot() == {k: (v[0], v[1]) for k, v in expected.items()}


def test_a_length_below_the_header_is_an_error() -> None:
    with pytest.raises(ValueError, match="length 4"):
        ovn.OpenFlowCount().feed(struct.pack("!BBHI", 6, 14, 4, 0))


def test_the_delta_names_only_the_types_that_moved() -> None:
    before = {"FLOW_MOD": (3, 300), "ECHO_REQUEST": (1, 8)}
    after = {"FLOW_MOD": (5, 520), "ECHO_REQUEST": (1, 8), "GROUP_MOD": (1, 96)}
    assert ovn.count_delta(before, after) == {"FLOW_MOD": (2, 220), "GROUP_MOD": (1, 96)}


@pytest.fixture
def nb_server(tmp_path: Path) -> Iterator[Path]:
    if shutil.which("ovsdb-server") is None or not ovn.NB_SCHEMA.exists():
        pytest.skip("needs ovsdb-server and OVN's NB schema (scripts/setup.sh installs them)")
    db, sock = tmp_path / "nb.db", tmp_path / "nb.sock"
    subprocess.run(["ovsdb-tool", "create", str(db), str(ovn.NB_SCHEMA)], check=True)
    server = subprocess.Popen(
        [
            "ovsdb-server",
            str(db),
            f"--remote=punix:{sock}",
            f"--unixctl={tmp_path / 'nb.ctl'}",
            "--no-chdir",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.1)  # bound before it listens
        yield sock
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(10)


def test_the_transactions_are_valid_for_ovns_schema_and_the_monitor_follows(
    nb_server: Path,
) -> None:
    rpc = ovn.Rpc(str(nb_server), "OVN_Northbound")
    try:
        rpc.transact([{"op": "insert", "table": "NB_Global", "row": {}}])
        rpc.transact(ovn.topology_ops([("client", "0a:58:00:00:00:02", ["10.244.0.2"])]))
        rpc.monitor({"NB_Global": ["nb_cfg"], "Load_Balancer": ["name", "vips"]})
        rpc.transact(ovn.load_ops(CLUSTER, 0, bump=True))
        ovn.wait_for([rpc], lambda: rpc.column("NB_Global", "nb_cfg") == [1], "nb_cfg 1", 10)
        assert sorted(rpc.column("Load_Balancer", "name")) == sorted(
            ovn.lb_name(port) for port, _ in CLUSTER
        )
        port, endpoints = CLUSTER[0]
        rpc.transact(ovn.set_backends_ops(port, endpoints[:1]))
        ovn.wait_for([rpc], lambda: rpc.column("NB_Global", "nb_cfg") == [2], "nb_cfg 2", 10)
        (changed,) = [
            row["vips"]
            for row in rpc.tables["Load_Balancer"].values()
            if row["name"] == ovn.lb_name(port)
        ]
        assert changed == ["map", [["172.16.0.1:80", "10.0.1.0:8080"]]]
        rpc.transact(ovn.clear_ops())
        ovn.wait_for([rpc], lambda: not rpc.column("Load_Balancer", "name"), "no LB", 10)
        with pytest.raises(ovn.RpcError, match="Load_Balancer"):
            rpc.transact([{"op": "insert", "table": "Load_Balancer", "row": {"vips": 1}}])
    finally:
        rpc.close()


def test_the_ovn_sandbox_records_its_daemons_and_stops_them_all() -> None:
    """OVN's daemons are in the sandbox's record (a crashed run's are swept by the next
    sandbox start) and gone after ``down()``, the tap's socket with the run directory."""
    if shutil.which("ovn-northd") is None or shutil.which("ovn-controller") is None:
        pytest.skip("needs ovn-central and ovn-host (scripts/setup.sh installs them)")
    sb = ovn.OvnSandbox()
    with sb:
        assert sb.record is not None
        pids = dict(sb.record.pids)
        rundir = sb.rundir
        assert set(ovn.OVN_DAEMONS) <= set(pids)
        for key in ovn.OVN_DAEMONS:
            assert _runs(pids[key], rundir), key
        assert (rundir / "tap" / f"{sb.bridge}.mgmt").exists()
    for key, pid in pids.items():
        assert not _runs(pid, rundir), f"{key} (pid {pid}) still runs"
    assert not rundir.exists()


def _runs(pid: int, rundir: Path) -> bool:
    """pid runs one of this sandbox's daemons (a recycled pid would not name its rundir).

    A daemon just spawned may still be going through its exec chain (``ip netns exec`` ->
    ``env`` -> the daemon): while the kernel swaps its image, ``/proc/PID/cmdline`` reads
    empty (seen: the check failed 1 run in 3 right after the start). Empty means "exec in
    progress": read again, briefly."""
    deadline = time.monotonic() + 2
    while True:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return False
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode()
        except FileNotFoundError:
            return False
        if cmdline or time.monotonic() > deadline:
            return str(rundir) in cmdline
        time.sleep(0.01)
