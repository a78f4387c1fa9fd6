"""Encoding OpenFlow 1.5: our codec against os-ken, measured in the same run.

* GroupMods with 10 buckets (set reg3, set reg4[0..15], resubmit), the datapath's steady
  state: buckets are per-endpoint values built once, so a group (re-)encode builds the
  GroupMod and its bytes from the buckets' cached encodings. os-ken's counterpart builds
  its OFPGroupMod from prebuilt bucket objects and serializes (it cannot reuse bytes).
  ``ours_per_s`` / ``os_ken_per_s`` / ``ratio``; target: >= 50,000/s and >= 10x.
* The same from scratch (every action and bucket built too): ``*_cold_per_s``.
* Flows built from scratch and encoded as bundle adds (what a full sync streams): the
  EndpointDNAT flow (match eth_type/ip_proto/reg3/reg4 + ct(commit,zone,table,nat,exec)),
  the ServiceLB flow (match ip_proto/ipv4_dst/tcp_dst -> group); by the generic
  constructors and by the codec's templates (``protocol.templates``: what the datapath uses;
  ``*_template_*``).
* A full sync's worth (10,000 Services x 10 endpoints: 10,000 groups + 110,000 flows) built
  and encoded, timed end to end (``full_sync_build_encode_s``; with the templates and the
  fast bucket and group constructors: ``full_sync_build_encode_template_s``).
"""

from __future__ import annotations

import gc
import ipaddress
import time
from collections.abc import Callable
from typing import Any

from ovsproxy.openflow import protocol as of
from ovsproxy.openflow.protocol import templates

NAME = "encode"
DESCRIPTION = "GroupMods (10 buckets) and service flows encoded: ours vs os-ken, same run"

ENDPOINTS = 10
RESUBMIT_DNAT = of.Resubmit(60)
CT_MARK = of.SetField("ct_mark", 0x2, 0x2)


def _ips(n: int) -> list[ipaddress.IPv4Address]:
    return [ipaddress.IPv4Address(0x0A000000 + 1 + i) for i in range(n)]


def _best_rate(fn: Callable[[int], None], n: int, repeats: int = 3) -> float:
    """Items per second of fn(n), best of a few runs (the machine is shared)."""
    best = float("inf")
    for _ in range(repeats):
        gc.collect()
        started = time.perf_counter()
        fn(n)
        best = min(best, time.perf_counter() - started)
    return n / best


def _our_bucket(k: int, ip: ipaddress.IPv4Address) -> of.Bucket:
    return of.Bucket(
        k,
        (of.SetField("reg3", ip), of.SetField("reg4", 8080 | (1 << 16), 0x7FFFF), RESUBMIT_DNAT),
        weight=100,
    )


def _os_ken() -> Any:
    try:
        from os_ken.ofproto import ofproto_protocol
        from os_ken.ofproto import ofproto_v1_5 as ofp
        from os_ken.ofproto import ofproto_v1_5_parser as parser
    except ImportError:  # os-ken is a bench/test extra
        return None
    return ofproto_protocol.ProtocolDesc(version=ofp.OFP_VERSION), ofp, parser


def _os_ken_bucket(osk: Any, k: int, ip: ipaddress.IPv4Address) -> Any:
    _, ofp, p = osk
    return p.OFPBucket(
        bucket_id=k,
        actions=[
            p.OFPActionSetField(reg3=int(ip)),
            p.OFPActionSetField(reg4=(8080 | (1 << 16), 0x7FFFF)),
            p.NXActionResubmitTable(table_id=60),
        ],
        properties=[p.OFPGroupBucketPropWeight(type_=ofp.OFPGBPT_WEIGHT, weight=100)],
    )


def _os_ken_group(osk: Any, group_id: int, buckets: list[Any]) -> Any:
    dp, ofp, p = osk
    return p.OFPGroupMod(
        dp, command=ofp.OFPGC_ADD, type_=ofp.OFPGT_SELECT, group_id=group_id, buckets=buckets
    )


def _os_ken_bytes(msg: Any, xid: int) -> bytes:
    msg.set_xid(xid)
    msg.serialize()
    return bytes(msg.buf)


def _dnat_flow(ip: ipaddress.IPv4Address, port: int, cookie: int) -> of.FlowMod:
    return of.FlowMod(
        60,
        200,
        of.Match(eth_type=0x0800, ip_proto=6, reg3=ip, reg4=(port, 0xFFFF)),
        (
            of.ApplyActions(
                (
                    of.CT(
                        commit=True,
                        zone=65520,
                        table=70,
                        nat=of.NAT(dst=True, ip_min=ip, port_min=port),
                        actions=(CT_MARK,),
                    ),
                )
            ),
        ),
        cookie=cookie,
    )


