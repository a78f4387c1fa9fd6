"""A UDP client sending every millisecond on one socket never reaches an endpoint again once
its removal has settled (issue 13).

The race this guards: the agent flushes the (frontend, endpoint) conntrack entries right after
the commit, but Open vSwitch applies the group change to its cached datapath flows only when
its revalidators get to them; a datagram in between meets the cached "new connection" flow,
which still DNATs to the removed endpoint, and recreates the entry. Sending every millisecond
puts datagrams into that window every time."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest

from ovsproxy.model import Protocol
from tests.semantics.harness import World, endpoint

pytestmark = [pytest.mark.ovs, pytest.mark.shared_sandbox]

ROUNDS = 12
SOCKETS = 4  # each its own connection, each sending every INTERVAL
INTERVAL = 0.001
# Answers to datagrams sent before the second flush may still arrive (the pod's server works
# through its socket buffer): the window starts this much after the removal settled.
IN_FLIGHT = 0.1

# SOCKETS connected sockets, each sending every INTERVAL until stdin closes; every answer with
# the CLOCK_MONOTONIC time it arrived (the test's clock too, across namespaces).
_CLIENT = """
import json, select, socket, sys, time
host, port, n, interval = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
family = socket.AF_INET6 if ":" in host else socket.AF_INET
socks = []
for _ in range(n):
    s = socket.socket(family, socket.SOCK_DGRAM)
    s.connect((host, port))
    s.setblocking(False)
    socks.append(s)
answers, sent, errors = [], 0, 0
next_send = time.monotonic()
running = True
while running:
    if time.monotonic() >= next_send:
        for s in socks:
            try:
                s.send(b"ping")
            except OSError:
                errors += 1
            sent += 1
        next_send += interval
    ready, _, _ = select.select([sys.stdin, *socks], [], [], max(0.0, next_send - time.monotonic()))
    for s in ready:
        if s is sys.stdin:
            running = False
            continue
        try:
            answers.append((time.monotonic(), s.recv(64).decode().split(":")[0]))
        except OSError:
            errors += 1
print(json.dumps({"sent": sent, "errors": errors, "answers": answers}))
"""


def _start_client(netns: str, host: str) -> subprocess.Popen[str]:
    args = [host, "53", str(SOCKETS), str(INTERVAL)]
    cmd = ["ip", "netns", "exec", netns, sys.executable, "-c", _CLIENT, *args]
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


async def _endpoints_in_use(world: World, frontend: str) -> set[str]:
    """The pods the conntrack entries toward ``frontend`` are DNATed to."""
    by_ip = {str(p.ipv4.ip): p.name for p in world.sandbox.pods.values()}  # type: ignore[union-attr]
    for _ in range(100):
        dump = await asyncio.to_thread(world.sandbox.appctl, "dpctl/dump-conntrack")
        used = {
            by_ip[line.split("reply=(src=")[1].split(",")[0]]
            for line in dump.splitlines()
            if line.startswith("udp,") and f"dst={frontend}," in line
        }
        if used:
            return used
        await asyncio.sleep(0.02)
    raise AssertionError(f"no conntrack entry toward {frontend}")


@pytest.mark.parametrize("revalidation", ["appctl", pytest.param("timed", marks=pytest.mark.slow)])
async def test_a_removed_udp_endpoint_stays_removed_at_a_1ms_send_interval(
    world: World, revalidation: str
) -> None:
    """Each round removes the endpoint the client's sockets use and waits for the removal to
    settle; from then until the endpoint is added back, it must answer nothing and no
    conntrack entry may lead to it. Without the second flush, about one round in three
    fails (with one flush per removal: 3-5 of 12 rounds here). "timed": the second flush
    without ovs-appctl (a switch over tcp:), after REVALIDATION_GRACE."""
    world.semantics.conntrack.stats.revalidation = revalidation
    client = world.pod("client")
    pods = {name: world.pod(name, udp_ports=(5353,)) for name in ("a", "b")}
    frontend = "10.96.0.60"
    world.service("dns", [frontend], 53, protocol=Protocol.UDP)
    both = [endpoint(p, 5353) for p in pods.values()]
    world.endpoints("dns", both, Protocol.UDP)
    await world.sync()

    proc = await asyncio.to_thread(_start_client, client.netns, frontend)
    windows: list[tuple[str, float, float]] = []  # (removed, settled at, added back at)
    entries: list[tuple[int, str]] = []  # rounds with an entry to the removed endpoint
    try:
        used = await _endpoints_in_use(world, frontend)
        for _ in range(ROUNDS):
            # Remove an endpoint in use (after the first round: the only one in use).
            removed = sorted(used)[0]
            world.endpoints(
                "dns", [endpoint(p, 5353) for n, p in pods.items() if n != removed], Protocol.UDP
            )
            await world.sync()
            await world.semantics.conntrack.settled()
            settled = time.monotonic()
            await asyncio.sleep(0.4)
            windows.append((removed, settled, time.monotonic()))
            if removed in await _endpoints_in_use(world, frontend):
                entries.append((len(windows) - 1, removed))
            world.endpoints("dns", both, Protocol.UDP)  # back: the sockets stay where they are
            await world.sync()
            used = set(pods) - {removed}
        out, _ = await asyncio.to_thread(proc.communicate, "", 60)  # closes stdin: stop
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    result = json.loads(out)
    answers = result["answers"]
    assert result["errors"] == 0, {k: v for k, v in result.items() if k != "answers"}
    late = []
    for i, (removed, start, end) in enumerate(windows):
        window = [name for t, name in answers if start + IN_FLIGHT < t < end]
        assert len(window) > 100, (i, len(window))  # the client kept talking, to the other
        if removed in window:
            late.append((i, removed, window.count(removed), len(window)))
    stats = world.semantics.conntrack.stats
    assert not late and not entries, (late, entries, stats.as_dict())
    # One second flush a round; none for the new frontend's untranslated entries: its commit
    # was the first onto a switch without our flows (conntrack: nothing to flush again).
    assert stats.settle_flushes == ROUNDS and stats.revalidation == revalidation, stats
