"""The Kubernetes source against the real API server (kube-apiserver of the pinned release,
etcd, the controllers: ``ovsproxy.lab.controlplane``), read with the shipped RBAC's token.

What the real server can not be made to do keeps the fake (support/k8s_fake): an HTTP 500 on
demand, and an object it admits that the converter refuses (it validates what we check).
Dropped connections come from a forwarder the test owns (support/tcpcut), which the real
server's clients see as a network that went away.
"""

from __future__ import annotations

import asyncio
import json
import math
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.controlplane import apply_object
from support.k8s_fake import FakeKubeApi
from support.tcpcut import Forwarder

from ovsproxy.lab.controlplane import ControlPlane
from ovsproxy.proxy.tracker import ChangeTracker
from ovsproxy.sources.convert import SERVICE_PROXY_NAME_LABEL
from ovsproxy.sources.kubernetes import SERVICE_CIDRS, Backoff, KubernetesSource

FAST = {"page_size": 5, "watch_timeout": (30.0, 30.0), "backoff": Backoff(initial=0.01, cap=0.1)}
HIDDEN = {SERVICE_PROXY_NAME_LABEL: "other"}


def service(
    i: int, ns: str, port: int = 80, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": f"svc-{i}", "namespace": ns, "labels": labels or {}},
        "spec": {
            "type": "ClusterIP",
            "ipFamilies": ["IPv4"],
            "ports": [{"name": "http", "port": port, "targetPort": 8080, "protocol": "TCP"}],
        },
    }


def endpoint_slice(i: int, ns: str, *addresses: str) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"svc-{i}-abcde",
            "namespace": ns,
            "labels": {
                "kubernetes.io/service-name": f"svc-{i}",
                "endpointslice.kubernetes.io/managed-by": "tests.ovsproxy",
            },
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [
            {"addresses": [a], "conditions": {"ready": True}}
            for a in (addresses or (f"10.244.1.{i}",))
        ],
    }


def delete(api: ControlPlane, kind: str, ns: str, name: str) -> None:
    group = {"services": "/api/v1", "endpointslices": "/apis/discovery.k8s.io/v1"}[kind]
    api.request("DELETE", f"{group}/namespaces/{ns}/{kind}/{name}")


def populate(api: ControlPlane, ns: str, count: int) -> None:
    for i in range(1, count + 1):
        apply_object(api, service(i, ns))
        apply_object(api, endpoint_slice(i, ns))


