"""Every verb deploy/base/rbac.yaml grants is needed, and a missing one is named.

For each resource and verb of the shipped ClusterRole: the ClusterRole is applied without
that verb (the rest as shipped) on the real kube-apiserver, and a real agent process reads the
API as the shipped ServiceAccount. What it was refused (the server's 403 names the verb and
the resource) must be in its log and in ``/status`` ``problems``, and it keeps serving what it
still can: without ``list`` on Services or EndpointSlices nothing can be proxied (the agent
waits for both first lists, as kube-proxy does) and it stays unhealthy, naming why; without
any other verb it serves the Service and its endpoint (a ``watch`` refused: the informer
re-lists after a backoff; ServiceCIDRs refused: the Service routes come from the ClusterIPs;
its Node refused: node IPs from the node's devices).

With the shipped ClusterRole as is, nothing is refused. A verb whose removal changed nothing
(no request refused, everything served, the Node found) was one the agent does not use, and
went: ``get`` on nodes (the agent lists and watches its Node with a field selector, at
start-up and in its informer, and never gets it).
"""

from __future__ import annotations

import asyncio
import copy
import json
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from ovsproxy.lab.controlplane import RBAC_MANIFEST, ControlPlane
from ovsproxy.ovs.sandbox import Sandbox
from tests.e2e.harness import AgentProcess

pytestmark = [pytest.mark.slow, pytest.mark.ovs]

ACCOUNT = "system:serviceaccount:kube-system:ovsproxy"
Doc = dict[str, Any]


def shipped_role() -> Doc:
    return next(
        d for d in yaml.safe_load_all(RBAC_MANIFEST.read_text()) if d["kind"] == "ClusterRole"
    )


