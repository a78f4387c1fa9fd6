"""Services and EndpointSlices from the Kubernetes API: an informer loop per resource.

The informer speaks the list/watch protocol itself, over the HTTP client lightkube builds
from an in-cluster service account or a kubeconfig (TLS, tokens, exec plugins). lightkube's
own ``AsyncClient.watch`` can not ask for bookmarks, and on 410 it resumes from "now"
without re-listing, which would lose the deletes that happened in the gap; so:

* paged list (``limit`` + ``continue``); an expired continue token restarts the list;
* watch from the list's resourceVersion with ``allowWatchBookmarks``; bookmarks and events
  advance the resourceVersion, so a dropped watch resumes where it was;
* 410 Gone (an HTTP 410, or an ERROR event with code 410) re-lists and diffs against the
  store: deletes for objects that vanished during the gap, updates for changed ones;
* any other failure retries after a capped exponential backoff with jitter: a dropped
  connection (or a 429) resumes the watch; an error status from the server re-lists (from
  some resourceVersions it fails every time: a delete at etcd's compacted revision is a 500);
* a watch line (one event) longer than ``max_event_bytes`` is a failure (the stream is
  dropped, never buffered without end), and so is a line that does not decode; a watch that
  fails ``relist_after`` times in a row at one resourceVersion (a malformed event the server
  sends again on every resumption) re-lists instead, and resumes past it.

``Informer`` is generic over resources: a ``kubejson.Codec`` makes each list page and watch
event into keys, resourceVersions and values, which it delivers to an ``ObjectHandler``. It
keeps only each object's resourceVersion, by key: what a re-list diffs against and what tells
an update from an add. ``KubernetesSource`` runs one for Services and one for EndpointSlices,
whose codecs decode the API's JSON straight into model values (``kubejson``), and delivers
them to a ``SourceHandler``. Both select objects with kube-proxy's label selector
(``convert.proxy_label_selector``): those meant for this proxy by
``service.kubernetes.io/service-proxy-name`` (none: unlabelled ones), never headless ones.
On request it also runs one for ServiceCIDRs and one for this node's Node object (selected
with ``fieldSelector=metadata.name=<node>``, as kube-proxy's node informer).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import msgspec

from ovsproxy.gcpause import gc_paused
from ovsproxy.model import EndpointSlice, Service
from ovsproxy.model.handler import (
    SYNC_ENDPOINT_SLICES,
    SYNC_SERVICES,
    NodeHandler,
    ServiceCIDRHandler,
    SourceHandler,
)
from ovsproxy.model.problems import InvalidObject, InvalidObjectError, SourceError
from ovsproxy.sources import kubejson
from ovsproxy.sources.convert import check_service_proxy_name, proxy_label_selector
from ovsproxy.sources.kubejson import Codec, DictCodec, Event, ObjKey
from ovsproxy.sources.nodes import NodeEvents, node_field_selector
from ovsproxy.sources.servicecidrs import ServiceCIDREvents

try:  # lightkube >= 1.0 builds on httpx2, older releases on httpx
    import httpx2 as httpx
except ImportError:  # pragma: no cover - depends on the installed lightkube
    import httpx  # type: ignore[no-redef]

log = logging.getLogger(__name__)

Obj = dict[str, Any]
# A list at least this long leaves its objects in the collector's permanent generation.
FREEZE_AFTER_LIST = 1000
# One watch event: an object is at most 1.5 MiB in etcd; its JSON, escaped, a few times that.
MAX_WATCH_EVENT_BYTES = 16 << 20
# Watches failing this many times in a row at one resourceVersion: re-list instead of resuming.
RELIST_AFTER_FAILURES = 3
_Value = TypeVar("_Value")
_Handled_contra = TypeVar("_Handled_contra", contravariant=True)


@dataclass(frozen=True, slots=True)
class Resource:
    """Where a kind of object lives in the API."""

    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    def path(self, namespace: str | None = None) -> str:
        base = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        if namespace and self.namespaced:
            base += f"/namespaces/{namespace}"
        return f"{base}/{self.plural}"


SERVICES = Resource("", "v1", "services", "Service")
ENDPOINT_SLICES = Resource("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice")
SERVICE_CIDRS = Resource("networking.k8s.io", "v1", "servicecidrs", "ServiceCIDR", namespaced=False)
NODES = Resource("", "v1", "nodes", "Node", namespaced=False)


@dataclass(frozen=True, slots=True)
class Backoff:
    """Capped exponential backoff with jitter: attempt n waits up to initial * factor**n."""

    initial: float = 0.5
    cap: float = 30.0
    factor: float = 2.0
    jitter: float = 0.5  # the wait is reduced by up to this fraction, at random

    def delay(self, attempt: int, rand: float) -> float:
        """The wait before retry ``attempt`` (0-based), for ``rand`` uniform in [0, 1)."""
        base = min(self.cap, self.initial * self.factor ** min(attempt, 64))
        return base * (1.0 - self.jitter * rand)


class ResourceExpired(Exception):
    """410 Gone: the resourceVersion (or continue token) is older than the server keeps."""


class WatchLineTooLong(Exception):
    """A watch stream sent more than the bound without ending the event's line."""


