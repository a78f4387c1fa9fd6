"""Reading Open vSwitch's own packet trace through our pipeline (sans-I/O).

``ovs-appctl ofproto/trace BRIDGE FLOW --ct-next FLAGS ...`` translates one packet as the
switch would, and (Open vSwitch 3.1, what this is tested with) follows every
``ct(..., table=T)`` recirculation in the same run, taking the conntrack state of each
resumed pass from the next ``--ct-next`` (default ``trk|new``) and simulating NAT
("Replacing src/dst IP/ports to simulate NAT"). It does not execute the packet: no
conntrack entry, learned flow or counter changes. A select group with the "hash" method
(ours, see ``datapath.service_flows.GROUP_SELECTION_METHOD``) picks its bucket from the
packet's 5-tuple, so the bucket the trace names is the one a real packet with the same 5-tuple
gets.

Two pure steps:

* :func:`parse_trace` — the trace text into passes (one per recirculation), each with the flows
  it matched (table, match, priority, cookie) and their actions and notes;
* :func:`explain` — those passes in our pipeline's terms (``pipeline.Tables`` names the tables):
  the frontend flow matched, the group and bucket, the endpoint, the NAT applied in which zone,
  and where the packet leaves, or why it is dropped or rejected.

The running part (building the flow, calling ovs-appctl, reading the agent's /status) is the
command line's (``cli/trace_cmd.py``).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ovsproxy.datapath import pipeline as pl
from ovsproxy.model import IPFamily

# How many ct() recirculations a packet of a new connection can go through in our pipeline
# (ConntrackZone, the DNAT -- a group's bucket, or EndpointDNAT --, then hairpin or host
# SNAT), with margin; every resumed pass
# is a new connection's (``trk,new``). Unused --ct-next flags are ignored by OVS.
CT_PASSES = 4
CT_NEXT_NEW = "trk,new"


class TraceParseError(ValueError):
    pass


# -- parsing -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Action:
    """One action line of a matched flow, with the "-> ..." notes OVS printed under it."""

    text: str
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Step:
    """One flow the packet matched (or a table with no match: ``priority`` None)."""

    table: int
    match: str
    priority: int | None
    cookie: int | None
    actions: tuple[Action, ...]
    depth: int  # nesting: resubmits and group buckets print indented


@dataclass(frozen=True, slots=True)
class Pass:
    """One translation: the first, or one resumed after a ct() recirculation."""

    flow: str  # "Flow: ..." (the packet entering this pass)
    steps: tuple[Step, ...]
    datapath_actions: str
    final_flow: str = ""
    ct_state: str = ""  # the conntrack state the pass was resumed with ("" for the first)
    nat_before: str = ""  # OVS's NAT simulation: the fields before and after
    nat_after: str = ""
    resumed_table: int | None = None

    @property
    def fields(self) -> dict[str, str]:
        return flow_fields(self.flow)


@dataclass(frozen=True, slots=True)
class OFTrace:
    passes: tuple[Pass, ...]


def flow_fields(flow: str) -> dict[str, str]:
    """``a=b,c,d=e`` as ``{"a": "b", "c": "", "d": "e"}`` (brackets and parentheses kept)."""
    out: dict[str, str] = {}
    for item in _split_top(flow):
        key, _, value = item.partition("=")
        if key:
            out[key.strip()] = value.strip()
    return out


def _split_top(text: str) -> list[str]:
    """Split on commas outside parentheses and brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in (p.strip() for p in parts) if p]


_STEP = re.compile(
    r"^(?P<indent>\s*)(?P<table>\d+)\. (?:(?P<match>.*?), )?priority (?P<prio>\d+)"
    r"(?:, cookie (?P<cookie>0x[0-9a-fA-F]+))?\s*$"
)
_NO_MATCH = re.compile(r"^(?P<indent>\s*)(?P<table>\d+)\. No match\.?\s*$")
_RESUME = re.compile(r"resume conntrack with (?:default )?ct_state=(?P<state>[a-z|]+)")
_RESUMING = re.compile(r"^\s*Resuming from table (?P<table>\d+)")


