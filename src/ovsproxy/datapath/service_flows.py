"""What to install for a Service port: flows and groups as values.

Pure: (ServicePort, endpoints, group ids, tables, generation) in, (groups, flows) out. The
datapath diffs these against what is installed (and keeps the flows as their encodings).
Groups keep each bucket's actions as their encoding, and the EndpointDNAT flows are staged
as their encodings: what the datapath keeps is bytes, built afresh (no cache of values).
The shapes built per endpoint and per frontend (EndpointDNAT and ServiceLB flows, a bucket's
actions) come from the codec's templates (``openflow.protocol.templates``): exactly what the
generic constructors encode, several times cheaper (bench ``encode``). The fixed pipeline's
flows are ``fixed_flows``'s, a local pod's ``pod_flows``'s; the context all three build with
is ``flow_context``'s.
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath.desired import EncodedFlow, FlowKey, flow_key
from ovsproxy.datapath.flow_context import (
    IPPROTO_TCP,
    BucketWire,
    Context,
    DnatTemplates,
    FrontendTemplates,
    MidStreamWire,
    apply_actions,
    dst_field,
    eth_type,
    src_field,
)
from ovsproxy.datapath.groups import BucketSpec, GroupSpec, SelectionMethod
from ovsproxy.model import Endpoint, IPAddress, IPFamily, Protocol, ServicePort
from ovsproxy.openflow import protocol as of
from ovsproxy.openflow.protocol import templates
from ovsproxy.openflow.protocol.actions import decode_actions

_PORT_FIELD = {
    Protocol.TCP: "tcp_dst",
    Protocol.UDP: "udp_dst",
    Protocol.SCTP: "sctp_dst",
}


def _ip_value(ip: IPAddress) -> int:
    return int(ip)


# -- Services -----------------------------------------------------------------------------
# A bucket is kept as the encoding of its actions (``BucketSpec.wire``: the endpoint's address
# into a register, then the actions every bucket of that port and affinity shares), built in
# one struct call per endpoint: no value per endpoint, and no cache of them (a cache of every
# endpoint's bucket values was the largest single cost of a 10,000-Service cluster; bench
# ``memory``). Equal encodings compare in C (memcmp), so a re-built Service stages for free.
_new_tuple = tuple.__new__
_CT_MARK_SERVICE = of.SetField("ct_mark", pl.CT_MARK_SERVICE, pl.CT_MARK_SERVICE_MASK)


# A Service's buckets in its groups (``BucketSpec.key``) and its EndpointDNAT flows are keyed
# by one int: address << 17 | port << 1 | (1 for IPv6). An int hashes in C (an (ipaddress,
# port) key hashes in Python, per endpoint) and costs one object (a tuple of three costs two
# more). The address is read as the codec reads it (``ip._ip``: the int ``int(ip)`` returns,
# without the call).
EndpointKey = int
_IPV4 = ipaddress.IPv4Address


def endpoint_key(ip: IPAddress, port: int) -> EndpointKey:
    address: int = ip._ip  # type: ignore[union-attr]  # hot path, see above
    return address << 17 | port << 1 | (type(ip) is not _IPV4)


def _affinity_bucket_tail(port: int, tables: pl.Tables) -> tuple[of.Action, ...]:
    """An affinity bucket's actions after the address (see ``endpoint_bucket_wire``)."""
    return (
        of.SetField(
            pl.ENDPOINT_PORT_REG,
            port | pl.Selection.TO_LEARN.value_bits,
            pl.ENDPOINT_PORT_MASK | pl.SELECTION_MASK,
        ),
        of.Resubmit(tables.service_lb),
    )


def endpoint_dnat_ct(ip: IPAddress, port: int, tables: pl.Tables) -> of.CT:
    """The translation of a new connection to the endpoint ``ip:port``: ct(commit, zone=Z,
    nat(dst=IP:PORT), exec(ct_mark Service), table=Forwarding). A bucket's only action where
    the Service port has no affinity; the EndpointDNAT flows' where it has."""
    return of.CT(
        commit=True,
        zone=pl.ct_zone(IPFamily.of(ip)),
        table=tables.forwarding,
        nat=of.NAT(dst=True, ip_min=ip, port_min=port),
        actions=(_CT_MARK_SERVICE,),
    )


