"""TEST FAKE of the Kubernetes API server. Not a real API server; for tests only.

No kube-apiserver can run here, so the tests of the Kubernetes source talk real HTTP/1.1 to
this in-process stand-in on 127.0.0.1 (a random port). It implements the parts of the
list/watch protocol an informer depends on, with the API server's semantics:

* list with ``limit`` and ``continue`` tokens, each page a view of one snapshot, and the
  snapshot's ``resourceVersion`` in the list metadata; an expired token answers 410;
* watch (``watch=true``, chunked JSON lines) from a ``resourceVersion``: ADDED, MODIFIED,
  DELETED, and BOOKMARK (with ``allowWatchBookmarks``); ``timeoutSeconds``;
* ``labelSelector`` (``k``, ``!k``, ``k=v``, ``k!=v``), including the watch semantics of an
  object entering (ADDED) or leaving (DELETED) the selection;
* ``fieldSelector`` on ``metadata.name`` and ``metadata.namespace`` (``f=v``, ``f==v``,
  ``f!=v``; any other field or operator answers 400, as the API server does for a field
  label it does not support), with the same list and watch semantics;
* 410 Gone for a watch from a resourceVersion older than the kept history: as an HTTP 410
  (``gone_as="status"``) or as a 200 with an ERROR event of code 410 (``gone_as="event"``).

A test drives it with ``apply``/``delete`` (synchronous, so several can happen between two
awaits, i.e. atomically for the client), ``compact`` (expire the watch window and the
continue tokens), ``break_watches`` (end, abort or expire the open watch streams),
``send_bookmarks`` and ``fail_next``. ``requests`` records what the client asked, and
``on_request`` lets a test act at a precise point (say, between two list pages).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

Obj = dict[str, Any]

# (group, version, plural) -> (kind, namespaced)
RESOURCES: dict[tuple[str, str, str], tuple[str, bool]] = {
    ("", "v1", "services"): ("Service", True),
    ("discovery.k8s.io", "v1", "endpointslices"): ("EndpointSlice", True),
    ("networking.k8s.io", "v1", "servicecidrs"): ("ServiceCIDR", False),
    ("", "v1", "nodes"): ("Node", False),
}
# The fields every kind can be selected by.
SELECTABLE_FIELDS = ("metadata.name", "metadata.namespace")
_BY_PLURAL = {plural: (group, version) for group, version, plural in RESOURCES}


def parse_selector(text: str | None) -> list[tuple[str, str, str | None]]:
    """``a,!b,c=d,e!=f`` -> [(op, key, value)]. Only what kube-proxy style clients send."""
    requirements: list[tuple[str, str, str | None]] = []
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        if part.startswith("!"):
            requirements.append(("!", part[1:], None))
        elif "!=" in part:
            key, value = part.split("!=", 1)
            requirements.append(("!=", key, value))
        elif "=" in part:
            key, value = part.replace("==", "=").split("=", 1)
            requirements.append(("=", key, value))
        else:
            requirements.append(("exists", part, None))
    return requirements


def selector_matches(requirements: list[tuple[str, str, str | None]], obj: Obj | None) -> bool:
    if obj is None:
        return False
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for op, key, value in requirements:
        if op == "!" and key in labels:
            return False
        if op == "exists" and key not in labels:
            return False
        if op == "=" and labels.get(key) != value:
            return False
        if op == "!=" and labels.get(key) == value:
            return False
    return True


class BadSelector(ValueError):
    """A field selector the API server would refuse (400)."""


def parse_field_selector(text: str | None) -> list[tuple[str, str, str | None]]:
    """``metadata.name=x,metadata.namespace!=y`` -> [(op, field, value)]."""
    requirements = parse_selector(text)
    for op, name, _value in requirements:
        if op not in ("=", "!="):
            raise BadSelector(f"invalid field selector requirement {name!r}: needs = or !=")
        if name not in SELECTABLE_FIELDS:
            raise BadSelector(f'field label not supported: "{name}"')
    return requirements


def fields_match(requirements: list[tuple[str, str, str | None]], obj: Obj | None) -> bool:
    if obj is None:
        return False
    meta = obj.get("metadata") or {}
    for op, name, value in requirements:
        actual = meta.get(name.removeprefix("metadata."), "")
        if (op == "=") != (actual == value):
            return False
    return True


@dataclass
class Request:
    method: str
    path: str
    params: dict[str, str]


@dataclass
class _Change:
    resource_version: int
    plural: str
    old: Obj | None
    new: Obj | None


_END = "end"
_ABORT = "abort"
_GONE = "gone"


@dataclass(frozen=True)
class _Bookmark:
    # Taken when queued: every change up to here is ahead of it in the queue.
    resource_version: int


@dataclass(frozen=True)
class _Raw:
    """Bytes written into a watch stream as they are (no JSON, no newline added)."""

    resource_version: int
    plural: str
    data: bytes
    repeat: int = 1


@dataclass(eq=False)
class _Watcher:
    plural: str
    namespace: str | None
    selector: list[tuple[str, str, str | None]]
    bookmarks: bool
    fields: list[tuple[str, str, str | None]] = field(default_factory=list)
    queue: asyncio.Queue[_Change | _Bookmark | _Raw | str] = field(default_factory=asyncio.Queue)


_STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
    b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
)


def _status(code: int, reason: str, message: str) -> Obj:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class FakeKubeApi:
    """An in-process fake API server for tests (see the module docstring)."""

    def __init__(
        self,
        *,
        gone_as: Literal["event", "status"] = "event",
        bookmark_interval: float | None = None,
    ) -> None:
        self.gone_as = gone_as
        self.bookmark_interval = bookmark_interval  # None: bookmarks only on send_bookmarks()
        self.requests: list[Request] = []
        # Called with each request before it is answered: a test's hook into the timing.
        self.on_request: Callable[[Request], None] | None = None
        self._rv = 1
        self._objects: dict[str, dict[tuple[str, str], Obj]] = {p: {} for p in _BY_PLURAL}
        self._history: list[_Change] = []
        self._raw: list[_Raw] = []  # bytes in the streams, at their resourceVersion
        self._oldest_rv = 1  # a watch may start from here on
        self._snapshots: dict[int, tuple[int, list[Obj]]] = {}
        self._snapshot_ids = itertools.count(1)
        self._watchers: set[_Watcher] = set()
        self._failures: list[int] = []
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self.port = 0

    # --- lifecycle --------------------------------------------------------------------

    async def __aenter__(self) -> FakeKubeApi:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._on_connection, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self.break_watches(mode=_ABORT)
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        for task in list(self._connections):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._server is not None:
            await self._server.wait_closed()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kubeconfig(self, path: Path) -> Path:
        """Write a kubeconfig that points lightkube at this fake."""
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": "fake", "user": {"token": "fake-token"}}],
                    "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
                    "current-context": "fake",
                }
            )
        )
        return path

    # --- what tests do ----------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        return self._rv

    def objects(self, plural: str) -> dict[tuple[str, str], Obj]:
        return self._objects[plural]

    def apply(self, plural: str, obj: Obj) -> Obj:
        """Create or replace an object; returns it as stored (with its resourceVersion)."""
        _, namespaced = RESOURCES[(*_BY_PLURAL[plural], plural)]
        new = copy.deepcopy(obj)
        meta = new.setdefault("metadata", {})
        if namespaced:
            meta.setdefault("namespace", "default")
        else:
            meta.pop("namespace", None)
        key = (meta.get("namespace", ""), meta["name"])
        old = self._objects[plural].get(key)
        meta["uid"] = (old or {}).get("metadata", {}).get("uid") or str(uuid.uuid4())
        # Lists carry items without kind/apiVersion; so do we.
        new.pop("kind", None)
        new.pop("apiVersion", None)
        self._rv += 1
        meta["resourceVersion"] = str(self._rv)
        self._objects[plural][key] = new
        self._record(_Change(self._rv, plural, old, new))
        return new

    def delete(self, plural: str, namespace: str, name: str) -> None:
        old = self._objects[plural].pop((namespace, name))
        self._rv += 1
        self._record(_Change(self._rv, plural, old, None))

    def compact(self) -> None:
        """Expire the watch window: older resourceVersions and continue tokens get 410."""
        self._history.clear()
        self._oldest_rv = self._rv
        self._snapshots.clear()

    def break_watches(self, *, mode: Literal["end", "abort", "gone"] = "end") -> int:
        """End every open watch: cleanly, by dropping the connection, or with ERROR 410."""
        for watcher in self._watchers:
            watcher.queue.put_nowait(mode)
        count = len(self._watchers)
        self._watchers.clear()  # what happens from now on is not theirs to see
        return count

    def send_raw(self, plural: str, data: bytes, *, repeat: int = 1) -> int:
        """Write ``data`` (``repeat`` times) into the watch streams of ``plural`` as it is, at
        a new resourceVersion: what a broken server or proxy sends, a malformed event or a
        line without end. Watches resumed from an older version get it again (it is in the
        history, as an event is); lists are not affected. Returns its resourceVersion."""
        self._rv += 1
        raw = _Raw(self._rv, plural, data, repeat)
        self._raw.append(raw)
        for watcher in self._watchers:
            if watcher.plural == plural:
                watcher.queue.put_nowait(raw)
        return self._rv

    def send_bookmarks(self) -> None:
        for watcher in self._watchers:
            watcher.queue.put_nowait(_Bookmark(self._rv))

    def fail_next(self, count: int, status: int = 500) -> None:
        self._failures.extend([status] * count)

    @property
    def open_watches(self) -> int:
        return len(self._watchers)

    def requests_for(self, plural: str, *, watch: bool | None = None) -> list[Request]:
        return [
            r
            for r in self.requests
            if r.path.endswith("/" + plural)
            and (watch is None or (r.params.get("watch") == "true") == watch)
        ]

    # --- internals --------------------------------------------------------------------

    def _record(self, change: _Change) -> None:
        self._history.append(change)
        for watcher in self._watchers:
            if watcher.plural == change.plural:
                watcher.queue.put_nowait(change)

    def _event_for(self, watcher: _Watcher, change: _Change) -> Obj | None:
        """The watch event this watcher sees for a change, if any (selector semantics)."""
        obj = change.new or change.old
        assert obj is not None
        if watcher.namespace and obj["metadata"].get("namespace") != watcher.namespace:
            return None
        before = self._selected(watcher.selector, watcher.fields, change.old)
        after = self._selected(watcher.selector, watcher.fields, change.new)
        if change.new is None:
            kind, shown = "DELETED", copy.deepcopy(change.old)
            shown["metadata"]["resourceVersion"] = str(change.resource_version)
            return {"type": kind, "object": shown} if before else None
        if before and after:
            return {"type": "MODIFIED", "object": change.new}
        if after:
            return {"type": "ADDED", "object": change.new}
        if before:
            return {"type": "DELETED", "object": change.new}  # left the selection
        return None

    @staticmethod
    def _selected(
        labels: list[tuple[str, str, str | None]],
        fields: list[tuple[str, str, str | None]],
        obj: Obj | None,
    ) -> bool:
        return selector_matches(labels, obj) and fields_match(fields, obj)

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            method, target, _ = head.split(b"\r\n", 1)[0].decode().split(" ", 2)
            url = urlsplit(target)
            params = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
            request = Request(method, url.path, params)
            self.requests.append(request)
            if self.on_request is not None:
                self.on_request(request)
            await self._handle(method, url.path, params, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _handle(
        self, method: str, path: str, params: dict[str, str], writer: asyncio.StreamWriter
    ) -> None:
        if self._failures:
            code = self._failures.pop(0)
            await self._respond(writer, code, _status(code, "InternalError", "injected failure"))
            return
        route = self._route(path)
        if method != "GET" or route is None:
            await self._respond(writer, 404, _status(404, "NotFound", f"no route {path}"))
            return
        plural, namespace = route
        selector = parse_selector(params.get("labelSelector"))
        try:
            fields = parse_field_selector(params.get("fieldSelector"))
        except BadSelector as exc:
            await self._respond(writer, 400, _status(400, "BadRequest", str(exc)))
            return
        if params.get("watch") in ("true", "1"):
            await self._watch(writer, plural, namespace, selector, fields, params)
        else:
            await self._list(writer, plural, namespace, selector, fields, params)

    @staticmethod
    def _route(path: str) -> tuple[str, str | None] | None:
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "v1"]:
            rest = parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            rest = parts[3:]
        else:
            return None
        namespace = None
        if len(rest) == 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        if len(rest) != 1 or rest[0] not in _BY_PLURAL:
            return None
        return rest[0], namespace

    async def _list(
        self,
        writer: asyncio.StreamWriter,
        plural: str,
        namespace: str | None,
        selector: list[tuple[str, str, str | None]],
        fields: list[tuple[str, str, str | None]],
        params: dict[str, str],
    ) -> None:
        limit = int(params.get("limit") or 0)
        token = params.get("continue")
        if token:
            snapshot_id, offset = map(int, token.split(":"))
            if snapshot_id not in self._snapshots:
                message = "The provided continue parameter is too old to display a consistent list"
                await self._respond(writer, 410, _status(410, "Expired", message))
                return
            snapshot_rv, items = self._snapshots[snapshot_id]
        else:
            offset = 0
            snapshot_rv = self._rv
            items = [
                copy.deepcopy(obj)
                for key, obj in sorted(self._objects[plural].items())
                if (not namespace or key[0] == namespace) and self._selected(selector, fields, obj)
            ]
            snapshot_id = next(self._snapshot_ids)
        page = items[offset : offset + limit] if limit else items[offset:]
        metadata: Obj = {"resourceVersion": str(snapshot_rv)}
        end = offset + len(page)
        if end < len(items):
            self._snapshots[snapshot_id] = (snapshot_rv, items)
            metadata["continue"] = f"{snapshot_id}:{end}"
            if not selector and not fields:  # the API server counts only unfiltered lists
                metadata["remainingItemCount"] = len(items) - end
        kind, _ = RESOURCES[(*_BY_PLURAL[plural], plural)]
        group, version = _BY_PLURAL[plural]
        body = {
            "kind": f"{kind}List",
            "apiVersion": f"{group}/{version}" if group else version,
            "metadata": metadata,
            "items": page,
        }
        await self._respond(writer, 200, body)

    async def _watch(
        self,
        writer: asyncio.StreamWriter,
        plural: str,
        namespace: str | None,
        selector: list[tuple[str, str, str | None]],
        fields: list[tuple[str, str, str | None]],
        params: dict[str, str],
    ) -> None:
        since = params.get("resourceVersion") or ""
        if since not in ("", "0") and int(since) < self._oldest_rv:
            message = f"too old resource version: {since} ({self._oldest_rv})"
            if self.gone_as == "status":
                await self._respond(writer, 410, _status(410, "Expired", message))
            else:
                writer.write(_STREAM_HEAD)
                await self._chunk(
                    writer, {"type": "ERROR", "object": _status(410, "Expired", message)}
                )
                await self._end_stream(writer)
            return
        watcher = _Watcher(
            plural, namespace, selector, params.get("allowWatchBookmarks") == "true", fields
        )
        replay: list[Obj | _Raw] = []
        if since in ("", "0"):
            # "Any version": the current state as ADDED events, then changes.
            for key, obj in sorted(self._objects[plural].items()):
                if (not namespace or key[0] == namespace) and self._selected(selector, fields, obj):
                    replay.append({"type": "ADDED", "object": obj})
        else:
            since_rv = int(since)
            changes = [c for c in self._history if c.resource_version > since_rv]
            raws = [r for r in self._raw if r.resource_version > since_rv and r.plural == plural]
            # In resourceVersion order: a raw line stays where it was sent among the events.
            for item in sorted([*changes, *raws], key=lambda item: item.resource_version):
                if isinstance(item, _Raw):
                    replay.append(item)
                elif item.plural == plural:
                    event = self._event_for(watcher, item)
                    if event is not None:
                        replay.append(event)
        # Registered in the same step as the replay was taken: no change can fall between.
        self._watchers.add(watcher)
        writer.write(_STREAM_HEAD)
        try:
            for event in replay:
                if isinstance(event, _Raw):
                    await self._write_raw(writer, event)
                else:
                    await self._chunk(writer, event)
            await self._stream(writer, watcher, float(params.get("timeoutSeconds") or 1800))
        finally:
            self._watchers.discard(watcher)
        await self._end_stream(writer)

    @staticmethod
    async def _end_stream(writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    async def _stream(self, writer: asyncio.StreamWriter, watcher: _Watcher, timeout: float):
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while (remaining := deadline - loop.time()) > 0:
            wait = min(remaining, self.bookmark_interval or remaining)
            try:
                item = await asyncio.wait_for(watcher.queue.get(), wait)
            except TimeoutError:
                # An empty queue: everything up to the current version was sent.
                item = _Bookmark(self._rv) if self.bookmark_interval else _END
            if item == _END:
                return
            if item == _ABORT:
                writer.transport.abort()
                raise ConnectionResetError("aborted by the test")
            if item == _GONE:
                message = f"too old resource version ({self._oldest_rv})"
                await self._chunk(
                    writer, {"type": "ERROR", "object": _status(410, "Expired", message)}
                )
                return
            if isinstance(item, _Bookmark):
                if watcher.bookmarks:
                    kind, _ = RESOURCES[(*_BY_PLURAL[watcher.plural], watcher.plural)]
                    meta = {"resourceVersion": str(item.resource_version)}
                    await self._chunk(
                        writer, {"type": "BOOKMARK", "object": {"kind": kind, "metadata": meta}}
                    )
                continue
            if isinstance(item, _Raw):
                await self._write_raw(writer, item)
                continue
            assert isinstance(item, _Change)
            event = self._event_for(watcher, item)
            if event is not None:
                await self._chunk(writer, event)

    @staticmethod
    async def _write_raw(writer: asyncio.StreamWriter, raw: _Raw) -> None:
        for _ in range(raw.repeat):
            writer.write(b"%x\r\n%s\r\n" % (len(raw.data), raw.data))
            await writer.drain()

    @staticmethod
    async def _chunk(writer: asyncio.StreamWriter, event: Obj) -> None:
        data = json.dumps(event).encode() + b"\n"
        writer.write(b"%x\r\n%s\r\n" % (len(data), data))
        await writer.drain()

    @staticmethod
    async def _respond(writer: asyncio.StreamWriter, code: int, body: Obj) -> None:
        data = json.dumps(body).encode()
        reason = {
            200: "OK",
            400: "Bad Request",
            404: "Not Found",
            410: "Gone",
            500: "Internal Server Error",
        }
        writer.write(
            f"HTTP/1.1 {code} {reason.get(code, 'Error')}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
            f"Connection: close\r\n\r\n".encode()
            + data
        )
        await writer.drain()