class _PassBuilder:
    def __init__(self) -> None:
        self.flow = ""
        self.ct_state = ""
        self.nat_before = ""
        self.nat_after = ""
        self.final_flow = ""
        self.datapath_actions = ""
        self.resumed_table: int | None = None
        self.steps: list[tuple[int, str, int | None, int | None, int, list[list[Any]]]] = []

    def build(self) -> Pass:
        steps = tuple(
            Step(
                table=table,
                match=match,
                priority=prio,
                cookie=cookie,
                actions=tuple(Action(text, tuple(notes)) for text, notes in actions),
                depth=depth,
            )
            for table, match, prio, cookie, depth, actions in self.steps
        )
        return Pass(
            flow=self.flow,
            steps=steps,
            datapath_actions=self.datapath_actions,
            final_flow=self.final_flow,
            ct_state=self.ct_state,
            nat_before=self.nat_before,
            nat_after=self.nat_after,
            resumed_table=self.resumed_table,
        )


def parse_trace(text: str) -> OFTrace:
    """``ovs-appctl ofproto/trace`` output (one or more passes) as values.

    Raises :class:`TraceParseError` for text that is not a trace (e.g. an error OVS printed)."""
    passes: list[Pass] = []
    current: _PassBuilder | None = None
    pending = _PassBuilder()  # the header of the next pass (ct state, NAT) comes before it
    for raw in text.splitlines():
        line = raw.rstrip()
        stripped = line.strip()
        if not stripped or set(stripped) <= {"=", "-"}:
            continue
        if stripped.startswith("Flow: "):
            current, pending = pending, _PassBuilder()
            current.flow = stripped.removeprefix("Flow: ")
            continue
        if (m := _RESUME.search(stripped)) and not stripped.startswith("->"):
            if current is not None:
                passes.append(current.build())
                current = None
            pending.ct_state = m.group("state")
            continue
        if stripped.startswith("Initial flow:"):
            pending.nat_before = stripped.removeprefix("Initial flow:").strip()
            continue
        if stripped.startswith("Modified flow:"):
            pending.nat_after = stripped.removeprefix("Modified flow:").strip()
            continue
        if current is None:
            continue  # "Replacing src/dst ..." and other headers
        if stripped.startswith("Final flow:"):
            current.final_flow = stripped.removeprefix("Final flow:").strip()
            continue
        if stripped.startswith("Megaflow:"):
            continue
        if stripped.startswith("Datapath actions:"):
            current.datapath_actions = stripped.removeprefix("Datapath actions:").strip()
            continue
        if stripped.startswith("bridge(") or stripped == "thaw":
            continue
        if m2 := _RESUMING.match(line):
            current.resumed_table = int(m2.group("table"))
            continue
        if m3 := _STEP.match(line):
            cookie = m3.group("cookie")
            current.steps.append(
                (
                    int(m3.group("table")),
                    m3.group("match") or "",
                    int(m3.group("prio")),
                    int(cookie, 16) if cookie else None,
                    len(m3.group("indent")),
                    [],
                )
            )
            continue
        if m4 := _NO_MATCH.match(line):
            current.steps.append(
                (int(m4.group("table")), "", None, None, len(m4.group("indent")), [])
            )
            continue
        if not current.steps:
            continue
        actions = current.steps[-1][5]
        if stripped.startswith(("->", ">>")):  # notes ">>": e.g. learn ignored in a trace
            if actions:
                actions[-1][1].append(stripped[2:].strip())
            continue
        actions.append([stripped, []])
    if current is not None:
        passes.append(current.build())
    if not passes or not passes[0].flow:
        first = text.strip().splitlines()[0] if text.strip() else "(empty)"
        raise TraceParseError(f"not an ofproto/trace output: {first}")
    return OFTrace(tuple(passes))


# -- explaining ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Port:
    """What an OpenFlow port number is on this node (for "where the packet leaves")."""

    ofport: int
    name: str  # interface name
    kind: str  # "pod", "gateway", "bridge" or "port"
    pod: str = ""  # namespace/name of a pod


@dataclass(frozen=True, slots=True)
class ExplainedStep:
    pass_index: int
    table: int
    table_name: str
    match: str
    priority: int | None
    actions: tuple[str, ...]
    note: str  # what this step means in our pipeline ("" when nothing to say)
    depth: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "pass": self.pass_index,
            "table": self.table,
            "table_name": self.table_name,
            "match": self.match,
            "priority": self.priority,
            "actions": list(self.actions),
            "note": self.note,
        }


@dataclass(frozen=True, slots=True)
class Nat:
    kind: str  # "DNAT" or "SNAT"
    zone: int | None
    zone_name: str
    before: str  # address:port
    after: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "zone": self.zone,
            "zone_name": self.zone_name,
            "from": self.before,
            "to": self.after,
        }