# Samples for the DNAT bucket's encoder: addresses whose bytes occur once in the encoding.
_DNAT_SAMPLES: dict[int, tuple[IPAddress, IPAddress]] = {
    4: (ipaddress.IPv4Address(0xA1B2C3D4), ipaddress.IPv4Address(0xC7D8E9FA)),
    6: (
        ipaddress.IPv6Address(0xA1B2C3D4E5F60718293A4B5C6D7E8F90),
        ipaddress.IPv6Address(0xC1D2E3F405162738495A6B7C8D9EAFB0),
    ),
}


def _dnat_bucket_wire(port: int, version: int, tables: pl.Tables) -> BucketWire:
    """``endpoint_dnat_ct(IP, port, tables).wire`` for any address of one version (an int),
    in one struct call: the sample's encoding cut around its address (which must occur once,
    and a second sample must come out as the generic encoding; else generic for good)."""
    address_type = _IPV4 if version == 4 else ipaddress.IPv6Address

    def generic(address: int) -> bytes:
        return endpoint_dnat_ct(address_type(address), port, tables).wire

    sample, check = _DNAT_SAMPLES[version]
    wire = generic(int(sample))
    at = wire.find(sample.packed)
    if at < 0 or wire.find(sample.packed, at + 1) >= 0:
        return generic
    head, tail = wire[:at], wire[at + len(sample.packed) :]
    limit = 1 << (32 if version == 4 else 128)
    if version == 4:
        pack = struct.Struct(f"!{len(head)}sI{len(tail)}s").pack

        def fast(address: int) -> bytes:
            if 0 < address < limit:
                return pack(head, address, tail)
            return generic(address)

    else:
        join = b"".join

        def fast(address: int) -> bytes:
            if 0 < address < limit:
                return join((head, address.to_bytes(16, "big"), tail))
            return generic(address)

    if fast(int(check)) != generic(int(check)):
        return generic
    return fast


def _new_bucket_wire(
    makers: dict[tuple[int, bool, int], BucketWire],
    port: int,
    affinity: bool,
    version: int,
    tables: pl.Tables,
) -> BucketWire:
    if not affinity:
        make = makers[port, affinity, version] = _dnat_bucket_wire(port, version, tables)
        return make
    tail = b"".join([a.wire for a in _affinity_bucket_tail(port, tables)])
    reg = pl.ENDPOINT_IP_REG if version == 4 else pl.ENDPOINT_IP6_REG
    make = makers[port, affinity, version] = templates.set_field_exact_wire(reg, tail)
    return make


def endpoint_bucket_wire(ip: IPAddress, port: int, affinity: bool, ctx: Context) -> bytes:
    """A bucket's actions, encoded. Without affinity, the translation itself
    (``endpoint_dnat_ct``: a bucket may carry ct, as OVN's do). With affinity, the choice goes
    through registers, which the learn action reads (a learned flow cannot carry ct):
    endpoint address into reg3/xxreg3, port and selection state into reg4 (one masked
    set_field), then back to ServiceLB to learn it, and on to EndpointDNAT."""
    version = 4 if type(ip) is _IPV4 else 6
    makers = ctx.encoders.buckets
    make = makers.get((port, affinity, version))
    if make is None:
        make = _new_bucket_wire(makers, port, affinity, version, ctx.tables)
    return make(ip._ip)  # type: ignore[union-attr]


def endpoint_bucket_actions(
    ip: IPAddress, port: int, affinity: bool, ctx: Context
) -> tuple[of.Action, ...]:
    """``endpoint_bucket_wire`` as values."""
    wire = endpoint_bucket_wire(ip, port, affinity, ctx)
    return decode_actions(wire, 0, len(wire))


