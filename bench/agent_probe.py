"""The real agent (``ovsproxy.agent.Agent``, configured as ``ovsproxy run`` would be), run in
its own process with timers wrapped around the functions that own each phase, so the
benchmarks can say where a cold start's time goes and how long an event takes to reach the
switch. Nothing in src is changed: the wrappers replace module and class attributes before
the agent starts (a missing one fails loudly: the phase map is out of date).

    python -m bench.agent_probe '{"config": {...}, "decoder": "msgspec", "spawned_at": T}'

Prints one JSON line ``{"event": "ready", ...}`` when the agent's first sync is done, then
answers commands read from stdin, one JSON object a line, with one JSON line each:

* ``{"cmd": "min_interval", "value": S}``: set the sync runner's minimum interval;
* ``{"cmd": "window"}``: start a measurement window (clears the event latencies);
* ``{"cmd": "report", "expect": N}``: wait until N events are committed (or 60 s), then
  report the window: event -> commit reply latencies, syncs, messages and bytes sent;
* ``{"cmd": "stop"}``.

Phases (seconds; sums of the wrapped calls, wall time where said):

* list: per informer, the paged list (HTTP, decode and convert, wall), of which ``decode``
  is the JSON decoder (the agent's: msgspec into ``sources.schema``'s Structs, and into
  dicts for an object that does not fit them) and ``convert`` the Structs (or dicts) into
  model values (``kubejson.service_value``/``slice_value``,
  ``convert_service``/``convert_endpoint_slice``);
  deliver: the list's values handed to the handler (wall), of which ``track`` (the
  tracker's handlers). With another ``decoder`` (``json``, ``orjson``, ``msgspec-dicts``),
  the agent takes ``kubejson``'s dict codecs: that decoder into dicts, then
  ``convert_service``/``convert_endpoint_slice`` (``msgspec.convert`` into the Structs, then
  the one converter);
* sync: the first full ``Proxier.sync`` (wall), of which ``track`` (checkpoint + snapshot),
  ``build`` (``service_flows.frontend_objects``), ``stage`` (``SwitchSync.stage``), ``commit``
  (``SwitchSync.commit``: plan, encode, stream the bundle, OVS's reply); the rest is the
  proxier's own (endpoint selection, group ids, status records);
* gc: cyclic garbage collections, everywhere (a window's report also gives how many and the
  longest).

Event latency (churn): the bench stamps each EndpointSlice update with its send time
(annotation ``bench.ovsproxy/sent``); the conversion of the slice reads it and the
informer's update handler notes it, the tracker's
checkpoint hands the noted events to that sync, and the sync's commit reply ends them. The
report also gives each event's delivery (send -> the informer's handler: the fake API, the
HTTP stream and the decode) and a per-sync log (start, wall, commit, changes, events). With
``"stall_log": PATH`` in the spec, a thread writes the main thread's stack to PATH whenever
the event loop is late by more than 50 ms (diagnostics; off in the benchmarks).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

STAMP = "bench.ovsproxy/sent"
T0 = time.time()


class Timer:
    """Accumulates the time of wrapped calls."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0

    def wrap(self, func: Callable[..., Any]) -> Callable[..., Any]:
        clock = time.perf_counter

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = clock()
            try:
                return func(*args, **kwargs)
            finally:
                self.seconds += clock() - started
                self.calls += 1

        return timed

    def wrap_async(self, func: Callable[..., Any]) -> Callable[..., Any]:
        clock = time.perf_counter

        async def timed(*args: Any, **kwargs: Any) -> Any:
            started = clock()
            try:
                return await func(*args, **kwargs)
            finally:
                self.seconds += clock() - started
                self.calls += 1

        return timed


def _decoder(name: str) -> Callable[[Any], Any]:
    """A decoder into dicts, for ``kubejson``'s dict codecs."""
    if name == "json":
        return json.loads
    if name == "orjson":
        import orjson

        return orjson.loads
    if name == "msgspec-dicts":
        import msgspec

        return msgspec.json.Decoder().decode
    raise ValueError(f"unknown decoder {name!r}")


# The agent's decoders (msgspec into kubejson's Structs, and into dicts for the rest).
_TYPED_DECODERS = (
    "decode_service_list",
    "decode_slice_list",
    "decode_service",
    "decode_slice",
    "decode_event",
    "decode_keyed",
    "decode_json",
)