@dataclass(frozen=True, slots=True)
class Explanation:
    """A trace in our pipeline's terms."""

    verdict: str  # "forwarded", "dropped", "rejected"
    reason: str  # why dropped or rejected; where it leaves when forwarded
    steps: tuple[ExplainedStep, ...]
    frontend: str = ""  # the ServiceLB flow's match ("" when no Service frontend matched)
    frontend_priority: int | None = None
    group_id: int | None = None
    bucket: int | None = None
    buckets: int | None = None  # how many buckets the group has (those OVS scored)
    endpoint: str = ""  # address:port the connection is DNATed to
    nat: tuple[Nat, ...] = ()
    leaves: Mapping[str, Any] = field(default_factory=dict)
    drop_at: str = ""  # the table (and priority) of the flow that dropped it

    def as_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "reason": self.reason,
            "frontend": self.frontend,
            "frontend_priority": self.frontend_priority,
            "group_id": self.group_id,
            "bucket": self.bucket,
            "buckets": self.buckets,
            "endpoint": self.endpoint or None,
            "nat": [n.as_dict() for n in self.nat],
            "leaves": dict(self.leaves),
            "drop_at": self.drop_at or None,
            "steps": [s.as_dict() for s in self.steps],
        }


TABLE_NAMES = {
    "classifier": "Classifier",
    "conntrack_zone": "ConntrackZone",
    "conntrack_state": "ConntrackState",
    "session_affinity": "SessionAffinity",
    "service_lb": "ServiceLB",
    "endpoint_dnat": "EndpointDNAT",
}


def table_names(tables: pl.Tables, mode: pl.Mode) -> dict[int, str]:
    """Table number -> our name; the next table is our L3Forwarding (standalone) or the
    CNI's (integrated)."""
    names = {
        getattr(tables, attr): name
        for attr, name in TABLE_NAMES.items()
        if getattr(tables, attr) is not None
    }
    names[tables.forwarding] = (
        "L3Forwarding" if mode == pl.Mode.STANDALONE else "next table (the CNI's)"
    )
    return names


def zone_names() -> dict[int, str]:
    names: dict[int, str] = {}
    for family in IPFamily:
        names[pl.ct_zone(family)] = "Service"
        names[pl.hairpin_ct_zone(family)] = "hairpin"
        names[pl.host_snat_ct_zone(family)] = "host SNAT"
    return names


_ZONE = re.compile(r"zone=(\d+)")
_NAT_DST = re.compile(r"nat\(dst=(?P<to>[^)]+)\)")
_GROUP = re.compile(r"^group:(\d+)$")
_BUCKET_SCORE = re.compile(r"^bucket (\d+): score")
_USING_BUCKET = re.compile(r"^using bucket (\d+)")
_OUTPUT = re.compile(r"^output:(\d+)$")


def _cookie_category(cookie: int | None) -> pl.Category | None:
    if cookie is None or pl.cookie_generation(cookie) is None:
        return None
    try:
        return pl.Category((cookie >> pl.COOKIE_CATEGORY_SHIFT) & 0xFF)
    except ValueError:
        return None


def _addr_port(ip: str, port: str) -> str:
    ip = ip.strip("[]")  # OVS brackets IPv6 addresses in its NAT simulation
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _nat_changes(p: Pass, zones: Mapping[int, str]) -> list[Nat]:
    """The NAT OVS simulated before resuming pass ``p``: source or destination changed."""
    if not p.nat_before or not p.nat_after:
        return []
    before, after = flow_fields(p.nat_before), flow_fields(p.nat_after)
    zone_text = p.fields.get("ct_zone")
    zone = int(zone_text) if zone_text and zone_text.isdigit() else None
    zone_name = zones.get(zone, "") if zone is not None else ""
    out = []
    for kind, ip_key, port_key in (("SNAT", "src", "tp_src"), ("DNAT", "dst", "tp_dst")):
        ip_before = before.get(f"nw_{ip_key}") or before.get(f"ipv6_{ip_key}", "")
        ip_after = after.get(f"nw_{ip_key}") or after.get(f"ipv6_{ip_key}", "")
        port_before, port_after = before.get(port_key, ""), after.get(port_key, "")
        if (ip_before, port_before) != (ip_after, port_after):
            out.append(
                Nat(
                    kind,
                    zone,
                    zone_name,
                    _addr_port(ip_before, port_before),
                    _addr_port(ip_after, port_after),
                )
            )
    return out


_REG0_SET = re.compile(rf"^set_field:(0x[0-9a-f]+)(?:/0x[0-9a-f]+)?->{pl.FROM_POD_REG}$")


