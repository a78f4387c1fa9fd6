"""The embedded default (``ovsproxy run`` with no OVS given): a private OVS sandbox with the
example lab's pods, the bundled example manifests, and a banner saying how to try it."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable

from ovsproxy.agent.wiring import Components, manifest_paths
from ovsproxy.config import AgentConfig
from ovsproxy.lab import build_lab
from ovsproxy.model import IPAddress
from ovsproxy.ovs.sandbox import Sandbox

log = logging.getLogger("ovsproxy.agent")


async def start_sandbox(config: AgentConfig) -> Sandbox:
    """Start the sandbox (its own OVS and node namespace) and build the lab's pods in it."""
    log.info("no OVS given: starting the private OVS sandbox with the example lab")
    sandbox = Sandbox("run-" + os.urandom(2).hex(), bridge=config.bridge, gateway=config.gateway)
    await asyncio.to_thread(sandbox.up)
    try:
        await asyncio.to_thread(build_lab, sandbox)
    except BaseException:
        await asyncio.to_thread(sandbox.down)
        raise
    log.info(
        "sandbox %s: bridge %s, node namespace %s, OpenFlow %s",
        sandbox.name,
        config.bridge,
        sandbox.netns,
        sandbox.openflow,
    )
    return sandbox


def banner(
    sandbox: Sandbox, http_port: int, cluster_ips: Iterable[IPAddress], manifests: Iterable[str]
) -> list[str]:
    """How to try the embedded default: the lab's ClusterIPs answer from its namespaces.
    No ``manifests``: the Services come from the API (``ovsproxy run --kube``)."""
    manifests = list(manifests)
    ns = sandbox.netns
    ips = sorted({str(ip) for ip in cluster_ips})
    return [
        "embedded default is up. Try (as root, in another terminal):",
        f"  ip netns exec {ns} curl -s http://10.96.0.10/        # from the node",
        f"  ip netns exec {ns}-client curl -s http://10.96.0.10/  # from a pod",
        f"  ip netns exec {ns} curl -s 'http://[fd00:10:96::20]/'",
        f"  ovsproxy status --address 127.0.0.1:{http_port}",
        f"  ovsproxy dump --address 127.0.0.1:{http_port}",
        f"ClusterIPs: {', '.join(ips)}",
        (
            f"Edit the manifests in {', '.join(manifests)}: changes apply live. "
            "Ctrl-C stops and removes the sandbox."
            if manifests
            else "The Services come from the Kubernetes API: what kubectl changes applies "
            "live. Ctrl-C stops and removes the sandbox and the control plane."
        ),
    ]


def log_banner(parts: Components, http_port: int) -> None:
    """Log the banner once the first sync is done (the lab's ClusterIPs answer by then)."""
    assert parts.sandbox is not None
    lines = banner(
        parts.sandbox, http_port, parts.tracker.cluster_ips(), manifest_paths(parts.config)
    )
    for line in lines:
        log.info("%s", line)
