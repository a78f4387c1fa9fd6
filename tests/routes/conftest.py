"""Fixtures for route tests: a private network namespace with a veth "gateway", and helpers
that read the kernel's table with iproute2 (an oracle independent of pyroute2).

Routes only ever change inside the namespace the test creates; the root namespace's table is
never touched. The namespace (and with it every device and route) is deleted after each test,
even a failing one, and namespaces left behind by a killed test run are swept at start.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ovsproxy.model import IPFamily, IPNetwork
from ovsproxy.ovs.namespaces import create_netns, delete_netns

PREFIX = "ovsp-rt-"
GATEWAY = "gw0"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _sweep_leftovers() -> None:
    """Delete namespaces of earlier runs whose pytest process is gone."""
    run_dir = Path("/run/netns")
    if not run_dir.exists():
        return
    for entry in run_dir.iterdir():
        if not entry.name.startswith(PREFIX):
            continue
        try:
            pid = int(entry.name[len(PREFIX) :].split("-")[0])
        except ValueError:
            continue
        if pid != os.getpid() and not Path(f"/proc/{pid}").exists():
            _ip("netns", "del", entry.name, check=False)


@dataclass(frozen=True)
class Netns:
    name: str
    gateway: str = GATEWAY

    def ip(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return _ip("-n", self.name, *args, check=check)

    def routes(self, family: IPFamily | None = None, dev: str | None = GATEWAY) -> list[dict]:
        """``ip -j route show table main [dev gw0]`` for one or both families."""
        found: list[dict] = []
        for fam in [family] if family else [IPFamily.IPv4, IPFamily.IPv6]:
            args = ["-j", f"-{fam.value}", "route", "show", "table", "main"]
            if dev:
                args += ["dev", dev]
            out = self.ip(*args).stdout.strip()
            for r in json.loads(out or "[]"):
                r.setdefault("dev", dev)
                found.append(r)
        return found

    def service_routes(self, family: IPFamily | None = None) -> set[IPNetwork]:
        """Our Service routes: proto 155 and a gateway (excludes the next hop's host route)."""
        return {
            ipaddress.ip_network(r["dst"], strict=False)
            for r in self.routes(family)
            if r.get("protocol") == "155" and r.get("gateway")
        }

    def all_route_keys(self) -> set[tuple[str, str, str, str]]:
        """Every route of the namespace (any device) as (dst, gateway, dev, protocol)."""
        return {
            (r["dst"], r.get("gateway", ""), r.get("dev", ""), str(r.get("protocol", "")))
            for r in self.routes(dev=None)
        }

    def add_route(self, spec: str, family: IPFamily = IPFamily.IPv4) -> None:
        self.ip(f"-{family.value}", "route", "add", *spec.split())

    def neighbours(self) -> list[dict]:
        return json.loads(self.ip("-j", "neigh", "show", "dev", self.gateway).stdout or "[]")


@pytest.fixture(scope="session", autouse=True)
def _sweep() -> None:
    if os.geteuid() == 0:
        _sweep_leftovers()


@pytest.fixture
def netns() -> Iterator[Netns]:
    if os.geteuid() != 0:
        pytest.skip("needs root to create a network namespace")
    name = f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    create_netns(name)  # recorded first: a killed run's namespace is swept
    try:
        ns = Netns(name)
        # veth, because this kernel has no dummy module; the peer stays in the namespace.
        ns.ip("link", "add", GATEWAY, "type", "veth", "peer", "name", f"{GATEWAY}p")
        for dev in ("lo", GATEWAY, f"{GATEWAY}p"):
            ns.ip("link", "set", dev, "up")
        yield ns
    finally:
        delete_netns(name)
