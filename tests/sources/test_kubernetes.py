"""The Kubernetes source against the fake API server (real HTTP, lightkube's kubeconfig)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.k8s_fake import FakeKubeApi

from ovsproxy.proxy.tracker import ChangeTracker
from ovsproxy.sources.convert import SERVICE_PROXY_NAME_LABEL
from ovsproxy.sources.kubernetes import SERVICE_CIDRS, Backoff, KubernetesSource

FAST = {"page_size": 5, "watch_timeout": (30.0, 30.0), "backoff": Backoff(initial=0.01, cap=0.1)}


def service(i: int, port: int = 80, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": f"svc-{i}", "namespace": "apps", "labels": labels or {}},
        "spec": {
            "type": "ClusterIP",
            "clusterIP": f"10.96.1.{i}",
            "clusterIPs": [f"10.96.1.{i}"],
            "ipFamilies": ["IPv4"],
            "ports": [{"name": "http", "port": port, "targetPort": 8080, "protocol": "TCP"}],
        },
    }


def endpoint_slice(i: int, *addresses: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"svc-{i}-abcde",
            "namespace": "apps",
            "labels": {"kubernetes.io/service-name": f"svc-{i}"},
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [
            {"addresses": [a], "conditions": {"ready": True}}
            for a in (addresses or (f"10.244.1.{i}",))
        ],
    }


async def until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Wait for a condition on state the source changes (there is no event for each)."""
    async with asyncio.timeout(timeout):
        while True:
            if predicate():
                return
            await asyncio.sleep(0.01)


def service_names(tracker: ChangeTracker) -> set[str]:
    return {n.name for n in tracker.snapshot()}


@pytest.fixture
async def api() -> AsyncIterator[FakeKubeApi]:
    async with FakeKubeApi() as server:
        yield server


def populate(api: FakeKubeApi, count: int) -> None:
    for i in range(1, count + 1):
        api.apply("services", service(i))
        api.apply("endpointslices", endpoint_slice(i))


async def started(api: FakeKubeApi, tmp_path: Path, **options: Any):
    tracker = ChangeTracker()
    source = KubernetesSource(
        tracker, kubeconfig=api.kubeconfig(tmp_path / "kubeconfig"), **{**FAST, **options}
    )
    await source.start()
    await asyncio.wait_for(source.wait_synced(), 5)
    return tracker, source


async def test_paged_list_then_watch_from_its_resource_version(api, tmp_path) -> None:
    populate(api, 23)
    list_version = str(api.resource_version)
    tracker, source = await started(api, tmp_path)
    try:
        assert tracker.synced
        assert service_names(tracker) == {f"svc-{i}" for i in range(1, 24)}
        assert all(len(s.endpoints) == 1 for s in tracker.snapshot().values())

        lists = api.requests_for("services", watch=False)
        assert [r.params.get("continue") is not None for r in lists] == [False] + [True] * 4
        assert {r.params["limit"] for r in lists} == {"5"}
        await until(lambda: api.requests_for("services", watch=True) != [])
        [watch] = api.requests_for("services", watch=True)
        assert watch.params["resourceVersion"] == list_version
        assert watch.params["allowWatchBookmarks"] == "true"
        assert watch.params["labelSelector"] == (
            "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless"
        )
    finally:
        await source.stop()


async def test_watch_events_reach_the_tracker(api, tmp_path) -> None:
    populate(api, 3)
    tracker, source = await started(api, tmp_path)
    try:
        tracker.checkpoint()
        await until(lambda: api.open_watches == 2)
        api.apply("services", service(4))
        api.apply("endpointslices", endpoint_slice(2, "10.244.1.2", "10.244.2.2"))
        api.delete("services", "apps", "svc-3")
        await until(lambda: tracker.pending == 3)
        changes = {n.name: c for n, c in tracker.checkpoint().items()}
        assert set(changes) == {"svc-2", "svc-3", "svc-4"}
        assert len(changes["svc-2"].current.endpoints) == 2
        assert changes["svc-3"].current is None
        assert changes["svc-4"].previous is None
    finally:
        await source.stop()