def _lb_flow(vip: ipaddress.IPv4Address, group_id: int, cookie: int) -> of.FlowMod:
    return of.FlowMod(
        50,
        200,
        of.Match(eth_type=0x0800, ip_proto=6, ipv4_dst=vip, tcp_dst=80),
        (of.ApplyActions((of.GroupAction(group_id),)),),
        cookie=cookie,
    )


_DNAT_TEMPLATE = templates.EndpointDnatFlows(
    60,
    200,
    0,  # the cookie varies below: the flows are the same shape as _dnat_flow's otherwise
    version=4,
    ip_proto=6,
    ip_field="reg3",
    port_field="reg4",
    zone=65520,
    ct_table=70,
    ct_actions=(CT_MARK,),
)
_LB_TEMPLATE = templates.FrontendFlows(
    50, 200, 0, version=4, ip_proto=6, ip_field="ipv4_dst", port_field="tcp_dst"
)
_SET_REG3 = templates.set_field_exact("reg3")
_BUCKET_TAIL = (of.SetField("reg4", 8080 | (1 << 16), 0x7FFFF), RESUBMIT_DNAT)


def run(quick: bool = False) -> dict[str, Any]:
    n_groups = 2_000 if quick else 20_000
    n_os_ken = 300 if quick else 2_000
    n_flows = 10_000 if quick else 100_000
    services = 1_000 if quick else 10_000
    ips = _ips(max(n_groups * ENDPOINTS, n_flows, services * ENDPOINTS))
    result: dict[str, Any] = {"buckets_per_group": ENDPOINTS}

    # -- GroupMods from per-endpoint cached buckets (the steady state) -------------------
    cached = [[_our_bucket(k, ips[g * ENDPOINTS + k]) for k in range(ENDPOINTS)] for g in range(64)]

    def ours(n: int) -> None:
        for g in range(n):
            msg = of.GroupMod(
                of.GroupModCommand.ADD, g, buckets=cached[g & 63], selection_method="dp_hash"
            )
            msg.encode(g)

    def ours_cold(n: int) -> None:
        for g in range(n):
            base = g * ENDPOINTS
            buckets = [_our_bucket(k, ips[base + k]) for k in range(ENDPOINTS)]
            of.GroupMod(
                of.GroupModCommand.ADD, g, buckets=buckets, selection_method="dp_hash"
            ).encode(g)

    result["ours_per_s"] = round(_best_rate(ours, n_groups))
    result["ours_cold_per_s"] = round(_best_rate(ours_cold, n_groups))
    sample = of.GroupMod(of.GroupModCommand.ADD, 1, buckets=cached[0])
    result["group_bytes"] = sample.length

    osk = _os_ken()
    if osk is not None:
        their_cached = [
            [_os_ken_bucket(osk, k, ips[g * ENDPOINTS + k]) for k in range(ENDPOINTS)]
            for g in range(64)
        ]

        def theirs(n: int) -> None:
            for g in range(n):
                _os_ken_bytes(_os_ken_group(osk, g, their_cached[g & 63]), g)

        def theirs_cold(n: int) -> None:
            for g in range(n):
                base = g * ENDPOINTS
                buckets = [_os_ken_bucket(osk, k, ips[base + k]) for k in range(ENDPOINTS)]
                _os_ken_bytes(_os_ken_group(osk, g, buckets), g)

        result["os_ken_per_s"] = round(_best_rate(theirs, n_os_ken))
        result["os_ken_cold_per_s"] = round(_best_rate(theirs_cold, n_os_ken))
        result["ratio"] = round(result["ours_per_s"] / result["os_ken_per_s"], 1)
        result["cold_ratio"] = round(result["ours_cold_per_s"] / result["os_ken_cold_per_s"], 1)
        # Same content, same bytes (os-ken encodes this message correctly).
        result["bytes_equal_os_ken"] = sample.encode(7) == _os_ken_bytes(
            _os_ken_group(osk, 1, their_cached[0]), 7
        )
    else:
        result["os_ken_per_s"] = None
        result["ratio"] = None

    # -- flows from scratch, encoded as bundle adds ------------------------------------------
    def dnat(n: int) -> None:
        for i in range(n):
            of.encode_bundle_add(1, _dnat_flow(ips[i], 8080, i), i)

    def service_lb(n: int) -> None:
        for i in range(n):
            of.encode_bundle_add(1, _lb_flow(ips[i], i, i), i)

    def dnat_template(n: int) -> None:
        flow = _DNAT_TEMPLATE.flow
        for i in range(n):
            of.encode_bundle_add(1, flow(ips[i]._ip, 8080), i)

    def service_lb_template(n: int) -> None:
        flow = _LB_TEMPLATE.group_flow
        for i in range(n):
            of.encode_bundle_add(1, flow(ips[i]._ip, 80, i), i)

    result["dnat_flow_per_s"] = round(_best_rate(dnat, n_flows))
    result["service_lb_flow_per_s"] = round(_best_rate(service_lb, n_flows))
    result["dnat_flow_us"] = round(1e6 / result["dnat_flow_per_s"], 2)
    result["service_lb_flow_us"] = round(1e6 / result["service_lb_flow_per_s"], 2)
    result["dnat_flow_template_us"] = round(1e6 / _best_rate(dnat_template, n_flows), 2)
    result["service_lb_flow_template_us"] = round(1e6 / _best_rate(service_lb_template, n_flows), 2)

    # -- a full sync's worth, built and encoded (what the datapath streams) -----------------
    built: list[of.Message] = []

    def full_sync(n_services: int) -> None:
        size = 0
        keep = built.append
        for s in range(n_services):
            base = s * ENDPOINTS
            buckets = [_our_bucket(k, ips[base + k]) for k in range(ENDPOINTS)]
            group = of.GroupMod(
                of.GroupModCommand.ADD, s, buckets=buckets, selection_method="dp_hash"
            )
            keep(group)
            size += len(of.encode_bundle_add(1, group, s))
            for k in range(ENDPOINTS):
                flow = _dnat_flow(ips[base + k], 8080, s)
                keep(flow)
                size += len(of.encode_bundle_add(1, flow, s))
            flow = _lb_flow(ips[s], s, s)
            keep(flow)
            size += len(of.encode_bundle_add(1, flow, s))
        result["full_sync_bytes"] = size

    # The values are kept (a datapath caches them). CPython's collector never untracks tuple
    # subclasses, so with its default thresholds it rescans the growing cache again and
    # again; measured both ways, with it paused (as a full sync should run) and not.
    messages = services * (2 + ENDPOINTS)
    gc.collect()
    started = time.perf_counter()
    full_sync(services)
    result["full_sync_build_encode_default_gc_s"] = round(time.perf_counter() - started, 3)
    built.clear()
    gc.collect()
    gc.disable()
    try:
        started = time.perf_counter()
        full_sync(services)
        elapsed = time.perf_counter() - started
    finally:
        gc.enable()
    result["full_sync_services"] = services
    result["full_sync_messages"] = messages
    result["full_sync_build_encode_s"] = round(elapsed, 3)
    result["full_sync_us_per_message"] = round(elapsed / messages * 1e6, 2)

    # The same content through the templates and the fast bucket and group constructors.
    fast: list[of.Message] = []

    def full_sync_template(n_services: int) -> None:
        keep = fast.append
        dnat_flow, lb_flow = _DNAT_TEMPLATE.flow, _LB_TEMPLATE.group_flow
        for s in range(n_services):
            base = s * ENDPOINTS
            specs = [
                (None, (_SET_REG3(ips[base + k]._ip), *_BUCKET_TAIL), 100) for k in range(ENDPOINTS)
            ]
            group = templates.group_mod(
                of.GroupModCommand.ADD,
                s,
                of.GroupType.SELECT,
                templates.numbered_buckets(specs),
                selection_method="dp_hash",
            )
            keep(group)
            of.encode_bundle_add(1, group, s)
            for k in range(ENDPOINTS):
                flow = dnat_flow(ips[base + k]._ip, 8080)
                keep(flow)
                of.encode_bundle_add(1, flow, s)
            flow = lb_flow(ips[s]._ip, 80, s)
            keep(flow)
            of.encode_bundle_add(1, flow, s)

    gc.collect()
    gc.disable()
    try:
        started = time.perf_counter()
        full_sync_template(services)
        elapsed = time.perf_counter() - started
    finally:
        gc.enable()
    fast.clear()
    result["full_sync_build_encode_template_s"] = round(elapsed, 3)

    # A replay after a reconnection: the same values, already built, encoded again.
    gc.collect()
    started = time.perf_counter()
    for xid, msg in enumerate(built):
        of.encode_bundle_add(1, msg, xid)
    elapsed = time.perf_counter() - started
    result["replay_encode_s"] = round(elapsed, 3)
    result["replay_us_per_message"] = round(elapsed / messages * 1e6, 2)
    return result
