"""The fake API server (support/k8s_fake) on an event loop of its own, for synchronous callers.

``bench chaos`` runs its agents against it (the Kubernetes conformance tests, which used this
module's imitation of kube-apiserver's allocators and of the EndpointSlice controller, now run
against the real control plane: tests/conformance/kube.py).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from support.k8s_fake import FakeKubeApi

Obj = dict[str, Any]
T = TypeVar("T")


class FakeApiThread:
    """The fake API server on an event loop of its own (a daemon thread)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.api = FakeKubeApi(bookmark_interval=5.0)
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def start(self) -> None:
        self._thread.start()
        self.call(self.api.start())

    def stop(self) -> None:
        self.call(self.api.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def run(self, func: Callable[[], T]) -> T:
        """Run ``func`` on the API's loop (its watchers' queues belong to that loop)."""

        async def wrapper() -> T:
            return func()

        return self.call(wrapper())

    def apply(self, plural: str, obj: Obj) -> Obj:
        return self.run(lambda: self.api.apply(plural, obj))

    def delete(self, plural: str, namespace: str, name: str) -> None:
        self.run(lambda: self.api.delete(plural, namespace, name))

    def kubeconfig(self, path: Path) -> Path:
        return self.api.kubeconfig(path)
