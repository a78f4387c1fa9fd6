"""The machine's ``ovsp-`` network namespaces: recorded before they are created, and removed
when no live run owns them.

Every part of ovsproxy (and of its tests and benchmarks) that creates an ``ovsp-`` namespace
names it in a JSON record under ``/run/ovsproxy/<kind>/`` first: a sandbox in its sandbox
record, a lab in its lab record, anything else through ``create_netns`` here (a record of the
namespace and its owner process, ``/run/ovsproxy/netns/<name>.json``). So a run killed at any
point leaves either a record, which the next start's sweep acts on, or nothing.

``sweep_orphan_netns`` (run by every sandbox and lab start) removes

* the namespaces of ``create_netns`` records whose owner process is gone (a recycled pid is
  told apart by its start time), with their records;
* an ``ovsp-`` namespace named by no record at all that has no process in it and is older than
  a grace period (a namespace left by a run that crashed between its own cleanup steps, or by
  older code that did not record): one that a live run uses has a record, a process, or is
  younger than the grace, and is kept.

A namespace named by a sandbox or lab record is never touched here: that record's own sweep
decides when it is a leftover.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

log = logging.getLogger(__name__)

NETNS_PREFIX = "ovsp-"
NETNS_DIR = Path("/run/netns")
R = TypeVar("R")
RUN_DIR = Path(os.environ.get("OVSPROXY_RUN_DIR", "/run/ovsproxy"))
NETNS_REGISTRY = RUN_DIR / "netns"
# An unrecorded namespace younger than this may be a live run's that records after creating
# (older code): kept.
ORPHAN_GRACE = 600.0


def netns_exists(name: str) -> bool:
    return (NETNS_DIR / name).exists()


def save_record(path: Path, record: Any) -> None:
    """Write a registry record (a dataclass) as JSON, atomically: a reader (another run's
    sweep) never sees half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(record), indent=2))
    tmp.replace(path)


