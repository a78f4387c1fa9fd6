"""Fast, exact constructors for the values a full sync builds by the hundred thousand.

A Service proxy builds the same few shapes over and over: per endpoint an EndpointDNAT flow
(match on the endpoint's address and port in registers, ``ct(commit, nat(dst=IP:PORT))``), a
set_field of its address and a bucket; per frontend a ServiceLB flow (match on the address and
port, ``group:G``). The generic constructors validate, canonicalise and encode every part of
every value (bench ``encode`` measures both paths); here a shape is prepared once and each value
is then a few byte joins and ``tuple.__new__`` calls.

How a template is made, so it cannot drift from the codec: it builds a *sample* value with the
generic constructors, cuts each encoding around the sample's variable bytes (address, port,
...; each must occur exactly once), and keeps the constant parts and the constant field values
of the sample. Building a value is then formatting the variable bytes into those parts. The
template checks itself on two samples when it is made (a shape it cannot reproduce is built by
the generic constructors: ``template.fast`` is then False), and outside its fast path's domain
(an address 0, a port 0...) it calls the generic constructors, so the result is always what
they build -- or the error they raise.

The values are equal to the generic ones in every respect: same type, same wire, the same
field values recursively (so the same text); ``identical`` checks that.
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Callable, Iterable, Sequence
from operator import itemgetter
from typing import Any

from . import constants as c
from .actions import CT, NAT, Action, ApplyActions, GroupAction, SetField
from .encoded import EncodedGroupMod
from .errors import MessageTooLarge, OpenFlowEncodeError
from .fields import Match, get_field
from .flows import FlowMod
from .groups import Bucket, GroupMod, _selection_method_prop

__all__ = [
    "EndpointDnatFlows",
    "FrontendFlows",
    "TemplateError",
    "bucket",
    "bucket_wire",
    "encoded_group_mod",
    "group_mod",
    "identical",
    "numbered_buckets",
    "set_field_exact",
    "set_field_exact_wire",
]

_new = tuple.__new__
_ETH_TYPE = {4: 0x0800, 6: 0x86DD}
_ADDRESS = {4: ipaddress.IPv4Address, 6: ipaddress.IPv6Address}
_ADDRESS_BYTES = {4: 4, 6: 16}
# Samples: variable parts with bytes that occur nowhere else in the encodings (checked).
_SAMPLE_IPS = {
    4: (0xA1B2C3D4, 0xC7D8E9FA),
    6: (0xA1B2C3D4E5F60718293A4B5C6D7E8F90, 0xC1D2E3F405162738495A6B7C8D9EAFB0),
}
_SAMPLE_PORTS = (0xB7E9, 0xD3C5)


class TemplateError(ValueError):
    """This shape cannot be templated (its variable bytes are not where a template needs
    them); use the generic constructors."""


def identical(a: Any, b: Any) -> bool:
    """Same type and, recursively, the same elements: a value's wire *and* its field values
    (``==`` on values compares only the wire)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, tuple):
        return len(a) == len(b) and all(identical(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


class _Cut:
    """An encoding cut around the bytes of its variable parts: ``fmt % parts`` (the parts in
    ``order``, each as wide as in the sample) is the encoding for other values."""

    __slots__ = ("fmt", "order")

    def __init__(self, wire: bytes, needles: dict[str, bytes]) -> None:
        found = []
        for name, needle in needles.items():
            if wire.count(needle) != 1:
                raise TemplateError(f"{name} ({needle.hex()}) is not once in {wire.hex()}")
            found.append((wire.index(needle), len(needle), name))
        found.sort()
        parts: list[bytes] = []
        pos = 0
        for at, width, _ in found:
            if at < pos:
                raise TemplateError("variable parts overlap")
            parts += (_escape(wire[pos:at]), b"%b")
            pos = at + width
        parts.append(_escape(wire[pos:]))
        self.fmt = b"".join(parts)
        self.order = tuple(name for _, _, name in found)

    def picker(self, names: Sequence[str]) -> Callable[[tuple[bytes, ...]], tuple[bytes, ...]]:
        """Picks the parts, given in ``names`` order, in this encoding's order."""
        if len(self.order) < 2:
            raise TemplateError("a cut needs two variable parts")  # itemgetter of one: no tuple
        return itemgetter(*(names.index(n) for n in self.order))


def _address_port_cut(wire: bytes, address: bytes, port: bytes) -> tuple[_Cut, bool]:
    """The cut of an encoding holding an address and a port: (cut, whether the address is
    in two 8-byte halves, as an xxreg match is)."""
    try:
        return _Cut(wire, {"ip": address, "port": port}), False
    except TemplateError:
        if len(address) != 16:
            raise
    return _Cut(wire, {"hi": address[:8], "lo": address[8:], "port": port}), True


def _escape(constant: bytes) -> bytes:
    """A constant part of a ``%`` format."""
    return constant.replace(b"%", b"%%")


def _prefix(wire: bytes, rest: bytes) -> bytes:
    """The part of ``wire`` before ``rest``, which must end it."""
    if not wire.endswith(rest):
        raise TemplateError("unexpected encoding layout")
    return wire[: len(wire) - len(rest)]


_CUT_NAMES = ("ip", "hi", "lo", "port")
_KEY_HEAD = struct.Struct("!BH")  # a flow's table id and priority, before its match


class EndpointDnatFlows:
    """EndpointDNAT flows of one shape, for any endpoint address and port::

        FlowMod(table_id, priority,
                Match(eth_type=..., ip_proto=ip_proto,
                      <ip_field>=IP, <port_field>=(PORT, port_mask)),
                [ApplyActions([CT(commit=True, zone=zone, table=ct_table,
                                  nat=NAT(dst=True, ip_min=IP, port_min=PORT),
                                  actions=ct_actions)])],
                cookie=cookie)

    ``flows.flow(ip, port)`` with the address as an int; ``flows.wire(ip, port)`` is its
    encoding only (``flow(ip, port).wire``, without building the value); ``flows.keyed(ip,
    port)`` is (its identity in OpenFlow -- table id, priority and match as bytes, "!BH" then
    the match's encoding --, its encoding); ``flows.generic(ip, port)`` builds the same flow
    with the generic constructors.
    """

    def __init__(
        self,
        table_id: int,
        priority: int,
        cookie: int,
        *,
        version: int,
        ip_proto: int,
        ip_field: str,
        port_field: str,
        port_mask: int = 0xFFFF,
        zone: int,
        ct_table: int | None,
        ct_actions: Iterable[Action] = (),
    ) -> None:
        if version not in _ETH_TYPE:
            raise TemplateError(f"IP version {version}")
        self.version = version
        self._spec = (
            table_id,
            priority,
            cookie,
            ip_proto,
            ip_field,
            port_field,
            port_mask,
            zone,
            ct_table,
            tuple(ct_actions),
        )
        self.wire: Callable[[int, int], bytes]
        self.keyed: Callable[[int, int], tuple[bytes, bytes]]
        try:
            self.flow: Callable[[int, int], FlowMod] = self._make()
            self.fast = True
        except TemplateError:  # built generically, then
            self.flow = self.generic
            self.wire = self._generic_wire
            self.keyed = self._generic_keyed
            self.fast = False

    def _generic_wire(self, ip: int, port: int) -> bytes:
        wire: bytes = self.generic(ip, port)[0]
        return wire

    def _generic_keyed(self, ip: int, port: int) -> tuple[bytes, bytes]:
        flow = self.generic(ip, port)
        return _KEY_HEAD.pack(flow[1], flow[2]) + flow[3][0], flow[0]

    def generic(self, ip: int, port: int) -> FlowMod:
        """The flow, built by the generic constructors."""
        (
            table_id,
            priority,
            cookie,
            ip_proto,
            ip_field,
            port_field,
            port_mask,
            zone,
            ct_table,
            ct_actions,
        ) = self._spec
        match = Match(
            **{
                "eth_type": _ETH_TYPE[self.version],
                "ip_proto": ip_proto,
                ip_field: ip,
                port_field: (port, port_mask),
            }
        )
        ct = CT(
            commit=True,
            zone=zone,
            table=ct_table,
            nat=NAT(dst=True, ip_min=_ADDRESS[self.version](ip), port_min=port),
            actions=ct_actions,
        )
        return FlowMod(table_id, priority, match, (ApplyActions((ct,)),), cookie=cookie)

    def _make(self) -> Callable[[int, int], FlowMod]:
        if self._spec[6] != 0xFFFF:
            raise TemplateError("the port is matched with a mask other than 0xffff")
        n_bytes = _ADDRESS_BYTES[self.version]
        ip_limit = 1 << (8 * n_bytes)
        sample_ip, other_ip = _SAMPLE_IPS[self.version]
        sample_port, other_port = _SAMPLE_PORTS
        sample = self.generic(sample_ip, sample_port)
        ipb = sample_ip.to_bytes(n_bytes, "big")
        portb = sample_port.to_bytes(2, "big")
        match = sample[3]
        (apply,) = sample[4]
        (ct,) = apply[1]
        nat = ct[5]
        # Cut the encodings around their variable bytes. The flow's encoding is its head, the
        # match, then the apply-actions instruction, which ends with the ct action, which holds
        # the nat action: one format for the flow, and the others are slices of it.
        match_cut, split = _address_port_cut(match[0], ipb, portb)
        nat_cut = _Cut(nat[0], {"ip": ipb, "port": portb})
        ct_wire = ct[0]
        ct_head = ct_wire[: ct_wire.index(nat[0])]
        ct_tail = ct_wire[len(ct_head) + len(nat[0]) :]
        apply_head = _prefix(apply[0], ct_wire)
        flow_head = _prefix(sample[0], match[0] + apply[0])
        flow_fmt = b"".join(
            (
                _escape(flow_head),
                match_cut.fmt,
                _escape(apply_head + ct_head),
                nat_cut.fmt,
                _escape(ct_tail),
            )
        )
        pick = itemgetter(*(_CUT_NAMES.index(n) for n in match_cut.order + nat_cut.order))
        match_at = len(flow_head)
        apply_at = match_at + len(match[0])
        ct_at = apply_at + len(apply_head)
        nat_at = ct_at + len(ct_head)
        nat_end = nat_at + len(nat[0])
        # Constant field values, from the sample.
        _, ct_commit, ct_zone, ct_table, ct_alg, _, ct_actions, ct_force = ct
        _, nat_src, nat_dst, _, nat_ip_max, _, nat_port_max, nat_pers, nat_hash, nat_rand = nat
        _, table_id, priority, _, _, *flow_tail = sample
        f5, f6, f7, f8, f9, f10, f11, f12, f13, f14 = flow_tail
        match_cls, nat_cls, ct_cls, apply_cls, flow_cls = Match, NAT, CT, ApplyActions, FlowMod
        generic = self.generic

        def flow(ip: int, port: int) -> FlowMod:
            if not (0 < ip < ip_limit and 0 < port <= 0xFFFF):
                return generic(ip, port)  # what the generic constructors make of it
            ipb = ip.to_bytes(n_bytes, "big")
            portb = port.to_bytes(2, "big")
            wire = flow_fmt % pick(
                (ipb, ipb[:8], ipb[8:], portb) if split else (ipb, ipb, ipb, portb)
            )
            nat = _new(
                nat_cls,
                (
                    wire[nat_at:nat_end],
                    nat_src,
                    nat_dst,
                    ipb,
                    nat_ip_max,
                    port,
                    nat_port_max,
                    nat_pers,
                    nat_hash,
                    nat_rand,
                ),
            )
            ct = _new(
                ct_cls,
                (wire[ct_at:], ct_commit, ct_zone, ct_table, ct_alg, nat, ct_actions, ct_force),
            )
            return _new(
                flow_cls,
                (
                    wire,
                    table_id,
                    priority,
                    _new(match_cls, (wire[match_at:apply_at], None)),
                    (_new(apply_cls, (wire[apply_at:], (ct,))),),
                    f5,
                    f6,
                    f7,
                    f8,
                    f9,
                    f10,
                    f11,
                    f12,
                    f13,
                    f14,
                ),
            )

        def wire_of(ip: int, port: int) -> bytes:
            if not (0 < ip < ip_limit and 0 < port <= 0xFFFF):
                wire: bytes = generic(ip, port)[0]
                return wire
            ipb = ip.to_bytes(n_bytes, "big")
            portb = port.to_bytes(2, "big")
            encoded: bytes = flow_fmt % pick(
                (ipb, ipb[:8], ipb[8:], portb) if split else (ipb, ipb, ipb, portb)
            )
            return encoded

        key_fmt = _escape(_KEY_HEAD.pack(table_id, priority)) + match_cut.fmt
        key_pick = itemgetter(*(_CUT_NAMES.index(n) for n in match_cut.order))
        generic_keyed = self._generic_keyed

        def keyed(ip: int, port: int) -> tuple[bytes, bytes]:
            if not (0 < ip < ip_limit and 0 < port <= 0xFFFF):
                return generic_keyed(ip, port)
            ipb = ip.to_bytes(n_bytes, "big")
            portb = port.to_bytes(2, "big")
            parts = (ipb, ipb[:8], ipb[8:], portb) if split else (ipb, ipb, ipb, portb)
            return key_fmt % key_pick(parts), flow_fmt % pick(parts)

        for ip, port in ((sample_ip, sample_port), (other_ip, other_port)):
            if not identical(flow(ip, port), self.generic(ip, port)):
                raise TemplateError("the template does not reproduce the generic flow")
            if wire_of(ip, port) != self.generic(ip, port)[0]:
                raise TemplateError("the template does not reproduce the generic encoding")
            if keyed(ip, port) != self._generic_keyed(ip, port):
                raise TemplateError("the template does not reproduce the generic key")
        self.wire = wire_of
        self.keyed = keyed
        return flow


class FrontendFlows:
    """ServiceLB flows of one shape, for any frontend address, port and actions::

        FlowMod(table_id, priority,
                Match(eth_type=..., ip_proto=ip_proto, <ip_field>=IP, <port_field>=PORT),
                [ApplyActions(actions)] if actions else [], cookie=cookie)

    ``flows.flow(ip, port, actions)`` (address as an int, actions a tuple) and
    ``flows.group_flow(ip, port, group_id)`` for ``actions=(GroupAction(group_id),)``.
    """

    def __init__(
        self,
        table_id: int,
        priority: int,
        cookie: int,
        *,
        version: int,
        ip_proto: int,
        ip_field: str,
        port_field: str,
    ) -> None:
        if version not in _ETH_TYPE:
            raise TemplateError(f"IP version {version}")
        self.version = version
        self._spec = (table_id, priority, cookie, ip_proto, ip_field, port_field)
        try:
            self.flow: Callable[[int, int, tuple[Action, ...]], FlowMod] = self._make()
            self.fast = True
        except TemplateError:  # built generically, then
            self.flow = self.generic
            self.fast = False

    def generic(self, ip: int, port: int, actions: tuple[Action, ...]) -> FlowMod:
        table_id, priority, cookie, ip_proto, ip_field, port_field = self._spec
        match = Match(
            **{
                "eth_type": _ETH_TYPE[self.version],
                "ip_proto": ip_proto,
                ip_field: _ADDRESS[self.version](ip),
                port_field: port,
            }
        )
        instructions = (ApplyActions(actions),) if actions else ()
        return FlowMod(table_id, priority, match, instructions, cookie=cookie)

    def group_flow(self, ip: int, port: int, group_id: int) -> FlowMod:
        return self.flow(ip, port, (GroupAction(group_id),))

    def _make(self) -> Callable[[int, int, tuple[Action, ...]], FlowMod]:
        n_bytes = _ADDRESS_BYTES[self.version]
        ip_limit = 1 << (8 * n_bytes)
        sample_ip, other_ip = _SAMPLE_IPS[self.version]
        sample_port, other_port = _SAMPLE_PORTS
        sample_actions = (GroupAction(0x7B6A5948),)
        sample = self.generic(sample_ip, sample_port, sample_actions)
        match = sample[3]
        (apply,) = sample[4]
        match_cut, split = _address_port_cut(
            match[0], sample_ip.to_bytes(n_bytes, "big"), sample_port.to_bytes(2, "big")
        )
        match_fmt = match_cut.fmt
        match_pick = match_cut.picker(_CUT_NAMES)
        apply_head_len = len(apply[0]) - len(sample_actions[0][0])
        flow_head = _prefix(sample[0], match[0] + apply[0])
        _, table_id, priority, _, _, *tail = sample
        flow_tail = tuple(tail)
        apply_header = struct.Struct("!HH4x")
        if apply[0][:apply_head_len] != apply_header.pack(c.OFPIT_APPLY_ACTIONS, len(apply[0])):
            raise TemplateError("unexpected apply-actions layout")
        generic = self.generic
        match_cls, apply_cls, flow_cls = Match, ApplyActions, FlowMod
        pack_apply = apply_header.pack
        apply_type = c.OFPIT_APPLY_ACTIONS

        def flow(ip: int, port: int, actions: tuple[Action, ...]) -> FlowMod:
            if not (0 <= ip < ip_limit and 0 <= port <= 0xFFFF and type(actions) is tuple):
                return generic(ip, port, actions)
            for action in actions:
                if not isinstance(action, Action):
                    return generic(ip, port, actions)
            ipb = ip.to_bytes(n_bytes, "big")
            portb = port.to_bytes(2, "big")
            parts = (ipb, ipb[:8], ipb[8:], portb) if split else (ipb, ipb, ipb, portb)
            match_wire = match_fmt % match_pick(parts)
            if actions:
                body = b"".join([a[0] for a in actions])
                if len(body) + 8 > 0xFFFF:
                    return generic(ip, port, actions)
                apply_wire = pack_apply(apply_type, len(body) + 8) + body
                instructions: tuple[Any, ...] = (_new(apply_cls, (apply_wire, actions)),)
            else:
                apply_wire = b""
                instructions = ()
            return _new(
                flow_cls,
                (
                    flow_head + match_wire + apply_wire,
                    table_id,
                    priority,
                    _new(match_cls, (match_wire, None)),
                    instructions,
                    *flow_tail,
                ),
            )

        for ip, port, actions in (
            (sample_ip, sample_port, sample_actions),
            (other_ip, other_port, (GroupAction(1), GroupAction(2))),
            (other_ip, sample_port, ()),
        ):
            if not identical(flow(ip, port, actions), self.generic(ip, port, actions)):
                raise TemplateError("the template does not reproduce the generic flow")
        return flow


def set_field_exact(field: str) -> Callable[[int], SetField]:
    """``SetField(field, value)`` (unmasked), for int values: ``set_field_exact("reg3")(ip)``."""
    f = get_field(field)
    prefix, pad = f.set_field_exact
    n_bytes, limit, name, cls = f.n_bytes, f.limit, f.name, SetField

    def make(value: int) -> SetField:
        if type(value) is int and 0 <= value < limit:
            return _new(cls, (prefix + value.to_bytes(n_bytes, "big") + pad, name, value, None))
        return SetField(name, value)

    return make


_VALUE_FORMATS = {1: "B", 2: "H", 4: "I", 8: "Q"}


def set_field_exact_wire(field: str, after: bytes = b"") -> Callable[[int], bytes]:
    """``SetField(field, value).wire + after`` for int values, in one struct call: a bucket's
    actions kept encoded (the endpoint's address, then the actions its buckets share)."""
    f = get_field(field)
    prefix, pad = f.set_field_exact
    n_bytes, limit, name = f.n_bytes, f.limit, f.name
    rest = pad + after
    code = _VALUE_FORMATS.get(n_bytes)
    if code is not None:
        pack = struct.Struct(f"!{len(prefix)}s{code}{len(rest)}s").pack

        def make(value: int) -> bytes:
            if type(value) is int and 0 <= value < limit:
                return pack(prefix, value, rest)
            return SetField(name, value).wire + after

    else:

        def make(value: int) -> bytes:
            if type(value) is int and 0 <= value < limit:
                return b"".join((prefix, value.to_bytes(n_bytes, "big"), rest))
            return SetField(name, value).wire + after

    return make


_BUCKET_HEAD = struct.Struct("!HHI")
_WEIGHT_PROP = struct.Struct("!HHH2x")
_DEFAULT_WEIGHT = _WEIGHT_PROP.pack(c.OFPGBPT_WEIGHT, 8, 100)  # every service bucket's


def _weight_prop(weight: object) -> bytes | None:
    """A bucket's weight property, or None for a weight out of range (or not an int)."""
    if weight == 100 and type(weight) is int:
        return _DEFAULT_WEIGHT
    if type(weight) is not int or not 0 <= weight <= 0xFFFF:
        return None
    return _WEIGHT_PROP.pack(c.OFPGBPT_WEIGHT, 8, weight)


def bucket(bucket_id: int, actions: tuple[Action, ...], weight: int | None = 100) -> Bucket:
    """``Bucket(bucket_id, actions, weight)`` without watch port or group."""
    prop = _weight_prop(weight)
    if prop is None:
        return Bucket(bucket_id, actions, weight)
    if type(actions) is not tuple or not 0 <= bucket_id <= c.OFPG_BUCKET_MAX:
        return Bucket(bucket_id, actions, weight)
    for action in actions:
        if not isinstance(action, Action):
            return Bucket(bucket_id, actions, weight)
    body = b"".join([a[0] for a in actions])
    size = len(body)
    if size + 16 > 0xFFFF:
        return Bucket(bucket_id, actions, weight)
    return _new(
        Bucket,
        (
            _BUCKET_HEAD.pack(size + 16, size, bucket_id) + body + prop,
            bucket_id,
            actions,
            weight,
            None,
            None,
        ),
    )


# A select bucket's bytes besides its actions: its header and its weight property.
BUCKET_OVERHEAD = 16


def bucket_wire(bucket_id: int, actions: bytes, weight: int = 100) -> bytes:
    """``Bucket(bucket_id, actions, weight).wire`` from the actions' encoding (what a group
    keeps per endpoint: see ``datapath.groups.BucketSpec``)."""
    prop = _DEFAULT_WEIGHT if weight == 100 and type(weight) is int else _weight_prop(weight)
    if prop is None:
        raise OpenFlowEncodeError(f"bucket weight {weight!r} is out of range")
    if not 0 <= bucket_id <= c.OFPG_BUCKET_MAX:
        raise OpenFlowEncodeError(f"bucket id {bucket_id} is out of range")
    size = len(actions)
    if size + BUCKET_OVERHEAD > 0xFFFF:
        raise MessageTooLarge("bucket", size + BUCKET_OVERHEAD, 0xFFFF)
    return b"".join((_BUCKET_HEAD.pack(size + BUCKET_OVERHEAD, size, bucket_id), actions, prop))


def encoded_group_mod(
    command: int,
    group_id: int,
    group_type: int,
    buckets: Sequence[bytes],
    *,
    command_bucket_id: int | None = None,
    selection_method: str | None = None,
    fields: tuple[str, ...] = (),
) -> EncodedGroupMod:
    """``EncodedGroupMod.of(GroupMod(...))`` from the buckets' encodings (``bucket_wire``):
    the same bytes, without a value per bucket."""
    if command_bucket_id is None:
        command_bucket_id = (
            c.OFPG_BUCKET_LAST if command == c.GroupModCommand.INSERT_BUCKET else c.OFPG_BUCKET_ALL
        )
    props = b""
    if not selection_method and fields:
        raise OpenFlowEncodeError(f"group {group_id}: fields {fields!r} without a selection method")
    if selection_method:
        if command not in _PROPERTY_COMMANDS:
            raise OpenFlowEncodeError(f"group {group_id}: a selection method on command {command}")
        found = _selection_prop(selection_method, fields)
        if found is None:  # the generic constructor raises the error
            GroupMod(
                command, group_id, group_type, (), selection_method=selection_method, fields=fields
            )
            raise OpenFlowEncodeError(f"group {group_id}: selection method {selection_method}")
        props = found[0]
    if buckets and command in _NO_BUCKET_COMMANDS:
        raise OpenFlowEncodeError(f"group {group_id}: buckets on command {command}")
    body = b"".join(buckets)
    if len(body) > 0xFFFF:
        raise MessageTooLarge(f"group {group_id} buckets", len(body), 0xFFFF)
    head = _GROUP_MOD_HEAD.pack(command, group_type, group_id, len(body), command_bucket_id)
    return _new(EncodedGroupMod, (b"".join((head, body, props)),))


def numbered_buckets(specs: Iterable[Sequence[Any]], first_id: int = 0) -> list[Bucket]:
    """``[Bucket(first_id + i, actions, weight) ...]`` for ``(key, actions, weight)``
    triples (a group's bucket specs), in one loop."""
    result: list[Bucket] = []
    append = result.append
    bucket_id = first_id
    default_weight = _DEFAULT_WEIGHT
    pack_head = _BUCKET_HEAD.pack
    action_type = Action
    max_id = c.OFPG_BUCKET_MAX
    for _, actions, weight in specs:
        prop = default_weight if weight == 100 and type(weight) is int else _weight_prop(weight)
        if prop is not None and type(actions) is tuple and bucket_id <= max_id:
            if len(actions) == 3:  # an endpoint's bucket: one join, no intermediate body
                a, b, d = actions
                if (
                    isinstance(a, action_type)
                    and isinstance(b, action_type)
                    and isinstance(d, action_type)
                ):
                    size = len(a[0]) + len(b[0]) + len(d[0])
                    if size + 16 <= 0xFFFF:
                        wire = b"".join(
                            (pack_head(size + 16, size, bucket_id), a[0], b[0], d[0], prop)
                        )
                        append(_new(Bucket, (wire, bucket_id, actions, weight, None, None)))
                        bucket_id += 1
                        continue
            else:
                for action in actions:
                    if not isinstance(action, action_type):
                        break
                else:
                    body = b"".join([a[0] for a in actions])
                    size = len(body)
                    if size + 16 <= 0xFFFF:
                        wire = pack_head(size + 16, size, bucket_id) + body + prop
                        append(_new(Bucket, (wire, bucket_id, actions, weight, None, None)))
                        bucket_id += 1
                        continue
        append(bucket(bucket_id, actions, weight))  # the generic constructor decides
        bucket_id += 1
    return result


_GROUP_MOD_HEAD = struct.Struct("!HBxIH2xI")
_PROPERTY_COMMANDS = frozenset(
    {c.GroupModCommand.ADD, c.GroupModCommand.MODIFY, c.GroupModCommand.ADD_OR_MOD}
)
# (method, fields as given) -> (the property's bytes, the fields' canonical names); a few
# selection methods in practice, so a small bounded cache.
_SELECTION_PROPS: dict[tuple[str, tuple[str, ...]], tuple[bytes, tuple[str, ...]]] = {}


def _selection_prop(method: str, fields: tuple[str, ...]) -> tuple[bytes, tuple[str, ...]] | None:
    """The selection method property and the canonical field names, or None where the
    generic constructor must decide (an unknown field, fields without "hash")."""
    key = (method, fields)
    found = _SELECTION_PROPS.get(key)
    if found is None:
        if fields and method != "hash":
            return None
        try:
            resolved = tuple(get_field(f) for f in fields)
        except (OpenFlowEncodeError, TypeError):  # the generic constructor raises it
            return None
        found = (_selection_method_prop(method, 0, resolved), tuple(f.name for f in resolved))
        if len(_SELECTION_PROPS) < 64:
            _SELECTION_PROPS[key] = found
    return found


def group_mod(
    command: int,
    group_id: int,
    group_type: int,
    buckets: Sequence[Bucket],
    *,
    command_bucket_id: int | None = None,
    selection_method: str | None = None,
    fields: Sequence[str] = (),
) -> GroupMod:
    """``GroupMod(command, group_id, group_type, buckets, command_bucket_id=...,
    selection_method=..., fields=...)`` (no selection method parameter)."""
    if type(buckets) is not tuple:
        buckets = tuple(buckets)
    if type(fields) is not tuple:
        fields = tuple(fields)
    for b in buckets:
        if type(b) is not Bucket:
            break
    else:
        if command_bucket_id is None:
            command_bucket_id = (
                c.OFPG_BUCKET_LAST
                if command == c.GroupModCommand.INSERT_BUCKET
                else c.OFPG_BUCKET_ALL
            )
        if selection_method == "":
            selection_method = None
        names: tuple[str, ...] = ()
        props: bytes | None
        if selection_method is None:
            props = None if fields else b""  # fields without a method: the generic error
        elif command in _PROPERTY_COMMANDS:
            found = _selection_prop(selection_method, fields)
            props, names = (None, ()) if found is None else found
        else:
            props = None  # refused: the generic constructor raises
        body = b"".join([b[0] for b in buckets])
        if (
            props is not None
            and len(body) <= 0xFFFF
            and not (buckets and command in _NO_BUCKET_COMMANDS)
            and type(group_id) is int
            and 0 <= group_id <= 0xFFFFFFFF
            and type(command_bucket_id) is int
            and 0 <= command_bucket_id <= 0xFFFFFFFF
            and 0 <= command <= 0xFFFF
            and 0 <= group_type <= 0xFF
        ):
            head = _GROUP_MOD_HEAD.pack(command, group_type, group_id, len(body), command_bucket_id)
            return _new(
                GroupMod,
                (
                    head + body + props,
                    command,
                    group_id,
                    group_type,
                    buckets,
                    command_bucket_id,
                    selection_method,
                    0,
                    names,
                ),
            )
    return GroupMod(
        command,
        group_id,
        group_type,
        buckets,
        command_bucket_id=command_bucket_id,
        selection_method=selection_method,
        fields=fields,
    )


_NO_BUCKET_COMMANDS = frozenset({c.GroupModCommand.DELETE, c.GroupModCommand.REMOVE_BUCKET})
