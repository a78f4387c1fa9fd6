"""NodePort steering: adding one Service to a table that already holds many.

Real nftables in a private network namespace (needs root). For each size (1,000 and 10,000
Services; ``--quick``: 100 and 1,000), in the same run:

1. ``first_sync``: the tracker fed every Service, then one full rebuild transaction of the
   ``inet ovsproxy`` table (time, JSON bytes, elements).
2. ``add_one``: one more NodePort Service, from ``SteeringTracker.update`` to libnftables'
   return (the kernel has committed): median time (``add_one_transaction_ms``: the part on
   the nft worker thread, without the hand-off from the event loop), and the transaction's
   size in JSON bytes and elements (each Service is dual-stack: one element per family); then
   the Service is removed again (``remove_one``), so every round starts from the same table.
   The two sizes' tables exist side by side and their rounds alternate.
3. ``recompute_add_one``: the same add through the from-scratch path (``desired_state`` over
   every Service, then ``SteeringTable.sync`` diffing it against what is installed), for
   contrast: that path's CPU work grows with the table, the transaction does not.

Figures compare the sizes: ``add_one_time_ratio`` and ``add_one_bytes_ratio`` (the larger size
over the smaller; flat means ~1). Every tenth Service is a LoadBalancer with two ingress IPs,
an external IP and source ranges, so the firewall sets are populated too. NodePorts are drawn
from 20000 upwards (10,000 do not fit the API server's default 30000-32767 range; the table
does not care).
"""

from __future__ import annotations

import asyncio
import ipaddress
import statistics
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from ovsproxy.model import (
    IPAddress,
    Protocol,
    ServicePort,
    ServicePortName,
    ServiceType,
)
from ovsproxy.ovs.namespaces import create_netns, delete_netns
from ovsproxy.steering import NodePortAddresses, SteeringTable, SteeringTracker
from ovsproxy.steering.desired import desired_state

NAME = "nodeport"
DESCRIPTION = "NodePort steering: time and nft transaction size to add one Service, 1k vs 10k"

NODE_IPS: list[IPAddress] = [
    ipaddress.ip_address("192.168.50.1"),
    ipaddress.ip_address("fd50::1"),
]
ROUNDS = 31
WARMUP = 3
RECOMPUTE_ROUNDS = 5


def service(n: int) -> ServicePort:
    lb = n % 10 == 0
    return ServicePort(
        name=ServicePortName("bench", f"svc-{n}", "", Protocol.TCP),
        cluster_ips=(
            ipaddress.IPv4Address(int(ipaddress.IPv4Address("10.96.0.0")) + n),
            ipaddress.IPv6Address(int(ipaddress.IPv6Address("fd00:10:96::")) + n),
        ),
        port=80,
        type=ServiceType.LOAD_BALANCER if lb else ServiceType.NODE_PORT,
        node_port=20000 + n,
        external_ips=(ipaddress.IPv4Address(int(ipaddress.IPv4Address("192.0.2.0")) + n),)
        if lb
        else (),
        load_balancer_ips=(
            ipaddress.IPv4Address(int(ipaddress.IPv4Address("203.0.0.0")) + n),
            ipaddress.IPv6Address(int(ipaddress.IPv6Address("2001:db8::")) + n),
        )
        if lb
        else (),
        load_balancer_source_ranges=(
            ipaddress.ip_network("198.51.100.0/24"),
            ipaddress.ip_network("2001:db8:ff::/48"),
        )
        if lb
        else (),
    )


def commit() -> str:
    root = Path(__file__).resolve().parents[2]
    try:
        rev = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "unknown"
    return f"{rev}{'-dirty' if dirty else ''}" if rev else "unknown"