class ApiStatusError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class ObjectHandler(Protocol[_Handled_contra]):
    """The events of one informer, as its codec's values. ``on_delete`` gets the key only:
    the informer keeps no object."""

    def on_add(self, value: _Handled_contra) -> None: ...

    def on_update(self, value: _Handled_contra) -> None: ...

    def on_delete(self, key: ObjKey) -> None: ...

    def on_synced(self) -> None: ...

    def on_error(self, problem: SourceError) -> None: ...


@dataclass(slots=True)
class InformerStats:
    lists: int = 0  # complete lists, the first included
    pages: int = 0
    watches: int = 0  # watch requests answered with 200
    events: int = 0
    bookmarks: int = 0
    expired: int = 0  # 410 Gone seen, by watch or by list
    failures: int = 0  # other errors (each followed by a backoff)
    stuck_relists: int = 0  # re-lists after relist_after failures at one resourceVersion


class Informer(Generic[_Value]):
    """List, then watch, one resource; ``store`` maps each object's (namespace, name) to its
    resourceVersion."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        resource: Resource,
        handler: ObjectHandler[_Value],
        codec: Codec[_Value],
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
        watch_timeout: tuple[float, float] = (300.0, 600.0),
        backoff: Backoff = Backoff(),
        request_timeout: float = 30.0,
        max_event_bytes: int = MAX_WATCH_EVENT_BYTES,
        relist_after: int = RELIST_AFTER_FAILURES,
    ) -> None:
        self.client = client
        self.resource = resource
        self.handler = handler
        self.codec = codec
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.page_size = page_size
        self.watch_timeout = watch_timeout  # each watch asks the server to end within this
        self.backoff = backoff
        self.request_timeout = request_timeout
        self.max_event_bytes = max_event_bytes
        self.relist_after = relist_after
        self.store: dict[ObjKey, str] = {}
        self.resource_version: str | None = None
        self.synced = False
        self.stats = InformerStats()
        # The last failure ("kubernetes/<plural>: ..."), until a list or a watch succeeds:
        # what /status shows while the informer retries (a 403 names the verb and resource).
        self.problem: str | None = None
        self._failures = 0  # consecutive, for the backoff
        self._failed_at: tuple[str | None, int] = (None, 0)  # (resourceVersion, failures there)
        self._synced_event = asyncio.Event()
        self._name = f"kubernetes/{resource.plural}"

    async def wait_synced(self) -> None:
        await self._synced_event.wait()

    async def run(self) -> None:
        """Run until cancelled. Never raises for API or network trouble."""
        while True:
            try:
                if self.resource_version is None:
                    await self._relist()
                started, events = asyncio.get_running_loop().time(), self.stats.events
                await self._watch()
                if events == self.stats.events and asyncio.get_running_loop().time() - started < 1:
                    # Ended at once and empty: something between us and the server closes
                    # watches; do not hammer it.
                    self._failures += 1
                    await self._sleep_backoff()
            except asyncio.CancelledError:
                raise
            except ResourceExpired as exc:
                self.stats.expired += 1
                self.resource_version = None
                log.info("%s: %s; re-listing", self._name, exc)
                self._failures += 1
                if self._failures > 1:  # the list itself expired again: do not spin
                    await self._sleep_backoff()
            except Exception as exc:
                self.stats.failures += 1
                self._failures += 1
                message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                if isinstance(exc, ApiStatusError) and exc.code != 429:
                    # The server refused to go on from this resourceVersion (e.g. etcd's
                    # "PrevKv=nil" 500 for a delete at the compacted revision, every time
                    # from there): list again, as client-go's reflector does. A dropped
                    # connection or a 429 resumes the watch.
                    self.resource_version = None
                elif self._stuck():
                    message += f"; {self.relist_after} failures at resourceVersion "
                    message += f"{self.resource_version}: re-listing"
                    self.stats.stuck_relists += 1
                    self.resource_version = None
                log.warning("%s: %s; retrying", self._name, message)
                self.problem = f"{self._name}: {message}"
                self.handler.on_error(SourceError(self._name, message))
                await self._sleep_backoff()

    def _stuck(self) -> bool:
        """Count a failure at the current resourceVersion; True when it is the
        ``relist_after``-th in a row there (resuming from it again would fail again)."""
        if self.resource_version is None:
            return False
        version, count = self._failed_at
        count = count + 1 if version == self.resource_version else 1
        self._failed_at = (self.resource_version, count)
        if count >= self.relist_after:
            self._failed_at = (None, 0)
            return True
        return False

    async def _sleep_backoff(self) -> None:
        await asyncio.sleep(self.backoff.delay(self._failures - 1, random.random()))

    def _params(self) -> dict[str, str]:
        params = {"labelSelector": self.label_selector} if self.label_selector else {}
        if self.field_selector:
            params["fieldSelector"] = self.field_selector
        return params

    async def _relist(self) -> None:
        # A list's pages and what they convert to all stay alive: no collector passes over
        # them, from the first page to the freeze (collecting after each page would scan
        # every page decoded so far, again and again). Process-wide, for the list's length.
        with gc_paused():
            items, resource_version = await self._list()
            old = self.store
            self.store = {key: rv for key, (rv, _) in items.items()}
            # Diff against what was known: the events the expired watch could not deliver.
            handler = self.handler
            for key, (rv, value) in items.items():
                previous = old.get(key)
                if previous is None:
                    self._deliver(handler.on_add, value)
                elif previous != rv:
                    self._deliver(handler.on_update, value)
            for key in old:
                if key not in items:
                    self._deliver(handler.on_delete, key)
            if len(items) >= FREEZE_AFTER_LIST:
                gc.freeze()
        self.resource_version = resource_version
        self.stats.lists += 1
        self._failures = 0
        self.problem = None
        if not self.synced:
            self.synced = True
            self._synced_event.set()
            self._deliver(self.handler.on_synced)

    async def _list(self) -> tuple[dict[ObjKey, tuple[str, _Value]], str]:
        params = {**self._params(), "limit": str(self.page_size)}
        items: dict[ObjKey, tuple[str, _Value]] = {}
        resource_version = ""
        while True:
            response = await self.client.get(
                self.resource.path(), params=params, timeout=self.request_timeout
            )
            if response.status_code != 200:
                raise _status_error(response.status_code, response.content)
            page = self.codec.page(response.content)  # (the collector is paused: _relist)
            self.stats.pages += 1
            for key, rv, value in page.items:
                items[key] = (rv, value)
            # Every page is a view of the first page's snapshot; watch from that version.
            resource_version = resource_version or page.resource_version
            if not page.continue_token:
                return items, resource_version
            params["continue"] = page.continue_token

    async def _watch(self) -> None:
        low, high = self.watch_timeout
        server_timeout = random.uniform(low, high)
        params = {
            **self._params(),
            "watch": "true",
            "allowWatchBookmarks": "true",
            "resourceVersion": self.resource_version or "",
            "timeoutSeconds": str(max(1, round(server_timeout))),
        }
        # No read timeout shorter than the server's own: a quiet watch is not a dead one.
        timeout = httpx.Timeout(self.request_timeout, read=server_timeout + 30.0)
        async with self.client.stream(
            "GET", self.resource.path(), params=params, timeout=timeout
        ) as response:
            if response.status_code != 200:
                raise _status_error(response.status_code, await response.aread())
            self.stats.watches += 1
            self.problem = None
            async for line in self._lines(response):
                if line.strip():
                    self._on_event(self.codec.event(line))

    async def _lines(self, response: httpx.Response) -> AsyncIterator[bytes]:
        """The stream's lines, each at most ``max_event_bytes`` (else ``WatchLineTooLong``:
        nothing is kept past the bound)."""
        pending = bytearray()
        async for chunk in response.aiter_bytes():
            start = 0
            while (end := chunk.find(b"\n", start)) >= 0:
                if len(pending) + end - start > self.max_event_bytes:
                    raise self._too_long()
                if pending:
                    pending += chunk[start:end]
                    yield bytes(pending)
                    pending.clear()
                else:
                    yield chunk[start:end]
                start = end + 1
            pending += chunk[start:]
            if len(pending) > self.max_event_bytes:
                raise self._too_long()
        if pending:
            yield bytes(pending)

    def _too_long(self) -> WatchLineTooLong:
        return WatchLineTooLong(
            f"a watch event longer than {self.max_event_bytes:,} bytes; dropping the stream"
        )

    def _on_event(self, event: Event[_Value]) -> None:
        kind = event.type
        if kind == "ERROR":
            status = event.status or {}
            code = status.get("code") or 0
            message = status.get("message") or status.get("reason") or "watch error"
            if code == 410:
                raise ResourceExpired(message)
            raise ApiStatusError(code, message)
        resource_version = event.resource_version
        if kind == "BOOKMARK":
            self.stats.bookmarks += 1
        elif kind in ("ADDED", "MODIFIED"):
            key = event.key
            known = key in self.store
            self.store[key] = resource_version
            callback = self.handler.on_update if known else self.handler.on_add
            self._deliver(callback, event.value)
        elif kind == "DELETED":
            # Also what the server sends when an object stops matching the label selector.
            if self.store.pop(event.key, None) is not None:
                self._deliver(self.handler.on_delete, event.key)
        else:
            log.warning("%s: unknown watch event type %.80r", self._name, kind)
        self.stats.events += 1
        if resource_version:
            self.resource_version = resource_version
        self._failures = 0

    def _deliver(self, callback: Callable[..., None], *args: Any) -> None:
        # A handler bug must not stop the informer (nor lose its place in the stream).
        try:
            callback(*args)
        except Exception as exc:
            log.exception("%s: handler failed", self._name)
            with contextlib.suppress(Exception):
                self.handler.on_error(SourceError(self._name, f"handler failed: {exc!r}"))


def _status_error(code: int, body: bytes) -> Exception:
    try:
        status = kubejson.decode_json(body)
        message = status.get("message") or status.get("reason") or ""
    except (msgspec.DecodeError, AttributeError):
        message = body[:200].decode("utf-8", "replace")
    if code == 410:
        return ResourceExpired(message or "410 Gone")
    return ApiStatusError(code, message)


SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def in_cluster_config(service_account: str = SERVICE_ACCOUNT_DIR) -> Any:
    """A pod's own configuration, as client-go's ``rest.InClusterConfig``: the server from
    ``$KUBERNETES_SERVICE_HOST``/``_PORT``, the token, CA and namespace from the service
    account's files. Raises ``ValueError`` naming what is missing."""
    from lightkube.config.kubeconfig import KubeConfig

    missing = [
        v for v in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT") if not os.environ.get(v)
    ]
    missing += [
        f"{service_account}/{name}"
        for name in ("token", "ca.crt", "namespace")
        if not os.path.isfile(os.path.join(service_account, name))
    ]
    if missing:
        raise ValueError(f"in-cluster: {', '.join(missing)} missing (not running in a pod?)")
    return KubeConfig.from_service_account(service_account=service_account)


