"""Group planning (pure): one GroupMod per changed group, stable bucket ids, chunking."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath import service_flows as svc
from ovsproxy.datapath.flow_context import Context
from ovsproxy.datapath.groups import (
    MAX_BUNDLED_MESSAGE,
    BucketSpec,
    GroupPlan,
    GroupSpec,
    InstalledGroup,
    SelectionMethod,
    bucket_spec,
    group_mod_chunks,
    plan_group,
)
from ovsproxy.openflow import protocol as of

TABLES = pl.Tables.for_config(pl.PipelineConfig())
CTX = Context(TABLES, 1)
CMD = of.GroupModCommand


def bucket(i: int, port: int = 8080, v6: bool = False) -> BucketSpec:
    base = "fd00:10:244::" if v6 else "10.244."
    ip = ipaddress.ip_address(f"{base}{i:x}" if v6 else f"{base}{i // 250}.{i % 250 + 1}")
    return BucketSpec((ip, port), svc.endpoint_bucket_wire(ip, port, False, CTX))


def group(keys: list[int], gid: int = 7, **kw: object) -> GroupSpec:
    return GroupSpec(gid, tuple(bucket(k, **kw) for k in keys))  # type: ignore[arg-type]


def values(plan: GroupPlan) -> list[of.GroupMod]:
    """A plan's messages (its encodings) as values."""
    return [m.decoded() for m in plan.messages]


def apply_to_model(
    state: dict[int, of.Bucket] | None, messages: tuple[of.GroupMod, ...]
) -> dict[int, of.Bucket] | None:
    """What OpenFlow 1.5 says the switch holds after these group mods (ids -> buckets)."""
    for m in messages:
        if m.command == CMD.ADD:
            assert state is None, "ADD of an existing group"
            state = {b.bucket_id: b for b in m.buckets}
        elif m.command == CMD.MODIFY:
            assert state is not None
            state = {b.bucket_id: b for b in m.buckets}
        elif m.command == CMD.INSERT_BUCKET:
            assert state is not None
            for b in m.buckets:
                assert b.bucket_id not in state, "duplicate bucket id"
                state[b.bucket_id] = b
        elif m.command == CMD.REMOVE_BUCKET:
            assert state is not None and m.command_bucket_id in state
            del state[m.command_bucket_id]
        elif m.command == CMD.DELETE:
            state = None
    return state


def test_new_group_is_one_add_with_ids_in_order() -> None:
    plan = plan_group(group([1, 2, 3]), None)
    assert [m.command for m in values(plan)] == [CMD.ADD]
    assert [b.bucket_id for b in values(plan)[0].buckets] == [0, 1, 2]


def test_unchanged_group_sends_nothing() -> None:
    first = plan_group(group([1, 2, 3]), None)
    again = plan_group(group([1, 2, 3]), first.result)
    assert again.messages == () and again.kind == "none"


def test_one_added_endpoint_is_one_insert_bucket_with_only_that_bucket() -> None:
    first = plan_group(group([1, 2, 3]), None)
    plan = plan_group(group([1, 2, 3, 4]), first.result)
    assert [m.command for m in values(plan)] == [CMD.INSERT_BUCKET]
    (msg,) = values(plan)
    assert len(msg.buckets) == 1 and msg.buckets[0].bucket_id == 3
    assert msg.command_bucket_id == of.OFPG_BUCKET_LAST


def test_one_removed_endpoint_is_one_remove_bucket_by_its_id() -> None:
    first = plan_group(group([1, 2, 3]), None)
    plan = plan_group(group([1, 3]), first.result)
    assert [(m.command, m.command_bucket_id) for m in values(plan)] == [(CMD.REMOVE_BUCKET, 1)]
    assert plan.result is not None and plan.result.ids == {bucket(1).key: 0, bucket(3).key: 2}


