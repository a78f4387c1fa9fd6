"""`ovsproxy cleanup`: remove everything of ours from this node, with nothing but the
configuration (no Kubernetes API, no sync); safe to run again (then nothing is left to remove).

It takes `ovsproxy run`'s configuration and flags (the OVS endpoints, bridge, gateway, network
namespace, mode and group range say where ours is), prints each thing removed and each thing
left on purpose, and exits 0 when done (also when nothing was there), 1 when a removal failed."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import click

from ovsproxy.cli.run_cmd import _options, report_config
from ovsproxy.config import ConfigError


@click.command()
@_options
@click.option("--timeout", type=float, default=30.0, show_default=True, help="seconds to reach OVS")
def cleanup(config_file: str | None, timeout: float, **flags: Any) -> None:
    """Remove our flows, groups, meter, Service routes, neighbour entries, nftables table and
    policy rules from this node (stop the agent first); print what was removed and what is
    left on purpose."""
    from ovsproxy.agent.cleanup import cleanup_node

    config = report_config(config_file, flags)
    try:
        report = asyncio.run(cleanup_node(config, timeout=timeout))
    except ConfigError as exc:
        raise click.ClickException(f"configuration: {exc}") from exc
    click.echo(report.text())
    sys.exit(1 if report.errors else 0)
