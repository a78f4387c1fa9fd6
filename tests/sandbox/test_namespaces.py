"""``ovsp-`` namespaces no live run owns are removed; those a live run uses are kept.

Real namespaces, made the way a killed run leaves them: a child process that recorded and
created one and died (os._exit, no cleanup), and a bare ``ip netns add`` with no record (a run
that crashed between its cleanup steps, or older code). Every sweep here is restricted
(``only=``) to the test's own namespaces: other runs on the machine keep theirs.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from ovsproxy.ovs import namespaces as ns
from ovsproxy.ovs.sandbox import Sandbox, sweep_leftovers

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces)")


@pytest.fixture
def names() -> Iterator[list[str]]:
    """Names for the test's namespaces; whatever is left of them is removed afterwards."""
    made: list[str] = []
    yield made
    for name in made:
        ns.delete_netns(name)


def new_name(names: list[str], tag: str) -> str:
    name = f"ovsp-t{tag}{secrets.token_hex(3)}"
    names.append(name)
    return name


def test_a_killed_runs_recorded_namespace_is_removed_by_the_next_start(names: list[str]) -> None:
    name = new_name(names, "k")
    script = (
        "import os; from ovsproxy.ovs.namespaces import create_netns; "
        f"create_netns({name!r}); os._exit(1)"  # killed: no cleanup at all
    )
    subprocess.run([sys.executable, "-c", script], check=False, timeout=60)
    record = ns.NetnsRecord.load(ns.NetnsRecord.path_of(name))
    assert ns.netns_exists(name) and record is not None and record.is_leftover()
    sweep_leftovers()  # what every sandbox (and lab) start runs
    assert not ns.netns_exists(name)
    assert not ns.NetnsRecord.path_of(name).exists()


def test_an_orphan_with_no_record_and_no_process_is_removed_past_the_grace(
    names: list[str],
) -> None:
    name = new_name(names, "o")
    subprocess.run(["ip", "netns", "add", name], check=True)
    # Young: it may be a live run's that records after creating (older code): kept.
    assert ns.sweep_orphan_netns(only=[name]) == []
    assert ns.netns_exists(name)
    assert ns.sweep_orphan_netns(grace=0, only=[name]) == [name]
    assert not ns.netns_exists(name)


def test_namespaces_in_use_are_kept(names: list[str], sandbox: Sandbox) -> None:
    busy = new_name(names, "b")  # unrecorded, but a process runs in it
    subprocess.run(["ip", "netns", "add", busy], check=True)
    sleeper = subprocess.Popen(["ip", "netns", "exec", busy, "sleep", "60"])
    mine = new_name(names, "m")  # recorded by this live process
    ns.create_netns(mine)
    pod = sandbox.add_pod("p1")  # named by a live sandbox's record
    try:
        candidates = [busy, mine, sandbox.netns, pod.netns]
        assert ns.sweep_orphan_netns(grace=0, only=candidates) == []
        assert all(ns.netns_exists(name) for name in candidates)
    finally:
        sleeper.kill()
        sleeper.wait()
    # Once its last process is gone, the unrecorded one is an orphan; the others are not.
    assert ns.sweep_orphan_netns(grace=0, only=candidates) == [busy]
    assert ns.netns_exists(mine) and ns.netns_exists(sandbox.netns)


def test_only_our_prefix_may_be_recorded() -> None:
    with pytest.raises(ValueError, match="ovsp-"):
        ns.create_netns("someone-elses")


def _link_local(netns: str) -> str:
    return subprocess.run(
        ["ip", "-n", netns, "-6", "addr", "show", "scope", "link"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def _tentative(netns: str) -> str:
    return subprocess.run(
        ["ip", "-n", netns, "-6", "addr", "show", "tentative"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_interfaces_of_our_namespaces_have_no_tentative_ipv6_address(names: list[str]) -> None:
    """IPv6 DAD is off in every namespace we create (``namespaces.DAD_OFF``): an interface's
    link-local is usable the moment its link is up, for one made in the namespace and for one
    moved into it. With DAD on it stays tentative for up to 2 s, and a packet the namespace
    forwards meanwhile waits 1 s for its neighbour (the soak's phase-start losses)."""
    name = new_name(names, "d")
    ns.create_netns(name)
    try:
        other = new_name(names, "o")
        ns.create_netns(other)
        subprocess.run(
            [
                "ip",
                "-n",
                name,
                "link",
                "add",
                "v0",
                "type",
                "veth",
                "peer",
                "name",
                "v1",
                "netns",
                other,
            ],
            check=True,
        )
        for netns, dev in ((name, "v0"), (other, "v1")):
            subprocess.run(["ip", "-n", netns, "link", "set", dev, "up"], check=True)
        for netns in (name, other):
            # once its link-local exists (the check below is about something), none tentative:
            # with DAD on, an address stays tentative for at least a second after it appears
            deadline = time.monotonic() + 5
            while "fe80::" not in _link_local(netns) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert "fe80::" in _link_local(netns), netns
            assert _tentative(netns) == "", (netns, _tentative(netns))
    finally:
        for made in list(names):
            ns.delete_netns(made)
