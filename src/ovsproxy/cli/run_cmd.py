"""`ovsproxy run`: the agent. With no flags it runs the embedded default: a private OVS sandbox
with the bundled example manifests and the pods they point at."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
from typing import Any

import click

from ovsproxy.config import AgentConfig, ConfigError, load


def _options(func: Any) -> Any:
    options = [
        click.option(
            "--config",
            "config_file",
            type=click.Path(exists=True, dir_okay=False),
            help="YAML file; flags override its keys",
        ),
        click.option("--manifests", multiple=True, help="manifest file or directory (repeat)"),
        click.option(
            "--manifest-max-bytes",
            type=int,
            help="a larger manifest file is not read (reported) [67108864]",
        ),
        click.option("--kubeconfig", help="read the Kubernetes API with this kubeconfig"),
        click.option(
            "--in-cluster",
            is_flag=True,
            default=None,
            help="read the Kubernetes API with the pod's service account",
        ),
        click.option(
            "--service-proxy-name",
            help="handle only Services labelled service.kubernetes.io/service-proxy-name=NAME "
            "[none: only Services without that label]",
        ),
        click.option(
            "--refuse-external-ips",
            is_flag=True,
            default=None,
            help="serve Services without their externalIPs (each such Service a problem)",
        ),
        click.option("--ovsdb", help="OVSDB endpoint, e.g. unix:/var/run/openvswitch/db.sock"),
        click.option(
            "--openflow", help="OpenFlow endpoint, e.g. unix:/var/run/openvswitch/br-int.mgmt"
        ),
        click.option("--bridge", help="bridge name [br0]"),
        click.option("--gateway", help="gateway port/device for Service routes [gw0]"),
        click.option("--netns", help="network namespace of the node's routes (default: ours)"),
        click.option(
            "--mode",
            type=click.Choice(["standalone", "integrated"]),
            help="own the bridge, or a table range in a CNI's bridge",
        ),
        click.option("--first-table", type=int, help="first of our 5 tables [10]"),
        click.option("--next-table", type=int, help="table that takes forwarded packets [20]"),
        click.option("--group-id-min", type=int, help="lowest group id we use [1]"),
        click.option("--group-id-max", type=int, help="highest group id we use [0xFFFFFEFF]"),
        click.option(
            "--host-snat-ip",
            multiple=True,
            help="standalone: per family, the address node-originated Service traffic to other "
            "nodes is SNATed to (its neighbour entry is made) [the address below the last of "
            "the gateway's pod CIDR]",
        ),
        click.option(
            "--node-name",
            help="this node's name, for traffic policies Local [the host name]",
        ),
        click.option("--zone", help="this node's topology zone"),
        click.option(
            "--node-ip",
            multiple=True,
            help="this node's IP (repeat; primary of each family first); default: the global "
            "addresses of the node namespace's devices other than the gateway",
        ),
        click.option(
            "--node-port-addresses",
            multiple=True,
            help="node IPs that accept NodePorts: CIDRs (repeat) or 'primary' [all node IPs]",
        ),
        click.option(
            "--node-ports/--no-node-ports",
            default=None,
            help="standalone: capture NodePort, external IP and LB IP traffic into OVS "
            "(nftables table, policy routes, health-check servers) [capture]",
        ),
        click.option(
            "--service-cidr",
            multiple=True,
            help="Service range(s) to route; else ServiceCIDR API, else aggregation",
        ),
        click.option(
            "--manage-routes/--no-routes",
            default=None,
            help="route the Service CIDRs via the gateway [manage]",
        ),
        click.option(
            "--route-sync-interval",
            type=float,
            help="seconds between route repairs; 0: never [60]",
        ),
        click.option(
            "--mid-stream-flows",
            type=click.Choice(["auto", "on", "off"]),
            help="re-create connections' translations after an ovs-vswitchd restart; auto: "
            "on for the userspace datapath (netdev) [auto]",
        ),
        click.option(
            "--route-backend",
            type=click.Choice(["auto", "linux", "windows"]),
            help="routing table to program; auto: by platform [auto]",
        ),
        click.option(
            "--health-address",
            help="HOST:PORT for /healthz, /readyz and /livez only (what a kubelet or a load "
            "balancer asks); empty: none [0.0.0.0:10256]",
        ),
        click.option(
            "--metrics-address",
            help="HOST:PORT for /metrics and the health paths, and /status and /dump when "
            "HOST is loopback [127.0.0.1:10249]",
        ),
        click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"])),
        click.option("--log-format", type=click.Choice(["text", "json"])),
        click.option("--min-sync-interval", type=float, help="seconds between syncs [0.1]"),
        click.option("--full-resync-interval", type=float, help="seconds [3600]"),
        click.option(
            "--counters-interval",
            type=float,
            help="seconds between reads of the switch's per-Service counters; 0: never [15]",
        ),
        click.option(
            "--counters-max-series",
            type=int,
            help="most series per traffic counter metric; the rest summed as (other) [1000]",
        ),
        click.option(
            "--cleanup",
            is_flag=True,
            default=None,
            help="on exit, remove our flows, groups, Service routes, capture table and its "
            "policy routes",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def report_config(config_file: str | None, flags: dict[str, Any]) -> AgentConfig:
    """The configuration of a command that prints a report (``verify``, ``cleanup``), with
    logging quiet unless asked: the report goes to stdout, logs to stderr."""
    from ovsproxy.agent import setup_logging

    try:
        config = load(config_file, **flags)
    except ConfigError as exc:
        raise click.ClickException(f"configuration: {exc}") from exc
    setup_logging(flags.get("log_level") or "warning", config.log_format)
    return config


@click.command()
@_options
@click.option(
    "--kube",
    is_flag=True,
    help="the embedded default on a real Kubernetes control plane (etcd, kube-apiserver, "
    "kube-controller-manager on loopback): the example Services and EndpointSlices applied "
    "through the API, the agent reading it; Ctrl-C removes it all",
)
def run(config_file: str | None, kube: bool, **flags: Any) -> None:
    """Run the proxy agent (Ctrl-C to stop; flows and routes stay unless --cleanup)."""
    from ovsproxy.agent import setup_logging

    try:
        config = load(config_file, **flags)
    except ConfigError as exc:
        raise click.ClickException(f"configuration: {exc}") from exc
    setup_logging(config.log_level, config.log_format)
    if not kube:
        _run_agent(config)
        return
    if not config.embedded or config.manifests or config.kubeconfig or config.in_cluster:
        raise click.ClickException(
            "--kube runs the embedded default on its own control plane: give it no "
            "--ovsdb/--openflow, --manifests, --kubeconfig or --in-cluster"
        )
    from ovsproxy.lab.controlplane import ControlPlaneError, kube_binary
    from ovsproxy.lab.examples import agent_kubeconfig, example_control_plane, user_kubeconfig

    log = logging.getLogger("ovsproxy.agent")
    log.info("--kube: starting the control plane (etcd, kube-apiserver, kube-controller-manager)")
    try:
        with example_control_plane(config.node_name) as api:
            log.info("API server %s holds the examples (namespace demo); kubectl:", api.url)
            log.info("  export KUBECONFIG=%s", user_kubeconfig(api))
            log.info("  %s get services,endpointslices", kube_binary("kubectl"))
            _run_agent(dataclasses.replace(config, kubeconfig=str(agent_kubeconfig(api))))
    except ControlPlaneError as exc:
        raise click.ClickException(f"--kube: {exc}") from exc


def _run_agent(config: AgentConfig) -> None:
    from ovsproxy.agent import Agent

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        main_pid = os.getpid()

        def on_signal(signum: int, frame: object) -> None:
            # Not loop.add_signal_handler: its wakeup fd is shared with children forked
            # from us (pyroute2 forks a helper per network namespace), whose signals would
            # then stop the agent.
            if os.getpid() != main_pid:
                return
            logging.getLogger("ovsproxy.agent").info("%s: stopping", signal.Signals(signum).name)
            loop.call_soon_threadsafe(stop.set)

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, on_signal)
        await Agent(config).run(stop)

    try:
        asyncio.run(main())
    except Exception as exc:  # start-up errors: one clear line, not a traceback
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from exc
