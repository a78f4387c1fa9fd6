"""``peer-kube-proxy`` at its quick size: ours and kube-proxy in both modes on one real API
server, every figure produced and the same content answering on every side; and the
histogram arithmetic its churn figures come from."""

from __future__ import annotations

import os

import pytest

from bench.scenarios import peer_kube_proxy as kp

# kube-proxy's bucket bounds below 2 s (and ours: the same)
BOUNDS = [0.25, 0.5, 1.0, 2.0, float("inf")]


def _hist(cumulative: list[float]) -> dict:
    return {"buckets": dict(zip(BOUNDS, cumulative, strict=True)), "sum": 0.0, "count": 0.0}


def test_histogram_quantile_interpolates_within_the_bucket() -> None:
    # 10 observations in (0, 0.25], 10 in (0.25, 0.5]: the median is the first bucket's top,
    # the 75th percentile halfway through the second.
    hist = _hist([10, 20, 20, 20, 20])
    assert kp.histogram_quantile(0.5, hist) == pytest.approx(0.25)
    assert kp.histogram_quantile(0.75, hist) == pytest.approx(0.375)
    assert kp.histogram_quantile(0.99, _hist([0, 0, 0, 0, 0])) is None


def test_histogram_delta_is_the_window_alone() -> None:
    before = {**_hist([5, 5, 5, 5, 5]), "sum": 1.0, "count": 5.0}
    after = {**_hist([5, 15, 15, 15, 15]), "sum": 4.0, "count": 15.0}
    delta = kp.histogram_delta(before, after)
    assert delta["count"] == 10 and delta["sum"] == pytest.approx(3.0)
    assert kp.histogram_quantile(0.5, delta) == pytest.approx(0.375)


@pytest.mark.skipif(os.geteuid() != 0, reason="namespaces, OVS and kube-proxy need root")
def test_quick_run_produces_every_figure_with_the_same_content() -> None:
    result = kp.run(quick=True)
    size = str(kp.QUICK_SIZES[-1])
    row = result["per_size"][size]
    for proxy in kp.PROXIES:
        programming = row[proxy]["programming"]
        assert programming["ready_s"] > 0 and programming["answering_s"] > 0, proxy
        assert programming["healthz"] is True, proxy
        assert row[proxy]["endpoint"]["to_traffic_ms"] > 0, proxy
        assert row[proxy]["datapath"]["answered"] == kp.QUICK_LATENCY_CONNECTS, proxy
        for rate in kp.CHURN_RATES:
            window = result["churn"]["default_min_sync"][proxy][f"{rate}/s"]
            assert window["observed"] > 0, (proxy, rate)
            assert result["churn"]["min_sync_0"][proxy][f"{rate}/s"]["observed"] > 0
    assert result["same_content"] == {size: True}
    for name, goal in result["goals"].items():
        assert isinstance(goal["goal_met"], bool), name
        assert goal["ours"] is not None, name
    assert result["versions"]["kube_proxy"].startswith("v1.")