def _dnat_template(ctx: Context, version: int, protocol: Protocol) -> templates.EndpointDnatFlows:
    """The EndpointDNAT flows of one family and protocol (the codec's fast constructor)."""
    family = IPFamily(version)
    return templates.EndpointDnatFlows(
        ctx.tables.endpoint_dnat,
        pl.PRIORITY_NORMAL,
        ctx.cookie(pl.Category.ENDPOINT),
        version=version,
        ip_proto=protocol.ip_proto,
        ip_field=pl.endpoint_ip_reg(family),
        port_field=pl.ENDPOINT_PORT_REG,
        port_mask=pl.ENDPOINT_PORT_MASK,
        zone=pl.ct_zone(family),
        ct_table=ctx.tables.forwarding,
        ct_actions=(_CT_MARK_SERVICE,),
    )


def _frontend_template(ctx: Context, version: int, protocol: Protocol) -> templates.FrontendFlows:
    """ServiceLB's group (or reject/drop) flows of one family and protocol."""
    family = IPFamily(version)
    return templates.FrontendFlows(
        ctx.tables.service_lb,
        pl.PRIORITY_LOW,
        ctx.cookie(pl.Category.SERVICE),
        version=version,
        ip_proto=protocol.ip_proto,
        ip_field=dst_field(family),
        port_field=_PORT_FIELD[protocol],
    )


def _templates(ctx: Context, protocol: Protocol) -> tuple[DnatTemplates, FrontendTemplates]:
    """The context's EndpointDNAT and ServiceLB templates of a protocol, by IP version."""
    by_protocol = ctx.encoders.by_protocol
    found = by_protocol.get(protocol)
    if found is None:
        found = by_protocol[protocol] = (
            {v: _dnat_template(ctx, v, protocol) for v in (4, 6)},
            {v: _frontend_template(ctx, v, protocol) for v in (4, 6)},
        )
    return found


# EndpointDNAT flows are not cached: the datapath keeps what it was given as its encoding
# only, and a cache of the values would keep every flow's value tree (several times its
# bytes) alive as well.
def endpoint_dnat_flow(ctx: Context, ip: IPAddress, port: int, protocol: Protocol) -> of.FlowMod:
    """EndpointDNAT: ct(commit, zone=Z, nat(dst=IP:PORT), exec(ct_mark)) then Forwarding."""
    return _templates(ctx, protocol)[0][ip.version].flow(int(ip), port)


def frontend_flow_key(ctx: Context, ip: IPAddress, port: int, protocol: Protocol) -> FlowKey:
    """The key (table, priority, match) of a frontend's ServiceLB flow, whatever its action
    (to the group, the reject, the drop): what ``frontend_objects`` stages for it."""
    return flow_key(_templates(ctx, protocol)[1][ip.version].flow(int(ip), port, ()))


def mid_stream_flow(
    ctx: Context, ip: IPAddress, port: int, frontends: Iterable[tuple[IPAddress, int]]
) -> of.FlowMod:
    """ServiceLB (standalone): a TCP segment without SYN, new to conntrack, from the endpoint
    ``ip:port`` to a local pod (the probe's TO_LOCAL_POD) is a Service connection whose entry
    the switch lost, seen from the server's side. With exactly one frontend (address, port)
    mapping to this endpoint, ``ct(commit, nat(src=frontend))`` re-creates the translation the
    client's socket expects (the entry's reply direction is its next packet to the frontend,
    un-NATed to the endpoint); with more than one it is dropped: the client's next packet
    picks the connection up through the group (the same endpoint: the same bucket ids)."""
    family = IPFamily.of(ip)
    unique = sorted(set(frontends), key=lambda f: (f[0].version, int(f[0]), f[1]))
    match = of.Match(
        **{
            "eth_type": eth_type(family),
            "ip_proto": IPPROTO_TCP,
            src_field(family): ip,
            "tcp_src": port,
            pl.TO_LOCAL_POD_REG: (pl.TO_LOCAL_POD, pl.TO_LOCAL_POD),
        }
    )
    instructions: tuple[of.Instruction, ...] = ()
    if len(unique) == 1:
        frontend, frontend_port = unique[0]
        instructions = apply_actions(
            of.CT(
                commit=True,
                zone=pl.ct_zone(family),
                table=ctx.tables.forwarding,
                nat=of.NAT(src=True, ip_min=frontend, port_min=frontend_port),
                actions=(_CT_MARK_SERVICE,),
            )
        )
    return of.FlowMod(
        table_id=ctx.tables.service_lb,
        priority=pl.PRIORITY_MID_STREAM,
        match=match,
        instructions=instructions,
        cookie=ctx.cookie(pl.Category.ENDPOINT),
    )


