"""A cluster served by the fake Kubernetes API (support/k8s_fake) over real HTTP, for the
agent-level benchmarks (``cold-start``, ``churn``, ``scale``).

(The cluster's objects themselves are built by ``support.cluster``.)
* ``ServingKubeApi``: the fake, answering lists from a cached snapshot with cached encoded
  pages, so what the clock sees is the agent, not the fake deep-copying and encoding 20,000
  objects in Python (a real API server serves lists from its watch cache). Paging is the
  API server's: ``limit`` + ``continue`` over one snapshot, the snapshot's resourceVersion on
  every page, no ``remainingItemCount`` when a label selector is given.
"""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

from support.k8s_fake import FakeKubeApi
from support.k8s_fake.server import _BY_PLURAL, RESOURCES, selector_matches


class ServingKubeApi(FakeKubeApi):
    """The fake API with lists served from a cached snapshot and cached encoded pages (see
    the module docstring). Watches, selectors and 410s are the fake's own."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # (plural, namespace, selector text) -> (resourceVersion, snapshot id, items)
        self._listed: dict[tuple[str, str | None, str], tuple[int, int, list[Any]]] = {}
        self._pages: dict[tuple[int, int, int], bytes] = {}
        self.served_bytes = 0

    def load(self, plural: str, objects: list[dict[str, Any]]) -> None:
        """Store many objects at once (as ``apply`` would, without the per-object copy)."""
        for obj in objects:
            meta = obj["metadata"]
            self._rv += 1
            meta["resourceVersion"] = str(self._rv)
            self._objects[plural][(meta.get("namespace", ""), meta["name"])] = obj
        self._history.clear()
        self._oldest_rv = self._rv

    def prepare(self, plural: str, selector: str, limit: int) -> int:
        """Take the snapshot and encode every page of a list before the clock starts;
        returns the bytes of all pages."""
        requirements = _parse(selector)
        rv, snapshot_id, items = self._snapshot(plural, None, selector, requirements)
        total = 0
        for offset in range(0, max(len(items), 1), limit):
            total += len(self._page(plural, rv, snapshot_id, items, offset, limit, bool(selector)))
        return total

    def pages(self) -> list[bytes]:
        return list(self._pages.values())

    def _snapshot(
        self, plural: str, namespace: str | None, text: str, requirements: Any
    ) -> tuple[int, int, list[Any]]:
        key = (plural, namespace, text)
        cached = self._listed.get(key)
        if cached is not None and cached[0] == self._rv:
            return cached
        items = [
            obj
            for k, obj in sorted(self._objects[plural].items())
            if (not namespace or k[0] == namespace) and selector_matches(requirements, obj)
        ]
        snapshot_id = next(self._snapshot_ids)
        self._snapshots[snapshot_id] = (self._rv, items)
        self._listed[key] = (self._rv, snapshot_id, items)
        return self._listed[key]

    def _page(
        self,
        plural: str,
        rv: int,
        snapshot_id: int,
        items: list[Any],
        offset: int,
        limit: int,
        selected: bool,
    ) -> bytes:
        key = (snapshot_id, offset, limit)
        data = self._pages.get(key)
        if data is None:
            page = items[offset : offset + limit] if limit else items[offset:]
            metadata: dict[str, Any] = {"resourceVersion": str(rv)}
            end = offset + len(page)
            if end < len(items):
                metadata["continue"] = f"{snapshot_id}:{end}"
                if not selected:  # the API server counts only unfiltered lists
                    metadata["remainingItemCount"] = len(items) - end
            kind, _ = RESOURCES[(*_BY_PLURAL[plural], plural)]
            group, version = _BY_PLURAL[plural]
            body = {
                "kind": f"{kind}List",
                "apiVersion": f"{group}/{version}" if group else version,
                "metadata": metadata,
                "items": page,
            }
            data = self._pages[key] = json.dumps(body, separators=(",", ":")).encode()
        return data

    async def _list(
        self, writer: Any, plural: str, namespace: Any, selector: Any, fields: Any, params: Any
    ):
        if fields:  # (the agent's one Node: nothing to make cheaper)
            await super()._list(writer, plural, namespace, selector, fields, params)
            return
        limit = int(params.get("limit") or 0)
        token = params.get("continue")
        if token:
            snapshot_id, offset = map(int, token.split(":"))
            if snapshot_id not in self._snapshots:
                message = "The provided continue parameter is too old to display a consistent list"
                await self._respond(writer, 410, _gone(message))
                return
            rv, items = self._snapshots[snapshot_id]
        else:
            offset = 0
            rv, snapshot_id, items = self._snapshot(
                plural, namespace, params.get("labelSelector") or "", selector
            )
        selected = bool(params.get("labelSelector"))
        data = self._page(plural, rv, snapshot_id, items, offset, limit, selected)
        self.served_bytes += len(data)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(data)
        )
        writer.write(data)
        await writer.drain()

    async def _stream(self, writer: Any, watcher: Any, timeout: float) -> None:
        """The fake's watch stream, cheaper per event: the changes queued by the time the
        stream runs go out as one write (the churn generator sends up to 1,000 a second, and
        a wait and a drain per event made this process the bottleneck). Anything else in
        the queue (an end, an abort, a bookmark) is the fake's own stream's to handle."""
        from support.k8s_fake.server import _Change

        if self.bookmark_interval:
            await super()._stream(writer, watcher, timeout)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        queue = watcher.queue
        while (remaining := deadline - loop.time()) > 0:
            if queue.empty():
                try:
                    item = await asyncio.wait_for(queue.get(), remaining)
                except TimeoutError:
                    return
                queue.put_nowait(item)  # (back at the end of an empty queue: first)
            chunks = []
            while not queue.empty() and isinstance(queue._queue[0], _Change):
                event = self._event_for(watcher, queue.get_nowait())
                if event is not None:
                    data = json.dumps(event).encode() + b"\n"
                    chunks.append(b"%x\r\n%s\r\n" % (len(data), data))
            if chunks:
                writer.write(b"".join(chunks))
                await writer.drain()
            if not queue.empty() and not isinstance(queue._queue[0], _Change):
                # an end, abort, gone or bookmark: the fake's stream takes it from here
                await super()._stream(writer, watcher, max(0.0, deadline - loop.time()))
                return

    def apply_fast(self, plural: str, obj: dict[str, Any]) -> None:
        """``apply`` for an object the caller built fresh and never touches again (no
        deep copy): keeps the churn generator's own cost low."""
        meta = obj["metadata"]
        key = (meta.get("namespace", ""), meta["name"])
        old = self._objects[plural].get(key)
        if old is not None:
            meta["uid"] = old["metadata"].get("uid", meta.get("uid"))
        self._rv += 1
        meta["resourceVersion"] = str(self._rv)
        self._objects[plural][key] = obj
        from support.k8s_fake.server import _Change

        self._record(_Change(self._rv, plural, old, obj))


def _parse(text: str) -> Any:
    from support.k8s_fake.server import parse_selector

    return parse_selector(text)


def _gone(message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "Expired",
        "code": 410,
    }


def copy_object(obj: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(obj)
