"""`ovsproxy status` and `ovsproxy dump`: what a running agent has installed, from its
metrics address (``--metrics-address``: /metrics, /status and /dump; /healthz is on the
health address)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ovsproxy.config import DEFAULT_METRICS_ADDRESS

ADDRESS_HELP = "the agent's --metrics-address"


def _get(address: str, path: str) -> str:
    url = f"http://{address}{path}"
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return str(resp.read().decode())
    except (urllib.error.URLError, OSError) as exc:
        raise click.ClickException(
            f"no ovsproxy agent answers at {url} ({exc}); is `ovsproxy run` running, and with "
            "which --metrics-address?"
        ) from exc


def _affinity(service: dict[str, Any]) -> str:
    seconds = service.get("session_affinity_s") or 0
    return f"ClientIP {seconds}s" if seconds else "-"


_STYLE = {"forward": "green", "reject": "yellow", "drop": "red"}


def _describe(action: str, endpoints: int, reason: str) -> str:
    if action == "forward":
        return f"[green]forwarding to {endpoints} endpoint{'' if endpoints == 1 else 's'}[/]"
    verb = {"reject": "rejecting", "drop": "dropping"}.get(action, action)
    why = f" ({escape(reason)})" if reason else ""
    return f"[{_STYLE.get(action, 'red')}]{verb}{why}[/]"


def switch_action(service: dict[str, Any]) -> str:
    """What the switch does with this Service port's traffic: forwarding to N endpoints,
    rejecting or dropping (and why), per family and for external frontends when they differ.

    Read from each family's selection (``families`` in /status); an agent without it is
    described by its ``rejecting`` flag and endpoint count."""
    families: dict[str, Any] = service.get("families") or {}
    if not families:
        if service.get("rejecting"):
            return _describe("reject", 0, "")
        return _describe("forward", len(service.get("endpoints", ())), "")
    parts: list[tuple[str, str]] = []
    for family, sel in sorted(families.items()):
        parts.append((family, _describe(sel["action"], len(sel["endpoints"]), sel["reason"])))
        external = sel.get("external")
        if external:
            what = _describe(external["action"], len(external["endpoints"]), external["reason"])
            parts.append((f"{family} external", what))
    if len({what for _, what in parts}) == 1:
        return parts[0][1]
    return "; ".join(f"{where}: {what}" for where, what in parts)


def render_status(info: dict[str, Any], console: Console) -> None:
    head = Table(show_header=False, title="ovsproxy agent")
    head.add_row("version", str(info["version"]))
    head.add_row("healthy", "yes" if info["healthy"] else "[red]NO[/]")
    node = info.get("node")
    if node:
        head.add_row("Node", f"{escape(node['name'])}: {_node_text(node)}")
    head.add_row(
        "OpenFlow",
        f"connected={info['openflow']['connected']} connections={info['openflow']['connections']}",
    )
    ovsdb = info.get("ovsdb") or {}
    if ovsdb:
        text = "connected" if ovsdb.get("connected") else "[red]NOT connected[/]"
        if not ovsdb.get("connected") and ovsdb.get("last_error"):
            text += f" ({escape(str(ovsdb['last_error']))})"
        registry = ovsdb.get("group_ids") or {}
        if registry and not registry.get("saved"):
            text += ", [yellow]group ids not saved yet[/] (kept in memory, retried)"
        head.add_row("OVSDB", f"{escape(str(ovsdb.get('endpoint', '')))}: {text}")
    if info.get("sandbox"):
        head.add_row("sandbox", f"{info['sandbox']} (node namespace {info['node_namespace']})")
    head.add_row(
        "installed",
        f"{info['groups']} groups, {info['flows']} flows, cookie generation {info['generation']}",
    )
    mid_stream = (info.get("ovs") or {}).get("mid_stream_flows")
    if mid_stream:
        state = "on" if mid_stream["on"] else "off"
        head.add_row("mid-stream flows", f"{state} ({escape(str(mid_stream['reason']))})")
    head.add_row("Service routes", ", ".join(info["routes"]) or "-")
    host_snat = info.get("host_snat") or {}
    if host_snat:
        head.add_row(
            "host SNAT",
            ", ".join(
                f"{family} {c['address']} ({c['origin']})"
                if c["address"]
                else f"{family} [yellow]none[/] ({escape(c['reason'] or '')})"
                for family, c in host_snat.items()
            ),
        )
    node_ports = info.get("node_ports")
    if node_ports:
        head.add_row("NodePort IPs", ", ".join(node_ports["node_port_ips"]) or "-")
        last_steering_sync = node_ports.get("last_sync") or {}
        head.add_row(
            "capture table",
            f"{node_ports['table']}: {node_ports['elements']} elements"
            + (f", last sync {last_steering_sync['kind']}" if last_steering_sync else "")
            + (f", {node_ports['errors']} failed syncs" if node_ports["errors"] else ""),
        )
        head.add_row("capture routes", "; ".join(node_ports["policy_routes"]) or "-")
        checks = [
            f"{c['service']} :{c['port']} {c['status']}"
            if "port" in c
            else f"{c['service']} FAILED {c['failed']}"
            for c in node_ports["health_checks"]
        ]
        head.add_row("health checks", ", ".join(checks) or "-")
    last = info.get("last_sync", {})
    head.add_row(
        "last sync",
        f"{last.get('last_sync_age_s')}s ago"
        + (f", error: {last['last_sync_error']}" if last.get("last_sync_error") else ""),
    )
    console.print(head)
    console.print("[bold]Service ports[/]")
    for svc in info["services"]:
        groups = ", ".join(f"IPv{family} {gid}" for family, gid in svc["group_ids"].items())
        port = svc["port"]
        frontends = ", ".join(
            f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}" for ip in svc["cluster_ips"]
        )
        state = switch_action(svc)
        used = ", ".join(svc["endpoints"]) or "-"
        console.print(f"  [bold]{escape(svc['name'])}[/]  {state}  group {groups}")
        console.print(f"    frontends  {escape(frontends)}")
        console.print(
            f"    endpoints  {escape(used)} "
            f"({len(svc['endpoints'])} in use of {svc['all_endpoints']})"
        )
        console.print(
            f"    affinity {_affinity(svc)}, internal traffic policy "
            f"{svc['internal_traffic_policy']}"
        )
        external = [*svc.get("external_ips", []), *svc.get("load_balancer_ips", [])]
        if svc.get("node_port") or external:
            line = f"    {svc.get('type', '')}"
            if svc.get("node_port"):
                line += f", NodePort {svc['node_port']}"
            if external:
                line += f", external/LB IPs {', '.join(external)}"
            line += f", external traffic policy {svc.get('external_traffic_policy', '')}"
            if svc.get("health_check_node_port"):
                line += f", health check :{svc['health_check_node_port']}"
            if svc.get("load_balancer_source_ranges"):
                line += f", source ranges {', '.join(svc['load_balancer_source_ranges'])}"
            console.print(escape(line))
    if info.get("refused"):
        console.print("[bold red]refused by Open vSwitch (last good state kept)[/]")
        for name, reason in info["refused"].items():
            console.print(f"  {escape(name)}: {escape(reason)}")
    if info.get("conflicts"):
        console.print("[bold red]refused: a port an older Service claims (not installed)[/]")
        for conflict in info["conflicts"]:
            console.print(f"  {escape(conflict['problem'])}")
    if info.get("unserved_paths"):
        console.print("[bold yellow]paths this node cannot serve[/]")
        for path in info["unserved_paths"]:
            line = f"  {path['path']} ({path['family']}): {path['reason']}"
            console.print(escape(line))
    if info.get("not_pods"):
        console.print("[bold yellow]bridge interfaces not read as pods (no flows)[/]")
        for port in info["not_pods"]:
            console.print(f"  {escape(port['interface'])}: {escape(port['reason'])}")
    if info.get("problems"):
        console.print("[bold red]problems in the sources[/]")
        for problem in info["problems"]:
            console.print(f"  {escape(problem)}")


@click.command()
@click.option("--address", default=DEFAULT_METRICS_ADDRESS, show_default=True, help=ADDRESS_HELP)
@click.option("--json", "as_json", is_flag=True)
def status(address: str, as_json: bool) -> None:
    """Services, ClusterIPs, group ids, endpoints and routes of a running agent."""
    info = json.loads(_get(address, "/status"))
    if as_json:
        click.echo(json.dumps(info, indent=2))
    else:
        render_status(info, Console())


@click.command()
@click.option("--address", default=DEFAULT_METRICS_ADDRESS, show_default=True, help=ADDRESS_HELP)
def dump(address: str) -> None:
    """The groups and flows the agent owns, in ovs-ofctl -O OpenFlow15 syntax."""
    click.echo(_get(address, "/dump"), nl=False)


def _node_text(node: dict[str, Any]) -> str:
    """The Node object's standing, as /healthz takes it (Kubernetes API source only)."""
    if node["deleted"]:
        return "[red]deleted[/] (/healthz 503)"
    if not node["found"]:
        return "not found (counts as eligible)"
    ips = ", ".join(node["internal_ips"] + node["external_ips"]) or "no addresses"
    if node["eligible"]:
        return f"eligible, {ips}"
    why = "being deleted" if node["deletion_timestamp"] else "tainted " + ", ".join(node["taints"])
    return f"[red]going away[/] ({escape(why)}; /healthz 503), {ips}"