def kube_http_client(
    *,
    kubeconfig: str | os.PathLike[str] | None = None,
    in_cluster: bool = False,
    context: str | None = None,
    timeout: float = 10.0,
    trust_env: bool = True,
) -> httpx.AsyncClient:
    """An HTTP client for the API server, configured by lightkube.

    ``in_cluster``: the pod's service account (``in_cluster_config``) and nothing else;
    ``kubeconfig``: that file; neither: lightkube's order (the in-cluster service account,
    then ``$KUBECONFIG``, then ``~/.kube/config``).
    """
    from lightkube.config.client_adapter import AsyncClient, ConnectionParams
    from lightkube.config.kubeconfig import KubeConfig

    if in_cluster and kubeconfig:
        raise ValueError("kubeconfig and in-cluster: choose one")
    if in_cluster:
        config = in_cluster_config()
    else:
        config = KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_env()
    single = config.get(context_name=context)
    if single is None:
        where = kubeconfig or "$KUBECONFIG / ~/.kube/config / in-cluster"
        raise ValueError(f"kubeconfig {where}: no context {context or '(current)'} to use")
    params = ConnectionParams(timeout=httpx.Timeout(timeout), trust_env=trust_env)
    client: httpx.AsyncClient = AsyncClient(single, params)
    client.headers["Accept"] = "application/json"
    client.headers["User-Agent"] = "ovsproxy"
    return client