def load_record(cls: type[R], path: Path) -> R | None:
    """A registry record as ``save_record`` wrote it, or None when it is gone or unreadable."""
    try:
        return cls(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def start_time(pid: int) -> int | None:
    """When a process started (clock ticks since boot), or None when it does not exist."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def netns_pids(name: str) -> list[int]:
    """The processes in a namespace (``ip netns pids``)."""
    out = subprocess.run(
        ["ip", "netns", "pids", name], capture_output=True, text=True, timeout=30
    ).stdout
    return [int(pid) for pid in out.split() if pid.isdigit()]


def _stop(pids: list[int], timeout: float) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)  # reap if it is our child
            pids = [pid for pid in pids if start_time(pid) is not None]
            if not pids:
                return
            time.sleep(0.02)


def delete_netns(name: str) -> bool:
    """Stop what runs inside (SIGTERM, then SIGKILL), delete the namespace and its
    ``create_netns`` record. True when it is gone."""
    if netns_exists(name):
        # Anything still running inside would keep the namespace's devices alive.
        _stop(netns_pids(name), timeout=2)
        result = subprocess.run(
            ["ip", "netns", "del", name], capture_output=True, text=True, timeout=30
        )
        if netns_exists(name):
            log.warning("could not delete network namespace %s: %s", name, result.stderr.strip())
            return False
    with contextlib.suppress(FileNotFoundError):
        NetnsRecord.path_of(name).unlink()
    return True


@dataclass
class NetnsRecord:
    """A namespace created by ``create_netns``, and the process that owns it."""

    name: str
    owner_pid: int
    owner_started: int | None
    created: float = field(default_factory=time.time)

    @staticmethod
    def path_of(name: str) -> Path:
        return NETNS_REGISTRY / f"{name}.json"

    def save(self) -> None:
        save_record(self.path_of(self.name), self)

    @classmethod
    def load(cls, path: Path) -> NetnsRecord | None:
        return load_record(cls, path)

    def is_leftover(self) -> bool:
        return start_time(self.owner_pid) != self.owner_started


def record_netns(name: str) -> None:
    """Record a namespace as this process's, before it (or a command it runs) creates it."""
    if not name.startswith(NETNS_PREFIX) or "/" in name:
        raise ValueError(f"network namespace {name!r}: ours start with {NETNS_PREFIX!r}")
    me = os.getpid()
    NetnsRecord(name, me, start_time(me)).save()


# Every namespace we create has IPv6 duplicate address detection off, for the interfaces
# made in it or moved into it afterwards (``default``; ``all`` because the kernel skips DAD
# only when both are off). With DAD, an interface's link-local address stays tentative for
# up to 2 s after the link comes up, and until then the kernel sends no neighbour
# solicitation for a packet it forwards (the solicitation's source must be that link-local):
# the packet waits for the next try, 1 s later. A lab starts its traffic within those 2 s
# of creating its nodes, so the first forwarded IPv6 packets between nodes waited 1 s (bench
# soak, quiet phase: connects of 1.0 s and UDP replies after the client's timeout, at the
# phase's start only; ``ip monitor neigh`` showed the neighbour resolved 1.0 s after the
# first send). A real node's interfaces are up long before its pods' traffic; its pods' are
# set up by their CNI, which turns DAD off as well.
DAD_OFF = (
    "net.ipv6.conf.all.accept_dad=0",
    "net.ipv6.conf.default.accept_dad=0",
)


def add_netns(name: str) -> None:
    """``ip netns add`` (the caller has recorded the name), loopback up, IPv6 DAD off for
    every interface that will be in it (``DAD_OFF``)."""
    steps = (
        ["ip", "netns", "add", name],
        ["ip", "-n", name, "link", "set", "lo", "up"],
        ["ip", "netns", "exec", name, "sysctl", "-qw", *DAD_OFF],
    )
    for cmd in steps:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {result.stderr.strip()}")


def create_netns(name: str) -> None:
    """Record the namespace (owned by this process), then create it (``add_netns``)."""
    record_netns(name)
    try:
        add_netns(name)
    except RuntimeError:
        if not netns_exists(name):
            with contextlib.suppress(FileNotFoundError):
                NetnsRecord.path_of(name).unlink()
        raise


def _named_in(value: Any) -> Iterator[str]:
    """Every namespace name in a record's JSON, wherever the record keeps it."""
    if isinstance(value, str):
        if value.startswith(NETNS_PREFIX):
            yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _named_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from _named_in(item)


def claimed_netns(record_dirs: Iterable[Path] = ()) -> set[str]:
    """Namespaces named by any record: under ``RUN_DIR``'s registries and ``record_dirs``."""
    dirs = {*RUN_DIR.glob("*/"), *record_dirs}
    claimed: set[str] = set()
    for directory in dirs:
        for path in directory.glob("*.json"):
            with contextlib.suppress(OSError, ValueError):
                claimed.update(_named_in(json.loads(path.read_text())))
    return claimed


def _age(name: str, now: float) -> float:
    try:
        # A namespace's nsfs inode carries its creation time.
        return now - (NETNS_DIR / name).stat().st_mtime
    except OSError:
        return 0.0


def sweep_orphan_netns(
    *,
    grace: float = ORPHAN_GRACE,
    record_dirs: Iterable[Path] = (),
    only: Iterable[str] | None = None,
) -> list[str]:
    """Remove namespaces no live run owns (see the module docstring); returns their names.
    ``only``: consider just these namespaces (tests, beside other runs)."""
    wanted = set(only) if only is not None else None
    removed: list[str] = []
    if NETNS_REGISTRY.is_dir():
        for path in sorted(NETNS_REGISTRY.glob("*.json")):
            record = NetnsRecord.load(path)
            if record is None or (wanted is not None and record.name not in wanted):
                continue
            if record.is_leftover():
                log.warning(
                    "removing leftover network namespace %s (from pid %d)",
                    record.name,
                    record.owner_pid,
                )
                if delete_netns(record.name):
                    removed.append(record.name)
    if not NETNS_DIR.is_dir():
        return removed
    claimed = claimed_netns(record_dirs)
    now = time.time()
    for entry in sorted(NETNS_DIR.iterdir()):
        name = entry.name
        if not name.startswith(NETNS_PREFIX) or name in claimed:
            continue
        if wanted is not None and name not in wanted:
            continue
        if _age(name, now) < grace or netns_pids(name):
            continue
        log.warning("removing orphan network namespace %s (no record, no process)", name)
        if delete_netns(name):
            removed.append(name)
    return removed