def granted() -> list[tuple[str, str, str]]:
    """(API group, resource, verb) for every verb the shipped ClusterRole grants."""
    return [
        (group, resource, verb)
        for rule in shipped_role()["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    ]


def role_without(resource: str, verb: str) -> Doc:
    """The shipped ClusterRole with ``verb`` on ``resource`` removed (a rule left with no
    verb is dropped: the server refuses a rule without verbs)."""
    role = copy.deepcopy(shipped_role())
    rules = []
    for rule in role["rules"]:
        if resource in rule["resources"]:
            others = [r for r in rule["resources"] if r != resource]
            if others:
                rules.append({**rule, "resources": others})
            verbs = [v for v in rule["verbs"] if v != verb]
            if verbs:
                rules.append({**rule, "resources": [resource], "verbs": verbs})
        else:
            rules.append(rule)
    role["rules"] = rules
    return role


def can_i(api: ControlPlane, verb: str, resource: str) -> bool:
    done = api.kubectl("auth", "can-i", verb, resource, f"--as={ACCOUNT}", check=False)
    return done.stdout.strip() == "yes"


def apply_role(api: ControlPlane, role: Doc, verb: str, resource: str, allowed: bool) -> None:
    """Apply ``role`` and wait until the authorizer answers ``allowed`` for verb/resource."""
    api.kubectl("apply", "-f", "-", input=json.dumps(role))
    deadline = time.monotonic() + 30
    while can_i(api, verb, resource) != allowed:
        assert time.monotonic() < deadline, f"RBAC still says {not allowed} for {verb} {resource}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def agent_kubeconfig(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """The shipped RBAC applied and a token of its ServiceAccount; the shipped ClusterRole
    again after the module."""
    path = control_plane.ovsproxy_kubeconfig(tmp_path_factory.mktemp("rbac") / "agent.kubeconfig")
    yield path
    control_plane.kubectl("apply", "-f", str(RBAC_MANIFEST))


@dataclass(frozen=True)
class Objects:
    service: str  # its name in /status, "<namespace>/web:http/TCP"
    node: str


@pytest.fixture
def objects(control_plane: ControlPlane, kube_namespace: str) -> Iterator[Objects]:
    """A Service with one ready endpoint (in the test's namespace) and a Node of a name of
    its own (removed after)."""
    ns = kube_namespace
    control_plane.request(
        "POST",
        f"/api/v1/namespaces/{ns}/services",
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web"},
            "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
        },
    )
    control_plane.request(
        "POST",
        f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices",
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {"name": "web-1", "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": [{"addresses": ["10.244.0.11"], "conditions": {"ready": True}}],
        },
    )
    node = f"rbac-{secrets.token_hex(4)}"
    control_plane.request(
        "POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}
    )
    yield Objects(f"{ns}/web:http/TCP", node)
    control_plane.request("DELETE", f"/api/v1/nodes/{node}", ok=(200, 404))


def wait_for(
    what: str, check: Callable[[], bool], agent: AgentProcess, timeout: float = 60
) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert agent.proc is not None and agent.proc.poll() is None, agent.log()[-3000:]
        assert time.monotonic() < deadline, f"{what} within {timeout:.0f} s:\n{agent.log()[-3000:]}"
        time.sleep(0.25)


def status(agent: AgentProcess) -> Doc:
    """/status, or nothing before the agent listens."""
    try:
        return agent.status()
    except OSError:
        return {}


def served(agent: AgentProcess, objects: Objects) -> bool:
    """The Service is programmed with its endpoint, and /healthz answers 200."""
    ports = {s["name"]: s for s in status(agent).get("services", [])}
    web = ports.get(objects.service)
    return web is not None and web["endpoints"] != [] and agent.get("/healthz")[0] == 200


def agent_for(sandbox: Sandbox, kubeconfig: Path, objects: Objects, log: Path) -> AgentProcess:
    return AgentProcess(
        sandbox, None, log, *("--kubeconfig", str(kubeconfig), "--node-name", objects.node)
    )


async def test_the_shipped_role_is_enough_and_nothing_is_refused(
    agent_kubeconfig: Path, objects: Objects, sandbox: Sandbox, tmp_path: Path
) -> None:
    """The shipped ClusterRole as is: everything served, the Node found, no request refused
    (an agent that starts using a verb the role does not grant fails here)."""
    agent = agent_for(sandbox, agent_kubeconfig, objects, tmp_path / "agent.log")
    try:
        await asyncio.to_thread(agent.start, wait=False)
        await asyncio.to_thread(wait_for, "served", lambda: served(agent, objects), agent)
        assert agent.status()["node"]["found"] is True
        assert "forbidden" not in agent.log() and agent.status()["problems"] == []
    finally:
        await asyncio.to_thread(agent.stop)


@pytest.mark.parametrize(("group", "resource", "verb"), granted(), ids=lambda v: v or "core")
async def test_each_granted_verb_is_needed_and_named_when_refused(
    control_plane: ControlPlane,
    agent_kubeconfig: Path,
    objects: Objects,
    sandbox: Sandbox,
    tmp_path: Path,
    group: str,
    resource: str,
    verb: str,
) -> None:
    qualified = f"{resource}.{group}" if group else resource
    await asyncio.to_thread(
        apply_role, control_plane, role_without(resource, verb), verb, qualified, False
    )
    agent = agent_for(sandbox, agent_kubeconfig, objects, tmp_path / "agent.log")
    refused = f'cannot {verb} resource "{resource}"'  # the server's 403 message says so
    try:
        await asyncio.to_thread(agent.start, wait=False)

        def named() -> bool:
            problems = status(agent).get("problems", [])
            return refused in agent.log() and any(refused in p for p in problems)

        await asyncio.to_thread(wait_for, f"{refused} named", named, agent)
        if (resource, verb) in (("services", "list"), ("endpointslices", "list")):
            # Nothing to proxy without both first lists: not healthy, and it says why.
            assert agent.get("/healthz")[0] != 200
            assert objects.service not in {s["name"] for s in agent.status()["services"]}
        else:
            await asyncio.to_thread(wait_for, "served", lambda: served(agent, objects), agent)
            if resource != "nodes":
                assert agent.status()["node"]["found"] is True
    finally:
        await asyncio.to_thread(agent.stop)
        await asyncio.to_thread(apply_role, control_plane, shipped_role(), verb, qualified, True)