_Model = TypeVar("_Model", Service, EndpointSlice)


@dataclass(slots=True)
class _ModelEvents(Generic[_Model]):
    """Converted objects of one kind (or why one was rejected) -> the SourceHandler."""

    handler: SourceHandler
    sync_name: str
    add: Callable[[_Model], None]
    update: Callable[[_Model], None]
    delete: Callable[[str, str], None]

    def on_add(self, value: _Model | InvalidObjectError) -> None:
        if isinstance(value, InvalidObjectError):
            self._rejected(value)
        else:
            self.add(value)

    def on_update(self, value: _Model | InvalidObjectError) -> None:
        # A rejected update is skipped: the handler keeps the last valid version, if any.
        if isinstance(value, InvalidObjectError):
            self._rejected(value)
        else:
            self.update(value)

    def on_delete(self, key: ObjKey) -> None:
        namespace, name = key
        if namespace and name:
            self.delete(namespace, name)

    def on_synced(self) -> None:
        self.handler.on_synced(self.sync_name)

    def on_error(self, problem: SourceError) -> None:
        self.handler.on_error(problem)

    def _rejected(self, exc: InvalidObjectError) -> None:
        for error in exc.errors:
            log.warning("%s", error)
        self.handler.on_error(InvalidObject(exc.errors))