# mid_stream_flow's encoding for many endpoints (one flow per TCP endpoint in a full sync):
# the flow of sample values, encoded once by the generic constructors, with the endpoint's
# and the frontend's address and port written at their places (the places of sample values
# that occur once in it; checked against a second generic encoding, else generic for good).
_SAMPLES = {
    4: (
        (
            ipaddress.ip_address("10.241.226.211"),
            0xB7C5,
            ipaddress.ip_address("10.193.178.163"),
            0x9D8E,
        ),
        (ipaddress.ip_address("10.17.34.51"), 0x1357, ipaddress.ip_address("10.68.85.102"), 0x2468),
    ),
    6: (
        (
            ipaddress.ip_address("fd5b:a7c3:91e2:d4f6:08b1:3c5e:7a9d:2f64"),
            0xB7C5,
            ipaddress.ip_address("fd3e:c1a9:57d2:e8b4:6f03:9a1c:d5e7:4b28"),
            0x9D8E,
        ),
        (ipaddress.ip_address("fd00::1"), 0x1357, ipaddress.ip_address("fd00::2"), 0x2468),
    ),
}


def endpoint_of_key(key: EndpointKey) -> tuple[IPAddress, int]:
    """The (address, port) an ``endpoint_key`` was made of."""
    address, port = key >> 17, (key >> 1) & 0xFFFF
    return (ipaddress.IPv6Address(address) if key & 1 else _IPV4(address)), port


def _mid_stream_wire(ctx: Context, version: int, recreate: bool) -> MidStreamWire | None:
    """A fast ``mid_stream_flow(...).wire`` for one family and kind (None: not templatable)."""

    def generic(key: EndpointKey, frontend: IPAddress, frontend_port: int) -> bytes:
        fronts = [(frontend, frontend_port)] * (1 if recreate else 2)
        if not recreate:  # two frontends: the drop
            fronts[1] = (frontend, frontend_port + 1 if frontend_port < 0xFFFF else 1)
        return mid_stream_flow(ctx, *endpoint_of_key(key), fronts).wire

    sample, check = _SAMPLES[version]
    proto = generic(endpoint_key(sample[0], sample[1]), sample[2], sample[3])
    values = [(sample[0].packed, 0), (sample[1].to_bytes(2, "big"), 1)]
    if recreate:
        values += [(sample[2].packed, 2), (sample[3].to_bytes(2, "big"), 3)]
    places: list[tuple[int, int, int]] = []
    for raw, which in values:
        at = proto.find(raw)
        if at < 0 or proto.find(raw, at + 1) >= 0:
            return None
        places.append((at, at + len(raw), which))
    address_bytes = 16 if version == 6 else 4
    places.sort()
    # the sample's bytes between the places, each followed by the value that goes there
    pieces = [proto[end : places[i + 1][0]] for i, (_, end, _) in enumerate(places[:-1])]
    head, tail = proto[: places[0][0]], proto[places[-1][1] :]
    order = [which for _, _, which in places]
    join = b"".join

    def fast(key: EndpointKey, frontend: IPAddress, frontend_port: int) -> bytes:
        args = (
            (key >> 17).to_bytes(address_bytes, "big"),
            ((key >> 1) & 0xFFFF).to_bytes(2, "big"),
            frontend.packed if recreate else b"",
            frontend_port.to_bytes(2, "big") if recreate else b"",
        )
        if recreate:
            return join(
                (head, args[order[0]], pieces[0], args[order[1]], pieces[1], args[order[2]],
                 pieces[2], args[order[3]], tail)
            )  # fmt: skip
        return join((head, args[order[0]], pieces[0], args[order[1]], tail))

    check_key = endpoint_key(check[0], check[1])
    if fast(check_key, check[2], check[3]) != generic(check_key, check[2], check[3]):
        return None
    return fast


