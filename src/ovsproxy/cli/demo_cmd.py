"""`ovsproxy demo`: ClusterIPs load-balanced by OVS, with real pods and real HTTP, in one command.

Builds the example lab in a private sandbox, runs the agent on the bundled example manifests,
sends HTTP requests to every ClusterIP from a pod and from the node (through the Service
route), shows which endpoint answered how often, then changes the endpoints and shows the
traffic follow. Everything is removed at the end.

``--nodes N`` runs the tour on the multi-node lab instead (``ovsproxy.lab.cluster``): a real
control plane and N nodes, each with its own OVS and agent process reading the API server; the
Service ``lab/web`` created through the API with a selector, so its endpoint on every node comes
from kube-controller-manager; HTTP from a pod and from the node namespace of every node, IPv4
and IPv6, so every node's traffic reaches every endpoint (local ones directly, remote ones over
the underlay); then an endpoint change as a cluster makes one (a Pod deleted, another started)
and the traffic following it.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table

from ovsproxy.config import load
from ovsproxy.lab import EXAMPLES, build_lab
from ovsproxy.lab.cluster import HTTP_PORT, Lab
from ovsproxy.lab.evidence import RigNode, lab_rig, probe
from ovsproxy.lab.manifests import endpoint_texts
from ovsproxy.ovs.sandbox import Sandbox


@dataclass(frozen=True)
class Target:
    service: str
    url: str
    expected: frozenset[str]


INITIAL = (
    Target(
        "demo/web (ClusterIP, 2 endpoints)", "http://10.96.0.10/", frozenset({"web-1", "web-2"})
    ),
    Target("demo/api (dual-stack)", "http://10.96.0.20/", frozenset({"api-1", "api-2"})),
    Target(
        "demo/api (dual-stack, IPv6)", "http://[fd00:10:96::20]/", frozenset({"api-1", "api-2"})
    ),
    Target("demo/shop:http", "http://10.96.0.30/", frozenset({"web-1", "api-1"})),
    Target(
        "demo/shop:admin (multi-port)", "http://10.96.0.30:9000/", frozenset({"web-1", "api-1"})
    ),
)
AFTER_CHANGE = (
    Target("demo/web after the change", "http://10.96.0.10/", frozenset({"web-1", "api-2"})),
)
# The endpoint change: web-2 leaves Service web, api-2 joins it.
OLD_WEB_2 = """  - addresses: [10.244.0.12]
    conditions: {ready: true, serving: true, terminating: false}
    nodeName: node-1
    targetRef: {kind: Pod, namespace: demo, name: web-2}
"""
NEW_API_2 = """  - addresses: [10.244.0.14]
    conditions: {ready: true, serving: true, terminating: false}
    nodeName: node-1
    targetRef: {kind: Pod, namespace: demo, name: api-2}
