"""The steering table in libnftables' JSON command language (pure: values in, dicts out).

One ``inet`` table holds both families. Its chains and rules are fixed; only set elements
depend on Services (``ovsproxy.steering.desired``)::

    prerouting  filter hook prerouting, priority mangle    new connections: firewall; capture-mark
    output      route  hook output,     priority mangle    the same for the node's own traffic
    firewall    LB destination in @firewall-vN and (destination, source) not in
                @firewall-allow-vN -> drop
    capture-mark  dst in @nodeport-ips-vN and (proto, port) in @nodeports-vN, or
                (dst, proto, port) in @external-vN -> mark |= NODE_STEERING_MARK
    nat-prerouting / nat-output  nat hooks, priority dstnat:
                NodePort traffic (as above) -> dnat to VIRTUAL_NODEPORT_IP (the port is kept)
    nat-postrouting  nat hook postrouting, priority srcnat: a steered connection (mark) to
                (dst, proto, port) in @masquerade-vN -> masquerade (externalTrafficPolicy
                Cluster: the endpoint sees the gateway's address, as kube-proxy's
                masquerade shows it the node's)

The masquerade is kube-proxy's semantics, and more: it makes the kernel's conntrack pick a
4-tuple no other connection to that endpoint has. Without it, a client that used one source
port at once for a ClusterIP (DNATed on its own node, arriving here as a plain connection) and
this node's NodePort of the same endpoint gave the endpoint one 4-tuple for two connections
(docs/DESIGN.md, "One client port, two paths to one endpoint").

Marking happens at mangle priority, before DNAT, on the original destination, so every
packet of a steered connection is marked (NAT rewrites each packet at dstnat priority after
it), and one policy rule on the mark routes it all to gw0. The ``route`` type on output makes
the kernel re-route the node's own packets once they are marked.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any

from ovsproxy.model import IPFamily, Protocol
from ovsproxy.model.node import NODE_STEERING_MARK, VIRTUAL_NODEPORT_IP
from ovsproxy.steering.desired import Element, SetKey, SteeringDiff, SteeringSet, SteeringState

TABLE = "ovsproxy"
FAMILY = "inet"
COMMENT = "ovsproxy: NodePort, external IP and load-balancer IP capture (owned by ovsproxy)"

Command = dict[str, Any]

_ADDR = {IPFamily.IPv4: "ipv4_addr", IPFamily.IPv6: "ipv6_addr"}
_IP = {IPFamily.IPv4: "ip", IPFamily.IPv6: "ip6"}
_SUFFIX = {IPFamily.IPv4: "v4", IPFamily.IPv6: "v6"}


def set_name(name: SteeringSet, family: IPFamily) -> str:
    return f"{name.value}-{_SUFFIX[family]}"


def _set_type(name: SteeringSet, family: IPFamily) -> list[str] | str:
    addr = _ADDR[family]
    if name is SteeringSet.NODEPORT_IPS:
        return addr
    if name is SteeringSet.NODEPORTS:
        return ["inet_proto", "inet_service"]
    if name is SteeringSet.FIREWALL_ALLOW:
        return [addr, "inet_proto", "inet_service", addr]
    return [addr, "inet_proto", "inet_service"]


def element_json(name: SteeringSet, element: Element) -> Any:
    """One element as libnftables JSON (a value, or a ``concat`` of values)."""
    parts: list[Any] = []
    for value in element:
        if isinstance(value, Protocol):
            parts.append(value.value.lower())
        elif isinstance(value, int):
            parts.append(value)
        elif isinstance(value, ipaddress.IPv4Network | ipaddress.IPv6Network):
            parts.append({"prefix": {"addr": str(value.network_address), "len": value.prefixlen}})
        else:
            parts.append(str(value))
    if name is SteeringSet.NODEPORT_IPS:
        return parts[0]
    return {"concat": parts}


def _payload(protocol: str, fld: str) -> dict[str, Any]:
    return {"payload": {"protocol": protocol, "field": fld}}


def _match(left: Any, right: Any, op: str = "==") -> dict[str, Any]:
    return {"match": {"op": op, "left": left, "right": right}}


def _tuple(family: IPFamily, *, with_source: bool = False) -> dict[str, Any]:
    ip = _IP[family]
    parts = [_payload(ip, "daddr"), {"meta": {"key": "l4proto"}}, _payload("th", "dport")]
    if with_source:
        parts.append(_payload(ip, "saddr"))
    return {"concat": parts}


def _nodeport_match(family: IPFamily) -> list[dict[str, Any]]:
    return [
        _match(_payload(_IP[family], "daddr"), f"@{set_name(SteeringSet.NODEPORT_IPS, family)}"),
        _match(
            {"concat": [{"meta": {"key": "l4proto"}}, _payload("th", "dport")]},
            f"@{set_name(SteeringSet.NODEPORTS, family)}",
        ),
    ]


def _set_mark() -> dict[str, Any]:
    return {
        "mangle": {
            "key": {"meta": {"key": "mark"}},
            "value": {"|": [{"meta": {"key": "mark"}}, NODE_STEERING_MARK]},
        }
    }


def _steered() -> dict[str, Any]:
    """The packet carries the steering mark (set in prerouting/output by capture-mark)."""
    marked = {"&": [{"meta": {"key": "mark"}}, NODE_STEERING_MARK]}
    return _match(marked, NODE_STEERING_MARK)


def _rule(chain: str, expr: list[dict[str, Any]]) -> Command:
    return {"add": {"rule": {"family": FAMILY, "table": TABLE, "chain": chain, "expr": expr}}}


def _chain(name: str, hook: tuple[str, str, int] | None = None) -> Command:
    chain: dict[str, Any] = {"family": FAMILY, "table": TABLE, "name": name}
    if hook is not None:
        kind, hook_name, priority = hook
        chain.update(type=kind, hook=hook_name, prio=priority, policy="accept")
    return {"add": {"chain": chain}}


MANGLE = -150
DSTNAT = -100
SRCNAT = 100


def skeleton() -> list[Command]:
    """The table with its chains, rules and empty sets (the part that never changes)."""
    commands: list[Command] = [
        {"add": {"table": {"family": FAMILY, "name": TABLE, "comment": COMMENT}}}
    ]
    for family in IPFamily:
        for name in SteeringSet:
            spec: dict[str, Any] = {
                "family": FAMILY,
                "table": TABLE,
                "name": set_name(name, family),
                "type": _set_type(name, family),
            }
            if name is SteeringSet.FIREWALL_ALLOW:
                spec["flags"] = ["interval"]  # the source is a prefix
            commands.append({"add": {"set": spec}})
    commands.append(_chain("firewall"))
    commands.append(_chain("capture-mark"))
    commands.append(_chain("prerouting", ("filter", "prerouting", MANGLE)))
    commands.append(_chain("output", ("route", "output", MANGLE)))
    commands.append(_chain("nat-prerouting", ("nat", "prerouting", DSTNAT)))
    commands.append(_chain("nat-output", ("nat", "output", DSTNAT)))
    commands.append(_chain("nat-postrouting", ("nat", "postrouting", SRCNAT)))
    new_only = _match({"ct": {"key": "state"}}, "new", op="in")
    for base in ("prerouting", "output"):
        commands.append(_rule(base, [new_only, {"jump": {"target": "firewall"}}]))
        commands.append(_rule(base, [{"jump": {"target": "capture-mark"}}]))
    for family in IPFamily:
        fw = f"@{set_name(SteeringSet.FIREWALL, family)}"
        allow = f"@{set_name(SteeringSet.FIREWALL_ALLOW, family)}"
        commands.append(
            _rule(
                "firewall",
                [
                    _match(_tuple(family), fw),
                    _match(_tuple(family, with_source=True), allow, op="!="),
                    {"counter": None},
                    {"drop": None},
                ],
            )
        )
        commands.append(_rule("capture-mark", [*_nodeport_match(family), _set_mark()]))
        external = f"@{set_name(SteeringSet.EXTERNAL, family)}"
        commands.append(_rule("capture-mark", [_match(_tuple(family), external), _set_mark()]))
        dnat = {"dnat": {"family": _IP[family], "addr": str(VIRTUAL_NODEPORT_IP[family])}}
        for chain in ("nat-prerouting", "nat-output"):
            commands.append(_rule(chain, [*_nodeport_match(family), {"counter": None}, dnat]))
        masquerade = f"@{set_name(SteeringSet.MASQUERADE, family)}"
        commands.append(
            _rule(
                "nat-postrouting",
                [
                    _match(_tuple(family), masquerade),
                    _steered(),
                    {"counter": None},
                    {"masquerade": None},
                ],
            )
        )
    return commands


def _element_command(verb: str, key: SetKey, elements: Iterable[Element]) -> Command:
    name, family = key
    items = sorted((element_json(name, e) for e in elements), key=repr)  # stable output
    return {
        verb: {
            "element": {
                "family": FAMILY,
                "table": TABLE,
                "name": set_name(name, family),
                "elem": items,
            }
        }
    }


def full_rebuild(state: SteeringState) -> list[Command]:
    """One transaction replacing whatever table of ours exists with exactly ``state``.

    ``add table`` first so that ``delete table`` cannot fail on a first run; in one batch the
    kernel swaps old for new atomically.
    """
    commands: list[Command] = [
        {"add": {"table": {"family": FAMILY, "name": TABLE}}},
        {"delete": {"table": {"family": FAMILY, "name": TABLE}}},
        *skeleton(),
    ]
    for key in sorted(state.sets, key=lambda k: (k[0].value, k[1])):
        if state.sets[key]:
            commands.append(_element_command("add", key, state.sets[key]))
    return commands


def patch(change: SteeringDiff) -> list[Command]:
    """One transaction applying ``change``: deletes first, then adds (one command per set)."""
    commands: list[Command] = []
    for verb, part in (("delete", change.deletes), ("add", change.adds)):
        for key in sorted(part, key=lambda k: (k[0].value, k[1])):
            if part[key]:
                commands.append(_element_command(verb, key, part[key]))
    return commands


def delete_table() -> list[Command]:
    """Remove our table (and nothing else); a no-op when it is not there."""
    return [
        {"add": {"table": {"family": FAMILY, "name": TABLE}}},
        {"delete": {"table": {"family": FAMILY, "name": TABLE}}},
    ]