def mid_stream_wire(
    ctx: Context, endpoint: EndpointKey, frontends: Collection[tuple[IPAddress, int]]
) -> bytes:
    """``mid_stream_flow(ctx, *endpoint_of_key(endpoint), frontends).wire``, several times
    cheaper (the endpoint as its ``endpoint_key``: the index keeps it so)."""
    recreate = len(frontends) == 1
    made = ctx.encoders.mid_stream
    key = (6 if endpoint & 1 else 4, recreate)
    if key not in made:
        made[key] = _mid_stream_wire(ctx, key[0], recreate)
    fast = made[key]
    frontend, frontend_port = next(iter(frontends))
    if fast is None:
        return mid_stream_flow(ctx, *endpoint_of_key(endpoint), frontends).wire
    return fast(endpoint, frontend, frontend_port)


def service_frontend_ips(port: ServicePort, family: IPFamily) -> tuple[IPAddress, ...]:
    """ClusterIPs, externalIPs and load-balancer ingress IPs of one family."""
    seen: dict[IPAddress, None] = {}
    for ip in (*port.cluster_ips, *port.external_ips, *port.load_balancer_ips):
        if ip.version == family:
            seen.setdefault(ip, None)
    return tuple(seen)


def affinity_timeouts(timeout: int, max_ovs: int = pl.OVS_MAX_TIMEOUT) -> tuple[int, bool]:
    """How a ClientIP affinity timeout is realised: (learned flows' idle_timeout, swept).

    kube-proxy's timer restarts with every new connection of the client (iptables ``recent``
    --set on each new connection), so the learned flow gets an *idle* timeout: it is hit by the
    first packet of each new connection only (established packets skip selection). Up to OVS's
    16-bit limit OVS expires it; above it (Kubernetes allows 86,400 s) the flow has no OVS
    timeout and the agent's sweeper deletes it once its idle age reaches the timeout (the cookie
    carries the timeout and the swept flag).
    """
    if timeout <= 0:
        return 0, False
    if timeout <= max_ovs:
        return timeout, False
    return 0, True


def _learn_affinity(ctx: Context, port: ServicePort, family: IPFamily) -> of.Learn:
    """Remember client -> endpoint in SessionAffinity, refreshed by each new connection."""
    src = "ipv4_src" if family == IPFamily.IPv4 else "ipv6_src"
    dst = dst_field(family)
    reg = pl.endpoint_ip_reg(family)
    idle, swept = affinity_timeouts(port.affinity_timeout, ctx.max_ovs_timeout)
    return of.Learn(
        table=ctx.tables.session_affinity,
        priority=pl.PRIORITY_NORMAL,
        idle_timeout=idle,
        cookie=pl.learned_cookie(port.affinity_timeout, swept),
        delete_learned=True,
        specs=(
            of.LearnMatchValue("eth_type", eth_type(family)),
            of.LearnMatchValue("ip_proto", port.protocol.ip_proto),
            of.LearnMatchField(src, src),
            of.LearnMatchField(dst, dst),
            of.LearnMatchField(_PORT_FIELD[port.protocol], _PORT_FIELD[port.protocol]),
            of.LearnLoadField(reg, reg),
            of.LearnLoadField(pl.ENDPOINT_PORT_REG, pl.ENDPOINT_PORT_REG, n_bits=16),
            of.LearnLoadValue(
                pl.SELECTION_REG,
                int(pl.Selection.SELECTED),
                dst_offset=pl.SELECTION_SHIFT,
                n_bits=3,
            ),
        ),
    )


