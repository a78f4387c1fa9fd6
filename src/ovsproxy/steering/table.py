"""The one owner of the node's ``inet ovsproxy`` nftables table: sync, verify, cleanup.

Binding: libnftables' JSON API through Debian's ``python3-nftables`` module (a thin ctypes
wrapper over ``libnftables.so.1``, maintained with nftables itself). Why not ``nft -j -f -``:
the library runs a whole JSON batch as one netlink transaction in-process (no fork+exec per
sync, no parsing of a second process's output), returns the kernel's error text for the
batch, and reads the table back as JSON through the same call. The module is pure Python over
ctypes, so it works with any CPython; the Debian package installs it for the system Python
only, so when ``import nftables`` fails (our virtualenv does not see dist-packages) it is
loaded from the Debian path by file location. ``scripts/setup.sh`` installs ``nftables`` and
``python3-nftables``.

Ownership: every command names ``inet ovsproxy``; nothing else in the ruleset is read or
written. Every sync is one transaction (one libnftables batch, atomic in the kernel):

* first sync, or after a failed one: a full rebuild (``add``+``delete``+recreate the table
  with every element), so whatever state the table was left in is replaced at once;
* afterwards: only the element adds and deletes between the installed and the desired
  state (``sync``: diffed here; ``sync_changes``: a ``SteeringTracker``'s pending change, so
  the work is proportional to the change). A patch the kernel rejects (someone deleted our
  table or an element: drift) is answered by a full rebuild in the same sync. ``verify``
  reads the table back and compares (the periodic resync's check; additions by others are
  found there). ``listing`` reads the whole table back for ``ovsproxy verify``
  (``steering.compare``).

Network namespaces: a netlink socket belongs to the namespace of the thread that opens it,
so all library calls run on one worker thread that first joins ``netns`` (``setns``), which
also keeps blocking calls off the event loop.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ovsproxy.model import IPFamily
from ovsproxy.netns import enter_netns
from ovsproxy.steering import render
from ovsproxy.steering.desired import (
    Element,
    SetKey,
    SteeringDiff,
    SteeringSet,
    SteeringState,
    diff,
)

DEBIAN_MODULE = Path("/usr/lib/python3/dist-packages/nftables/__init__.py")


class NftablesError(RuntimeError):
    """libnftables rejected a transaction; ``message`` is its error text."""

    def __init__(self, what: str, message: str, commands: int) -> None:
        self.what = what
        self.message = message.strip()
        self.commands = commands
        super().__init__(f"nftables {what} ({commands} commands) failed: {self.message}")


def load_binding() -> Any:
    """The ``nftables`` module (python3-nftables), importable or from the Debian path."""
    try:
        import nftables

        return nftables
    except ImportError:
        pass
    if not DEBIAN_MODULE.exists():
        raise RuntimeError(
            "libnftables' Python binding is missing: apt-get install nftables python3-nftables"
        )
    spec = importlib.util.spec_from_file_location(
        "nftables", DEBIAN_MODULE, submodule_search_locations=[str(DEBIAN_MODULE.parent)]
    )
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {DEBIAN_MODULE}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["nftables"] = module
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True, slots=True)
class SyncResult:
    """What one sync sent: ``kind`` is "rebuild", "patch" or "none"."""

    kind: str
    elements: int  # elements added + deleted (rebuild: elements written)
    commands: int
    bytes: int  # size of the JSON transaction handed to libnftables
    seconds: float
    error: str | None = None  # a rejected patch that led to this rebuild


class SteeringTable:
    """Makes the node's ``inet ovsproxy`` table hold a ``SteeringState``; nothing else."""

    def __init__(self, netns: str | None = None) -> None:
        self.netns = netns
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nft")
        self._nft: Any = None
        self._joined = False  # the worker thread is inside netns
        # What the kernel holds (mutable, so a patch costs its own size); None: unknown,
        # the next sync rebuilds.
        self._installed: dict[SetKey, set[Element]] | None = None
        self.last: SyncResult | None = None

    # -- the worker thread ------------------------------------------------------------------

    def _context(self) -> Any:
        """The libnftables context, created on the worker thread inside ``netns`` (once: a
        failure, such as a missing namespace, is raised to the caller and retried next time)."""
        if self._nft is None:
            if self.netns and not self._joined:
                enter_netns(self.netns)
                self._joined = True
            nft = load_binding().Nftables()
            nft.set_json_output(True)
            nft.set_handle_output(False)
            self._nft = nft
        return self._nft

    def _run(self, what: str, commands: list[dict[str, Any]]) -> tuple[int, Any]:
        payload = json.dumps({"nftables": commands}, separators=(",", ":"))
        rc, output, error = self._context().cmd(payload)
        if rc != 0:
            raise NftablesError(what, error or "(no message)", len(commands))
        return len(payload), output

    def _installed_state(self) -> SteeringState:
        assert self._installed is not None
        return SteeringState({k: frozenset(v) for k, v in self._installed.items()})

    def _rebuild(self, desired: SteeringState, started: float, rejected: str | None) -> SyncResult:
        commands = render.full_rebuild(desired)
        self._installed = None
        size, _ = self._run("rebuild", commands)
        self._installed = {k: set(v) for k, v in desired.sets.items()}
        elapsed = time.perf_counter() - started
        return SyncResult("rebuild", desired.size, len(commands), size, elapsed, rejected)

    def _patch(self, change: SteeringDiff, started: float) -> SyncResult | str:
        """The patch's result, or the kernel's reason for rejecting it (drift)."""
        assert self._installed is not None
        if not change:
            return SyncResult("none", 0, 0, 0, time.perf_counter() - started)
        commands = render.patch(change)
        try:
            size, _ = self._run("patch", commands)
        except NftablesError as exc:
            self._installed = None
            return exc.message
        for key, removed in change.deletes.items():
            self._installed.setdefault(key, set()).difference_update(removed)
        for key, added in change.adds.items():
            self._installed.setdefault(key, set()).update(added)
        elapsed = time.perf_counter() - started
        return SyncResult("patch", change.size, len(commands), size, elapsed)

    def _sync_blocking(self, desired: SteeringState) -> SyncResult:
        started = time.perf_counter()
        rejected: str | None = None
        if self._installed is not None:
            result = self._patch(diff(self._installed_state(), desired), started)
            if isinstance(result, SyncResult):
                return result
            rejected = result  # drift: someone changed our table; rebuild it
        return self._rebuild(desired, started, rejected)

    def _sync_changes_blocking(
        self, change: SteeringDiff, desired: Callable[[], SteeringState]
    ) -> SyncResult:
        started = time.perf_counter()
        rejected: str | None = None
        if self._installed is not None:
            result = self._patch(change, started)
            if isinstance(result, SyncResult):
                return result
            rejected = result
        return self._rebuild(desired(), started, rejected)

    def _read_blocking(self) -> dict[str, Any] | None:
        rc, output, error = self._context().cmd(f"list table {render.FAMILY} {render.TABLE}")
        if rc != 0:
            if "No such file or directory" in error:
                return None
            raise NftablesError("list", error, 1)
        listing: dict[str, Any] = json.loads(output) if isinstance(output, str) else output
        return listing

    def _cleanup_blocking(self) -> None:
        self._run("cleanup", render.delete_table())
        self._installed = None

    # -- the API (coroutines; state changes only on the worker thread, one call at a time) --

    async def _call(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    @property
    def installed(self) -> SteeringState | None:
        """What the kernel holds as far as we know (None: unknown; O(elements))."""
        return None if self._installed is None else self._installed_state()

    @property
    def installed_size(self) -> int:
        """How many elements the kernel holds as far as we know (0: unknown; O(sets))."""
        return 0 if self._installed is None else sum(len(v) for v in self._installed.values())

    async def sync(self, desired: SteeringState) -> SyncResult:
        """One transaction making the table hold ``desired`` (diffed against what is
        installed: O(elements)); raises ``NftablesError``."""
        result: SyncResult = await self._call(self._sync_blocking, desired)
        self.last = result
        return result

    async def sync_changes(
        self, change: SteeringDiff, desired: Callable[[], SteeringState]
    ) -> SyncResult:
        """One transaction applying ``change`` (a ``SteeringTracker``'s pending change): work
        proportional to the change. ``desired`` gives the whole state for a first sync or a
        rebuild after drift."""
        result: SyncResult
        if not change and self._installed is not None:
            # Nothing to patch (most endpoint changes): no hop to the worker thread.
            result = SyncResult("none", 0, 0, 0, 0.0)
        else:
            result = await self._call(self._sync_changes_blocking, change, desired)
        self.last = result
        return result

    async def listing(self) -> dict[str, Any] | None:
        """The table as ``list table inet ovsproxy`` answers in JSON (None when absent)."""
        listing: dict[str, Any] | None = await self._call(self._read_blocking)
        return listing

    async def read(self) -> SteeringState | None:
        """The table's current set content, parsed back (None when the table is absent)."""
        listing = await self._call(self._read_blocking)
        return None if listing is None else parse_listing(listing)

    async def adopt(self) -> bool:
        """Take over the table a previous run left (an agent restart): when it has our chains
        (name, type, hook, priority, policy) with as many rules each as ours and our sets,
        its elements become what we hold, and the first sync patches it instead of rebuilding
        it. (A rebuild replaces the NAT chains, and with them, in the kernel, the NAT state of
        connections in flight.) False: absent or not our shape; the first sync rebuilds."""
        listing = await self._call(self._read_blocking)
        if listing is None or not _our_shape(listing):
            return False
        state = parse_listing(listing)
        self._installed = {k: set(v) for k, v in state.sets.items()}
        return True

    async def verify(self) -> bool:
        """True when the kernel's table holds exactly what we installed (every element) in our
        shape (chains, rule counts, sets); else forget it, so the next sync rebuilds."""
        listing = await self._call(self._read_blocking)
        ok = (
            self._installed is not None
            and listing is not None
            and _our_shape(listing)
            and parse_listing(listing) == self.installed
        )
        if not ok:
            self._installed = None
        return ok

    async def cleanup(self) -> None:
        """Delete our table (``--cleanup``); nothing else in the ruleset is touched."""
        await self._call(self._cleanup_blocking)

    async def close(self) -> None:
        self._executor.shutdown(wait=True)


def _shape(chains: list[dict[str, Any]], rules: list[str]) -> tuple[Any, ...]:
    described = sorted(
        tuple(str(c.get(k)) for k in ("name", "type", "hook", "prio", "policy")) for c in chains
    )
    counts = sorted((name, rules.count(name)) for name in set(rules))
    return tuple(described), tuple(counts)


def _our_shape(listing: dict[str, Any]) -> bool:
    """The listed table has the skeleton's chains, rule counts per chain and sets."""
    items = listing.get("nftables", [])
    chains = [i["chain"] for i in items if "chain" in i]
    rules = [i["rule"]["chain"] for i in items if "rule" in i]
    sets = {i["set"]["name"] for i in items if "set" in i}
    want_chains, want_rules, want_sets = [], [], set()
    for command in render.skeleton():
        body = command.get("add", {})
        if "chain" in body:
            want_chains.append(body["chain"])
        elif "rule" in body:
            want_rules.append(body["rule"]["chain"])
        elif "set" in body:
            want_sets.add(body["set"]["name"])
    return sets == want_sets and _shape(chains, rules) == _shape(want_chains, want_rules)


_SET_BY_NAME = {
    render.set_name(name, family): (name, family) for name in SteeringSet for family in IPFamily
}


def parse_listing(listing: dict[str, Any]) -> SteeringState:
    """The sets of a ``list table`` JSON answer as a ``SteeringState`` (for verify and tests)."""
    import ipaddress

    from ovsproxy.model import Protocol

    protocols = {p.value.lower(): p for p in Protocol}

    def value(raw: Any) -> Any:
        if isinstance(raw, int):
            return raw
        if isinstance(raw, dict) and "prefix" in raw:
            prefix = raw["prefix"]
            return ipaddress.ip_network(f"{prefix['addr']}/{prefix['len']}")
        if isinstance(raw, str) and raw in protocols:
            return protocols[raw]
        return ipaddress.ip_address(raw)

    sets: dict[tuple[SteeringSet, IPFamily], frozenset[Element]] = {}
    for item in listing.get("nftables", []):
        spec = item.get("set")
        if not spec or spec.get("name") not in _SET_BY_NAME:
            continue
        key = _SET_BY_NAME[spec["name"]]
        elements: set[Element] = set()
        for raw in spec.get("elem", []):
            if isinstance(raw, dict) and "elem" in raw:  # an element with options
                raw = raw["elem"]["val"]
            if isinstance(raw, dict) and "concat" in raw:
                element = tuple(value(v) for v in raw["concat"])
            else:
                element = (value(raw),)
            # a host prefix lists as a plain address; the model keeps networks
            if key[0] is SteeringSet.FIREWALL_ALLOW and not hasattr(element[-1], "prefixlen"):
                element = (*element[:-1], ipaddress.ip_network(element[-1]))
            elements.add(element)
        sets[key] = frozenset(elements)
    return SteeringState(sets)