"""


def _measure(
    sandbox: Sandbox,
    pods: dict[str, Any],
    targets: tuple[Target, ...],
    requests: int,
    progress: Progress | None,
) -> list[dict[str, Any]]:
    clients = {"pod demo/client": pods["client"].netns, "node (Service route)": sandbox.netns}
    rig = (RigNode("node-1", sandbox),)  # the agent runs in this process: no /status to ask
    results = []
    task = None
    if progress is not None:
        task = progress.add_task("requests", total=len(targets) * len(clients) * requests)
    for target in targets:
        for client, netns in clients.items():
            out = probe(rig, netns, "http", target.url, "--count", str(requests), echo=False)
            ok = out["failed"] == 0 and set(out["counts"]) == set(target.expected)
            results.append(
                {
                    "service": target.service,
                    "url": target.url,
                    "client": client,
                    "counts": dict(sorted(out["counts"].items())),
                    "failed": out["failed"],
                    "failures": out["failures"],
                    **({"evidence": out["evidence"]} if "evidence" in out else {}),
                    "expected": sorted(target.expected),
                    "ok": ok,
                }
            )
            if progress is not None and task is not None:
                progress.advance(task, requests)
    return results


def _table(title: str, results: list[dict[str, Any]]) -> Table:
    table = Table(title=title)
    for column in ("Service and URL", "client", "answers per endpoint", "failed", ""):
        table.add_column(column)
    for r in results:
        total = sum(r["counts"].values()) or 1
        answers = "\n".join(
            f"{name}: {count} ({100 * count // total}%)" for name, count in r["counts"].items()
        )
        table.add_row(
            f"{r['service']}\n{escape(r['url'])}",
            r["client"],
            answers,
            str(r["failed"]),
            "[green]ok[/]" if r["ok"] else "[red]UNEXPECTED[/]",
        )
    return table


async def _run_demo(requests: int, as_json: bool, console: Console) -> dict[str, Any]:
    from ovsproxy.agent import Agent

    say = (lambda *a, **k: None) if as_json else console.print
    workdir = Path(tempfile.mkdtemp(prefix="ovsproxy-demo-"))
    manifests = workdir / "manifests"
    shutil.copytree(EXAMPLES, manifests)
    sandbox = Sandbox("demo-" + workdir.name[-6:].replace("_", "x").lower())
    report: dict[str, Any] = {"phases": [], "ok": False}
    stop = asyncio.Event()
    agent_task: asyncio.Task[None] | None = None
    try:
        say(
            "[bold]1.[/] private Open vSwitch (ovsdb-server + ovs-vswitchd, userspace datapath) "
            "in its own network namespace, and 5 pods"
        )
        await asyncio.to_thread(sandbox.up)
        pods = await asyncio.to_thread(build_lab, sandbox)
        config = load(
            ovsdb=sandbox.ovsdb,
            openflow=sandbox.openflow,
            netns=sandbox.netns,
            manifests=[str(manifests)],
            min_sync_interval=0.0,
            metrics_address="127.0.0.1:0",
            health_address="",
            node_name="node-1",
            log_level="warning",
        )
        agent = Agent(config)
        agent_task = asyncio.create_task(agent.run(stop))
        say(
            "[bold]2.[/] ovsproxy agent on the example manifests "
            f"({', '.join(p.name for p in sorted(manifests.glob('*.yaml')))})"
        )
        ready = asyncio.create_task(agent.ready.wait())
        done, _ = await asyncio.wait(
            {ready, agent_task}, timeout=60, return_when=asyncio.FIRST_COMPLETED
        )
        if agent_task in done:
            agent_task.result()  # raises the start-up error
        if ready not in done:
            raise RuntimeError("the agent did not finish its first sync within 60 s")
        status = agent.pages.status_json()
        report["installed"] = {
            "groups": status["groups"],
            "flows": status["flows"],
            "routes": status["routes"],
        }
        say(
            f"   installed {status['groups']} select groups and {status['flows']} flows; "
            f"node routes: {', '.join(status['routes'])}"
        )
        say(f"[bold]3.[/] {requests} HTTP requests per ClusterIP, from a pod and from the node")
        with Progress(console=console, transient=True, disable=as_json) as progress:
            first = await asyncio.to_thread(_measure, sandbox, pods, INITIAL, requests, progress)
        report["phases"].append({"phase": "initial", "results": first})
        say(_table("Which endpoint answered", first))

        say("[bold]4.[/] endpoint change in web.yaml: web-2 leaves, api-2 joins")
        web = manifests / "web.yaml"
        web.write_text(web.read_text().replace(OLD_WEB_2, NEW_API_2))
        sent_before = agent.parts.channel.counters.total("sent") if agent.parts.channel else (0, 0)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            eps = {s["name"]: s["endpoints"] for s in agent.pages.status_json()["services"]}
            if eps.get("demo/web:http/TCP") == ["10.244.0.11:8080", "10.244.0.14:8080"]:
                break
            await asyncio.sleep(0.1)
        sent_after = agent.parts.channel.counters.total("sent") if agent.parts.channel else (0, 0)
        change = {
            "openflow_messages": sent_after[0] - sent_before[0],
            "openflow_bytes": sent_after[1] - sent_before[1],
        }
        report["change"] = change
        say(
            f"   applied with {change['openflow_messages']} OpenFlow messages "
            f"({change['openflow_bytes']} bytes, bundle control included)"
        )
        with Progress(console=console, transient=True, disable=as_json) as progress:
            second = await asyncio.to_thread(
                _measure, sandbox, pods, AFTER_CHANGE, requests, progress
            )
        report["phases"].append({"phase": "after endpoint change", "results": second})
        say(_table("Traffic follows the endpoints", second))
        report["ok"] = all(r["ok"] for phase in report["phases"] for r in phase["results"])
    finally:
        stop.set()
        if agent_task is not None:
            try:
                await agent_task
            except Exception as exc:
                report.setdefault("error", f"{type(exc).__name__}: {exc}")
        await asyncio.to_thread(sandbox.down)
        shutil.rmtree(workdir, ignore_errors=True)
        say("[bold]5.[/] cleaned up: agent stopped, sandbox, pods and namespaces removed")
    return report


def _measure_cluster(
    lab: Lab, requests: int, console: Console, as_json: bool
) -> list[dict[str, Any]]:
    """``requests`` HTTP requests to lab/web (IPv4 and IPv6) from a pod and from the node
    namespace of every node; each row says whether every serving pod, and only those, answered."""
    expected = sorted(ep.pod for ep in lab.endpoints())
    results = []
    with Progress(console=console, transient=True, disable=as_json) as progress:
        task = progress.add_task("requests", total=len(lab.nodes) * 4 * requests)
        for node in lab.nodes.values():
            client = next(p for p in node.pods.values() if not p.http_ports)
            for url in ("http://10.96.0.10/", "http://[fd00:10:96::10]/"):
                for who, netns in (
                    (f"pod {client.name}", client.netns),
                    ("node namespace", node.netns),
                ):
                    out = probe(
                        lab_rig(lab), netns, "http", url, "--count", str(requests), echo=False
                    )
                    results.append(
                        {
                            "service": f"lab/web ({node.name})",
                            "url": url,
                            "node": node.name,
                            "client": f"{node.name} {who}",
                            "counts": dict(sorted(out["counts"].items())),
                            "failed": out["failed"],
                            "failures": out["failures"],
                            **({"evidence": out["evidence"]} if "evidence" in out else {}),
                            "expected": expected,
                            "ok": out["failed"] == 0 and sorted(out["counts"]) == expected,
                        }
                    )
                    progress.advance(task, requests)
    return results


def _wait_web(lab: Lab) -> float:
    """Seconds until every agent programs lab/web with the lab's serving pods."""
    started = time.monotonic()
    lab.wait_endpoints("lab/web:http/TCP", endpoint_texts(lab.endpoints(), HTTP_PORT))
    return round(time.monotonic() - started, 3)