def _patch(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
    if not hasattr(owner, name):
        raise RuntimeError(f"agent_probe: {owner!r} has no {name}: update the phase map")
    setattr(owner, name, make(getattr(owner, name)))


class Probe:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.timers = {
            k: Timer()
            for k in (
                "decode",
                "parse",
                "convert",
                "track",
                "sync_track",
                "build",
                "stage",
                "commit",
                "sync",
            )
        }
        self.lists: dict[str, dict[str, float]] = {}
        self.marks: dict[str, float] = {}
        self.rss: dict[str, int] = {}  # kB at some marks
        self.gc_seconds = 0.0
        self.gc_collections = 0
        self._gc_started = 0.0
        self.gc_by_generation: dict[str, list[float]] = {}  # generation -> [count, seconds]
        self.gc_longest = 0.0  # the longest single collection since the window started
        self.syncs: list[dict[str, float]] = []
        # event latency: stamps noted by the informer, handed to a sync at its checkpoint
        # (sent, noted): the bench's stamp and when the informer's handler saw the event
        self.noted: list[tuple[float, float]] = []
        # (kind, namespace, name) -> the stamp its conversion read, until its update is noted
        self.stamps: dict[tuple[str, str, str], str] = {}
        self.in_sync: list[tuple[float, float]] = []
        self.latencies: list[float] = []  # sent -> commit reply
        self.window_started_at = 0.0  # events sent earlier are not the window's
        self.carried_over = 0
        self.deliveries: list[float] = []  # sent -> the informer's handler
        self.committed_at = 0.0
        self.agent: Any = None

    def mark(self, name: str) -> None:
        self.marks.setdefault(name, time.time() - self.spec.get("spawned_at", T0))

    # -- wiring -------------------------------------------------------------------------------
    def install(self) -> None:
        from ovsproxy.datapath import service_flows as svc
        from ovsproxy.datapath.switch_sync import SwitchSync
        from ovsproxy.proxy.proxier import Proxier
        from ovsproxy.sources import kubejson
        from ovsproxy.sources import kubernetes as k8s

        t = self.timers
        probe = self
        decoder = self.spec.get("decoder", "msgspec")
        if decoder == "msgspec":
            for name in _TYPED_DECODERS:
                _patch(kubejson, name, t["decode"].wrap)
        else:
            kubejson.decode_json = t["decode"].wrap(_decoder(decoder))
            _patch(kubejson, "service_codec", lambda _: kubejson.dict_service_codec)
            _patch(kubejson, "endpoint_slice_codec", lambda _: kubejson.dict_endpoint_slice_codec)

        def stamped(read: Callable[[Any], Any]) -> Callable[[Any], Callable[..., Any]]:
            def wrap(convert: Callable[..., Any]) -> Callable[..., Any]:
                def converted(obj: Any, *args: Any, **kwargs: Any) -> Any:
                    value = convert(obj, *args, **kwargs)
                    stamp = read(obj)
                    if stamp is not None:
                        probe.stamps[type(value).__name__, value.namespace, value.name] = stamp
                    return value

                return t["convert"].wrap(converted)

            return wrap

        def struct_stamp(obj: Any) -> Any:
            annotations = obj.metadata.annotations if obj.metadata is not None else None
            return annotations.get(STAMP) if annotations else None

        def dict_stamp(obj: Any) -> Any:
            return ((obj.get("metadata") or {}).get("annotations") or {}).get(STAMP)

        _patch(kubejson, "service_value", t["convert"].wrap)
        _patch(kubejson, "slice_value", stamped(struct_stamp))
        _patch(kubejson, "convert_service", t["convert"].wrap)
        _patch(kubejson, "convert_endpoint_slice", stamped(dict_stamp))
        _patch(svc, "frontend_objects", t["build"].wrap)
        _patch(SwitchSync, "stage", t["stage"].wrap)

        def wrap_commit(commit: Callable[..., Any]) -> Callable[..., Any]:
            timed = t["commit"].wrap_async(commit)

            async def committed(*args: Any, **kwargs: Any) -> Any:
                result = await timed(*args, **kwargs)
                probe.committed_at = time.time()
                return result

            return committed

        _patch(SwitchSync, "commit", wrap_commit)

        def wrap_sync(sync: Callable[..., Any]) -> Callable[..., Any]:
            async def timed(proxier: Any, full: bool = False) -> Any:
                before = {k: t[k].seconds for k in ("sync_track", "build", "stage", "commit")}
                started, started_at = time.perf_counter(), time.time()
                result = await sync(proxier, full)
                wall = time.perf_counter() - started
                if result.full and "sync_started" not in probe.marks:
                    spawned = probe.spec.get("spawned_at", T0)
                    probe.marks["sync_started"] = started_at - spawned
                    probe.marks["sync_done"] = time.time() - spawned
                t["sync"].seconds += wall
                t["sync"].calls += 1
                events = 0
                if probe.in_sync and result.commit.messages:
                    probe.latencies.extend(probe.committed_at - s for s, _ in probe.in_sync)
                    probe.deliveries.extend(n - s for s, n in probe.in_sync)
                    events = len(probe.in_sync)
                    probe.in_sync = []
                if result.changed or result.full:
                    entry = {k: t[k].seconds - v for k, v in before.items()}
                    entry.update(
                        at=started_at,
                        events=events,
                        wall=wall,
                        changed=result.changed,
                        messages=result.commit.messages,
                        full=result.full,
                    )
                    probe.syncs.append(entry)
                return result

            return timed

        _patch(Proxier, "sync", wrap_sync)

        def wrap_list(method: Callable[..., Any]) -> Callable[..., Any]:
            async def timed(informer: Any) -> Any:
                probe.mark("list_started")
                started = time.perf_counter()
                decode_before = t["decode"].seconds
                result = await method(informer)
                entry = probe.lists.setdefault(informer.resource.plural, {})
                entry["list_s"] = time.perf_counter() - started
                entry["decode_s"] = t["decode"].seconds - decode_before
                entry["pages"] = informer.stats.pages
                entry["objects"] = len(result[0])
                return result

            return timed

        def wrap_relist(method: Callable[..., Any]) -> Callable[..., Any]:
            async def timed(informer: Any) -> Any:
                started = time.perf_counter()
                before = t["convert"].seconds, t["track"].seconds
                await method(informer)
                entry = probe.lists.setdefault(informer.resource.plural, {})
                entry["deliver_s"] = time.perf_counter() - started - entry.get("list_s", 0.0)
                entry["convert_s"] = t["convert"].seconds - before[0]
                entry["track_s"] = t["track"].seconds - before[1]
                probe.mark(f"listed_{informer.resource.plural}")
                probe.rss[f"listed_{informer.resource.plural}"] = rss_kb()["VmRSS"]

            return timed

        _patch(k8s.Informer, "_list", wrap_list)
        _patch(k8s.Informer, "_relist", wrap_relist)

        def wrap_update(method: Callable[..., Any]) -> Callable[..., Any]:
            def noted(events: Any, value: Any) -> None:
                key = (
                    type(value).__name__,
                    getattr(value, "namespace", ""),
                    getattr(value, "name", ""),
                )
                stamp = probe.stamps.pop(key, None)
                if stamp is not None:
                    sent = float(stamp)
                    if sent >= probe.window_started_at:
                        probe.noted.append((sent, time.time()))
                    else:  # sent before this window: the last window's backlog
                        probe.carried_over += 1
                method(events, value)

            return noted

        _patch(k8s._ModelEvents, "on_update", wrap_update)

        # Manifests: files are read and parsed (and their objects converted) in a thread.
        from ovsproxy.sources import manifests

        _patch(manifests, "parse_manifest", t["parse"].wrap)
        for kind in ("Service", "EndpointSlice"):
            manifests._CONVERTERS[kind] = t["convert"].wrap(manifests._CONVERTERS[kind])

        def wrap_start(method: Callable[..., Any]) -> Callable[..., Any]:
            async def timed(source: Any) -> Any:
                probe.mark("list_started")
                started = time.perf_counter()
                before = t["parse"].seconds, t["convert"].seconds, t["track"].seconds
                await method(source)
                probe.lists["manifests"] = {
                    "load_s": time.perf_counter() - started,
                    "parse_s": t["parse"].seconds - before[0] - (t["convert"].seconds - before[1]),
                    "convert_s": t["convert"].seconds - before[1],
                    "track_s": t["track"].seconds - before[2],
                }
                probe.mark("listed_manifests")
                probe.rss["listed_manifests"] = rss_kb()["VmRSS"]

            return timed

        _patch(manifests.ManifestSource, "start", wrap_start)
        gc.callbacks.append(self._gc)

    def _gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            took = time.perf_counter() - self._gc_started
            self.gc_seconds += took
            self.gc_collections += 1
            self.gc_longest = max(self.gc_longest, took)
            gen = self.gc_by_generation.setdefault(str(info["generation"]), [0, 0.0])
            gen[0] += 1
            gen[1] += took

    def attach(self, agent: Any) -> None:
        """Time the tracker's handlers (the sources bind them at start) and hand the noted
        events to the sync whose checkpoint consumes them."""
        self.agent = agent
        tracker = agent.parts.tracker
        for name in (
            "on_service_add",
            "on_service_update",
            "on_service_delete",
            "on_endpoint_slice_add",
            "on_endpoint_slice_update",
            "on_endpoint_slice_delete",
        ):
            _patch(tracker, name, self.timers["track"].wrap)
        probe = self

        def wrap_checkpoint(method: Callable[..., Any]) -> Callable[..., Any]:
            timed = self.timers["sync_track"].wrap(method)

            def checkpoint() -> Any:
                probe.in_sync.extend(probe.noted)
                probe.noted = []
                return timed()

            return checkpoint

        _patch(tracker, "checkpoint", wrap_checkpoint)
        _patch(tracker, "snapshot", self.timers["sync_track"].wrap)

    # -- reports ------------------------------------------------------------------------------
    def ready_report(self) -> dict[str, Any]:
        first = next((s for s in self.syncs if s["full"]), {})
        t = self.timers
        return {
            "event": "ready",
            "marks": {k: round(v, 4) for k, v in self.marks.items()},
            "lists": {k: {n: round(x, 4) for n, x in v.items()} for k, v in self.lists.items()},
            "first_sync": {k: round(v, 4) if isinstance(v, float) else v for k, v in first.items()},
            "decode_s": round(t["decode"].seconds, 4),
            "parse_s": round(t["parse"].seconds - t["convert"].seconds, 4)
            if t["parse"].calls
            else 0.0,
            "convert_s": round(t["convert"].seconds, 4),
            "track_s": round(t["track"].seconds, 4),
            "gc_s": round(self.gc_seconds, 4),
            "gc_collections": self.gc_collections,
            "syncs": len(self.syncs),
            "rss_kb": rss_kb(),
            "rss_kb_at": probe_rss(self),
            "cpu_s": round(time.process_time(), 3),  # the process's, all threads, to ready
            "flows": len(self.agent.parts.datapath.installed_flows),
            "groups": len(self.agent.parts.datapath.installed_groups),
        }

    def window(self) -> dict[str, Any]:
        self.latencies = []
        self.deliveries = []
        self.noted = []
        self.in_sync = []
        self.window_started_at = time.time()
        self.carried_over = 0
        self.gc_longest = 0.0
        self._window = {
            "started": time.perf_counter(),
            "started_at": time.time(),
            "cpu": time.process_time(),
            "sent": self.agent.parts.channel.counters.total("sent"),
            "syncs": len(self.syncs),
            "gc": self.gc_seconds,
            "gc_collections": self.gc_collections,
            "gc_gen": {g: list(v) for g, v in self.gc_by_generation.items()},
            "decode": self.timers["decode"].seconds,
            "convert": self.timers["convert"].seconds,
            "track": self.timers["track"].seconds,
        }
        return {"event": "window"}

    async def report(self, expect: int) -> dict[str, Any]:
        deadline = time.perf_counter() + 60
        while len(self.latencies) < expect and time.perf_counter() < deadline:  # noqa: ASYNC110 - polled with a deadline
            await asyncio.sleep(0.01)
        w = self._window
        wall = time.perf_counter() - w["started"]
        messages, sent = self.agent.parts.channel.counters.total("sent")
        syncs = self.syncs[w["syncs"] :]
        return {
            "event": "report",
            "latencies": self.latencies,
            "deliveries": self.deliveries,
            # events sent before the window that reached the informer during it (not timed)
            "carried_over": self.carried_over,
            "events_noted_pending": len(self.noted) + len(self.in_sync),
            "wall_s": wall,
            "cpu_s": time.process_time() - w["cpu"],
            "messages": messages - w["sent"][0],
            "bytes": sent - w["sent"][1],
            "syncs": len(syncs),
            "sync_wall_s": sum(s["wall"] for s in syncs),
            "sync_commit_s": sum(s["commit"] for s in syncs),
            "sync_build_s": sum(s["build"] for s in syncs),
            "sync_stage_s": sum(s["stage"] for s in syncs),
            "sync_track_s": sum(s["sync_track"] for s in syncs),
            "changed": sum(s["changed"] for s in syncs),
            # per sync: start (s after the window's), wall, commit (s), changes, events
            "sync_log": [
                [
                    round(s["at"] - w["started_at"], 4),
                    round(s["wall"], 5),
                    round(s["commit"], 5),
                    s["changed"],
                    s["events"],
                ]
                for s in syncs
            ],
            "decode_s": self.timers["decode"].seconds - w["decode"],
            "convert_s": self.timers["convert"].seconds - w["convert"],
            "track_s": self.timers["track"].seconds - w["track"],
            "gc_s": self.gc_seconds - w["gc"],
            "gc_collections": self.gc_collections - w["gc_collections"],
            "gc_longest_s": self.gc_longest,
            "gc_by_generation": {
                g: [
                    c - w["gc_gen"].get(g, [0, 0.0])[0],
                    round(t - w["gc_gen"].get(g, [0, 0.0])[1], 4),
                ]
                for g, (c, t) in self.gc_by_generation.items()
            },
        }


def probe_rss(probe: Probe) -> dict[str, int]:
    return {**probe.rss, "ready": rss_kb()["VmRSS"]}


def rss_kb() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1])
    return out