@pytest.mark.parametrize("gone_as", ["event", "status"])
@pytest.mark.parametrize("how", ["reconnect", "open watch"])
async def test_watch_expiry_while_services_are_deleted(tmp_path, gone_as, how) -> None:
    """The acceptance case: after the 410 and the re-list, exactly the survivors remain."""
    async with FakeKubeApi(gone_as=gone_as) as api:
        populate(api, 30)
        tracker, source = await started(api, tmp_path)
        try:
            assert len(tracker.checkpoint()) == 30
            await until(lambda: api.open_watches == 2)
            if how == "reconnect":
                api.break_watches()  # the watch drops; what follows happens in the gap
            for i in range(1, 11):
                api.delete("services", "apps", f"svc-{i}")
                api.delete("endpointslices", "apps", f"svc-{i}-abcde")
            api.apply("services", service(11, port=8011))
            api.apply("endpointslices", endpoint_slice(12, "10.244.1.12", "10.244.9.12"))
            for i in (31, 32, 33):
                api.apply("services", service(i))
            api.compact()  # ...and falls out of the watch window
            if how == "open watch":
                api.break_watches(mode="gone")  # ERROR 410 on the open stream
            await until(lambda: source.services.stats.lists == 2)
            await until(lambda: source.endpoint_slices.stats.lists == 2)

            survivors = {f"svc-{i}" for i in (*range(11, 31), 31, 32, 33)}
            assert service_names(tracker) == survivors
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
            assert set(source.services.store) == {("apps", n) for n in survivors}
        finally:
            await source.stop()


async def test_bookmarks_let_a_dropped_watch_resume_without_relisting(api, tmp_path) -> None:
    populate(api, 2)
    tracker, source = await started(api, tmp_path)
    try:
        await until(lambda: api.open_watches == 2)
        # Changes this watch never sees (another proxy's Service): only a bookmark tells
        # the informer how far the history has gone.
        for i in range(50, 60):
            api.apply("services", service(i, labels={SERVICE_PROXY_NAME_LABEL: "other"}))
        api.send_bookmarks()
        await until(lambda: source.services.resource_version == str(api.resource_version))
        assert source.services.stats.bookmarks >= 1
        api.compact()
        api.break_watches(mode="abort")  # connection reset
        await until(lambda: len(api.requests_for("services", watch=True)) == 2)
        await until(lambda: api.open_watches == 2)
        assert source.services.stats.lists == 1 and source.services.stats.expired == 0
        assert service_names(tracker) == {"svc-1", "svc-2"}
    finally:
        await source.stop()


async def test_service_proxy_name_label_hides_a_service(api, tmp_path) -> None:
    populate(api, 2)
    api.apply("services", service(3, labels={SERVICE_PROXY_NAME_LABEL: "other"}))
    tracker, source = await started(api, tmp_path)
    try:
        assert service_names(tracker) == {"svc-1", "svc-2"}
        await until(lambda: api.open_watches == 2)
        api.apply("services", service(1, labels={SERVICE_PROXY_NAME_LABEL: "other"}))
        await until(lambda: service_names(tracker) == {"svc-2"})  # left the selection
        api.apply("services", service(3))
        await until(lambda: service_names(tracker) == {"svc-2", "svc-3"})  # joined it
    finally:
        await source.stop()