async def until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Wait for a condition on state the source changes (there is no event for each)."""
    async with asyncio.timeout(timeout):
        while True:
            if predicate():
                return
            await asyncio.sleep(0.01)


def service_names(tracker: ChangeTracker, ns: str | None = None) -> set[str]:
    return {n.name for n in tracker.snapshot() if ns is None or n.namespace == ns}


def via(kubeconfig: Path, port: int, path: Path) -> Path:
    """``kubeconfig`` with its server on 127.0.0.1:``port`` (a forwarder)."""
    config = json.loads(kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{port}"
    path.write_text(json.dumps(config))
    path.chmod(0o600)
    return path


@dataclass(frozen=True)
class Seen:
    """One request the source sent."""

    path: str
    params: dict[str, str]

    @property
    def watch(self) -> bool:
        return self.params.get("watch") == "true"


async def started(
    kubeconfig: Path,
    *,
    seen: list[Seen] | None = None,
    before: Callable[[Seen], Any] | None = None,
    **options: Any,
) -> tuple[ChangeTracker, KubernetesSource]:
    """A source reading with ``kubeconfig``, synced. ``seen`` collects its requests;
    ``before`` (async) runs before each is sent."""
    tracker = ChangeTracker()
    source = KubernetesSource(tracker, kubeconfig=kubeconfig, **{**FAST, **options})
    await source.start()  # the informer tasks have not run yet: hooks see every request

    async def hook(request: Any) -> None:
        request_seen = Seen(request.url.path, dict(request.url.params))
        if seen is not None:
            seen.append(request_seen)
        if before is not None:
            await before(request_seen)

    source.client.event_hooks["request"].append(hook)
    await asyncio.wait_for(source.wait_synced(), 30)
    return tracker, source


def watching(source: KubernetesSource) -> bool:
    return all(informer.stats.watches >= 1 for informer in source.informers)


# -- list and watch -----------------------------------------------------------------------------


async def test_paged_list_then_watch_from_its_resource_version(cp, agent_kubeconfig, ns) -> None:
    populate(cp, ns, 23)
    selector = "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless"
    before = cp.request("GET", "/api/v1/services", params={"labelSelector": selector})
    seen: list[Seen] = []
    tracker, source = await started(agent_kubeconfig, seen=seen)
    try:
        assert tracker.synced
        assert service_names(tracker, ns) == {f"svc-{i}" for i in range(1, 24)}
        assert all(
            len(s.endpoints) == 1 for n, s in tracker.snapshot().items() if n.namespace == ns
        )

        lists = [r for r in seen if r.path == "/api/v1/services" and not r.watch]
        # The server paged: 5 per page, each further page asked with its continue token.
        assert len(lists) == math.ceil(len(before["items"]) / 5) >= 5
        assert [r.params.get("continue") is not None for r in lists] == [False] + [True] * (
            len(lists) - 1
        )
        assert {r.params["limit"] for r in lists} == {"5"}
        assert source.services.stats.pages == len(lists) and source.services.stats.lists == 1
        await until(lambda: watching(source))
        [watch] = [r for r in seen if r.path == "/api/v1/services" and r.watch]
        # From the list's snapshot: no earlier than the state the test saw before starting.
        assert int(watch.params["resourceVersion"]) >= int(before["metadata"]["resourceVersion"])
        assert watch.params["allowWatchBookmarks"] == "true"
        assert watch.params["labelSelector"] == selector
    finally:
        await source.stop()


async def test_watch_events_reach_the_tracker(cp, agent_kubeconfig, ns) -> None:
    populate(cp, ns, 3)
    tracker, source = await started(agent_kubeconfig)
    try:
        tracker.checkpoint()
        await until(lambda: watching(source))
        apply_object(cp, service(4, ns))
        apply_object(cp, endpoint_slice(2, ns, "10.244.1.2", "10.244.2.2"))
        delete(cp, "services", ns, "svc-3")
        await until(lambda: tracker.pending == 3)
        changes = {n.name: c for n, c in tracker.checkpoint().items() if n.namespace == ns}
        assert set(changes) == {"svc-2", "svc-3", "svc-4"}
        assert len(changes["svc-2"].current.endpoints) == 2
        assert changes["svc-3"].current is None
        assert changes["svc-4"].previous is None
    finally:
        await source.stop()


async def test_watch_expiry_while_services_are_deleted(cp, agent_kubeconfig, ns, tmp_path) -> None:
    """The acceptance case: the connection drops; in the gap, Services are deleted, changed
    and created and etcd is compacted; the watch from the old resourceVersion gets the real
    server's 410 (an ERROR event ``Expired``), and after the re-list exactly the survivors
    remain, the deletes found by the diff."""
    populate(cp, ns, 30)
    async with Forwarder("127.0.0.1", cp.port) as path:
        kubeconfig = via(agent_kubeconfig, path.port, tmp_path / "via.kubeconfig")
        tracker, source = await started(kubeconfig)
        try:
            assert service_names(tracker, ns) == {f"svc-{i}" for i in range(1, 31)}
            await until(lambda: watching(source))
            tracker.checkpoint()
            path.cut()  # the watch drops; what follows happens in the gap
            for i in range(1, 11):
                delete(cp, "services", ns, f"svc-{i}")
                delete(cp, "endpointslices", ns, f"svc-{i}-abcde")
            apply_object(cp, service(11, ns, port=8011))
            apply_object(cp, endpoint_slice(12, ns, "10.244.1.12", "10.244.9.12"))
            for i in (31, 32, 33):
                apply_object(cp, service(i, ns))
            cp.compact()  # ...and falls out of etcd's history
            path.resume()
            await until(lambda: source.services.stats.lists == 2, timeout=30)
            await until(lambda: source.endpoint_slices.stats.lists == 2, timeout=30)

            survivors = {f"svc-{i}" for i in (*range(11, 31), 31, 32, 33)}
            assert service_names(tracker, ns) == survivors
            changes = {n.name: c for n, c in tracker.checkpoint().items()}
            assert {n for n, c in changes.items() if c.current is None} == {
                f"svc-{i}" for i in range(1, 11)
            }
            assert changes["svc-11"].current.port.port == 8011
            assert len(changes["svc-12"].current.endpoints) == 2
            assert {"svc-31", "svc-32", "svc-33"} <= set(changes)
            assert len(changes) == 10 + 2 + 3  # nothing else was touched
            assert source.services.stats.expired == 1
            assert tracker.stats.events["Service/delete"] == 10  # from the diff
            assert {k for k in source.services.store if k[0] == ns} == {(ns, n) for n in survivors}
        finally:
            await source.stop()


async def test_a_restarted_apiserver_is_watched_again_from_where_it_was(
    cp, agent_kubeconfig, ns
) -> None:
    """kube-apiserver stops (SIGTERM: its watches end) and comes back on the same port: the
    informers come back and see what follows, with no 410. (Just after /readyz the restarted
    server may refuse the ServiceAccount for a moment, 403, while its RBAC caches fill; on an
    error status the informer re-lists, as client-go's reflector does, so the list count is
    not fixed here.)"""
    populate(cp, ns, 3)
    slow = Backoff(initial=0.05, cap=1.0)  # the restart takes seconds: no tight retry loop
    tracker, source = await started(agent_kubeconfig, backoff=slow)
    try:
        await until(lambda: watching(source))
        tracker.checkpoint()
        watches = source.services.stats.watches
        await asyncio.to_thread(cp.restart_apiserver)
        await until(lambda: source.services.stats.watches > watches, timeout=30)
        apply_object(cp, service(4, ns))
        delete(cp, "services", ns, "svc-3")
        await until(lambda: tracker.pending == 2, timeout=10)
        changes = {n.name: c for n, c in tracker.checkpoint().items()}
        assert set(changes) == {"svc-3", "svc-4"}
        assert source.services.stats.expired == 0
        assert source.services.stats.failures >= 1  # it did see the server go
    finally:
        await source.stop()


async def test_bookmarks_move_the_resume_point_past_changes_the_watch_never_sees(
    control_plane, kube_namespace, tmp_path
) -> None:
    """Bookmarks come from the watch cache (the session's server has it on) about once a
    minute, and 2 s before a watch's own timeout: a 6 s watch gets one at about 4 s. Changes to
    Services this proxy does not select move the history on; only a bookmark tells the informer
    so, and its next watch resumes from there, with no re-list."""
    api, ns = control_plane, kube_namespace
    kubeconfig = api.ovsproxy_kubeconfig(tmp_path / "agent.kubeconfig")
    for i in (1, 2):
        apply_object(api, service(i, ns))
    seen: list[Seen] = []
    tracker, source = await started(kubeconfig, seen=seen, watch_timeout=(6.0, 6.0))
    try:
        await until(lambda: watching(source))
        for i in range(50, 60):
            apply_object(api, service(i, ns, labels=HIDDEN))
        head = int(api.request("GET", "/api/v1/services")["metadata"]["resourceVersion"])
        await until(lambda: source.services.stats.bookmarks >= 1, timeout=15)
        assert int(source.services.resource_version or 0) >= head
        await until(lambda: source.services.stats.watches >= 2, timeout=15)
        watches = [r for r in seen if r.path == "/api/v1/services" and r.watch]
        assert int(watches[1].params["resourceVersion"]) >= head
        assert source.services.stats.lists == 1 and source.services.stats.expired == 0
        assert service_names(tracker, ns) == {"svc-1", "svc-2"}
    finally:
        await source.stop()


async def test_service_proxy_name_label_hides_a_service(cp, agent_kubeconfig, ns) -> None:
    populate(cp, ns, 2)
    apply_object(cp, service(3, ns, labels=HIDDEN))
    tracker, source = await started(agent_kubeconfig)
    try:
        assert service_names(tracker, ns) == {"svc-1", "svc-2"}
        await until(lambda: watching(source))
        apply_object(cp, service(1, ns, labels=HIDDEN))
        await until(lambda: service_names(tracker, ns) == {"svc-2"})  # left the selection
        apply_object(cp, service(3, ns))
        await until(lambda: service_names(tracker, ns) == {"svc-2", "svc-3"})  # joined it
    finally:
        await source.stop()


async def test_a_named_proxy_handles_only_services_labelled_with_its_name(
    cp, agent_kubeconfig, ns
) -> None:
    """kube-proxy's rule from the other side: with ``service_proxy_name`` set, the informers
    select Services (and their slices) labelled with that name, and nothing else."""
    mine = {SERVICE_PROXY_NAME_LABEL: "ovsproxy"}
    for i, labels in ((1, {}), (2, mine), (3, HIDDEN)):
        apply_object(cp, service(i, ns, labels=labels))
        obj = endpoint_slice(i, ns)
        obj["metadata"]["labels"].update(labels)  # the EndpointSlice controller copies them
        apply_object(cp, obj)
    seen: list[Seen] = []
    tracker, source = await started(agent_kubeconfig, seen=seen, service_proxy_name="ovsproxy")
    try:
        assert service_names(tracker) == {"svc-2"}  # cluster-wide: default/kubernetes is not
        assert all(len(s.endpoints) == 1 for s in tracker.snapshot().values())
        first_list = next(r for r in seen if r.path.endswith("/endpointslices"))
        assert first_list.params["labelSelector"] == (
            f"{SERVICE_PROXY_NAME_LABEL}=ovsproxy,!service.kubernetes.io/headless"
        )
        await until(lambda: watching(source))
        apply_object(cp, service(1, ns, labels=mine))
        await until(lambda: service_names(tracker) == {"svc-1", "svc-2"})  # joined
        apply_object(cp, service(2, ns))
        await until(lambda: service_names(tracker) == {"svc-1"})  # left
    finally:
        await source.stop()


async def test_expired_continue_token_restarts_the_list(cp, agent_kubeconfig, ns) -> None:
    """Between the first page and the next, svc-12 is deleted and etcd compacted: the real
    server answers the continue token with HTTP 410 ("too old"); the list starts over."""
    populate(cp, ns, 12)
    expired = False

    async def expire_after_first_page(request: Seen) -> None:
        nonlocal expired
        if request.path == "/api/v1/services" and "continue" in request.params and not expired:
            expired = True
            delete(cp, "services", ns, "svc-12")
            cp.compact()

    tracker, source = await started(agent_kubeconfig, before=expire_after_first_page)
    try:
        assert expired
        assert service_names(tracker, ns) == {f"svc-{i}" for i in range(1, 12)}
        assert source.services.stats.expired == 1 and source.services.stats.lists == 1
    finally:
        await source.stop()


async def test_a_generic_informer_for_service_cidrs(cp, agent_kubeconfig) -> None:
    """The ``kubernetes`` ServiceCIDR the server made from --service-cluster-ip-range, then a
    second one added, changed and deleted."""

    class Recorder:
        def __init__(self) -> None:
            self.seen: list[tuple[str, str]] = []
            self.synced = False

        def on_add(self, obj):
            self.seen.append(("add", obj["metadata"]["name"]))

        def on_update(self, obj):
            self.seen.append(("update", obj["metadata"]["name"]))

        def on_delete(self, key):
            self.seen.append(("delete", key[1]))

        def on_synced(self):
            self.synced = True

        def on_error(self, problem):
            raise AssertionError(problem)

    name = f"extra-{secrets.token_hex(3)}"
    path = f"/apis/networking.k8s.io/v1/servicecidrs/{name}"
    _, source = await started(agent_kubeconfig)
    try:
        recorder = Recorder()
        informer = source.informer(SERVICE_CIDRS, recorder)
        await asyncio.wait_for(informer.wait_synced(), 10)
        assert recorder.synced and recorder.seen == [("add", "kubernetes")]
        await until(lambda: informer.stats.watches == 1)
        cidr = {"apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR"}
        cp.request(
            "POST",
            "/apis/networking.k8s.io/v1/servicecidrs",
            {**cidr, "metadata": {"name": name}, "spec": {"cidrs": ["10.97.0.0/24"]}},
        )
        await until(lambda: recorder.seen[-1] == ("add", name))
        changed = cp.request(
            "PATCH",
            path,
            {"metadata": {"labels": {"changed": "yes"}}},
            content_type="application/merge-patch+json",
        )
        await until(lambda: recorder.seen[-1] == ("update", name))
        assert informer.store[("", name)] == changed["metadata"]["resourceVersion"]
        cp.request("DELETE", path)
        await until(lambda: recorder.seen[-1] == ("delete", name), timeout=15)
        assert set(informer.store) == {("", "kubernetes")}
    finally:
        await source.stop()


@given(st.integers(0, 100), st.floats(0, 1, exclude_max=True))
def test_backoff_is_capped_exponential_with_jitter(attempt: int, rand: float) -> None:
    backoff = Backoff(initial=0.5, cap=30.0, factor=2.0, jitter=0.5)
    base = min(30.0, 0.5 * 2.0**attempt)
    delay = backoff.delay(attempt, rand)
    assert base * 0.5 <= delay <= base <= 30.0
    assert backoff.delay(attempt + 1, rand) >= delay


async def test_the_store_keeps_only_resource_versions(cp, agent_kubeconfig, ns) -> None:
    """The real server sends managedFields and the rest; the store keeps each object's
    resourceVersion, by key, and nothing else."""
    for i in (1, 2):
        apply_object(cp, service(i, ns))
    tracker, source = await started(agent_kubeconfig)
    try:
        await until(lambda: watching(source))
        apply_object(cp, service(3, ns))  # through the watch
        informer = source.services
        await until(lambda: len([k for k in informer.store if k[0] == ns]) == 3)
        listed = cp.request("GET", "/api/v1/services")["items"]
        assert listed[0]["metadata"]["managedFields"]
        expected = {
            (o["metadata"]["namespace"], o["metadata"]["name"]): o["metadata"]["resourceVersion"]
            for o in listed
        }
        assert informer.store == expected
        assert service_names(tracker, ns) == {"svc-1", "svc-2", "svc-3"}
    finally:
        await source.stop()


async def test_a_big_list_is_frozen_out_of_the_collectors_sight(
    cp, agent_kubeconfig, ns, monkeypatch
) -> None:
    import gc

    from ovsproxy.sources import kubernetes

    monkeypatch.setattr(kubernetes, "FREEZE_AFTER_LIST", 5)
    populate(cp, ns, 6)
    frozen = gc.get_freeze_count()
    _tracker, source = await started(agent_kubeconfig)
    try:
        assert gc.get_freeze_count() > frozen
        assert gc.isenabled()  # the list's pause is over
    finally:
        await source.stop()
        gc.unfreeze()


async def test_the_collector_stays_paused_from_a_lists_first_page_to_its_end(
    cp, agent_kubeconfig, ns, monkeypatch
) -> None:
    import gc

    from ovsproxy.sources import kubernetes

    collecting: list[bool] = []  # at each request for a further page
    get = kubernetes.httpx.AsyncClient.get

    async def recording_get(self: Any, url: Any, **kwargs: Any) -> Any:
        if "continue" in (kwargs.get("params") or {}):
            collecting.append(gc.isenabled())
        return await get(self, url, **kwargs)

    monkeypatch.setattr(kubernetes.httpx.AsyncClient, "get", recording_get)
    populate(cp, ns, 12)  # 3 pages of 5 per kind at least
    assert gc.isenabled()
    _tracker, source = await started(agent_kubeconfig)
    try:
        assert len(collecting) >= 4 and not any(collecting)
        assert gc.isenabled()
    finally:
        await source.stop()


# -- what no real server does: the fake ------------------------------------------------------


@pytest.fixture
async def fake() -> AsyncIterator[FakeKubeApi]:
    async with FakeKubeApi() as server:
        yield server


def fake_service(i: int, port: int = 80) -> dict[str, Any]:
    obj = service(i, "apps", port)
    obj["spec"].update(clusterIP=f"10.96.1.{i}", clusterIPs=[f"10.96.1.{i}"])
    return obj


async def fake_started(
    api: FakeKubeApi, tmp_path: Path, **options: Any
) -> tuple[ChangeTracker, KubernetesSource]:
    for i in (1, 2):
        api.apply("services", fake_service(i))
        api.apply("endpointslices", endpoint_slice(i, "apps"))
    return await started(api.kubeconfig(tmp_path / "kubeconfig"), **options)


async def test_errors_back_off_and_recover(fake, tmp_path) -> None:
    """HTTP 500 on demand: the fake (a real server fails so only when broken)."""
    fake.fail_next(4, status=500)
    tracker, source = await fake_started(fake, tmp_path)
    try:
        assert service_names(tracker) == {"svc-1", "svc-2"}
        failures = source.services.stats.failures + source.endpoint_slices.stats.failures
        assert failures == 4
        assert sum(tracker.stats.errors.values()) == 4
    finally:
        await source.stop()


async def test_invalid_objects_are_reported_and_skipped(fake, tmp_path) -> None:
    """An object the converter refuses: the real server refuses port 0 itself (it validates
    the fields the converter checks), so only the fake can serve one."""
    bad = fake_service(3)
    bad["spec"]["ports"][0]["port"] = 0
    fake.apply("services", bad)
    tracker, source = await fake_started(fake, tmp_path)
    try:
        assert service_names(tracker) == {"svc-1", "svc-2"}
        assert tracker.stats.invalid == {"Service": 1}
        await until(lambda: fake.open_watches == 2)
        fake.apply("services", fake_service(3))
        await until(lambda: "svc-3" in service_names(tracker))
    finally:
        await source.stop()


# -- hostile watch streams (issue 35). The fake API server writes the bytes: a real
# kube-apiserver cannot be made to send an endless line or a malformed event.


async def test_an_endless_watch_line_is_dropped_and_the_watch_recovers(
    fake, tmp_path, caplog
) -> None:
    """A line without end (64 MiB here, past a 1 MiB bound) is an error, not a buffer that
    grows: the stream is dropped, and after the same line at the same resourceVersion three
    times, a re-list moves past it; a Service added afterwards arrives."""
    tracker, source = await fake_started(fake, tmp_path, max_event_bytes=1 << 20)
    try:
        await until(lambda: fake.open_watches == 2)
        start = b'{"type": "ADDED", "object": {"x": "'
        fake.send_raw("services", start + b"x" * (1 << 20), repeat=64)
        fake.apply("services", fake_service(3))
        fake.apply("endpointslices", endpoint_slice(3, "apps"))
        await until(lambda: "svc-3" in service_names(tracker), timeout=10)
        assert source.services.stats.stuck_relists == 1, source.services.stats
        assert source.services.stats.failures == 3
        assert "a watch event longer than 1,048,576 bytes" in caplog.text
    finally:
        await source.stop()


async def test_a_malformed_event_repeated_by_the_server_is_passed_by_a_relist(
    fake, tmp_path
) -> None:
    """Every watch resumed before it gets it again: after three failures there, a re-list."""
    tracker, source = await fake_started(fake, tmp_path)
    try:
        await until(lambda: fake.open_watches == 2)
        fake.send_raw("services", b'{"type": "ADDED", "object": [not json\n')
        fake.apply("services", fake_service(3))
        fake.apply("endpointslices", endpoint_slice(3, "apps"))
        await until(lambda: "svc-3" in service_names(tracker), timeout=10)
        assert source.services.stats.stuck_relists == 1
        assert source.services.stats.lists == 2
    finally:
        await source.stop()
