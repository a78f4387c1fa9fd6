"""`ovsproxy sandbox up | status | down`: a private OVS to play with or point the agent at."""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from ovsproxy.ovs.sandbox import Sandbox, SandboxError, list_records, sweep_leftovers

DEFAULT_NAME = "ovsproxy"


def _print_status(info: dict[str, Any]) -> None:
    table = Table(title=f"OVS sandbox {info['name']}", show_header=False)
    table.add_row("running", "yes" if info["running"] else "NO")
    for key in ("bridge", "gateway", "openflow", "ovsdb", "netns", "rundir"):
        table.add_row(key, str(info[key]))
    table.add_row("ports", "\n".join(info["ports"]) or "-")
    table.add_row("processes", ", ".join(f"{k}={v}" for k, v in info["processes"].items()))
    Console().print(table)


@click.group()
def sandbox() -> None:
    """A private ovsdb-server + ovs-vswitchd in its own network namespace."""


@sandbox.command()
@click.option("--name", default=DEFAULT_NAME, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="print the status as JSON")
def up(name: str, as_json: bool) -> None:
    """Start a sandbox that stays up until `ovsproxy sandbox down`."""
    try:
        sb = Sandbox(name, persistent=True).up()
    except SandboxError as exc:
        raise click.ClickException(str(exc)) from exc
    info = sb.status()
    if as_json:
        click.echo(json.dumps(info, indent=2))
    else:
        _print_status(info)


@sandbox.command()
@click.option("--name", default=None, help="one sandbox (default: all)")
@click.option("--json", "as_json", is_flag=True)
def status(name: str | None, as_json: bool) -> None:
    """Bridge, ports, OpenFlow and OVSDB endpoints of running sandboxes."""
    sweep_leftovers()
    names = [name] if name else [r.name for r in list_records()]
    infos = []
    for each in names:
        try:
            infos.append(Sandbox.attach(each).status())
        except SandboxError as exc:
            raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(infos[0] if name else infos, indent=2))
        return
    if not infos:
        click.echo("no sandbox is up (`ovsproxy sandbox up` starts one)")
    for info in infos:
        _print_status(info)


@sandbox.command()
@click.option("--name", default=DEFAULT_NAME, show_default=True)
@click.option("--all", "all_", is_flag=True, help="every sandbox on this machine")
def down(name: str, all_: bool) -> None:
    """Stop a sandbox and remove its processes, namespaces, veths and run directory."""
    names = [r.name for r in list_records()] if all_ else [name]
    for each in names:
        try:
            Sandbox.attach(each).down()
        except SandboxError as exc:
            if not all_:
                raise click.ClickException(str(exc)) from exc
        click.echo(f"sandbox {each} removed", file=sys.stderr)