class KubernetesSource:
    """Services and EndpointSlices from the API server into a ``SourceHandler``.

    ``await start()`` creates the client and the two informers (running as tasks; each
    reports its kind synced after its first list); ``await wait_synced()`` waits for both;
    ``await stop()`` cancels them and closes the client. Also an async context manager.
    ``informer(resource, handler)`` runs another informer on the same client, stopped with the
    rest; ``service_cidrs(handler)`` runs the ServiceCIDR one and ``node(handler, name)`` the
    one of this node's Node object, converting their objects.
    """

    services: Informer[Service | InvalidObjectError]  # set by start()
    endpoint_slices: Informer[EndpointSlice | InvalidObjectError]

    def __init__(
        self,
        handler: SourceHandler,
        *,
        client: httpx.AsyncClient | None = None,
        kubeconfig: str | os.PathLike[str] | None = None,
        in_cluster: bool = False,
        context: str | None = None,
        page_size: int = 500,
        watch_timeout: tuple[float, float] = (300.0, 600.0),
        backoff: Backoff = Backoff(),
        service_proxy_name: str | None = None,
        max_event_bytes: int = MAX_WATCH_EVENT_BYTES,
    ) -> None:
        self.handler = handler
        self.service_proxy_name = check_service_proxy_name(service_proxy_name)
        self._client = client
        self._owns_client = client is None
        self._kubeconfig = kubeconfig
        self._in_cluster = in_cluster
        self._context = context
        self._options: dict[str, Any] = {
            "page_size": page_size,
            "watch_timeout": watch_timeout,
            "backoff": backoff,
            "max_event_bytes": max_event_bytes,
        }
        self.informers: list[Informer[Any]] = []
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> KubernetesSource:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            raise RuntimeError("KubernetesSource is not started")
        return self._client

    @property
    def api_server_host(self) -> str | None:
        """The API server's host (an address or a name), once ``start`` made the client."""
        return self._client.base_url.host if self._client is not None else None

    async def start(self) -> None:
        if self._client is None:
            # Reads the kubeconfig or service-account files: small, but still blocking.
            self._client = await asyncio.to_thread(
                kube_http_client,
                kubeconfig=self._kubeconfig,
                in_cluster=self._in_cluster,
                context=self._context,
            )
        handler = self.handler
        services = _ModelEvents(
            handler,
            SYNC_SERVICES,
            handler.on_service_add,
            handler.on_service_update,
            handler.on_service_delete,
        )
        slices = _ModelEvents(
            handler,
            SYNC_ENDPOINT_SLICES,
            handler.on_endpoint_slice_add,
            handler.on_endpoint_slice_update,
            handler.on_endpoint_slice_delete,
        )
        selector = proxy_label_selector(self.service_proxy_name)
        self.services = self.informer(
            SERVICES,
            services,
            kubejson.service_codec(self.service_proxy_name),
            label_selector=selector,
        )
        self.endpoint_slices = self.informer(
            ENDPOINT_SLICES, slices, kubejson.endpoint_slice_codec(), label_selector=selector
        )

    def informer(
        self,
        resource: Resource,
        handler: ObjectHandler[_Value],
        codec: Codec[_Value] | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> Informer[_Value]:
        """Run an informer for ``resource`` on this client. Without a ``codec``, its objects
        reach ``handler`` as decoded JSON (dicts)."""
        if codec is None:
            codec = DictCodec(_as_is, namespaced=resource.namespaced)  # type: ignore[arg-type]
        informer = Informer(
            self.client,
            resource,
            handler,
            codec,
            label_selector=label_selector,
            field_selector=field_selector,
            **self._options,
        )
        self.informers.append(informer)
        self._tasks.append(asyncio.create_task(informer.run(), name=f"informer-{resource.plural}"))
        return informer

    def service_cidrs(self, handler: ServiceCIDRHandler) -> Informer[Obj]:
        """Run a ServiceCIDR informer; its objects reach ``handler`` as model values."""
        return self.informer(SERVICE_CIDRS, ServiceCIDREvents(handler))

    def node(self, handler: NodeHandler, node_name: str) -> Informer[Obj]:
        """Run an informer for the Node named ``node_name`` alone (a field selector, as
        kube-proxy's); it reaches ``handler`` as a model value."""
        return self.informer(
            NODES, NodeEvents(handler), field_selector=node_field_selector(node_name)
        )

    async def wait_synced(self) -> None:
        await asyncio.gather(*(informer.wait_synced() for informer in self.informers))

    @property
    def problems(self) -> list[str]:
        """What each informer that is failing now last failed with (``/status``)."""
        return [informer.problem for informer in self.informers if informer.problem]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self._owns_client and self._client is not None:
            await self._client.aclose()
            self._client = None


def _as_is(obj: Obj) -> Obj:
    return obj