def _reg0_marks(actions: Sequence[str]) -> int:
    """The bits a flow sets in the register of the FROM_POD (and FROM_NODE) marks."""
    bits = 0
    for text in actions:
        if m := _REG0_SET.match(text):
            bits |= int(m.group(1), 16)
    return bits


def _step_note(step: Step, tables: pl.Tables, mode: pl.Mode, zones: Mapping[int, str]) -> str:
    """What a matched flow means here, from its table, priority and cookie category."""
    t, prio, cat = step.table, step.priority, _cookie_category(step.cookie)
    texts = [a.text for a in step.actions]
    if prio is None:
        return "no flow matched: dropped"
    if t == tables.classifier:
        marks = _reg0_marks(texts)
        if marks & pl.FROM_POD:
            return "from a local pod's port (FROM_POD)"
        # FROM_NODE comes with the NodePort wiring (pipeline.FROM_NODE)
        from_node = getattr(pl, "FROM_NODE", 0)
        if from_node and marks & from_node:
            return "from one of the node's own addresses (FROM_NODE)"
        if prio == pl.PRIORITY_SPOOFED:
            return "a local pod's address from another port: dropped (spoofed)"
        if prio == pl.PRIORITY_NORMAL:
            return "ARP / neighbour discovery: NORMAL"
        return "not from a pod's port"
    for text in texts:
        if text.startswith("ct(") and not text.startswith("ct(commit"):
            zone = _ZONE.search(text)
            zname = zones.get(int(zone.group(1)), "") if zone else ""
            return f"conntrack lookup in the {zname} zone (un-NATs replies)".replace("  ", " ")
    if t == tables.conntrack_state:
        if prio == pl.PRIORITY_MID_STREAM:
            return (
                "a TCP segment new to conntrack without SYN (picked up mid-stream): probes "
                "for a local pod, then Service selection"
            )
        if prio == pl.PRIORITY_INVALID_RST:
            return "an invalid TCP RST: to the agent (flushes the stale entry), then forwarded"
        if prio == pl.PRIORITY_INVALID_SYN:
            return "an invalid TCP SYN (a stale entry of the same tuple): forwarded"
        if prio == pl.PRIORITY_INVALID_SYN_ACK:
            return "an invalid TCP SYN-ACK: its stale entry is deleted, the SYN-ACK dropped"
        if prio == pl.PRIORITY_INVALID_POD_SYN_ACK:
            return "a local pod's invalid TCP SYN-ACK: its stale entry is deleted, it goes on"
        if prio == pl.PRIORITY_STALE_ENTRY:
            return "the stale entry deleted (ct commit, force)"
        if "drop" in texts or not texts:
            return "conntrack-invalid: dropped"
        if prio == pl.PRIORITY_NORMAL:
            return "established or reply: skips Service selection"
        return "new connection: Service selection"
    if t == tables.session_affinity:
        if cat == pl.Category.LEARNED:
            return "learned affinity: the endpoint this client used last"
        return "no learned affinity: endpoint to select"
    if t == tables.service_lb:
        if prio == pl.PRIORITY_MID_STREAM:
            if any(x.startswith("ct(commit") for x in texts):
                return (
                    "mid-stream from an endpoint to a local pod: its Service translation "
                    "re-created (SNAT to the one frontend)"
                )
            return (
                "mid-stream from an endpoint of several frontends: dropped (the client's "
                "next packet picks the connection up)"
            )
        if cat == pl.Category.SERVICE:
            if any(x.startswith("learn(") for x in texts):
                return "ClientIP affinity: this choice is learned (not by a trace), EndpointDNAT"
            if prio == pl.PRIORITY_NORMAL and f"{pl.SELECTION_REG}=" in step.match:
                return "ClientIP affinity: the learned endpoint is still valid, EndpointDNAT"
            if any(x.startswith("group:") for x in texts):
                for text in texts:  # a bucket that translates (a Service without affinity)
                    if text.startswith("ct(commit") and (m := _NAT_DST.search(text)):
                        return f"Service frontend -> select group, DNAT to the endpoint {m['to']}"
                return "Service frontend -> select group"
            if any(x.startswith("controller(") for x in texts):
                return "Service frontend without endpoints: rejected (the agent answers)"
            if "drop" in texts:
                return "Service frontend with no endpoint for this node's traffic: dropped"
            return "Service frontend"
        if prio == pl.PRIORITY_COMMIT:
            return "not a Service: committed to conntrack"
        return "no Service frontend matched"
    if t == tables.endpoint_dnat:
        for text in texts:
            if m := _NAT_DST.search(text):
                return f"DNAT to the endpoint {m.group('to')}"
        return "no endpoint flow"
    if t == tables.forwarding and mode == pl.Mode.STANDALONE:
        if prio == pl.PRIORITY_LOCAL_POD_PROBE:
            return "mid-stream probe: to a local pod (TO_LOCAL_POD)"
        if prio == pl.PRIORITY_PROBE_END:
            return "mid-stream probe: not to a local pod (the probe forwards nothing)"
        if prio == pl.PRIORITY_HAIRPIN_SNAT:
            return "hairpin: SNAT to the virtual Service IP"
        if prio == pl.PRIORITY_HAIRPIN_OUT:
            return "hairpin: back out the pod's own port"
        if prio == pl.PRIORITY_HOST_SNAT_OUT:
            return "host-SNATed: back out the gateway to the node"
        if prio == pl.PRIORITY_TO_NODE:
            return "reply to the node: back out the gateway"
        if prio == pl.PRIORITY_HOST_SNAT and any(x.startswith("ct(commit") for x in texts):
            return "the node's own Service connection to another node: host SNAT"
        if cat == pl.Category.FORWARDING:
            return "to a local pod"
        return "not a local pod: NORMAL (toward the gateway)"
    return ""