def frontend_match(
    port: ServicePort, ip: IPAddress, l4_port: int | None = None, **extra: object
) -> of.Match:
    """ServiceLB's match for one frontend (ClusterIP, external or load-balancer IP: the
    Service's port; the virtual NodePort IP: ``l4_port``, the nodePort)."""
    family = IPFamily.of(ip)
    return of.Match(
        **{
            "eth_type": eth_type(family),
            "ip_proto": port.protocol.ip_proto,
            dst_field(family): ip,
            _PORT_FIELD[port.protocol]: port.port if l4_port is None else l4_port,
            **extra,
        }
    )


def learned_flows_delete(
    ctx: Context, port: ServicePort, ip: IPAddress, l4_port: int | None = None
) -> of.FlowMod:
    """Delete every learned affinity flow of one frontend (non-strict: any client)."""
    return of.FlowMod.delete(
        ctx.tables.session_affinity,
        frontend_match(port, ip, l4_port),
        cookie=pl.learned_cookie(),
        cookie_mask=pl.LEARNED_CATEGORY_MASK,
    )


# Every select group uses Open vSwitch's "hash" method over the connection's 5-tuple:
# highest random weight per bucket id, so inserting or removing a bucket moves only the
# connections that bucket wins or had, and each new connection is translated afresh (also
# against just-learned affinity flows). OVS's default method, dp_hash, sends every new
# connection to a bucket added by INSERT_BUCKET until the next MODIFY (OVS 3.1); "hash"
# without fields is OVS's symmetric L4 hash, which leaves UDP ports out (one UDP client,
# one endpoint, however many sockets). OVS skips a listed field whose prerequisites the
# packet does not meet (ofproto-dpif-xlate.c, pick_hash_fields_select_group), so one list
# serves TCP, UDP and SCTP over IPv4 and IPv6; it is in OVS's field order, as dump-groups
# prints it.
CONNECTION_HASH_FIELDS = (
    "ipv4_src",
    "ipv4_dst",
    "ipv6_src",
    "ipv6_dst",
    "ip_proto",
    "tcp_src",
    "tcp_dst",
    "udp_src",
    "udp_dst",
    "sctp_src",
    "sctp_dst",
)
GROUP_SELECTION_METHOD = SelectionMethod("hash", CONNECTION_HASH_FIELDS)


@dataclass(frozen=True, slots=True)
class FrontendSet:
    """Frontends of one family that share one endpoint set and one select group: the
    ClusterIPs (internal traffic policy), or external and load-balancer IPs and the NodePort
    (external traffic policy)."""

    frontends: tuple[IPAddress, ...]  # matched with the Service's port
    group_id: int
    endpoints: tuple[Endpoint, ...]
    # What the frontends do while `endpoints` is empty: reject (the agent's controller action)
    # or, when empty, drop.
    empty_actions: tuple[of.Action, ...] = ()
    # The virtual NodePort IP of this family, matched with the Service's nodePort (at most one).
    node_port_frontends: tuple[IPAddress, ...] = ()
    # externalTrafficPolicy Local: in-cluster clients (from a local pod or the node) of these
    # frontends go to this group instead, with its endpoints (kube-proxy's short-circuit);
    # 0: no short-circuit.
    in_cluster_group: int = 0
    in_cluster_endpoints: tuple[Endpoint, ...] = ()
    in_cluster_empty_actions: tuple[of.Action, ...] = ()
    # Only the group (for another set's short-circuit), no frontends of its own.
    group_only: bool = False

    def frontend_ports(self, port: ServicePort) -> list[tuple[IPAddress, int]]:
        """(address, L4 port) of every frontend."""
        out = [(ip, port.port) for ip in self.frontends]
        out += [(ip, port.node_port) for ip in self.node_port_frontends]
        return out


