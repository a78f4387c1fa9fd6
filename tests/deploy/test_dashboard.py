"""The Grafana dashboard in deploy/grafana: every PromQL expression parses and names only
metrics (and labels) that a real agent serves on /metrics."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser as promql
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ovsproxy.metrics import Metrics
from tests.deploy.kube import DEPLOY

DASHBOARD = DEPLOY / "grafana" / "ovsproxy.json"
# Grafana's variables, replaced by values of their kind before parsing.
VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h", "$instance": ".*"}
TARGET_LABELS = {"instance", "job"}  # added by Prometheus to every scraped sample
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
}

Exported = dict[str, set[str] | None]  # sample name -> label names seen (None: no sample yet)


def load_dashboard(path: Path = DASHBOARD) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(path.read_text())
    return result


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def expressions(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable."""
    found = []
    for panel in _panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            found.append((f"panel {panel['title']!r} {target['refId']}", target["expr"]))
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]["query"]
        # label_values(METRIC, LABEL): the metric is a selector; LABEL must be one of its.
        inner = query.removeprefix("label_values(").removesuffix(")")
        metric, _, label = inner.rpartition(",")
        found.append((f"variable {variable['name']}", f"sum by ({label.strip()}) ({metric})"))
    return found


def exported_metrics(exposition: str) -> Exported:
    """The sample names a /metrics page offers, with the label names its samples carry."""
    exported: Exported = {}
    for family in text_string_to_metric_families(exposition):
        for suffix in SUFFIXES.get(family.type, ("",)):
            exported.setdefault(family.name + suffix, None)
        for sample in family.samples:
            labels = exported.get(sample.name) or set()
            exported[sample.name] = labels | set(sample.labels)
    return exported


def _selectors(node: Any) -> list[Any]:
    """The vector selectors under a PromQL node."""
    if isinstance(node, promql.VectorSelector):
        return [node]
    children: list[Any] = []
    if isinstance(node, promql.MatrixSelector):
        children = [node.vector_selector]
    elif isinstance(node, promql.BinaryExpr):
        children = [node.lhs, node.rhs]
    elif isinstance(node, promql.AggregateExpr):
        children = [node.expr, node.param]
    elif isinstance(node, promql.Call):
        children = list(node.args)
    elif isinstance(node, (promql.ParenExpr, promql.UnaryExpr, promql.SubqueryExpr)):
        children = [node.expr]
    return [s for child in children if child is not None for s in _selectors(child)]


def _selector_name(selector: Any) -> str | None:
    if selector.name:
        return str(selector.name)
    for matcher in selector.matchers.matchers:
        if matcher.name == "__name__":
            return str(matcher.value)
    return None


def _label_names(node: Any, exported: Exported) -> set[str] | None:
    """Labels the selectors under node can carry (None: some metric has no sample to tell)."""
    labels = set(TARGET_LABELS)
    for selector in _selectors(node):
        known = exported.get(_selector_name(selector) or "")
        if known is None:
            return None
        labels |= known
    return labels


def problems(expr: str, exported: Exported) -> list[str]:
    for variable, value in VARIABLES.items():
        expr = expr.replace(variable, value)
    try:
        tree = promql.parse(expr)
    except Exception as exc:  # the parser raises a bare ValueError/RuntimeError subclass
        return [f"does not parse: {exc}"]
    found = []
    selectors = _selectors(tree)
    if not selectors:
        found.append("names no metric")
    for selector in selectors:
        name = _selector_name(selector)
        if name not in exported:
            found.append(f"{name}: not exported by the agent")
            continue
        known = exported[name]
        for matcher in selector.matchers.matchers:
            if known is not None and matcher.name not in known | TARGET_LABELS | {"__name__"}:
                found.append(f"{name}: has no label {matcher.name!r} (has {sorted(known)})")
    found += _aggregation_problems(tree, exported)
    return found


def _aggregation_problems(node: Any, exported: Exported) -> list[str]:
    found = []
    if isinstance(node, promql.AggregateExpr) and node.modifier is not None:
        available = _label_names(node.expr, exported)
        if available is not None:
            for label in node.modifier.labels:
                if label not in available | {"le"}:
                    found.append(f"aggregates by {label!r}, which its metrics lack")
    children = []
    if isinstance(node, promql.BinaryExpr):
        children = [node.lhs, node.rhs]
    elif isinstance(node, promql.AggregateExpr):
        children = [node.expr]
    elif isinstance(node, promql.Call):
        children = list(node.args)
    elif isinstance(node, (promql.ParenExpr, promql.UnaryExpr, promql.SubqueryExpr)):
        children = [node.expr]
    for child in children:
        found += _aggregation_problems(child, exported)
    return found