def explain(
    trace: OFTrace,
    tables: pl.Tables,
    mode: pl.Mode = pl.Mode.STANDALONE,
    ports: Mapping[int, Port] | None = None,
    in_port: int | None = None,
) -> Explanation:
    """The trace in our pipeline's terms. ``ports`` names OpenFlow port numbers (pods, the
    gateway); ``in_port`` is the packet's input port (for ``IN_PORT`` outputs)."""
    ports = ports or {}
    names = table_names(tables, mode)
    zones = zone_names()
    steps: list[ExplainedStep] = []
    nat: list[Nat] = []
    frontend, frontend_priority = "", None
    group_id = bucket = buckets = None
    endpoint = ""
    verdict, reason, drop_at = "", "", ""
    last_exit: dict[str, Any] = {}
    drop_step: ExplainedStep | None = None
    for index, p in enumerate(trace.passes):
        nat.extend(_nat_changes(p, zones))
        if in_port is None and p.fields.get("in_port", "").isdigit():
            in_port = int(p.fields["in_port"])
        for step in p.steps:
            name = names.get(step.table, f"table {step.table}")
            note = _step_note(step, tables, mode, zones)
            texts = tuple(a.text for a in step.actions)
            ex = ExplainedStep(
                index, step.table, name, step.match, step.priority, texts, note, step.depth
            )
            steps.append(ex)
            cat = _cookie_category(step.cookie)
            if step.table == tables.service_lb and cat == pl.Category.SERVICE and not frontend:
                frontend, frontend_priority = step.match, step.priority
            for action in step.actions:
                if m := _GROUP.match(action.text):
                    group_id = int(m.group(1))
                    scored = [n for n in action.notes if _BUCKET_SCORE.match(n)]
                    buckets = len(scored) or None
                    for n in action.notes:
                        if mb := _USING_BUCKET.match(n):
                            bucket = int(mb.group(1))
                # the translation: in EndpointDNAT (affinity), or in the group's bucket
                # (printed under the ServiceLB flow that sent the packet to the group)
                if (
                    step.table in (tables.endpoint_dnat, tables.service_lb)
                    and action.text.startswith("ct(commit")
                    and (md := _NAT_DST.search(action.text))
                ):
                    endpoint = md.group("to")
                exit_ = _exit(action, in_port, ports)
                if exit_:
                    last_exit = exit_
                if action.text.startswith("controller(") and cat == pl.Category.SERVICE:
                    verdict = "rejected"
                probe_end = step.table == tables.forwarding and step.priority == (
                    pl.PRIORITY_PROBE_END
                )
                if (
                    action.text == "drop"
                    and not probe_end  # the mid-stream probe's end: the packet goes on
                    and not any(t.startswith("ct(") for t in texts[: texts.index("drop")])
                ):
                    drop_step = ex
            if step.priority is None:
                drop_step = ex
    final = trace.passes[-1].datapath_actions
    if verdict == "rejected":
        answer = (
            "a TCP RST"
            if "tcp" in trace.passes[0].flow.split(",")[0]
            else ("an ICMP port unreachable")
        )
        reason = f"ServiceLB sends the first packet to the agent, which answers with {answer}"
    elif last_exit and final != "drop":
        verdict, reason = "forwarded", last_exit["text"]
    else:
        verdict = "dropped"
        if drop_step is not None:
            where = f"{drop_step.table_name} (table {drop_step.table}"
            where += f", priority {drop_step.priority})" if drop_step.priority is not None else ")"
            reason, drop_at = f"{drop_step.note or 'dropped'}, in {where}", where
        else:
            reason = f"dropped (datapath actions: {final or 'none'})"
    return Explanation(
        verdict=verdict,
        reason=reason,
        steps=tuple(steps),
        frontend=frontend,
        frontend_priority=frontend_priority,
        group_id=group_id,
        bucket=bucket,
        buckets=buckets,
        endpoint=endpoint,
        nat=tuple(nat),
        leaves=last_exit if verdict == "forwarded" else {},
        drop_at=drop_at,
    )