@dataclass(frozen=True, slots=True)
class ServiceObjects:
    groups: tuple[GroupSpec, ...]
    # what ``SwitchSync.stage`` takes: the EndpointDNAT flows as their encodings only
    staged: tuple[of.FlowMod | EncodedFlow, ...]

    @property
    def flows(self) -> tuple[of.FlowMod, ...]:
        """The flows as values (decoded where staged encoded)."""
        return tuple(
            of.decode_flow_mod(f.wire) if type(f) is EncodedFlow else f  # type: ignore[misc]
            for f in self.staged
        )


def frontend_objects(
    ctx: Context, port: ServicePort, sets: Sequence[FrontendSet]
) -> ServiceObjects:
    """Groups and flows of one Service port. Per frontend F, in ServiceLB:

    * priority LOW: F -> group (any selection state: a new connection, or a learned choice
      that is no longer valid); with no endpoints, the reject action or drop;
    * with session affinity, priority NORMAL: F + "selected, learn it" (from a bucket) ->
      learn, then EndpointDNAT; and per endpoint E, F + "selected" + E (a learned choice that
      is still one of F's endpoints) -> EndpointDNAT. A learned choice whose endpoint left
      matches none of these and falls to the group, which picks and learns a live endpoint:
      the client moves at once, other clients keep their affinity.
    """
    t = ctx.tables
    groups: list[GroupSpec] = []
    flows: list[of.FlowMod] = []
    svc_cookie = ctx.cookie(pl.Category.SERVICE)
    affinity = port.session_affinity
    dnat_templates, frontend_templates = _templates(ctx, port.protocol)
    makers = ctx.encoders.buckets
    ipv4 = _IPV4
    # With affinity, the EndpointDNAT flows of the port's endpoints, each once (without it,
    # the buckets translate: see endpoint_bucket_wire).
    dnat: dict[EndpointKey, EncodedFlow] = {}
    for fset in sets:
        if not (fset.frontends or fset.node_port_frontends or fset.group_only):
            continue
        buckets: list[BucketSpec] = []
        append = buckets.append
        for ep in fset.endpoints:
            ip = ep.ip
            ep_port = ep.port
            address = ip._ip  # type: ignore[union-attr]  # hot: see endpoint_key
            if type(ip) is ipv4:
                version = 4
                key = address << 17 | ep_port << 1
            else:
                version = 6
                key = address << 17 | ep_port << 1 | 1
            make = makers.get((ep_port, affinity, version))
            if make is None:
                make = _new_bucket_wire(makers, ep_port, affinity, version, t)
            # BucketSpec(key, wire, weight), in C
            append(_new_tuple(BucketSpec, (key, make(address), 100)))
            if affinity and key not in dnat:
                dnat[key] = _new_tuple(EncodedFlow, dnat_templates[version].keyed(address, ep_port))
        # GroupSpec(group_id, buckets, selection_method): see GROUP_SELECTION_METHOD.
        groups.append(
            _new_tuple(GroupSpec, (fset.group_id, tuple(buckets), GROUP_SELECTION_METHOD))
        )
        # To the group; with no endpoints, the reject action or (empty) drop.
        actions = (of.GroupAction(fset.group_id),) if fset.endpoints else tuple(fset.empty_actions)
        short_circuit: tuple[of.Action, ...] = ()
        if fset.in_cluster_group:
            short_circuit = (
                (of.GroupAction(fset.in_cluster_group),)
                if fset.in_cluster_endpoints
                else tuple(fset.in_cluster_empty_actions)
            )
        for ip, l4_port in fset.frontend_ports(port):
            address = ip._ip  # type: ignore[union-attr]  # hot path: see endpoint_key
            flows.append(frontend_templates[ip.version].flow(address, l4_port, actions))
            if fset.in_cluster_group:
                flows.extend(_short_circuit_flows(ctx, port, ip, l4_port, short_circuit))
            if not (affinity and (fset.endpoints or fset.in_cluster_endpoints)):
                continue
            family = IPFamily.of(ip)
            selection = pl.SELECTION_REG
            flows.append(
                of.FlowMod(
                    table_id=t.service_lb,
                    priority=pl.PRIORITY_NORMAL,
                    match=frontend_match(
                        port,
                        ip,
                        l4_port,
                        **{selection: (pl.Selection.TO_LEARN.value_bits, pl.SELECTION_MASK)},
                    ),
                    instructions=apply_actions(
                        _learn_affinity(ctx, port, family),
                        of.SetField(selection, pl.Selection.SELECTED.value_bits, pl.SELECTION_MASK),
                        of.Resubmit(t.endpoint_dnat),
                    ),
                    cookie=svc_cookie,
                )
            )
            for ep in fset.endpoints:
                flows.append(_accept_learned(ctx, port, ip, l4_port, ep))
            # A learned choice of an in-cluster client among the cluster endpoints that are
            # not this set's (externalTrafficPolicy Local: those are the local ones).
            own = {(e.ip, e.port) for e in fset.endpoints}
            for ep in fset.in_cluster_endpoints:
                if (ep.ip, ep.port) in own:
                    continue
                for bit in (pl.FROM_POD, pl.FROM_NODE):
                    flows.append(
                        _accept_learned(ctx, port, ip, l4_port, ep, **{pl.FROM_POD_REG: (bit, bit)})
                    )
    return ServiceObjects(tuple(groups), (*flows, *dnat.values()))


