"""`ovsproxy verify`: compare what the node holds with what the agent's current input requires.

It takes `ovsproxy run`'s configuration and flags (the same manifests or API, OVS endpoints,
mode, tables, group range, routes), prints every difference in ovs-ofctl (or ip route) syntax
and exits 1 when there is one, 0 when the node has converged (2: it could not check)."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import click

from ovsproxy.cli.run_cmd import _options, report_config
from ovsproxy.config import ConfigError


@click.command()
@_options
@click.option("--timeout", type=float, default=60.0, show_default=True, help="seconds per step")
def verify(config_file: str | None, timeout: float, **flags: Any) -> None:
    """Exit 0 when the node holds exactly what the agent's input requires, else print every
    difference and exit 1 (nothing on the node is changed)."""
    from ovsproxy.agent.verify import verify as run_verify

    config = report_config(config_file, flags)
    try:
        report = asyncio.run(run_verify(config, timeout=timeout))
    except ConfigError as exc:
        raise click.ClickException(f"configuration: {exc}") from exc
    except Exception as exc:
        click.echo(f"Error: cannot verify: {type(exc).__name__}: {exc}", err=True)
        sys.exit(2)
    click.echo(report.text())
    sys.exit(0 if report.clean else 1)