def _run_cluster_demo(nodes: int, requests: int, as_json: bool, console: Console) -> dict[str, Any]:
    say = (lambda *a, **k: None) if as_json else console.print
    report: dict[str, Any] = {"nodes": nodes, "phases": [], "ok": False}
    say(
        f"[bold]1.[/] a Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager) "
        f"and {nodes} nodes, each a network namespace with its own Open vSwitch and agent "
        "reading the API server, on one underlay; a web pod and a client pod on every node, "
        "registered as Node and Pod objects"
    )
    with Lab(nodes, kube=True) as lab:
        report["lab_up_s"] = round(lab.started_in or 0.0, 3)
        say(f"   up in {report['lab_up_s']} s")
        lab.apply_web_service()
        report["service_programmed_s"] = _wait_web(lab)
        say(
            "[bold]2.[/] Service lab/web (10.96.0.10, fd00:10:96::10, selector app=web) created "
            f"through the API; kube-controller-manager made its EndpointSlices "
            f"({', '.join(ep.pod for ep in lab.endpoints())}) and every agent programmed them "
            f"in {report['service_programmed_s']} s"
        )
        say(f"[bold]3.[/] {requests} HTTP requests from a pod and from the node, on every node")
        results = _measure_cluster(lab, requests, console, as_json)
        report["phases"].append({"phase": "every node to every endpoint", "results": results})
        say(_table("Which endpoint answered (local and on other nodes)", results))
        # An endpoint change as a cluster makes one: a Pod ends, another starts.
        gone, added = f"web-{nodes}", "web-1b"
        lab.delete_pod(gone)
        lab.add_pod("node-1", added)
        report["change"] = {
            "deleted_pod": gone,
            "started_pod": f"{added} (node-1)",
            "programmed_s": _wait_web(lab),
        }
        say(
            f"[bold]4.[/] Pod {gone} deleted and Pod {added} started on node-1 (app=web): the "
            "EndpointSlices followed and every agent programmed them in "
            f"{report['change']['programmed_s']} s"
        )
        after = _measure_cluster(lab, requests, console, as_json)
        report["phases"].append({"phase": "after the pod change", "results": after})
        say(_table("Traffic follows the pods", after))
        report["ok"] = all(r["ok"] for phase in report["phases"] for r in phase["results"])
    say(
        "[bold]5.[/] cleaned up: agents and control plane stopped, nodes, pods, underlay and "
        "namespaces removed"
    )
    return report


@click.command()
@click.option("--json", "as_json", is_flag=True, help="print the results as one JSON object")
@click.option("--requests", default=60, show_default=True, help="requests per ClusterIP and client")
@click.option(
    "--nodes",
    type=click.IntRange(1, 50),
    default=None,
    help="run on the multi-node lab with this many nodes (each its own OVS and agent)",
)
def demo(as_json: bool, requests: int, nodes: int | None) -> None:
    """Show ClusterIPs load-balanced by OVS with real traffic (needs root)."""
    import logging

    logging.basicConfig(level=logging.WARNING)
    console = Console(stderr=as_json)
    try:
        if nodes is not None:
            report = _run_cluster_demo(nodes, requests, as_json, console)
        else:
            report = asyncio.run(_run_demo(requests, as_json, console))
    except Exception as exc:
        if as_json:
            click.echo(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}))
            sys.exit(1)
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from exc
    if as_json:
        click.echo(json.dumps(report, indent=2))
    elif report["ok"]:
        console.print("[bold green]every endpoint answered its share; no request failed[/]")
    sys.exit(0 if report["ok"] else 1)