def _accept_learned(
    ctx: Context,
    port: ServicePort,
    ip: IPAddress,
    l4_port: int,
    ep: Endpoint,
    **extra: object,
) -> of.FlowMod:
    """ServiceLB: a learned choice of ``ep`` for this frontend is still valid: EndpointDNAT."""
    family = IPFamily.of(ip)
    return of.FlowMod(
        table_id=ctx.tables.service_lb,
        priority=pl.PRIORITY_NORMAL,
        match=frontend_match(
            port,
            ip,
            l4_port,
            **{
                pl.endpoint_ip_reg(family): _ip_value(ep.ip),
                pl.ENDPOINT_PORT_REG: (
                    ep.port | pl.Selection.SELECTED.value_bits,
                    pl.ENDPOINT_PORT_MASK | pl.SELECTION_MASK,
                ),
                **extra,
            },
        ),
        instructions=apply_actions(of.Resubmit(ctx.tables.endpoint_dnat)),
        cookie=ctx.cookie(pl.Category.SERVICE),
    )


def _short_circuit_flows(
    ctx: Context,
    port: ServicePort,
    ip: IPAddress,
    l4_port: int,
    actions: tuple[of.Action, ...],
) -> list[of.FlowMod]:
    """ServiceLB: an in-cluster client (a local pod, or the node) of an external frontend
    with externalTrafficPolicy Local -> the cluster endpoints' group (one flow per reg0 bit)."""
    return [
        of.FlowMod(
            table_id=ctx.tables.service_lb,
            priority=pl.PRIORITY_SHORT_CIRCUIT,
            match=frontend_match(port, ip, l4_port, **{pl.FROM_POD_REG: (bit, bit)}),
            instructions=apply_actions(*actions) if actions else (),
            cookie=ctx.cookie(pl.Category.SERVICE),
        )
        for bit in (pl.FROM_POD, pl.FROM_NODE)
    ]


def service_objects(
    ctx: Context,
    port: ServicePort,
    endpoints: Sequence[Endpoint],
    group_ids: dict[IPFamily, int],
    reject_action: tuple[of.Action, ...] = (),
) -> ServiceObjects:
    """Groups and flows for one Service port whose frontends all use `endpoints` (after
    categorisation); `group_ids` has an id for every family the Service has frontends in.
    Without endpoints of a family, its frontends get `reject_action` (empty: drop)."""
    sets = [
        FrontendSet(
            frontends=service_frontend_ips(port, family),
            group_id=group_id,
            endpoints=tuple(ep for ep in endpoints if ep.ip.version == family),
            empty_actions=reject_action,
        )
        for family, group_id in sorted(group_ids.items())
    ]
    return frontend_objects(ctx, port, sets)