def test_the_service_selection_method_rides_on_add_and_modify_only() -> None:
    """ADD and MODIFY carry the 5-tuple hash fields; INSERT_BUCKET and REMOVE_BUCKET carry
    no selection method (OVS refuses it there and keeps the group's own), so an endpoint
    change costs the same bytes with or without fields."""
    method = svc.GROUP_SELECTION_METHOD
    assert method.fields == svc.CONNECTION_HASH_FIELDS
    first = plan_group(GroupSpec(7, group([1, 2, 3]).buckets, method), None)
    (add,) = values(first)
    assert (add.command, add.selection_method) == (CMD.ADD, "hash")
    assert add.fields == tuple(of.get_field(f) for f in svc.CONNECTION_HASH_FIELDS)
    assert of.group_mod_length(add) == of.group_mod_overhead(*method) + sum(
        len(b.wire) for b in add.buckets
    )
    grown = plan_group(GroupSpec(7, group([1, 2, 3, 4]).buckets, method), first.result)
    (insert,) = values(grown)
    assert (insert.command, insert.selection_method, insert.fields) == (
        CMD.INSERT_BUCKET,
        None,
        (),
    )
    assert of.group_mod_length(insert) == of.group_mod_overhead() + len(insert.buckets[0].wire)
    shrunk = plan_group(GroupSpec(7, group([1, 3, 4]).buckets, method), grown.result)
    (remove,) = values(shrunk)
    assert (remove.command, of.group_mod_length(remove)) == (CMD.REMOVE_BUCKET, 24)
    # A group an older agent installed without fields is rewritten whole, ids kept.
    old = plan_group(GroupSpec(7, group([1, 2, 3]).buckets, SelectionMethod("hash")), None)
    upgraded = plan_group(GroupSpec(7, group([1, 2, 3]).buckets, method), old.result)
    (modify,) = values(upgraded)
    assert (modify.command, modify.fields, upgraded.kind) == (CMD.MODIFY, add.fields, "modify")
    assert [b.bucket_id for b in modify.buckets] == [0, 1, 2]


def test_replacing_most_endpoints_is_one_modify() -> None:
    first = plan_group(group([1, 2, 3]), None)
    plan = plan_group(group([4, 5, 6]), first.result)
    assert [m.command for m in values(plan)] == [CMD.MODIFY]


def test_one_endpoint_added_to_1000_is_an_insert_under_200_bytes() -> None:
    first = plan_group(group(list(range(1000))), None)
    assert sum(of.group_mod_length(m) for m in values(first)) > 60_000  # a full MODIFY: 64 KB
    plan = plan_group(group(list(range(1001))), first.result)
    assert [m.command for m in values(plan)] == [CMD.INSERT_BUCKET]
    assert of.group_mod_length(values(plan)[0]) < 200


def test_huge_group_is_chunked_by_encoded_size_and_keeps_order() -> None:
    plan = plan_group(group(list(range(5000)), v6=True), None)
    lengths = [of.group_mod_length(m) for m in values(plan)]
    assert all(n <= MAX_BUNDLED_MESSAGE for n in lengths)
    assert values(plan)[0].command == CMD.ADD
    assert {m.command for m in values(plan)[1:]} == {CMD.INSERT_BUCKET}
    ids = [b.bucket_id for m in values(plan) for b in m.buckets]
    assert ids == list(range(5000))
    # Chunks are full: no more messages than the byte count requires (+1 for rounding).
    assert len(plan.messages) <= sum(lengths) // MAX_BUNDLED_MESSAGE + 1


@settings(max_examples=200, deadline=None)
@given(
    before=st.lists(st.integers(0, 60), unique=True, max_size=40),
    after=st.lists(st.integers(0, 60), unique=True, max_size=40),
)
def test_plan_takes_the_switch_to_the_desired_group_with_stable_ids(
    before: list[int], after: list[int]
) -> None:
    first = plan_group(group(before), None)
    switch = apply_to_model(None, values(first))
    plan = plan_group(group(after), first.result)
    switch = apply_to_model(switch, values(plan))
    assert switch is not None and plan.result is not None
    # The switch holds exactly the desired endpoints...
    assert sorted(b.actions for b in switch.values()) == sorted(bucket(k).actions for k in after)
    # ...every surviving endpoint kept its bucket id...
    assert first.result is not None
    for key, old_id in first.result.ids.items():
        if key in plan.result.ids:
            assert plan.result.ids[key] == old_id
    # ...the cache agrees with the switch...
    assert {i: b.actions for i, b in switch.items()} == {
        plan.result.ids[k]: plan.result.buckets[k].actions for k in plan.result.ids
    }
    # ...and no plan is larger than one full MODIFY.
    full = of.group_mod_length(of.GroupMod(CMD.MODIFY, 7, buckets=list(switch.values())))
    assert sum(of.group_mod_length(m) for m in values(plan)) <= max(full, 24)


def test_unknown_present_group_is_rewritten_with_add_or_mod() -> None:
    plan = plan_group(group([1, 2]), None, present_unknown=True)
    assert [m.command for m in values(plan)] == [CMD.ADD_OR_MOD]


def test_installed_group_counts_endpoints() -> None:
    assert InstalledGroup(1).endpoint_count == 0


