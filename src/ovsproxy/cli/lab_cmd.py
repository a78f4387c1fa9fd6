"""`ovsproxy lab up | status | down`: a cluster of N nodes on this machine, each with its own
OVS and agent, pods on every node and the Service ``lab/web`` across all of them."""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from ovsproxy.lab.cluster import HTTP_PORT, Lab, LabError, lab_down, lab_status, list_lab_records
from ovsproxy.lab.controlplane import ControlPlaneError
from ovsproxy.lab.manifests import endpoint_texts
from ovsproxy.ovs.sandbox import SandboxError

DEFAULT_NAME = "lab"


def _print_status(info: dict[str, Any]) -> None:
    console = Console()
    head = Table(title=f"ovsproxy lab {info['name']}", show_header=False)
    kube = info.get("kubernetes")
    if kube:
        head.add_row("API server", kube["server"])
        head.add_row("kubeconfig", f"export KUBECONFIG={kube['kubeconfig']}")
        head.add_row("kubectl", kube["kubectl"])
        head.add_row("web pods", f"namespace {kube['namespace']}, selector {_selector(kube)}")
    else:
        head.add_row("manifests", info["manifests"])
    head.add_row(
        "underlay", f"{info['underlay']['netns']} ({', '.join(info['underlay']['networks'])})"
    )
    ext = info["external_client"]
    head.add_row("external client", f"{ext['netns']} ({', '.join(ext['ips'])})")
    if info.get("started_in_s") is not None:
        head.add_row("started in", f"{info['started_in_s']} s")
    console.print(head)
    nodes = Table(title="nodes")
    for column in ("node", "zone", "namespace", "node IPs", "pod CIDRs", "agent"):
        nodes.add_column(column)
    pods = Table(title="pods")
    for column in ("pod", "node", "IPs", "namespace", "serves"):
        pods.add_column(column)
    for node in info["nodes"]:
        agent = node["agent"]
        state = agent.get("metrics") or "-"
        if agent.get("running") is False:
            state += " [red](not running)[/]"
        nodes.add_row(
            node["name"],
            node["zone"],
            node["netns"],
            "\n".join(node["node_ips"]),
            "\n".join(node["pod_cidrs"]),
            state,
        )
        for pod in node["pods"]:
            serves = pod["serves"]
            pods.add_row(
                pod["name"],
                node["name"],
                "\n".join(pod["ips"]),
                pod["netns"],
                " ".join(
                    [f"http:{p}" for p in serves["http"]] + [f"udp:{p}" for p in serves["udp"]]
                )
                or "-",
            )
    console.print(nodes)
    console.print(pods)


@click.group()
def lab() -> None:
    """A multi-node cluster on this machine (nodes, underlay, pods, one agent per node)."""


@lab.command()
@click.option("--nodes", default=3, show_default=True, help="number of nodes")
@click.option("--zones", default=1, show_default=True, help="zones (assigned round-robin)")
@click.option("--name", default=DEFAULT_NAME, show_default=True)
@click.option(
    "--manifests",
    "manifests_only",
    is_flag=True,
    help="no control plane: the agents read the lab's manifests directory instead",
)
@click.option("--json", "as_json", is_flag=True, help="print the status as JSON")
def up(nodes: int, zones: int, name: str, manifests_only: bool, as_json: bool) -> None:
    """Start a lab that stays up until `ovsproxy lab down`: a real Kubernetes control plane
    (etcd, kube-apiserver, kube-controller-manager on loopback), N nodes with their pods
    registered as Node and Pod objects, and the Service lab/web."""
    cluster = Lab(nodes, zones=zones, name=name, persistent=True, kube=not manifests_only)
    try:
        cluster.up()
    except (LabError, SandboxError, ControlPlaneError) as exc:
        raise click.ClickException(str(exc)) from exc
    try:
        service = cluster.apply_web_service()
        # Up means usable: every agent has programmed lab/web.
        for port in service.ports:
            cluster.wait_endpoints(
                f"lab/web:{port.name}/{port.protocol}",
                endpoint_texts(service.endpoints, port.target_port),
            )
        status = cluster.status()
    except BaseException as exc:
        # A lab that is not usable is not left half up.
        cluster.down()
        if isinstance(exc, (LabError, SandboxError, ControlPlaneError)):
            raise click.ClickException(str(exc)) from exc
        raise
    if as_json:
        click.echo(json.dumps(status, indent=2))
        return
    _print_status(status)
    node = status["nodes"][0]
    client = next((p for p in node["pods"] if not p["serves"]["http"]), node["pods"][0])
    click.echo(
        f"\nService lab/web: 10.96.0.10 / fd00:10:96::10 (HTTP 80, UDP 53) on every node's "
        f"web pod. Try:\n  ip netns exec {client['netns']} curl -s http://10.96.0.10/\n"
        f"  ip netns exec {node['netns']} curl -s http://[fd00:10:96::10]/\n"
        f"  ovsproxy status --address {node['agent']['metrics'].removeprefix('http://')}\n"
        + _kube_hint(status)
        + "`ovsproxy lab down` removes it all."
    )


def _selector(kube: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in kube["web_selector"].items())


def _kube_hint(status: dict[str, Any]) -> str:
    kube = status.get("kubernetes")
    if not kube:
        return f"Edit or add manifests in {status['manifests']}; "
    return (
        f"The cluster's API server is {kube['server']}; kubectl of the same release "
        f"(namespace {kube['namespace']} by default; the web pods are {_selector(kube)}):\n"
        f"  export KUBECONFIG={kube['kubeconfig']}\n"
        f"  {kube['kubectl']} get services,endpointslices,pods -o wide\n"
        f"  {kube['kubectl']} expose service web --name web-np --type NodePort"
        f" --port 80 --target-port {HTTP_PORT}\n"
    )


@lab.command()
@click.option("--name", default=DEFAULT_NAME, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="print the status as JSON")
def status(name: str, as_json: bool) -> None:
    """Nodes, pods, addresses, namespaces and agent endpoints of a running lab."""
    try:
        info = lab_status(name)
    except LabError as exc:
        if as_json:
            click.echo(json.dumps({"name": name, "running": False, "error": str(exc)}))
            sys.exit(1)
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(info, indent=2))
    else:
        _print_status(info)


@lab.command()
@click.option("--name", default=None, help="the lab to remove [every lab]")
def down(name: str | None) -> None:
    """Stop the agents and remove nodes, pods, namespaces and files of a lab."""
    try:
        removed = lab_down(name)
    except LabError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"removed {', '.join(removed)}" if removed else "no lab was up")


__all__ = ["lab", "list_lab_records"]