async def test_a_named_proxy_handles_only_services_labelled_with_its_name(api, tmp_path) -> None:
    """kube-proxy's rule from the other side: with ``service_proxy_name`` set, the informers
    select Services (and their slices) labelled with that name, and nothing else."""
    mine = {SERVICE_PROXY_NAME_LABEL: "ovsproxy"}
    api.apply("services", service(1))
    api.apply("services", service(2, labels=mine))
    api.apply("services", service(3, labels={SERVICE_PROXY_NAME_LABEL: "other"}))
    for i, labels in ((1, {}), (2, mine), (3, {SERVICE_PROXY_NAME_LABEL: "other"})):
        obj = endpoint_slice(i)
        obj["metadata"]["labels"].update(labels)  # the EndpointSlice controller copies them
        api.apply("endpointslices", obj)
    tracker, source = await started(api, tmp_path, service_proxy_name="ovsproxy")
    try:
        assert service_names(tracker) == {"svc-2"}
        assert all(len(s.endpoints) == 1 for s in tracker.snapshot().values())
        first_list = api.requests_for("endpointslices", watch=False)[0]
        assert first_list.params["labelSelector"] == (
            f"{SERVICE_PROXY_NAME_LABEL}=ovsproxy,!service.kubernetes.io/headless"
        )
        await until(lambda: api.open_watches == 2)
        api.apply("services", service(1, labels=mine))
        await until(lambda: service_names(tracker) == {"svc-1", "svc-2"})  # joined
        api.apply("services", service(2))
        await until(lambda: service_names(tracker) == {"svc-1"})  # left
    finally:
        await source.stop()


async def test_expired_continue_token_restarts_the_list(api, tmp_path) -> None:
    populate(api, 12)

    def expire_after_first_page(request) -> None:
        if request.path.endswith("/services") and request.params.get("continue"):
            api.on_request = None
            api.delete("services", "apps", "svc-12")
            api.compact()

    api.on_request = expire_after_first_page
    tracker, source = await started(api, tmp_path)
    try:
        assert service_names(tracker) == {f"svc-{i}" for i in range(1, 12)}
        assert source.services.stats.expired == 1 and source.services.stats.lists == 1
    finally:
        await source.stop()


async def test_errors_back_off_and_recover(api, tmp_path) -> None:
    populate(api, 2)
    api.fail_next(4, status=500)
    tracker, source = await started(api, tmp_path)
    try:
        assert service_names(tracker) == {"svc-1", "svc-2"}
        failures = source.services.stats.failures + source.endpoint_slices.stats.failures
        assert failures == 4
        assert sum(tracker.stats.errors.values()) == 4
    finally:
        await source.stop()


async def test_invalid_objects_are_reported_and_skipped(api, tmp_path) -> None:
    populate(api, 2)
    bad = service(3)
    bad["spec"]["ports"][0]["port"] = 0
    api.apply("services", bad)
    tracker, source = await started(api, tmp_path)
    try:
        assert service_names(tracker) == {"svc-1", "svc-2"}
        assert tracker.stats.invalid == {"Service": 1}
        await until(lambda: api.open_watches == 2)
        api.apply("services", service(3))
        await until(lambda: "svc-3" in service_names(tracker))
    finally:
        await source.stop()


async def test_a_generic_informer_for_service_cidrs(api, tmp_path) -> None:
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

    cidr = {"metadata": {"name": "kubernetes"}, "spec": {"cidrs": ["10.96.0.0/16"]}}
    api.apply("servicecidrs", cidr)
    _, source = await started(api, tmp_path)
    try:
        recorder = Recorder()
        informer = source.informer(SERVICE_CIDRS, recorder)
        await asyncio.wait_for(informer.wait_synced(), 5)
        assert recorder.synced and recorder.seen == [("add", "kubernetes")]
        await until(lambda: api.open_watches == 3)
        api.apply("servicecidrs", {**cidr, "spec": {"cidrs": ["10.96.0.0/16", "fd00::/108"]}})
        await until(lambda: recorder.seen[-1] == ("update", "kubernetes"))
        assert informer.store == {("", "kubernetes"): str(api.resource_version)}
        api.delete("servicecidrs", "", "kubernetes")
        await until(lambda: recorder.seen[-1] == ("delete", "kubernetes"))
        assert api.requests_for("servicecidrs")[0].path == "/apis/networking.k8s.io/v1/servicecidrs"
    finally:
        await source.stop()


@given(st.integers(0, 100), st.floats(0, 1, exclude_max=True))
def test_backoff_is_capped_exponential_with_jitter(attempt: int, rand: float) -> None:
    backoff = Backoff(initial=0.5, cap=30.0, factor=2.0, jitter=0.5)
    base = min(30.0, 0.5 * 2.0**attempt)
    delay = backoff.delay(attempt, rand)
    assert base * 0.5 <= delay <= base <= 30.0
    assert backoff.delay(attempt + 1, rand) >= delay