def _describe_port(ofport: int, ports: Mapping[int, Port]) -> tuple[str, dict[str, Any]]:
    port = ports.get(ofport)
    if port is None:
        return f"port {ofport}", {"ofport": ofport, "kind": "port"}
    info: dict[str, Any] = {"ofport": ofport, "interface": port.name, "kind": port.kind}
    if port.kind == "pod":
        info["pod"] = port.pod
        return f"pod {port.pod} (port {port.name})", info
    if port.kind == "gateway":
        return f"the gateway {port.name} (into the node's routing)", info
    return f"{port.kind} {port.name}", info


def _exit(action: Action, in_port: int | None, ports: Mapping[int, Port]) -> dict[str, Any]:
    """Where an output action sends the packet ({} for other actions)."""
    if m := _OUTPUT.match(action.text):
        text, info = _describe_port(int(m.group(1)), ports)
        return {**info, "action": action.text, "text": f"out to {text}"}
    if action.text == "IN_PORT" and in_port is not None:
        text, info = _describe_port(in_port, ports)
        return {**info, "action": action.text, "text": f"back out the port it came in on: {text}"}
    if action.text == "NORMAL":
        notes = " ".join(action.notes)
        gateway = next((p for p in ports.values() if p.kind == "gateway"), None)
        toward = f"toward the gateway {gateway.name}" if gateway else "by MAC"
        if "flooding" in notes:
            how = "its MAC not learned yet: flooded, the gateway among the ports"
        elif "dropping" in notes:
            return {}
        else:
            how = notes or "by MAC"
        return {
            "kind": "normal",
            "action": "NORMAL",
            "text": f"NORMAL switching {toward} ({how})",
            "notes": list(action.notes),
        }
    return {}


# -- the flow to trace ---------------------------------------------------------------------
_PROTO_FIELDS = {"tcp": "tcp", "udp": "udp", "sctp": "sctp"}


def trace_flow(
    *,
    in_port: str,
    protocol: str,
    src_mac: str,
    dst_mac: str,
    src_ip: str,
    dst_ip: str,
    src_port: int,
    dst_port: int,
) -> str:
    """The ``ofproto/trace`` flow of a new connection's first packet (a TCP SYN)."""
    proto = protocol.lower()
    if proto not in _PROTO_FIELDS:
        raise ValueError(f"protocol {protocol!r}: one of tcp, udp, sctp")
    v6 = ipaddress.ip_address(dst_ip).version == 6
    if ipaddress.ip_address(src_ip).version != (6 if v6 else 4):
        raise ValueError(f"source {src_ip} and destination {dst_ip} are of different families")
    l3 = "ipv6" if v6 else "nw"
    parts = [
        proto + ("6" if v6 else ""),
        f"in_port={in_port}",
        f"dl_src={src_mac}",
        f"dl_dst={dst_mac}",
        f"{l3}_src={src_ip}",
        f"{l3}_dst={dst_ip}",
        "nw_ttl=64",
        f"{proto}_src={src_port}",
        f"{proto}_dst={dst_port}",
    ]
    if proto == "tcp":
        parts.append("tcp_flags=syn")
    return ",".join(parts)


def trace_args(bridge: str, flow: str, passes: int = CT_PASSES) -> list[str]:
    """The ``ovs-appctl`` arguments tracing ``flow`` as a new connection's first packet."""
    args = ["ofproto/trace", bridge, flow]
    for _ in range(passes):
        args += ["--ct-next", CT_NEXT_NEW]
    return args