def _svc_bucket(i: int) -> of.Bucket:
    ip = ipaddress.ip_address(f"10.0.{i // 256}.{i % 256}")
    return of.Bucket(i, [of.SetField("reg3", ip), of.SetField("reg4", 80, 0xFFFF), of.Resubmit(42)])


def test_group_mod_chunks_keep_order_and_fit_a_bundle() -> None:
    buckets = [_svc_bucket(i) for i in range(2500)]
    assert sum(len(b.wire) for b in buckets) > 2 * 65535
    chunks = [
        c.decoded() for c in group_mod_chunks(CMD.ADD, 5, buckets, SelectionMethod("dp_hash"))
    ]
    assert len(chunks) == 3
    assert all(c.length <= MAX_BUNDLED_MESSAGE for c in chunks)
    assert chunks[0].command == CMD.ADD
    assert chunks[0].selection_method == "dp_hash"
    assert all(c.command == CMD.INSERT_BUCKET for c in chunks[1:])
    assert all(c.command_bucket_id == of.OFPG_BUCKET_LAST for c in chunks[1:])
    assert all(c.selection_method is None for c in chunks[1:])
    assert [b for c in chunks for b in c.buckets] == buckets
    # Outside a bundle the full 65,535 bytes are usable: fewer, fuller chunks.
    loose = [
        c.decoded() for c in group_mod_chunks(CMD.MODIFY, 5, buckets, limit=of.OFP_MAX_MESSAGE_LEN)
    ]
    assert all(c.length <= of.OFP_MAX_MESSAGE_LEN for c in loose)
    assert len(loose) <= len(chunks)
    assert [b for c in loose for b in c.buckets] == buckets
    small = of.GroupMod(CMD.MODIFY, 5, buckets=buckets[:3])
    assert [c.decoded() for c in group_mod_chunks(CMD.MODIFY, 5, buckets[:3])] == [small]
    huge = of.Bucket(0, [of.Controller(userdata=bytes(65460))])
    with pytest.raises(of.MessageTooLarge):
        group_mod_chunks(CMD.ADD, 5, [_svc_bucket(1), huge])


def test_a_group_written_whole_keeps_the_desired_buckets_and_sends_their_encoding() -> None:
    """Memory: the installed state of a new group is the desired tuple itself (no dict, no
    value per bucket), and its GroupMod is exactly what the generic codec encodes."""
    spec = GroupSpec(7, group([1, 2, 3]).buckets, svc.GROUP_SELECTION_METHOD)
    plan = plan_group(spec, None)
    assert plan.result is not None and plan.result.specs is spec.buckets
    (msg,) = plan.messages
    assert type(msg) is of.EncodedGroupMod
    generic = of.GroupMod(
        CMD.ADD,
        7,
        buckets=[of.Bucket(i, b.actions, b.weight) for i, b in enumerate(spec.buckets)],
        selection_method="hash",
        fields=svc.CONNECTION_HASH_FIELDS,
    )
    assert msg[0] == generic.wire
    # read back as values, by key, with ids 0..n-1
    assert plan.result.ids == {b.key: i for i, b in enumerate(spec.buckets)}
    assert plan.result.buckets == spec.by_key()
    # the same group again: nothing to send, the same installed state
    again = plan_group(GroupSpec(7, group([1, 2, 3]).buckets, spec.selection_method), plan.result)
    assert again.kind == "none" and again.result is plan.result


def test_a_repeated_endpoint_key_is_one_bucket() -> None:
    twice = GroupSpec(7, (bucket(1), bucket(2), bucket(1)))
    plan = plan_group(twice, None)
    assert [b.bucket_id for b in values(plan)[0].buckets] == [0, 1]
    assert plan.result is not None and plan.result.endpoint_count == 2


def test_bucket_specs_hold_the_encoding_and_read_back_as_values() -> None:
    ip = ipaddress.ip_address("10.244.0.9")
    actions = svc.endpoint_bucket_actions(ip, 8080, True, CTX)
    spec = BucketSpec("k", svc.endpoint_bucket_wire(ip, 8080, True, CTX))
    assert type(spec.wire) is bytes and spec.actions == actions
    assert bucket_spec("k", actions) == spec