def emit(payload: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(payload) + "\n")
    sys.stdout.flush()


def _watch_stalls(path: str, threshold: float = 0.05) -> None:
    """Diagnostics: a thread that writes the main thread's stack to ``path`` whenever the
    event loop has not run a 10 ms heartbeat for ``threshold`` seconds."""
    import traceback

    loop = asyncio.get_running_loop()
    main_id = threading.get_ident()
    beat = [time.perf_counter()]

    def tick() -> None:
        beat[0] = time.perf_counter()
        loop.call_later(0.01, tick)

    tick()

    def watch() -> None:
        reported = 0.0
        with open(path, "a") as out:
            while True:
                time.sleep(0.02)
                lag = time.perf_counter() - beat[0]
                if lag > threshold and beat[0] != reported:
                    frame = sys._current_frames().get(main_id)
                    stack = "".join(traceback.format_stack(frame)[-12:]) if frame else ""
                    out.write(f"--- {time.time():.3f} loop late {lag * 1000:.0f} ms\n{stack}")
                    out.flush()
                    reported = beat[0]

    threading.Thread(target=watch, daemon=True).start()


def _start_diagnostics(spec: dict[str, Any]) -> Any:
    """Diagnostics up to the first sync, off in the benchmarks: ``"profile": PATH`` (cProfile
    stats), ``"tracemalloc": PATH`` (the live allocations at ready, by line, as text)."""
    if spec.get("tracemalloc"):
        import tracemalloc

        tracemalloc.start(1)
    if spec.get("profile"):
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
        return profiler
    return None