class _Setup:
    """One size: its namespace, tracker and table, filled by one first sync."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.netns = f"ovsp-bench-np-{n}-{uuid.uuid4().hex[:8]}"
        create_netns(self.netns)  # recorded first: a killed run's namespace is swept
        self.addresses = NodePortAddresses()
        self.ports = [service(i) for i in range(1, n + 1)]
        self.tracker = SteeringTracker(NODE_IPS, self.addresses)
        self.table = SteeringTable(self.netns)
        self.figures: dict[str, Any] = {}
        self.add_s: list[float] = []
        self.add_tx_s: list[float] = []
        self.remove_s: list[float] = []
        self.add_bytes: list[int] = []
        self.add_elements: list[int] = []
        self.kinds: set[str] = set()
        self.recompute_s: list[float] = []

    async def first_sync(self) -> None:
        started = time.perf_counter()
        for port in self.ports:
            self.tracker.update(port)
        first = await self.table.sync_changes(self.tracker.take_changes(), self.tracker.state)
        self.figures.update(
            table_elements=first.elements,
            first_sync_s=round(time.perf_counter() - started, 4),
            first_sync_transaction_s=round(first.seconds, 4),
            first_sync_bytes=first.bytes,
        )

    async def add_and_remove_one(self, r: int, counted: bool) -> None:
        extra = service(self.n + 1 + r * 2)  # odd: a NodePort Service, never an LB one
        started = time.perf_counter()
        self.tracker.update(extra)
        added = await self.table.sync_changes(self.tracker.take_changes(), self.tracker.state)
        add_s = time.perf_counter() - started
        started = time.perf_counter()
        self.tracker.update(None, name=extra.name)
        removed = await self.table.sync_changes(self.tracker.take_changes(), self.tracker.state)
        remove_s = time.perf_counter() - started
        if counted:
            self.add_s.append(add_s)
            self.add_tx_s.append(added.seconds)
            self.remove_s.append(remove_s)
            self.add_bytes.append(added.bytes)
            self.add_elements.append(added.elements)
            self.kinds.update((added.kind, removed.kind))

    async def recompute_one(self, r: int) -> None:
        extra = service(self.n + 1 + r * 2)
        started = time.perf_counter()
        await self.table.sync(desired_state([*self.ports, extra], NODE_IPS, self.addresses))
        self.recompute_s.append(time.perf_counter() - started)
        await self.table.sync(desired_state(self.ports, NODE_IPS, self.addresses))

    async def finish(self) -> dict[str, Any]:
        verified = await self.table.verify()
        ms = 1e3
        self.figures.update(
            add_one_ms=round(statistics.median(self.add_s) * ms, 3),
            add_one_transaction_ms=round(statistics.median(self.add_tx_s) * ms, 3),
            add_one_bytes=int(statistics.median(self.add_bytes)),
            add_one_elements=int(statistics.median(self.add_elements)),
            remove_one_ms=round(statistics.median(self.remove_s) * ms, 3),
            round_kinds=sorted(self.kinds),  # ["patch"]: every round was one patch
            recompute_add_one_ms=round(statistics.median(self.recompute_s) * ms, 3),
            verified=verified,
        )
        return self.figures

    async def close(self) -> None:
        try:
            await self.table.cleanup()
            await self.table.close()
        finally:
            await asyncio.to_thread(delete_netns, self.netns)


async def _measure(sizes: tuple[int, int]) -> dict[int, dict[str, Any]]:
    setups: list[_Setup] = []
    try:
        for n in sizes:
            setups.append(_Setup(n))
            await setups[-1].first_sync()
        # Alternate the sizes round by round, so drift on a shared machine hits both alike.
        for r in range(-WARMUP, ROUNDS):
            for setup in setups:
                await setup.add_and_remove_one(r + WARMUP, counted=r >= 0)
        for r in range(RECOMPUTE_ROUNDS):
            for setup in setups:
                await setup.recompute_one(r)
        return {setup.n: await setup.finish() for setup in setups}
    finally:
        for setup in setups:
            await setup.close()


def run(quick: bool = False) -> dict[str, Any]:
    small, large = (100, 1_000) if quick else (1_000, 10_000)
    results = asyncio.run(_measure((small, large)))
    a, b = results[small], results[large]
    flat = {
        f"{size}_{k}": v for size, r in results.items() for k, v in r.items() if k != "services"
    }
    return {
        "commit": commit(),
        "sizes": [small, large],
        **flat,
        "add_one_time_ratio": round(b["add_one_ms"] / a["add_one_ms"], 3),
        "add_one_transaction_ratio": round(
            b["add_one_transaction_ms"] / a["add_one_transaction_ms"], 3
        ),
        "add_one_bytes_ratio": round(b["add_one_bytes"] / a["add_one_bytes"], 3),
        "add_one_elements": [a["add_one_elements"], b["add_one_elements"]],
        "recompute_time_ratio": round(b["recompute_add_one_ms"] / a["recompute_add_one_ms"], 3),
    }