MANAGED = [{"manager": "kubectl", "operation": "Update", "fieldsV1": {"f:spec": {}}}]


async def test_the_store_keeps_only_resource_versions(api, tmp_path) -> None:
    for i in (1, 2):
        obj = service(i)
        obj["metadata"]["managedFields"] = MANAGED
        api.apply("services", obj)
    tracker, source = await started(api, tmp_path)
    try:
        await until(lambda: api.open_watches == 2)
        changed = service(3)
        changed["metadata"]["managedFields"] = MANAGED
        api.apply("services", changed)  # through the watch
        informer = source.services
        await until(lambda: len(informer.store) == 3)
        expected = {
            key: obj["metadata"]["resourceVersion"] for key, obj in api.objects("services").items()
        }
        assert informer.store == expected
        assert service_names(tracker) == {"svc-1", "svc-2", "svc-3"}
    finally:
        await source.stop()


async def test_a_big_list_is_frozen_out_of_the_collectors_sight(api, tmp_path, monkeypatch) -> None:
    import gc

    from ovsproxy.sources import kubernetes

    monkeypatch.setattr(kubernetes, "FREEZE_AFTER_LIST", 5)
    populate(api, 6)
    frozen = gc.get_freeze_count()
    _tracker, source = await started(api, tmp_path)
    try:
        assert gc.get_freeze_count() > frozen
        assert gc.isenabled()  # the list's pause is over
    finally:
        await source.stop()
        gc.unfreeze()


async def test_the_collector_stays_paused_from_a_lists_first_page_to_its_end(
    api, tmp_path, monkeypatch
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
    populate(api, 12)  # 3 pages of 5 per kind
    assert gc.isenabled()
    _tracker, source = await started(api, tmp_path)
    try:
        assert collecting == [False] * 4  # 2 further pages of Services, 2 of slices
        assert gc.isenabled()
    finally:
        await source.stop()


# -- hostile watch streams (issue 35). The fake API server writes the bytes: a real
# kube-apiserver cannot be made to send an endless line or a malformed event.


async def test_an_endless_watch_line_is_dropped_and_the_watch_recovers(
    api, tmp_path, caplog
) -> None:
    """A line without end (64 MiB here, past a 1 MiB bound) is an error, not a buffer that
    grows: the stream is dropped, and after the same line at the same resourceVersion three
    times, a re-list moves past it; a Service added afterwards arrives."""
    populate(api, 2)
    tracker, source = await started(api, tmp_path, max_event_bytes=1 << 20)
    try:
        await until(lambda: api.open_watches == 2)
        start = b'{"type": "ADDED", "object": {"x": "'
        api.send_raw("services", start + b"x" * (1 << 20), repeat=64)
        api.apply("services", service(3))
        api.apply("endpointslices", endpoint_slice(3))
        await until(lambda: "svc-3" in service_names(tracker), timeout=10)
        assert source.services.stats.stuck_relists == 1, source.services.stats
        assert source.services.stats.failures == 3
        assert "a watch event longer than 1,048,576 bytes" in caplog.text
    finally:
        await source.stop()


async def test_a_malformed_event_repeated_by_the_server_is_passed_by_a_relist(
    api, tmp_path
) -> None:
    """Every watch resumed before it gets it again: after three failures there, a re-list."""
    populate(api, 2)
    tracker, source = await started(api, tmp_path)
    try:
        await until(lambda: api.open_watches == 2)
        api.send_raw("services", b'{"type": "ADDED", "object": [not json\n')
        api.apply("services", service(3))
        api.apply("endpointslices", endpoint_slice(3))
        await until(lambda: "svc-3" in service_names(tracker), timeout=10)
        assert source.services.stats.stuck_relists == 1
        assert source.services.stats.lists == 2
    finally:
        await source.stop()