def _stop_diagnostics(spec: dict[str, Any], profiler: Any) -> None:
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(spec["profile"])
    if spec.get("tracemalloc"):
        import tracemalloc

        gc.collect()
        top = tracemalloc.take_snapshot().statistics("lineno")
        tracemalloc.stop()
        with open(spec["tracemalloc"], "w") as out:
            for stat in top[:60]:
                out.write(f"{stat}\n")


async def main(spec: dict[str, Any]) -> None:
    probe = Probe(spec)
    probe.mark("started")
    profiler = _start_diagnostics(spec)
    from ovsproxy.agent import Agent, setup_logging
    from ovsproxy.config import load

    probe.mark("imported")
    probe.rss["imported"] = rss_kb()["VmRSS"]
    probe.install()
    config = load(**spec["config"])
    setup_logging(config.log_level, config.log_format)
    agent = Agent(config)
    probe.attach(agent)
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    ready = asyncio.create_task(agent.ready.wait())
    await asyncio.wait({task, ready}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()  # the agent failed: raise its error
        raise RuntimeError("the agent stopped before its first sync")
    probe.mark("ready")
    _stop_diagnostics(spec, profiler)
    emit(probe.ready_report())
    if spec.get("stall_log"):
        _watch_stalls(spec["stall_log"])

    loop = asyncio.get_running_loop()
    commands: asyncio.Queue[str] = asyncio.Queue()

    def read_stdin() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(commands.put_nowait, line)
        loop.call_soon_threadsafe(commands.put_nowait, '{"cmd": "stop"}')

    threading.Thread(target=read_stdin, daemon=True).start()
    try:
        while True:
            command = json.loads(await commands.get())
            cmd = command.get("cmd")
            if cmd == "stop":
                break
            if cmd == "min_interval":
                agent.parts.runner.min_interval = float(command["value"])
                emit({"event": "min_interval", "value": agent.parts.runner.min_interval})
            elif cmd == "window":
                emit(probe.window())
            elif cmd == "report":
                emit(await probe.report(int(command.get("expect", 0))))
            else:
                emit({"event": "error", "message": f"unknown command {cmd!r}"})
    finally:
        stop.set()
        await task


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
    os._exit(0)  # no interpreter teardown of a large heap: the bench waits for the exit
