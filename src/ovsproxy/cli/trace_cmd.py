"""`ovsproxy trace SRC DST[:PORT]`: Open vSwitch's own packet trace of a new connection through
our pipeline, explained with our table names.

The agent's /status (``--address``) says where the switch is (bridge, OVSDB, OpenFlow
endpoint, table numbers) and which Services exist and why one drops or rejects; OVSDB says
which pods sit on which port. The trace runs ``ovs-appctl ofproto/trace`` on the
ovs-vswitchd next to the agent's OpenFlow socket; ``ovsproxy.diagnostics.trace`` parses and
explains it. Resolving SRC and DST (:func:`resolve_source`, :func:`resolve_destination`) is
pure; the rest is I/O.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import click

from ovsproxy.cli.status_cmd import ADDRESS_HELP, _get
from ovsproxy.config import DEFAULT_METRICS_ADDRESS
from ovsproxy.datapath import pipeline as pl
from ovsproxy.diagnostics import trace as tr
from ovsproxy.model import IPAddress, IPFamily
from ovsproxy.model.node import NODE_STEERING_MARK, VIRTUAL_MAC, PodPort

DEFAULT_SOURCE_PORT = 40000


class TraceError(click.ClickException):
    pass


@dataclass(frozen=True, slots=True)
class Source:
    kind: str  # "pod", "node" or "address"
    label: str
    interface: str  # the OpenFlow port the packet enters on (a pod's, or the gateway)
    mac: str
    ips: tuple[IPAddress, ...]  # empty for the node: its source address is routed per DST

    def ip_for(self, family: int) -> IPAddress | None:
        return next((ip for ip in self.ips if ip.version == family), None)


@dataclass(frozen=True, slots=True)
class Destination:
    ip: IPAddress
    port: int
    protocol: str  # tcp, udp, sctp
    service: Mapping[str, Any] | None  # the /status entry of the Service port, if any
    kind: str  # "ClusterIP", or "address" (no Service frontend)

    @property
    def text(self) -> str:
        ip = f"[{self.ip}]" if self.ip.version == 6 else str(self.ip)
        return f"{ip}:{self.port}"


def _ip(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        return None


def resolve_source(text: str, pods: Sequence[PodPort], gateway: str, gateway_mac: str) -> Source:
    """SRC: "node", a pod on this node (name, namespace/name or one of its IPs), or any other
    address (a packet arriving from the gateway: another node's pod, an outside client)."""
    if text == "node":
        return Source("node", "the node", gateway, gateway_mac, ())
    ip = _ip(text)
    for pod in pods:
        full = f"{pod.namespace}/{pod.name}" if pod.namespace else pod.name
        if text in (pod.name, full) or (ip is not None and ip in pod.ips):
            return Source("pod", f"pod {full}", pod.interface, pod.mac, pod.ips)
    if ip is not None:
        return Source("address", f"address {ip} (from the gateway)", gateway, gateway_mac, (ip,))
    names = ", ".join(sorted({f"{p.namespace}/{p.name}" for p in pods})) or "none"
    raise TraceError(
        f"SRC {text!r}: not 'node', a pod on this node (pods here: {names}) or an IP address"
    )


def _split_port(text: str) -> tuple[str, str]:
    """DST's address or name and its port ("" when not given)."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        return host, rest.removeprefix(":")
    if text.count(":") > 1:  # a bare IPv6 address
        return text, ""
    host, _, port = text.partition(":")
    return host, port


def _service_name(entry: Mapping[str, Any]) -> tuple[str, str, str]:
    """(namespace/name, port name, protocol) of a /status name "ns/name:port/PROTO"."""
    name = str(entry["name"])
    base, _, rest = name.partition(":")
    port_name, _, proto = rest.rpartition("/")
    return base, port_name, proto.lower()


def frontends_of(entry: Mapping[str, Any]) -> list[tuple[IPAddress, str]]:
    """(address, kind) of a Service port's address frontends in ServiceLB: its ClusterIPs,
    then its external and load-balancer IPs (``families.*.external`` of /status)."""
    lb_ips = {str(_ip(a)) for a in entry.get("load_balancer_ips", ())}
    out = [(a, "ClusterIP") for c in entry.get("cluster_ips", ()) if (a := _ip(c)) is not None]
    for sel in (entry.get("families") or {}).values():
        for text in (sel.get("external") or {}).get("frontends", ()):
            if (a := _ip(text)) is not None:
                out.append((a, "LoadBalancer IP" if str(a) in lb_ips else "external IP"))
    return out


def resolve_destination(
    text: str,
    services: Sequence[Mapping[str, Any]],
    protocol: str | None,
    families: Sequence[int],
    node_ips: Sequence[str] = (),
) -> Destination:
    """DST: a Service (namespace/name), one of its frontends (ClusterIP, external or
    load-balancer IP; a node IP or ``node`` with a nodePort), or any address, with an optional
    :PORT (number, or for a Service its port name). ``families`` are the IP versions the
    source has, in order of preference; ``node_ips`` the node's NodePort addresses."""
    host, port_text = _split_port(text)
    ip = _ip(host)
    if host == "node" or (ip is not None and str(ip) in node_ips):
        return _node_port(text, host, ip, port_text, services, protocol, families, node_ips)
    candidates: list[tuple[Mapping[str, Any], str]] = []
    for entry in services:
        base, port_name, proto = _service_name(entry)
        kind = "ClusterIP"
        if ip is not None:
            kinds = {str(a): k for a, k in frontends_of(entry)}
            if str(ip) not in kinds:
                continue
            kind = kinds[str(ip)]
        elif base != host:
            continue
        if protocol and proto != protocol:
            continue
        if port_text and port_text not in (str(entry.get("port")), port_name):
            continue
        candidates.append((entry, kind))
    if len(candidates) > 1:
        choices = ", ".join(
            f"{e['port']!s}/{_service_name(e)[2]} ({e['name']})" for e, _ in candidates
        )
        raise TraceError(f"DST {text!r} has several ports; add :PORT and/or --proto: {choices}")
    if not candidates:
        if ip is None:
            known = sorted({_service_name(e)[0] for e in services})
            named = [e for e in services if _service_name(e)[0] == host]
            if named:
                ports = ", ".join(f"{e['port']}/{_service_name(e)[2]}" for e in named)
                raise TraceError(f"DST {text!r}: no such port of {host} (it has {ports})")
            raise TraceError(
                f"DST {text!r}: no Service of that name on this agent "
                f"(known: {', '.join(known) or 'none'})"
            )
        if not port_text.isdigit():
            raise TraceError(f"DST {text!r}: not a Service frontend; give a port number")
        return Destination(ip, int(port_text), protocol or "tcp", None, "address")
    entry, kind = candidates[0]
    proto = _service_name(entry)[2]
    if ip is None:
        ips = [a for a, k in frontends_of(entry) if k == "ClusterIP"]
        ip = next((a for f in families for a in ips if a.version == f), None)
        if ip is None:
            have = ", ".join(str(a) for a in ips) or "none"
            raise TraceError(
                f"DST {text!r}: no ClusterIP of a family the source has (ClusterIPs: {have})"
            )
    return Destination(ip, int(entry["port"]), proto, entry, kind)


def _node_port(  # noqa: PLR0917 - resolve_destination's own values, passed on
    text: str,
    host: str,
    ip: IPAddress | None,
    port_text: str,
    services: Sequence[Mapping[str, Any]],
    protocol: str | None,
    families: Sequence[int],
    node_ips: Sequence[str],
) -> Destination:
    """DST ``node:NODEPORT`` or ``NODE_IP:NODEPORT``."""
    if not port_text.isdigit():
        raise TraceError(f"DST {text!r}: a node address needs a nodePort")
    found = [
        e
        for e in services
        if e.get("node_port") == int(port_text)
        and (not protocol or _service_name(e)[2] == protocol)
    ]
    if not found:
        raise TraceError(f"DST {text!r}: no Service has nodePort {port_text}")
    if len(found) > 1:
        names = ", ".join(str(e["name"]) for e in found)
        raise TraceError(f"DST {text!r}: nodePort {port_text} of several ports; --proto: {names}")
    if ip is None:
        own = [a for n in node_ips if (a := _ip(n)) is not None]
        ip = next((a for f in families for a in own if a.version == f), None)
        if ip is None:
            raise TraceError(f"DST {text!r}: the agent reports no NodePort address of the family")
    return Destination(ip, int(port_text), _service_name(found[0])[2], found[0], "NodePort")


def source_range_block(source_ip: IPAddress, dest: Destination) -> str:
    """Why the node's steering table drops a connection from ``source_ip`` to a load-balancer
    IP before OVS sees it ("" when it does not): ``loadBalancerSourceRanges`` of the LB IP's
    family, when the Service lists any (kube-proxy's nftables semantics, ``steering.desired``;
    the node-primary-IP exception is not modelled here)."""
    if dest.kind != "LoadBalancer IP" or dest.service is None:
        return ""
    ranges = []
    for text in dest.service.get("load_balancer_source_ranges", ()):
        try:
            ranges.append(ipaddress.ip_network(text, strict=False))
        except ValueError:
            continue
    ranges = [r for r in ranges if r.version == dest.ip.version]
    if not ranges or any(source_ip in r for r in ranges):
        return ""
    listed = ", ".join(str(r) for r in ranges)
    return (
        f"loadBalancerSourceRanges: {source_ip} is in none of {listed}; the node's capture "
        "table drops it before it reaches Open vSwitch"
    )


def traced_address(dest: Destination, source: Source) -> tuple[IPAddress, str]:
    """The destination address OVS sees, and what happened before OVS ("" when nothing): a
    NodePort from outside OVS (the node, another host) reaches it DNATed by the node's
    steering table to the virtual NodePort IP, its port kept; a pod's reaches OVS as sent."""
    if dest.kind != "NodePort" or source.kind == "pod":
        return dest.ip, ""
    virtual = pl.VIRTUAL_NODEPORT_IP[IPFamily.of(dest.ip)]
    return virtual, f"the node's capture table DNATs {dest.text} to {virtual} (not traced)"


STEERED_KINDS = ("NodePort", "external IP", "LoadBalancer IP")


def masqueraded(dest: Destination, source: Source) -> bool:
    """Whether the node's steering table masquerades the connection before OVS sees it: a
    steered frontend (NodePort, external or load-balancer IP) reached from outside OVS (the
    node, another host) of a Service with externalTrafficPolicy Cluster (``steering.render``'s
    nat-postrouting). OVS then sees the gateway's address as the source (its port kept when
    the kernel's conntrack has it free), and hashes that."""
    if source.kind == "pod" or dest.kind not in STEERED_KINDS or dest.service is None:
        return False
    return str(dest.service.get("external_traffic_policy", "Cluster")) != "Local"


def service_context(dest: Destination) -> dict[str, Any]:
    """What the agent says about the destination's family: its action, reason and the
    endpoints it leaves out (and why) — the external selection for external, load-balancer
    and NodePort frontends."""
    if dest.service is None:
        return {}
    family = f"IPv{dest.ip.version}"
    sel = (dest.service.get("families") or {}).get(family) or {}
    if dest.kind != "ClusterIP" and sel.get("external"):
        sel = {**sel, **sel["external"]}
    return {
        "name": dest.service["name"],
        "frontend_kind": dest.kind,
        "action": sel.get("action"),
        "reason": sel.get("reason", ""),
        "endpoints": sel.get("endpoints", []),
        "excluded": sel.get("excluded", {}),
        "internal_traffic_policy": dest.service.get("internal_traffic_policy"),
        "external_traffic_policy": dest.service.get("external_traffic_policy"),
    }


def pipeline_of(ovs: Mapping[str, Any]) -> tuple[pl.Tables, pl.Mode]:
    mode = pl.Mode(str(ovs.get("mode", "standalone")))
    config = pl.PipelineConfig(
        mode=mode,
        first_table=int(ovs.get("first_table", 10)),
        next_table=int(ovs.get("next_table", 20)),
    )
    return pl.Tables.for_config(config), mode


def report(
    *,
    source: Source,
    dest: Destination,
    src_ip: IPAddress,
    src_port: int,
    ex: tr.Explanation,
    context: Mapping[str, Any],
    pods_by_ip: Mapping[str, str],
    node: str,
) -> dict[str, Any]:
    """The JSON result (the text output is rendered from it)."""
    reason = ex.reason
    if ex.verdict == "dropped" and context.get("action") == "drop":
        reason = f"{context['reason']}: its frontend flow drops it, in {ex.drop_at}"
    elif ex.verdict == "rejected" and context.get("reason"):
        reason = f"{context['reason']}: {reason}"
    endpoint_pod = ""
    if ex.endpoint:
        endpoint_pod = pods_by_ip.get(ex.endpoint.rpartition(":")[0].strip("[]"), "")
    out = ex.as_dict()
    out.update(
        {
            "node": node,
            "source": {
                "kind": source.kind,
                "label": source.label,
                "interface": source.interface,
                "ip": str(src_ip),
                "port": src_port,
            },
            "destination": {
                "ip": str(dest.ip),
                "port": dest.port,
                "protocol": dest.protocol,
                "kind": dest.kind,
                "service": context.get("name"),
            },
            "service": dict(context) or None,
            "endpoint_pod": endpoint_pod or None,
            "reason": reason,
        }
    )
    return out


def render_text(result: Mapping[str, Any]) -> list[str]:
    src, dst = result["source"], result["destination"]
    sip = f"[{src['ip']}]" if ":" in src["ip"] else src["ip"]
    dip = f"[{dst['ip']}]" if ":" in dst["ip"] else dst["ip"]
    svc = f" ({dst['kind']} of {dst['service']})" if dst.get("service") else ""
    lines = [
        f"trace {dst['protocol'].upper()} {sip}:{src['port']} -> {dip}:{dst['port']}{svc}",
        f"  from {src['label']}, in on {src['interface']}, on {result['node']}",
    ]
    if result.get("before_ovs"):
        lines.append(f"  first     {result['before_ovs']}")
    lines.append("")
    for step in result["steps"]:
        prio = "miss" if step["priority"] is None else f"prio {step['priority']}"
        match = step["match"] or "*"
        head = f"  [{step['pass']}] {step['table']:>3} {step['table_name']:<16} {prio:<9} {match}"
        lines.append(head)
        if step["note"]:
            lines.append(f"{'':>30}{step['note']}")
    lines.append("")
    if result["frontend"]:
        lines.append(
            f"  frontend   {result['frontend']} (ServiceLB, priority {result['frontend_priority']})"
        )
    if result["group_id"] is not None:
        of_n = f" of {result['buckets']}" if result["buckets"] else ""
        lines.append(f"  group      {result['group_id']}, bucket {result['bucket']}{of_n}")
    if result["endpoint"]:
        owner = result["endpoint_pod"]
        pod = f" (pod {owner})" if owner else " (not a pod of this node)"
        lines.append(f"  endpoint   {result['endpoint']}{pod}")
    for n in result["nat"]:
        lines.append(f"  {n['kind']:<10} {n['from']} -> {n['to']} (zone {n['zone_name']})")
    verdict = result["verdict"].upper()
    lines.append(f"  {verdict:<10} {result['reason']}")
    service = result.get("service") or {}
    for endpoint, why in (service.get("excluded") or {}).items():
        lines.append(f"  {'':<10} not used: {endpoint}: {why}")
    return lines


# -- I/O ------------------------------------------------------------------------------------
def _node_source_ip(netns: str | None, dst: IPAddress, mark: int | None = None) -> IPAddress:
    """The address the node's kernel would send from to ``dst`` (its route's preferred
    source); with ``mark``, of the route packets with that mark take (the steering table's policy
    route: the address a steered connection is masqueraded to)."""
    cmd = ["ip", "-j", "route", "get", str(dst)]
    if mark is not None:
        cmd += ["mark", hex(mark)]
    if netns:
        cmd = ["ip", "netns", "exec", netns, *cmd]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise TraceError(f"the node has no route to {dst}: {done.stderr.strip()}")
    routes = json.loads(done.stdout or "[]")
    src = _ip(str(routes[0].get("prefsrc", ""))) if routes else None
    if src is None:
        raise TraceError(f"the node's route to {dst} has no source address: {done.stdout}")
    return src


def _switch_facts(ovs: Mapping[str, Any]) -> tuple[list[PodPort], int, str]:
    """Pods on the bridge, the gateway's OpenFlow port and MAC (from OVSDB)."""
    from ovsproxy.ovs.ovsdb import OVSDB, OVSDBError

    endpoint = ovs.get("ovsdb")
    if not endpoint:
        raise TraceError("the agent's /status names no OVSDB endpoint")
    try:
        db = OVSDB(str(endpoint))
    except OVSDBError as exc:
        raise TraceError(str(exc)) from exc
    try:
        pods = db.pod_ports(str(ovs["bridge"]))
        gateway = str(ovs["gateway"])
        ofport = db.ofport(gateway)
        mac = db.api.db_get("Interface", gateway, "mac_in_use").execute(check_error=True)
    finally:
        db.close()
    return pods, ofport, str(mac[0] if isinstance(mac, list) and mac else mac)


def run_trace(appctl_target: str, args: Sequence[str]) -> str:
    cmd = ["ovs-appctl", "-t", appctl_target, *args]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise TraceError(f"{' '.join(cmd)}: {(done.stderr or done.stdout).strip()}")
    return done.stdout


@click.command()
@click.argument("src")
@click.argument("dst")
@click.option("--proto", type=click.Choice(["tcp", "udp", "sctp"]), help="[the Service's]")
@click.option(
    "--source-port",
    type=click.IntRange(1, 65535),
    default=DEFAULT_SOURCE_PORT,
    show_default=True,
    help="the client's port (the group picks the endpoint from the 5-tuple)",
)
@click.option("--address", default=DEFAULT_METRICS_ADDRESS, show_default=True, help=ADDRESS_HELP)
@click.option("--json", "as_json", is_flag=True, help="the result as JSON")
@click.option("--raw", is_flag=True, help="also print OVS's own trace")
def trace(  # noqa: PLR0917 - click passes the options positionally
    src: str,
    dst: str,
    proto: str | None,
    source_port: int,
    address: str,
    as_json: bool,
    raw: bool,
) -> None:
    """Trace a new connection from SRC to DST[:PORT] through the switch (OVS ofproto/trace).

    SRC: a pod on this node (name, namespace/name or IP), `node`, or any address (arriving
    from the gateway). DST: a Service (namespace/name[:port]), one of its ClusterIPs,
    external or load-balancer IPs, node:NODEPORT or NODE_IP:NODEPORT, or any address:port.
    Nothing is sent: the trace says which flow, group bucket and endpoint a packet with this
    5-tuple gets, the NAT, and where it leaves, or why it is dropped or rejected.
    """
    from ovsproxy.datapath.conntrack import vswitchd_control_socket

    status = json.loads(_get(address, "/status"))
    ovs = status.get("ovs")
    if not ovs:
        raise TraceError(
            f"the agent at {address} does not report its switch (/status has no 'ovs')"
        )
    tables, mode = pipeline_of(ovs)
    pods, gw_ofport, gw_mac = _switch_facts(ovs)
    source = resolve_source(src, pods, str(ovs["gateway"]), gw_mac)
    families = [ip.version for ip in source.ips] or [4, 6]
    node_ips = (status.get("node_ports") or {}).get("node_port_ips") or ()
    dest = resolve_destination(dst, status.get("services", []), proto, families, node_ips)
    src_ip = source.ip_for(dest.ip.version)
    if source.kind == "node":
        src_ip = _node_source_ip(status.get("node_namespace"), dest.ip)
    if src_ip is None:
        raise TraceError(f"{source.label} has no IPv{dest.ip.version} address for {dest.text}")
    pod_ips = {str(ip): pod for pod in pods for ip in pod.ips}
    local = pod_ips.get(str(dest.ip)) if dest.service is None else None
    if local is not None:
        dst_mac = local.mac  # a pod of this node: on the same subnet, by its own MAC
    elif source.kind == "pod":
        dst_mac = gw_mac  # a pod addresses everything off its subnet to its gateway
    elif dest.service is not None:
        dst_mac = VIRTUAL_MAC  # the node's Service (and steering) routes' next hop
    else:
        dst_mac = gw_mac
    traced_ip, before_ovs = traced_address(dest, source)
    traced_src = src_ip
    if masqueraded(dest, source):
        traced_src = _node_source_ip(status.get("node_namespace"), traced_ip, NODE_STEERING_MARK)
        before_ovs = "; ".join(
            filter(
                None,
                [
                    before_ovs,
                    f"the node's capture table masquerades {src_ip} to {traced_src} "
                    "(externalTrafficPolicy Cluster; the source port is kept when free)",
                ],
            )
        )
    flow = tr.trace_flow(
        in_port=source.interface,
        protocol=dest.protocol,
        src_mac=source.mac,
        dst_mac=dst_mac,
        src_ip=str(traced_src),
        dst_ip=str(traced_ip),
        src_port=source_port,
        dst_port=dest.port,
    )
    names = {ip: f"{p.namespace}/{p.name}" for ip, p in pod_ips.items()}
    node = f"node {status['node_name']}" if status.get("node_name") else "this node"

    def reported(ex: tr.Explanation) -> dict[str, Any]:
        return report(
            source=source,
            dest=dest,
            src_ip=src_ip,
            src_port=source_port,
            ex=ex,
            context=service_context(dest),
            pods_by_ip=names,
            node=node,
        )

    blocked = source_range_block(src_ip, dest) if source.kind != "pod" else ""
    if blocked:  # never reaches the switch: nothing to trace
        ex = tr.Explanation(verdict="dropped", reason=blocked, steps=())
        result = reported(ex)
        _print(result, as_json)
        return
    target = vswitchd_control_socket(str(ovs.get("openflow") or ""))
    if target is None:
        raise TraceError(
            f"cannot find the control socket of the ovs-vswitchd serving {ovs.get('openflow')} "
            "(ofproto/trace needs ovs-appctl access to the switch: a unix: OpenFlow socket)"
        )
    args = tr.trace_args(str(ovs["bridge"]), flow)
    text = run_trace(target, args)
    try:
        parsed = tr.parse_trace(text)
    except tr.TraceParseError as exc:
        raise TraceError(f"{exc}\n{text}") from exc
    ports = {
        p.ofport: tr.Port(p.ofport, p.interface, "pod", f"{p.namespace}/{p.name}") for p in pods
    }
    ports[gw_ofport] = tr.Port(gw_ofport, str(ovs["gateway"]), "gateway")
    ex = tr.explain(parsed, tables, mode, ports)
    result = reported(ex)
    result["command"] = ["ovs-appctl", "-t", target, *args]
    result["before_ovs"] = before_ovs or None
    if raw:
        result["ofproto_trace"] = text
        if not as_json:
            click.echo(text)
    _print(result, as_json)


def _print(result: Mapping[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        click.echo("\n".join(render_text(result)))