@given(st.lists(st.lists(st.integers(0, 30), unique=True, max_size=12), min_size=1, max_size=6))
def test_a_replay_writes_what_the_switch_held_ids_and_order(steps: list[list[int]]) -> None:
    """Any history of changes, then the switch loses the group (a vswitchd restart): the
    replay writes the very buckets, ids and order it held (OVS's hash scores buckets by id
    and weight, ties to the later one: a connection picked up mid-stream meets the same
    endpoint, issue 27). The installed state keeps the switch's order throughout."""
    installed: InstalledGroup | None = None
    switch: dict[int, of.Bucket] | None = None
    for keys in steps:
        plan = plan_group(group(keys), installed)
        switch = apply_to_model(switch, tuple(values(plan)))
        installed = plan.result
        assert installed is not None and switch is not None
        assert [installed.ids[k] for k in installed.buckets] == list(switch)
    assert installed is not None and switch is not None
    replay = plan_group(group(steps[-1]), None, present_unknown=True, replay=installed)
    (message, *more) = values(replay)
    assert message.command == CMD.ADD_OR_MOD and not more
    assert [(b.bucket_id, b.weight, b.actions) for b in message.buckets] == [
        (b.bucket_id, b.weight, b.actions) for b in switch.values()
    ]
    assert replay.result is not None and replay.result.ids == installed.ids


def _web(affinity: bool, n: int) -> svc.ServiceObjects:
    from ovsproxy.model import Endpoint, IPFamily, Protocol, ServicePort, ServicePortName

    spn = ServicePortName("ns", "web", "http", Protocol.TCP)
    port = ServicePort(
        spn, (ipaddress.ip_address("10.96.0.10"),), 80, affinity_timeout=10800 if affinity else 0
    )
    eps = [Endpoint(ipaddress.ip_address(f"10.244.0.{i + 1}"), 8080) for i in range(n)]
    return svc.service_objects(CTX, port, eps, {IPFamily.IPv4: 7})


def test_an_endpoint_added_without_affinity_is_one_insert_bucket_that_translates() -> None:
    """Without affinity the bucket commits and translates (as OVN's): an added endpoint is
    one INSERT_BUCKET of that bucket (seed 003) and no flow at all."""
    before, after = _web(False, 10), _web(False, 11)
    assert after.staged == before.staged  # the ServiceLB flow only: no per-endpoint flow
    plan = plan_group(after.groups[0], plan_group(before.groups[0], None).result)
    (msg,) = values(plan)
    assert msg.command == CMD.INSERT_BUCKET and len(msg.buckets) == 1
    (ct,) = msg.buckets[0].actions
    assert isinstance(ct, of.CT) and ct.commit and ct.zone == pl.CT_ZONE_V4
    assert ct.nat is not None and (str(ct.nat.ip_min), ct.nat.port_min) == ("10.244.0.11", 8080)
    assert ct.table == TABLES.forwarding
    assert of.group_mod_length(msg) <= 104


def test_an_endpoint_added_with_affinity_keeps_registers_and_its_endpoint_dnat_flow() -> None:
    """A learned flow cannot carry ct: with affinity the bucket loads registers (the learn
    action reads them) and the EndpointDNAT flow translates."""
    before, after = _web(True, 10), _web(True, 11)
    new = set(after.flows) - set(before.flows)
    assert {f.table_id for f in new} == {TABLES.service_lb, TABLES.endpoint_dnat}
    plan = plan_group(after.groups[0], plan_group(before.groups[0], None).result)
    (msg,) = values(plan)
    assert [type(a) for a in msg.buckets[0].actions] == [of.SetField, of.SetField, of.Resubmit]


def test_groups_of_up_to_describe_safe_buckets_fit_a_group_desc_entry() -> None:
    """GROUP_DESC entries have a 16-bit length (OVS overflows it, and the dump breaks): the
    drift check and verify describe only groups of at most DESCRIBE_SAFE_BUCKETS buckets,
    which must fit whatever our buckets are (family, affinity, the longest port)."""
    from ovsproxy.datapath.our_group_ids import DESCRIBE_SAFE_BUCKETS
    from ovsproxy.openflow.protocol.templates import bucket_wire

    largest = max(
        len(
            bucket_wire(0, svc.endpoint_bucket_wire(ipaddress.ip_address(ip), 65535, aff, CTX), 100)
        )
        for ip in ("255.255.255.255", "ffff::ffff")
        for aff in (False, True)
    )
    header = of.group_mod_overhead(*svc.GROUP_SELECTION_METHOD) - 8  # a GroupMod's is 8 more
    assert header + DESCRIBE_SAFE_BUCKETS * largest <= 0xFFFF
    assert header + (DESCRIBE_SAFE_BUCKETS + 1) * largest > 0xFFFF - largest  # not too small
