"""The route manager: the one owner of the node's Service routes.

Seed 000 in three lines: the Windows agent kept routes in a map keyed sometimes by ``10.96.0.1``
and sometimes by ``10.96.0.1/32``, let a reconcile run in parallel with adds, and so deleted
valid routes at every restart. Here:

* State is keyed only by canonical ``ipaddress`` networks (``to_network``): every spelling of
  an address or prefix becomes the same key before it is stored or compared.
* Every operation -- ensure, apply, reconcile, sync -- is a job on ONE asyncio queue, executed
  by ONE worker task. A job reads the state, calls the kernel and writes the state without any
  other job in between, so a reconcile and an add cannot interleave. Callers on other threads
  use ``manager.from_thread`` (``asyncio.run_coroutine_threadsafe`` underneath).
* The desired set only changes in ways that keep coverage: ``ensure`` and ``reconcile`` add
  (and then drop prefixes contained in wider ones); only ``apply`` of a discoverer change may
  withdraw a prefix, and only one the discoverer itself withdrew, in generation order.
* Growing is make-before-break: the wider route is installed, then the narrower one removed;
  if the install fails, nothing overlapping it is removed.
* Deletion is limited to routes carrying our ownership mark (the backend decides what that is)
  and happens only after the start-up ``reconcile``. ``sync`` never deletes.

Stopping the manager leaves the routes in place: an agent restart must not interrupt traffic.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import ipaddress
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

from ovsproxy.model import IPFamily, IPNetwork
from ovsproxy.routes.backend import (
    KernelRoute,
    RouteAbsentError,
    RouteBackend,
    RouteExistsError,
)
from ovsproxy.servicecidr.aggregate import (
    NetworkLike,
    family_of,
    reduce_networks,
    sort_networks,
    to_network,
)
from ovsproxy.servicecidr.discoverer import CIDRChange, ServiceCIDRDiscoverer

log = logging.getLogger(__name__)

T = TypeVar("T")

ALL_FAMILIES = (IPFamily.IPv4, IPFamily.IPv6)
DEFAULT_SYNC_INTERVAL = 60.0

# Kernel mutations, the figure the targets and the bench talk about.
MUTATIONS = ("add", "delete", "replace")

CIDRsInput = NetworkLike | Iterable[NetworkLike]
DesiredInput = CIDRsInput | Callable[[], Iterable[NetworkLike]]


class OpKey(NamedTuple):
    """A counter key: ``op`` (add, delete, replace, next_hop, list, apply), ``result`` (ok,
    error, conflict, absent, stale), ``family`` (IPv4, IPv6)."""

    op: str
    result: str
    family: str


@dataclass(frozen=True, slots=True)
class RouteChanges:
    """What one manager operation did to the routing table."""

    added: tuple[IPNetwork, ...] = ()
    replaced: tuple[IPNetwork, ...] = ()
    deleted: tuple[IPNetwork, ...] = ()
    kept: tuple[IPNetwork, ...] = ()
    conflicts: tuple[IPNetwork, ...] = ()  # desired, but a foreign route holds the destination
    skipped_deletes: tuple[IPNetwork, ...] = ()  # stale, kept because its successor failed
    errors: tuple[str, ...] = ()

    def __add__(self, other: RouteChanges) -> RouteChanges:
        return RouteChanges(
            *(getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self))
        )

    @property
    def mutations(self) -> int:
        return len(self.added) + len(self.replaced) + len(self.deleted)


@dataclass(slots=True)
class _Job:
    run: Callable[[], Awaitable[Any]]
    future: asyncio.Future[Any]
    name: str = ""


@dataclass(slots=True)
class _FamilyState:
    installed: dict[IPNetwork, tuple[KernelRoute, ...]] = field(default_factory=dict)  # ours
    foreign: dict[IPNetwork, KernelRoute] = field(default_factory=dict)  # from the last listing
    table: dict[IPNetwork, KernelRoute] = field(default_factory=dict)  # other devices' routes
    next_hop_ready: bool = False
    generation: int = 0  # last CIDRChange generation applied
    warned_conflicts: set[IPNetwork] = field(default_factory=set)


class RouteManager:
    """Owns the Service routes ``<cidr> via <virtual next hop> dev <gateway>``.

    Life cycle, from an asyncio agent::

        manager = RouteManager(LinuxRouteBackend(netns="node"), "gw0")
        await manager.start()                      # opens the backend, starts the worker
        discoverer.subscribe(manager.apply_soon)   # events from the loop or any thread
        discoverer.cluster_ips_synced()            # after the Service source synced ...
        await manager.reconcile(discoverer.desired)  # ... converge once, delete our stale
        ...
        await manager.stop()                       # routes stay installed

    ``sync_interval`` (seconds, ``None`` for never) drives the periodic ``sync``.
    """

    def __init__(
        self,
        backend: RouteBackend,
        gateway: str,
        families: Iterable[IPFamily] = ALL_FAMILIES,
        *,
        sync_interval: float | None = DEFAULT_SYNC_INTERVAL,
    ) -> None:
        self.backend = backend
        self.gateway = gateway
        self.families = tuple(dict.fromkeys(IPFamily(f) for f in families))
        self.sync_interval = sync_interval
        self.counters: Counter[OpKey] = Counter()
        self.from_thread = FromThread(self)
        self._desired: frozenset[IPNetwork] = frozenset()
        self._state = {family: _FamilyState() for family in self.families}
        self._reconciled = False
        self._reconcile_pending = False
        self._queue: asyncio.Queue[_Job | None] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._background: set[asyncio.Task[Any]] = set()

    # -- life cycle --------------------------------------------------------------------------

    async def start(self) -> None:
        if self._worker is not None:
            return
        await self.backend.open()
        self._loop = asyncio.get_running_loop()
        self._queue = asyncio.Queue()
        self._worker = asyncio.create_task(self._work(), name="route-manager")
        if self.sync_interval:
            self._ticker = asyncio.create_task(self._tick(self.sync_interval), name="route-sync")

    async def stop(self) -> None:
        """Stop the worker after the jobs already queued; leave every route in place."""
        if self._ticker is not None:
            self._ticker.cancel()
            await asyncio.gather(self._ticker, return_exceptions=True)
            self._ticker = None
        if self._background:  # applies queued with apply_soon go in before the worker stops
            await asyncio.gather(*self._background, return_exceptions=True)
        if self._worker is not None and self._queue is not None:
            await self._queue.put(None)
            await asyncio.gather(self._worker, return_exceptions=True)
        self._worker = None
        self._queue = None
        self._loop = None
        await self.backend.close()

    async def __aenter__(self) -> RouteManager:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def running(self) -> bool:
        return self._worker is not None and not self._worker.done()

    # -- public operations (each one job on the queue) ---------------------------------------

    async def ensure(self, cidrs: CIDRsInput) -> RouteChanges:
        """Route ``cidrs`` too (the CIDR grew). Narrower routes they cover are removed after
        the wider one is in (only once ``reconcile`` has run)."""
        nets = self._canonical(cidrs)
        return await self._submit("ensure", lambda: self._ensure(nets))

    async def apply(self, change: CIDRChange) -> RouteChanges:
        """Apply a discoverer event. Events older than one already applied are dropped."""
        return await self._submit("apply", lambda: self._apply(change))

    def _started_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("RouteManager is not started")
        return self._loop

    def apply_soon(self, change: CIDRChange) -> None:
        """Queue ``apply(change)`` without waiting, from the manager's loop or any thread.

        Made for ``discoverer.subscribe(manager.apply_soon)``: discoverer handlers are plain
        callables. Failures are logged; the periodic sync retries what could not be added.
        """
        loop = self._started_loop()
        if _running_loop() is loop:
            task = loop.create_task(self.apply(change))
            self._background.add(task)  # keep a reference until done
            task.add_done_callback(self._background_done)
        else:
            future = asyncio.run_coroutine_threadsafe(self.apply(change), loop)
            future.add_done_callback(self._background_done)

    def _background_done(
        self, future: asyncio.Future[Any] | concurrent.futures.Future[Any]
    ) -> None:
        if isinstance(future, asyncio.Task):
            self._background.discard(future)
        if not future.cancelled() and future.exception() is not None:
            log.error("routes: queued apply failed: %s", future.exception())

    async def reconcile(self, desired: DesiredInput = ()) -> RouteChanges:
        """Start-up convergence: list the gateway's routes, keep those equal to the desired
        ones, add the missing, then delete OUR stale ones (older CIDRs, per-IP /32s, anything
        ours not desired). Foreign routes are never touched.

        ``desired`` may be a callable (e.g. ``discoverer.desired``): it is then read when the
        job runs, not when it was queued, so it can never be older than an ``apply`` before it.
        """
        getter: Callable[[], Iterable[NetworkLike]] | None = None
        nets: frozenset[IPNetwork] = frozenset()
        if callable(desired):
            getter = desired
        else:
            nets = self._canonical(desired)
        # Passing discoverer.desired before the discoverer is ready would read an empty set and
        # delete every valid route at start-up: refuse instead.
        source = getattr(desired, "__self__", None)
        discoverer = source if isinstance(source, ServiceCIDRDiscoverer) else None

        async def job() -> RouteChanges:
            if discoverer is not None and not discoverer.ready:
                raise RuntimeError("the Service CIDR discoverer is not ready: reconcile after sync")
            return await self._reconcile(self._canonical(getter()) if getter else nets)

        return await self._submit("reconcile", job)

    async def uninstall(self) -> RouteChanges:
        """Remove every Service route of ours (``ovsproxy cleanup``, ``ovsproxy run
        --cleanup``): the desired set is emptied and each family is converged with deletes.

        The virtual next hop's host route and permanent neighbour entry stay: they carry no
        Service traffic once no route points at them, and a later agent reuses them as they
        are. ``remove_next_hop`` removes them (``ovsproxy cleanup``)."""

        async def job() -> RouteChanges:
            self._desired = frozenset()
            changes, _ = await self._list_and_converge(deletes=True, job="uninstall", level=None)
            return changes

        return await self._submit("uninstall", job)

    async def remove_next_hop(self, *, neighbours: bool) -> list[str]:
        """Undo the virtual next hop on the gateway (``ovsproxy cleanup``, after
        ``uninstall``): its host route when ours and, with ``neighbours``, the permanent
        neighbour entries resolving to the virtual MAC. Only a backend that can tell its own
        (Linux: ``LinuxRouteBackend.remove_next_hop``) removes anything; returns what it did."""
        remove = getattr(self.backend, "remove_next_hop", None)

        async def job() -> list[str]:
            done: list[str] = []
            if remove is not None:
                for family in self.families:
                    done += await remove(self.gateway, family, neighbours=neighbours)
                    self._state[family].next_hop_ready = False
            return done

        return await self._submit("remove next hop", job)

    async def sync(self) -> RouteChanges:
        """Periodic repair: re-add desired routes that are missing (deleted by hand, device
        recreated). Never deletes. Runs a pending reconcile if the last one could not list."""
        return await self._submit("sync", self._sync)

    def routes(self) -> frozenset[IPNetwork]:
        """The desired Service routes (canonical networks, every family)."""
        return self._desired

    def installed(self) -> frozenset[IPNetwork]:
        """Our routes the manager believes to be in the kernel."""
        return frozenset(dst for state in self._state.values() for dst in state.installed)

    def count(
        self, op: str | None = None, result: str | None = None, family: str | None = None
    ) -> int:
        """Sum of the counters matching the given labels (``None`` matches all)."""
        return sum(
            n
            for key, n in self.counters.items()
            if (op is None or key.op == op)
            and (result is None or key.result == result)
            and (family is None or key.family == family)
        )

    @property
    def mutations(self) -> int:
        """Route add/delete/replace operations attempted so far."""
        return sum(self.count(op) for op in MUTATIONS)

    # -- the worker --------------------------------------------------------------------------

    async def _submit(self, name: str, run: Callable[[], Awaitable[T]]) -> T:
        if self._queue is None or self._loop is None:
            raise RuntimeError("RouteManager is not started")
        future: asyncio.Future[T] = self._loop.create_future()
        await self._queue.put(_Job(run, future, name))
        # shield: a caller that gives up does not abort a job half-way through the kernel
        return await asyncio.shield(future)

    async def _work(self) -> None:
        assert self._queue is not None
        while True:
            job = await self._queue.get()
            if job is None:
                break
            if job.future.done():
                continue
            try:
                result = await job.run()
            except Exception as exc:
                log.debug("routes: %s failed: %s", job.name, exc)
                if not job.future.done():
                    job.future.set_exception(exc)
            else:
                if not job.future.done():
                    job.future.set_result(result)
        # Whatever is still queued after the sentinel (a racing submit) fails cleanly.
        while not self._queue.empty():
            job = self._queue.get_nowait()
            if job is not None and not job.future.done():
                job.future.set_exception(RuntimeError("RouteManager stopped"))

    async def _tick(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.sync()
            except Exception:
                log.exception("routes: periodic sync failed")

    # -- jobs (run only by the worker) -------------------------------------------------------

    async def _ensure(self, nets: frozenset[IPNetwork]) -> RouteChanges:
        self._set_desired(self._desired | nets)
        changes = RouteChanges()
        for family in self._families_of(nets):
            changes += await self._converge(family, deletes=self._reconciled)
        return changes

    async def _apply(self, change: CIDRChange) -> RouteChanges:
        family = IPFamily(change.family)
        state = self._state.get(family)
        if state is None:
            log.warning("routes: ignoring %s change, family not managed", family.name)
            return RouteChanges()
        if change.generation <= state.generation:
            self._count("apply", "stale", family)
            log.debug("routes: dropping stale change generation %d", change.generation)
            return RouteChanges()
        state.generation = change.generation
        withdrawn = set(change.withdrawn)
        self._set_desired({n for n in self._desired if n not in withdrawn} | set(change.new))
        return await self._converge(family, deletes=self._reconciled)

    async def _reconcile(self, nets: frozenset[IPNetwork]) -> RouteChanges:
        self._set_desired(self._desired | nets)
        changes, listed_all = await self._list_and_converge(
            deletes=True, job="reconcile", level=logging.ERROR
        )
        # Only a reconcile that saw the whole table may license later deletes; otherwise the
        # periodic sync retries it.
        self._reconciled = self._reconciled or listed_all
        self._reconcile_pending = not listed_all
        log.debug("routes: reconcile done: %s", _summary(changes))
        return changes

    async def _sync(self) -> RouteChanges:
        if self._reconcile_pending:
            return await self._reconcile(frozenset())
        changes, _ = await self._list_and_converge(deletes=False, job="sync")
        return changes

    # -- building blocks ---------------------------------------------------------------------

    async def _list_and_converge(
        self, *, deletes: bool, job: str, level: int | None = logging.WARNING
    ) -> tuple[RouteChanges, bool]:
        """List each family's routes and converge it (a family that cannot be listed is
        skipped, its error recorded and logged at ``level``; ``None``: not logged). Returns the
        changes and whether every family was listed."""
        changes = RouteChanges()
        listed_all = True
        for family in self.families:
            try:
                await self._list(family)
            except Exception as exc:
                listed_all = False
                changes += RouteChanges(errors=(f"list {family.name}: {exc}",))
                if level is not None:
                    log.log(level, "routes: %s cannot list %s routes: %s", job, family.name, exc)
                continue
            changes += await self._converge(family, deletes=deletes)
        return changes, listed_all

    async def _list(self, family: IPFamily) -> None:
        routes = await self._op("list", family, "", self.backend.list_routes(self.gateway, family))
        state = self._state[family]
        installed: dict[IPNetwork, list[KernelRoute]] = {}
        foreign: dict[IPNetwork, KernelRoute] = {}
        for route in routes:
            if route.ours:
                installed.setdefault(route.dst, []).append(route)
            else:
                foreign[route.dst] = route
        state.installed = {dst: tuple(rs) for dst, rs in installed.items()}
        state.foreign = foreign
        await self._list_table(family)
        # The listing is the truth now; re-check the next hop before relying on it.
        state.next_hop_ready = False

    async def _list_table(self, family: IPFamily) -> None:
        """The rest of the table: a desired prefix equal to a route of another device (the
        node's default route on its uplink, a CNI's route) is a conflict too, or our metric-0
        route would take its traffic. Backends without ``list_table`` see the gateway only."""
        list_table = getattr(self.backend, "list_table", None)
        if list_table is None:
            return
        others = await self._op("list", family, "table", list_table(self.gateway, family))
        table: dict[IPNetwork, KernelRoute] = {}
        for route in others:
            table.setdefault(route.dst, route)
        self._state[family].table = table

    async def _ensure_next_hop(self, family: IPFamily) -> None:
        state = self._state[family]
        if state.next_hop_ready:
            return
        done = await self._op(
            "next_hop", family, "check", self.backend.ensure_next_hop(self.gateway, family)
        )
        for what in done:
            self._count("next_hop", "changed", family)
            log.debug("routes: next hop: %s", what)
        state.next_hop_ready = True

    async def _converge(self, family: IPFamily, *, deletes: bool) -> RouteChanges:
        """Add/repair every desired route of ``family``, then (if allowed) delete our others."""
        state = self._state[family]
        desired = family_of(self._desired, family)
        hop = self.backend.next_hop(family)
        added: list[IPNetwork] = []
        replaced: list[IPNetwork] = []
        kept: list[IPNetwork] = []
        conflicts: list[IPNetwork] = []
        failed: list[IPNetwork] = []
        errors: list[str] = []

        if desired:
            try:
                await self._ensure_next_hop(family)
            except Exception as exc:
                errors.append(f"next hop {family.name}: {exc}")
                log.warning("routes: cannot set up the %s next hop: %s", family.name, exc)
        if any(dst not in state.installed for dst in desired):
            try:  # a prefix to add: judge it against the table as it is now
                await self._list_table(family)
            except Exception as exc:
                errors.append(f"list {family.name} table: {exc}")
                log.warning("routes: cannot list the %s table: %s", family.name, exc)

        for dst in desired:
            mine = state.installed.get(dst, ())
            if any(r.gateway == hop for r in mine):
                kept.append(dst)
                continue
            holder = state.foreign.get(dst) or state.table.get(dst)
            if not mine and holder is not None:
                # A foreign route is never replaced, nor shadowed by ours on another device.
                self._count("add", "conflict", family)
                self._conflict(state, dst, str(holder))
                failed.append(dst)
                conflicts.append(dst)
                continue
            try:
                if mine:  # ours, but pointing elsewhere (an older version, a changed gateway)
                    call = self.backend.replace_route(self.gateway, mine[0])
                    route = await self._op("replace", family, dst, call)
                    replaced.append(dst)
                else:
                    call = self.backend.add_route(self.gateway, dst)
                    route = await self._op("add", family, dst, call)
                    added.append(dst)
                state.installed[dst] = (route, *mine[1:])
            except RouteExistsError as exc:  # a foreign route appeared since the listing
                self._conflict(state, dst, str(exc))
                failed.append(dst)
                conflicts.append(dst)
            except Exception as exc:
                failed.append(dst)
                errors.append(f"{dst}: {exc}")
                log.warning("routes: cannot route %s: %s", dst, exc)

        deleted: dict[IPNetwork, None] = {}  # ordered set: one entry per prefix
        skipped: list[IPNetwork] = []
        if deletes:
            wanted = set(desired)
            for dst in sort_networks(state.installed):
                routes = state.installed[dst]
                if dst in wanted:
                    # Keep the one via our next hop; drop duplicates of ours pointing elsewhere
                    # (possible on Windows, where routes differing in next hop coexist).
                    stale = tuple(r for r in routes if r.gateway != hop)
                    if len(stale) == len(routes):
                        continue
                else:
                    stale = routes
                if not stale:
                    continue
                if any(dst.overlaps(f) for f in failed):
                    skipped.append(dst)  # its successor is not in: keep it (make-before-break)
                    continue
                remaining = list(routes)
                for route in stale:
                    try:
                        await self._op(
                            "delete", family, dst, self.backend.delete_route(self.gateway, route)
                        )
                    except RouteAbsentError:
                        pass  # gone already: the goal is reached
                    except Exception as exc:
                        errors.append(f"delete {route}: {exc}")
                        log.warning("routes: cannot delete %s: %s", route, exc)
                        continue
                    remaining.remove(route)
                    deleted[dst] = None
                if remaining:
                    state.installed[dst] = tuple(remaining)
                else:
                    del state.installed[dst]

        return RouteChanges(
            added=tuple(added),
            replaced=tuple(replaced),
            deleted=tuple(deleted),
            kept=tuple(kept),
            conflicts=tuple(conflicts),
            skipped_deletes=tuple(skipped),
            errors=tuple(errors),
        )

    async def _op(self, op: str, family: IPFamily, target: object, call: Awaitable[T]) -> T:
        try:
            result = await call
        except RouteExistsError:
            self._count(op, "conflict", family)
            log.debug("routes: %s %s %s: conflict", op, family.name, target)
            raise
        except RouteAbsentError:
            self._count(op, "absent", family)
            log.debug("routes: %s %s %s: absent", op, family.name, target)
            raise
        except Exception:
            self._count(op, "error", family)
            log.debug("routes: %s %s %s: error", op, family.name, target, exc_info=True)
            raise
        self._count(op, "ok", family)
        log.debug("routes: %s %s %s dev %s: ok", op, family.name, target, self.gateway)
        return result

    @staticmethod
    def _conflict(state: _FamilyState, dst: IPNetwork, holder: str) -> None:
        if dst not in state.warned_conflicts:  # once per prefix, not every sync period
            state.warned_conflicts.add(dst)
            log.warning("routes: cannot route %s, a route not ours holds it: %s", dst, holder)

    def _count(self, op: str, result: str, family: IPFamily) -> None:
        self.counters[OpKey(op, result, family.name)] += 1

    def _set_desired(self, nets: Iterable[IPNetwork]) -> None:
        managed = [n for n in nets if IPFamily.of(n) in self._state]
        # One immutable value, swapped whole: readers on other threads see old or new, never
        # a half-updated set.
        self._desired = reduce_networks(managed)

    def _families_of(self, nets: Iterable[IPNetwork]) -> list[IPFamily]:
        present = {IPFamily.of(n) for n in nets}
        return [f for f in self.families if f in present]

    @staticmethod
    def _canonical(cidrs: CIDRsInput) -> frozenset[IPNetwork]:
        if isinstance(
            cidrs,
            str
            | ipaddress.IPv4Address
            | ipaddress.IPv6Address
            | ipaddress.IPv4Network
            | ipaddress.IPv6Network
            | ipaddress.IPv4Interface
            | ipaddress.IPv6Interface,
        ):
            cidrs = (cidrs,)
        return frozenset(to_network(c) for c in cidrs)


class FromThread:
    """The manager's operations for callers on other threads.

    Each method schedules the operation on the manager's event loop and returns a
    ``concurrent.futures.Future``; call ``.result(timeout)`` to wait. Never call these from the
    manager's own loop (that would deadlock on ``.result()``): ``await`` the methods instead.
    """

    def __init__(self, manager: RouteManager) -> None:
        self._manager = manager

    def ensure(self, cidrs: CIDRsInput) -> concurrent.futures.Future[RouteChanges]:
        return self._run(lambda: self._manager.ensure(cidrs))

    def apply(self, change: CIDRChange) -> concurrent.futures.Future[RouteChanges]:
        return self._run(lambda: self._manager.apply(change))

    def reconcile(self, desired: DesiredInput = ()) -> concurrent.futures.Future[RouteChanges]:
        return self._run(lambda: self._manager.reconcile(desired))

    def sync(self) -> concurrent.futures.Future[RouteChanges]:
        return self._run(self._manager.sync)

    def _run(
        self, make: Callable[[], Coroutine[Any, Any, RouteChanges]]
    ) -> concurrent.futures.Future[RouteChanges]:
        loop = self._manager._started_loop()
        if _running_loop() is loop:
            raise RuntimeError("from_thread used on the manager's own loop; await instead")
        return asyncio.run_coroutine_threadsafe(make(), loop)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop of the calling thread, if it runs one."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _summary(changes: RouteChanges) -> str:
    parts = []
    for name in ("added", "replaced", "deleted", "kept", "conflicts", "skipped_deletes"):
        items = getattr(changes, name)
        if items:
            parts.append(f"{name}={[str(n) for n in items]}")
    if changes.errors:
        parts.append(f"errors={list(changes.errors)}")
    return ", ".join(parts) or "nothing to do"
