"""The switch synchroniser, and the datapath's one entry point: ``SwitchSync`` holds the desired
state (``desired.DesiredState``: groups and flows by owner) and what the switch holds
(``plan.InstalledState``), and commits the difference to OVS as one ordered, atomic bundle
planned by ``plan``.

Owners ``stage`` the complete set of groups and flows they want (``DesiredState.stage``);
nothing is sent until ``commit``. ``commit`` looks only at what staged owners touched (its
cost follows the size of the change, not the number of Services), has ``plan.emit`` write the
messages in a safe order and sends them as one bundle. What the switch holds is recorded only
when the bundle committed; a failed commit leaves everything dirty, so the next commit retries
the same diff. A commit whose outcome is unknown (its COMMIT went out, no answer came: a busy
ovs-vswitchd may apply it after we gave up) makes the next commit adopt the switch again
(``_outcome_unknown``).

Streaming: the bundle is streamed (``Switch.bundle()``): messages are planned, encoded and
written while Open vSwitch decodes the ones before them, so a full sync costs about
max(planning, OVS) instead of their sum (``plan``'s docstring: why flows are interleaved with
the groups).

Streaming while staging: the adopting (first) commit writes everything the switch should hold,
whatever it holds, so its messages do not wait for the commit. Once ``STREAM_WHILE_STAGING_AFTER``
groups and flows are staged, its bundle is opened and every owner staged from then on is
written into it (a few dozen owners at a time, by ``plan.write_owner``: every group whole with
ADD_OR_MOD, then the owner's flows that use no group still to come), as long as the socket takes
what is written; Open vSwitch takes a cold start in while the rest of it is still being built.
Nothing of it is applied before the commit, which adopts the switch as usual and plans only
what was not written, or was staged again (or shared) since: those are planned against what
the bundle already carries, and sent into the same bundle. If the bundle is lost (its
connection went), the commit discards it and sends everything in a new one.

Memory: the datapath does not switch the cyclic garbage collector or trim the heap. Whoever
runs a sync or a replay does, around it (``datapath.memory.memory_policy``: the collector paused,
and after a big one the new state frozen and the heap's free pages given back); ``touched``
counts the groups and flows committed, for it to tell a big sync.

On (re)connection, :meth:`SwitchSync.resync_switch` adopts whatever the switch holds: every group
id it has in our range is rewritten whole (ADD_OR_MOD) or deleted, every flow is re-added with
the current generation's cookie, and the flows of older generations are deleted, all in one
bundle. This is replay after an ovs-vswitchd restart and the hitless hand-over after an agent
restart. The ids of the groups we installed are kept in a ``GroupRegistry`` (OVSDB, for the
agent) across restarts, by ``our_group_ids.OurGroupIds``; ``drifted`` checks the switch
against what was committed (``drift.DriftCheck``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Protocol

from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath.desired import (
    DatapathError,
    DesiredState,
    EncodedFlow,
    Flow,
    FlowKey,
    Owner,
    encoded_flow,
    flow_key,
    flow_value,
)
from ovsproxy.datapath.drift import DriftCheck
from ovsproxy.datapath.groups import GroupSpec, InstalledGroup, delete_group
from ovsproxy.datapath.our_group_ids import GroupRegistry, OurGroupIds
from ovsproxy.datapath.plan import (
    CommitStats,
    Diff,
    InstalledState,
    Written,
    emit,
    fold_written,
    owners_of,
    write_owner,
)
from ovsproxy.openflow import protocol as of
from ovsproxy.openflow.errors import BundleError, ChannelError

__all__ = [
    "CommitStats",
    "SwitchSync",
    "DatapathError",
    "EncodedFlow",
    "FlowKey",
    "InstalledFlows",
    "Removal",
    "StreamingBundle",
    "Switch",
    "encoded_flow",
    "flow_key",
]

log = logging.getLogger(__name__)

# Streaming: yield to the event loop (so the transport writes) every this many messages.
_STREAM_YIELD_EVERY = 512
# The adopting commit is streamed while staging once this many groups + flows are pending...
STREAM_WHILE_STAGING_AFTER = 5000
# ...as long as the socket takes what is written (beyond this backlog the commit sends the rest,
# with flow control).
STREAM_WHILE_STAGING_BACKLOG = 1 << 20
_STREAM_OWNERS_EVERY = 64


class InstalledFlows(Mapping[FlowKey, of.FlowMod]):
    """The installed flows by key, read-only; those kept encoded are decoded as read."""

    __slots__ = ("_wires",)

    def __init__(self, wires: dict[FlowKey, Flow]) -> None:
        self._wires = wires

    def __getitem__(self, key: FlowKey) -> of.FlowMod:
        return flow_value(self._wires[key])

    def __contains__(self, key: object) -> bool:
        return key in self._wires

    def __iter__(self) -> Iterator[FlowKey]:
        return iter(self._wires)

    def __len__(self) -> int:
        return len(self._wires)


class StreamingBundle(Protocol):
    """A bundle being written (``openflow.connection.Bundle``)."""

    @property
    def state(self) -> str:
        """``open`` while messages may be added."""

    @property
    def backlog(self) -> int:
        """Bytes added but not yet taken by the socket."""

    def add(self, msg: of.Message) -> int:
        """Buffer one message into the bundle (written in chunks); returns its xid."""

    def add_bodies(self, msg_type: int, bodies: Sequence[bytes]) -> None:
        """Buffer one ``msg_type`` message per body (its encoding without the header)."""

    async def drain(self) -> None:
        """Write what is buffered and wait until the transport can take more."""

    async def commit(self) -> None:
        """Close and commit; raise ``BundleError`` (after discarding) if anything failed."""

    async def discard(self) -> None:
        """Throw the bundle away (nothing from it is applied)."""


class Switch(Protocol):
    """What the datapath needs from an OpenFlow connection (``openflow.connection.Channel``)."""

    @property
    def connected(self) -> bool: ...

    def bundle(self) -> StreamingBundle:
        """A new atomic, ordered bundle, streamed as messages are added."""

    async def group_ids(self) -> set[int]:
        """Ids of every group the switch holds."""

    async def flow_cookies(self, cookie: int, mask: int) -> list[int]:
        """Cookies of the flows whose cookie matches cookie/mask."""

    async def flow_keys(self, cookie: int, mask: int) -> list[tuple[int, FlowKey]]:
        """(cookie, key: table, priority and match as bytes) of the flows whose cookie
        matches cookie/mask."""


class _Streaming:
    """The adopting commit's bundle, opened and written while the owners are staged, so that
    Open vSwitch takes a full sync in while the rest of it is still being built (a cold start
    builds everything, then commits: the build is most of our time, and OVS would idle
    through it). Nothing of it is applied before the commit, which plans only what was not
    written (or was re-staged since) and sends it into the same bundle."""

    __slots__ = ("bundle", "queue", "restaged", "written")

    def __init__(self, bundle: StreamingBundle) -> None:
        self.bundle = bundle
        self.written = written = Written()
        self.restaged = written.restaged  # (bound once: staging calls it per owner)
        self.queue: list[Owner] = []  # staged, to write


class _Out:
    """Where a commit's messages go (``plan.Stream``): its bundle, opened with the first
    message."""

    __slots__ = ("_switch", "bundle", "since")

    def __init__(self, switch: Switch, bundle: StreamingBundle | None = None) -> None:
        self._switch = switch
        self.bundle = bundle
        self.since = 0  # messages since the caller last let the transport write

    def _bundle(self) -> StreamingBundle:
        bundle = self.bundle  # (not `or`: a bundle's truth is its length)
        if bundle is None:
            bundle = self.bundle = self._switch.bundle()
        return bundle

    def add_bodies(self, msg_type: int, bodies: Sequence[bytes]) -> None:
        if bodies:
            self._bundle().add_bodies(msg_type, bodies)
            self.since += len(bodies)

    def add(self, msg: of.Message) -> None:
        self._bundle().add(msg)
        self.since += 1

    @property
    def due(self) -> bool:
        return self.since >= _STREAM_YIELD_EVERY

    @property
    def batch(self) -> int:
        return _STREAM_YIELD_EVERY


@dataclass(frozen=True, slots=True)
class Removal:
    """What ``SwitchSync.remove_all`` found and deleted: the number of our flows, the group ids."""

    flows: int
    groups: tuple[int, ...]


class SwitchSync:
    """The datapath's entry point: staging (into ``desired``), committing (planned by
    ``plan``, sent as one bundle) and adoption; it holds the drift check (``drift``) and our
    group ids with their record in ``registry`` (``group_ids``).

    ``freeze_gc``: after a big sync, move what is alive out of the cyclic collector's
    sight (read by ``datapath.memory.memory_policy``; a one-shot process has nothing to keep out
    of it).
    ``stream_while_staging``: stream the adopting commit's bundle while its owners are staged
    (see ``_Streaming``)."""

    def __init__(
        self,
        switch: Switch,
        config: pl.PipelineConfig,
        generation: int,
        registry: GroupRegistry | None = None,
        *,
        freeze_gc: bool = True,
        stream_while_staging: bool = True,
    ) -> None:
        self.freeze_gc = freeze_gc
        self.stream_while_staging = stream_while_staging
        self.switch = switch
        self.config = config
        self.tables = pl.Tables.for_config(config)
        self.generation = generation
        self.desired = DesiredState()
        self.installed = InstalledState()
        self.group_ids = OurGroupIds(config, registry)
        self.drift = DriftCheck(switch, self.installed, generation, self.group_ids.ours)
        # old-generation cookies to delete with the next commit
        self._stale_generations: set[int] = set()
        self._lock = asyncio.Lock()
        # The first commit adopts what the switch holds (an older agent's state): it must carry
        # the complete desired state, so adoption waits for it instead of wiping the switch.
        self._adopt = True
        self.last_commit = CommitStats()
        self.commits = 0
        self.touched = 0  # groups + flows of every successful commit's diff, added up
        self._streaming: _Streaming | None = None
        self._abandoned: list[StreamingBundle] = []  # streamed bundles to discard

    # -- staging ----------------------------------------------------------------------------
    def stage(
        self,
        owner: Hashable,
        groups: Iterable[GroupSpec],
        flows: Iterable[of.FlowMod | EncodedFlow],
    ) -> None:
        """Replace everything `owner` wants. Cost: the size of the owner's old + new sets."""
        streaming = self._streaming
        if streaming is None:
            if self.desired.stage(owner, groups, flows) is not None and self._adopt:
                self._start_streaming()
            return
        # staged again: what was written for this owner is planned again
        me = self.desired.stage(owner, groups, flows, streaming.restaged)
        if me is not None:
            queue = streaming.queue
            queue.append(me)
            if len(queue) >= _STREAM_OWNERS_EVERY:
                self._stream_queued(streaming)

    def unstage(self, owner: Hashable) -> None:
        self.stage(owner, (), ())

    # -- streaming while staging (see _Streaming) -----------------------------------------------
    def _start_streaming(self) -> None:
        """Open the adopting commit's bundle once enough is staged, and write what is."""
        desired = self.desired
        if (
            not self.stream_while_staging
            or len(desired.dirty_flows) + len(desired.dirty_groups) < STREAM_WHILE_STAGING_AFTER
            or self._lock.locked()
            or not self.switch.connected
        ):
            return
        try:
            asyncio.get_running_loop()  # a bundle needs the loop (its replies are futures)
            bundle = self.switch.bundle()
        except (RuntimeError, ChannelError):
            return
        streaming = self._streaming = _Streaming(bundle)
        streaming.queue.extend(desired.owners.values())
        self._stream_queued(streaming)

    def _stream_queued(self, streaming: _Streaming) -> None:
        """Write the owners staged since the last write (a few dozen at a time: building and
        encoding each in its own tight loop is cheaper than alternating per owner), each by
        ``plan.write_owner``; an owner is skipped while the socket does not keep up (the
        commit plans what was not written)."""
        queue, streaming.queue = streaming.queue, []
        owners = self.desired.owners
        bundle, written = streaming.bundle, streaming.written
        dirty_groups, replay_groups = self.desired.dirty_groups, self.installed.replay_groups
        for owner in queue:
            if self._streaming is not streaming:
                return  # abandoned
            if owners.get(owner.key) is not owner:
                continue  # unstaged since
            try:
                if bundle.state != "open":
                    self._abandon_streaming()
                    return
                if bundle.backlog > STREAM_WHILE_STAGING_BACKLOG:
                    continue
                write_owner(owner, written, dirty_groups, replay_groups, bundle)
            except Exception as exc:  # the commit plans everything again, reports any error
                log.debug("streaming while staging stopped: %s", exc)
                self._abandon_streaming()
                return

    def _abandon_streaming(self) -> None:
        streaming, self._streaming = self._streaming, None
        if streaming is not None:
            self._abandoned.append(streaming.bundle)

    def _take_streamed(self, diff: Diff) -> StreamingBundle | None:
        """The streamed bundle, if it is still open, with what it holds folded into the diff
        (``plan.fold_written``)."""
        streaming, self._streaming = self._streaming, None
        if streaming is None:
            return None  # (owners still queued are planned by the commit)
        if streaming.bundle.state != "open":
            self._abandoned.append(streaming.bundle)
            return None
        fold_written(diff, streaming.written)
        return streaming.bundle

    async def _discard_abandoned(self) -> None:
        abandoned, self._abandoned = self._abandoned, []
        for bundle in abandoned:
            with contextlib.suppress(Exception):
                await bundle.discard()

    # -- reading ----------------------------------------------------------------------------
    def owners(self) -> list[Hashable]:
        return list(self.desired.owners)

    def desired_flow(self, key: FlowKey) -> of.FlowMod | None:
        flow = self.desired.flow(key)
        return None if flow is None else flow_value(flow)

    def owner_flows(self, owner: Hashable) -> list[of.FlowMod]:
        """The flows ``owner`` has staged (decoded)."""
        found = self.desired.owners.get(owner)
        return [] if found is None else [flow_value(f) for f in found.flows.values()]

    def desired_group(self, gid: int) -> GroupSpec | None:
        return self.desired.group(gid)

    @property
    def installed_flows(self) -> InstalledFlows:
        """What the switch holds once the last commit succeeded: flows by key."""
        return InstalledFlows(self.installed.flows)

    @property
    def installed_groups(self) -> dict[int, InstalledGroup]:
        """What the switch holds once the last commit succeeded: groups by id."""
        return self.installed.groups

    @property
    def pending(self) -> bool:
        desired = self.desired
        return bool(desired.dirty_flows or desired.dirty_groups or self._stale_generations)

    # -- committing -------------------------------------------------------------------------
    async def commit(self, watch: Callable[[], AbstractSet[FlowKey]] | None = None) -> CommitStats:
        """Send what changed since the last successful commit as one bundle (nothing at all
        when nothing changed). Raises on failure; the same diff is retried by the next call.
        When this commit adopts a switch that holds flows of ours, its stats tell which of
        the keys ``watch()`` returns the switch held before (``CommitStats.held_before``)."""
        async with self._lock:
            if self._adopt:
                return await self._resync_locked(watch)
            return await self._commit_locked()

    async def on_connected(self) -> None:
        """The channel's (re)connection hook: replay before any new change is sent."""
        async with self._lock:
            # We have installed state (the switch may have lost it), or had, and a commit of
            # unknown outcome left it to be adopted: replay now, not at the next commit (an
            # agent's next sync comes only after its failed one's backoff). Before the first
            # commit there is nothing to replay: that commit adopts.
            if not self._adopt or self.commits:
                await self._resync_locked()

    async def _send(self, diff: Diff, bundle: StreamingBundle | None) -> None:
        """Stream the messages into one bundle (``bundle``: the one streamed while staging)."""
        out = _Out(self.switch, bundle)
        try:
            for _ in emit(diff, self.desired, self.installed, out):
                # Write what is buffered and let the loop push it to OVS, which decodes
                # these messages while we plan the next ones.
                out.since = 0
                if out.bundle is not None:
                    await out.bundle.drain()
                await asyncio.sleep(0)
        except BaseException:
            if out.bundle is not None:
                with contextlib.suppress(Exception):
                    await out.bundle.discard()
            raise
        if out.bundle is None:
            return  # nothing changed: not even an empty bundle
        diff.committing = True
        await out.bundle.commit()

    async def _commit_locked(self) -> CommitStats:
        started = time.perf_counter()
        # Take the dirty sets: what is staged while the bundle is in flight stays dirty for
        # the next commit.
        dirty_groups, dirty_flows = self.desired.take_dirty()
        diff = Diff(dirty_groups, dirty_flows, self._stale_generations)
        self._stale_generations = set()
        streamed = self._take_streamed(diff)
        if self._abandoned:
            await self._discard_abandoned()
        try:
            await self._send(diff, streamed)
        except asyncio.CancelledError:
            self._restore(diff)
            if diff.committing:
                self._outcome_unknown(diff)
            raise
        except BundleError as exc:  # refused and discarded: nothing was applied
            self._restore(diff)
            failed = [failure.message for failure in exc.failures]
            raise DatapathError(f"bundle refused: {exc}", owners_of(failed, self.desired)) from exc
        except Exception as exc:
            self._restore(diff)
            if diff.committing:
                self._outcome_unknown(diff)
            elif not isinstance(exc, ChannelError):
                raise  # a planning bug: the bundle was discarded, nothing was applied
            what = (
                f"bundle of {diff.stats.messages} messages"
                if diff.stats.messages
                else "bundle (before all its messages were sent)"
            )
            raise DatapathError(f"{what} failed: {exc}") from exc
        self.installed.record(diff)
        self.touched += diff.size
        stats = diff.stats
        stats.seconds = time.perf_counter() - started
        self.last_commit = stats
        self.commits += 1
        await self._save_group_ids()
        return stats

    def _outcome_unknown(self, diff: Diff) -> None:
        """The bundle's COMMIT went out and no answer came (a timeout, a cancellation, a lost
        connection): a busy ovs-vswitchd may still apply it, after we gave up on it. What the
        switch holds is unknown, so the next commit adopts it again, as after a reconnection
        (``_resync_locked``: every group we want written whole with ADD_OR_MOD, every flow we
        want re-added, the rest of ours deleted), with what this bundle may have added counted
        as held (``InstalledState.mark_uncertain``). A record kept as it was would send
        nothing for a Service the late bundle deleted and is wanted again (it stays missing),
        and ADD a group it added (GROUP_EXISTS, antrea#8190)."""
        self.installed.mark_uncertain(diff)
        self._adopt = True

    def _restore(self, diff: Diff) -> None:
        """A failed commit: everything it took is dirty again."""
        self.desired.restore_dirty(diff.dirty_groups, diff.dirty_flows)
        self._stale_generations |= diff.stale

    # -- the switch's own state -------------------------------------------------------------
    async def resync_switch(self) -> CommitStats:
        """Make the switch hold exactly our desired state, whatever it holds now. Called on
        every (re)connection before any other change is sent."""
        async with self._lock:
            return await self._resync_locked()

    async def drifted(self) -> bool:
        """Does the switch still hold what was committed? (``drift.DriftCheck``: for the
        periodic full resync.)"""
        return await self.drift.drifted()

    async def _save_group_ids(self) -> None:
        await self.group_ids.record(self.installed)

    async def _resync_locked(
        self, watch: Callable[[], AbstractSet[FlowKey]] | None = None
    ) -> CommitStats:
        try:
            present = await self.group_ids.in_switch(
                self.installed, self.desired, self.switch.group_ids
            )
            held = await self.switch.flow_keys(
                pl.COOKIE_APP << pl.COOKIE_APP_SHIFT, pl.COOKIE_APP_MASK
            )
        except ChannelError as exc:  # as a failed commit: nothing was changed yet
            raise DatapathError(f"reading the switch to adopt it failed: {exc}") from exc
        generations = {pl.cookie_generation(c) for c, _ in held}
        self._stale_generations = {
            g
            for g in generations
            if g is not None and g not in (self.generation, pl.LEARNED_GENERATION)
        }
        # Forget what we thought was installed: rewrite everything we want, and delete what
        # we installed and no longer want (a DELETE_STRICT of a missing flow is harmless).
        desired, installed = self.desired, self.installed
        refs = desired.flow_refs
        installed.flows = {k: f for k, f in installed.flows.items() if k not in refs}
        # (a lost group is replayed with the bucket ids and order it had: the same endpoint
        # for each connection conntrack picks up again; groups.plan_group)
        installed.replay_groups.update(installed.groups)
        installed.groups.clear()
        installed.group_ids_changed = True
        # Every group we want is written whole with ADD_OR_MOD: right whether the switch lost
        # it (vswitchd restart) or holds an older agent's version of it.
        installed.unknown_groups = set(present) | set(desired.group_owner)
        desired.dirty_groups = set(installed.unknown_groups)
        dirty_flows = dict.fromkeys(installed.flows)
        if dirty_flows:
            dirty_flows.update(dict.fromkeys(refs))
        else:
            dirty_flows = dict.fromkeys(refs)
        desired.dirty_flows = dirty_flows
        stats = await self._commit_locked()
        stats.onto_empty_switch = not held
        if watch is not None and held:
            watched = watch()
            stats.held_before = frozenset(key for _, key in held if key in watched)
        self._adopt = False
        return stats

    # -- removal ----------------------------------------------------------------------------
    async def remove_all(self) -> Removal:
        """Delete everything of ours the switch holds, whatever this run installed: every flow
        with our cookie's app bits (every generation, learned flows too), then every group of
        ours it may hold (the registry's ids, the installed ones, the listed ones in our range),
        in one bundle; then forget the desired and installed state and record no group ids.
        The next commit adopts the switch as at start-up. (``ovsproxy cleanup`` and
        ``--cleanup``.)"""
        async with self._lock:
            app = pl.COOKIE_APP << pl.COOKIE_APP_SHIFT
            flows = len(await self.switch.flow_cookies(app, pl.COOKIE_APP_MASK))
            recorded = await self.group_ids.recorded()
            present = (
                set(self.installed_groups) | self.installed.unknown_groups | (recorded or set())
            )
            listed: set[int] | None = None
            try:
                listed = await self.switch.group_ids()
            except Exception as exc:  # statistics too large to list: the registry's ids only
                log.warning("cannot list the switch's groups (%s): removing recorded ones", exc)
            present = {gid for gid in present | (listed or set()) if self.group_ids.ours(gid)}
            # What was there: the listed ones when the switch could list them.
            groups = tuple(sorted(present if listed is None else present & listed))
            if flows or present:
                bundle = self.switch.bundle()
                try:
                    bundle.add(of.FlowMod.delete(cookie=app, cookie_mask=pl.COOKIE_APP_MASK))
                    for gid in sorted(present):  # a DELETE of a missing group is a no-op
                        bundle.add(delete_group(gid))
                    await bundle.commit()
                except BaseException:
                    with contextlib.suppress(Exception):
                        await bundle.discard()
                    raise
            self.desired.clear()
            installed = self.installed
            installed.flows.clear()
            installed.groups.clear()
            installed.unknown_groups.clear()
            self._stale_generations.clear()
            self._adopt = True
            await self.group_ids.forget(recorded)
            return Removal(flows, groups)

    # -- introspection ----------------------------------------------------------------------
    def dump(self) -> list[str]:
        """Installed groups and flows in ovs-ofctl syntax."""
        return dump_lines(self.installed_groups, self.installed_flows)

    def installed_snapshot(self) -> tuple[dict[int, InstalledGroup], InstalledFlows]:
        """Copies of the installed groups and flows for ``dump_lines`` on another thread: the
        dicts are copied; their values are replaced by a commit, never changed in place."""
        return dict(self.installed.groups), InstalledFlows(dict(self.installed.flows))


def dump_lines(
    groups: Mapping[int, InstalledGroup], flows: Mapping[FlowKey, of.FlowMod]
) -> list[str]:
    """Groups and flows in ovs-ofctl syntax, groups by id, flows by table and priority."""
    lines = []
    for gid in sorted(groups):
        group = groups[gid]
        # Text is built per bucket: a large group is no single OpenFlow message.
        text = f"group_id={gid},type=select"
        if group.selection_method is not None:
            text += "," + group.selection_method.to_text()
        # in the switch's order, as ovs-ofctl dump-groups prints them
        for key, spec in group.buckets.items():
            bucket = of.Bucket(group.ids[key], spec.actions, spec.weight)
            text += "," + bucket.to_text(of.GroupType.SELECT)
        lines.append(text)
    ordered = sorted(flows.values(), key=lambda f: (f.table_id, -f.priority, of.format_flow(f)))
    lines.extend(of.format_flow(f) for f in ordered)
    return lines