# -- the dashboard on its own ----------------------------------------------------------------
def test_dashboard_is_grafana_json_with_unique_panel_ids() -> None:
    dashboard = load_dashboard()
    ids = [p["id"] for p in _panels(dashboard["panels"])]
    assert len(ids) == len(set(ids))
    assert dashboard["uid"] and dashboard["schemaVersion"] >= 36
    for panel in _panels(dashboard["panels"]):
        if panel["type"] != "row":
            assert panel["targets"], panel["title"]
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]


def test_dashboard_covers_what_issue_18_asks_for() -> None:
    text = " ".join(expr for _, expr in expressions(load_dashboard()))
    for metric in (
        "ovsproxy_sync_duration_seconds_bucket",
        "ovsproxy_openflow_sent_messages_total",
        "ovsproxy_openflow_sent_bytes_total",
        "ovsproxy_openflow_errors_total",
        "ovsproxy_route_operations_total",
        "ovsproxy_services_refused",
    ):
        assert metric in text, metric


def test_the_check_finds_unknown_metrics_labels_and_parse_errors() -> None:
    exported = exported_metrics(Metrics().render().decode())
    exported["ovsproxy_route_operations_total"] = {"op", "result", "family"}
    good = 'sum by (op) (rate(ovsproxy_route_operations_total{instance=~"$instance"}[5m]))'
    assert problems(good, exported) == []
    assert problems("rate(ovsproxy_route_operation_total[5m])", exported) == [
        "ovsproxy_route_operation_total: not exported by the agent"
    ]
    assert problems('ovsproxy_route_operations_total{zone="a"}', exported)[0].endswith(
        "has no label 'zone' (has ['family', 'op', 'result'])"
    )
    assert problems("sum by (zone) (ovsproxy_route_operations_total)", exported) == [
        "aggregates by 'zone', which its metrics lack"
    ]
    # A histogram's family name is not a series; its _bucket is.
    assert problems("ovsproxy_sync_duration_seconds", exported) != []
    assert problems("ovsproxy_sync_duration_seconds_bucket", exported) == []
    assert problems("sum(rate(ovsproxy_syncs_total[5m])", exported)[0].startswith("does not parse")
    assert problems("time()", exported) == ["names no metric"]


# -- against a real agent ----------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.ovs
def test_every_dashboard_expression_names_what_a_running_agent_exports(
    sandbox: Any, tmp_path: Path
) -> None:
    from ovsproxy.lab import build_lab
    from tests.e2e.harness import AgentProcess, copy_examples

    build_lab(sandbox)
    agent = AgentProcess(sandbox, copy_examples(tmp_path / "manifests"), tmp_path / "agent.log")
    agent.start()
    try:
        with urllib.request.urlopen(agent.url + "/metrics", timeout=5) as response:
            exposition = response.read().decode()
    finally:
        agent.stop()
    exported = exported_metrics(exposition)
    assert "ovsproxy_route_operations_total" in exported  # a real agent's page, routes and all
    found = {
        f"{where}: {expr}": p
        for where, expr in expressions(load_dashboard())
        if (p := problems(expr, exported))
    }
    assert not found, json.dumps(found, indent=2)
    # A latency metric for network programming, once the agent exports one, is shown too.
    shown = " ".join(expr for _, expr in expressions(load_dashboard()))
    missing = [n for n in exported if "programming" in n and n.endswith("_bucket")]
    assert all(n in shown for n in missing), missing


def test_kube_proxys_panels_work_with_the_prefix_swapped() -> None:
    """The kube-proxy row names only kube-proxy's metrics (``kubeproxy_`` made ``ovsproxy_``,
    read from its source), and each of those we export is on one of its panels."""
    from tests.agent.test_kube_proxy_metric_set import (
        NOT_OURS,
        kube_proxy_metrics,
        kube_proxy_metrics_source,
    )

    theirs = kube_proxy_metrics(kube_proxy_metrics_source())
    dashboard = load_dashboard()
    row = next(i for i, p in enumerate(dashboard["panels"]) if p["title"].startswith("kube-proxy"))
    panels = dashboard["panels"][row + 1 :]
    assert panels and all(p["type"] != "row" for p in panels)
    named = set()
    for panel in panels:
        for target in panel["targets"]:
            expr = target["expr"].replace("$__rate_interval", "5m").replace("$instance", ".*")
            for selector in _selectors(promql.parse(expr)):
                name = _selector_name(selector) or ""
                family = name.removeprefix("ovsproxy_")
                for suffix in ("_bucket", "_count", "_sum"):
                    family = family.removesuffix(suffix)
                assert f"kubeproxy_{family}" in theirs, (panel["title"], name)
                named.add(f"kubeproxy_{family}")
    assert named == set(theirs) - set(NOT_OURS), sorted(set(theirs) - set(NOT_OURS) - named)
