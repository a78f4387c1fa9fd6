"""The fuzz bench itself: it finds what it is meant to find, and it is reproducible."""

from __future__ import annotations

import random
import struct

from bench.scenarios import fuzz
from ovsproxy.openflow import protocol as of


def test_a_short_fuzz_run_meets_every_goal() -> None:
    result = fuzz.fuzz(3000, seed=3)
    assert result["inputs"] == 3000
    assert result["seeds_from_ovs"] > 40  # the recorded corpus is there
    assert result["unexpected_exceptions"] == 0, result["unexpected_examples"]
    assert result["framing_mismatches"] == 0
    assert result["global_tables_changed"] == {}
    assert result["decoded_whole"] > 0  # mutations do not only produce garbage


def test_the_same_seed_gives_the_same_inputs() -> None:
    seeds = fuzz.seeds()
    first = fuzz.Mutator(random.Random(9), seeds)
    second = fuzz.Mutator(random.Random(9), seeds)
    assert [first.next() for _ in range(500)] == [second.next() for _ in range(500)]


def test_length_fields_are_found_at_every_nesting_level() -> None:
    inner = of.CT(commit=True, actions=[of.SetField("ct_mark", 1)])
    bucket = of.Bucket(0, [of.CT(commit=True, actions=[inner])])
    group = of.GroupMod(of.GroupModCommand.ADD, 1, buckets=[bucket])
    data = of.encode_bundle_add(5, group, 9)
    found = dict(fuzz.length_fields(data))
    # Outer header, inner header, buckets_len, bucket length and actions_len, the outer
    # ct, the nested ct, its set_field and the set_field's OXM length byte.
    inner_at = 16
    bucket_at = inner_at + 24
    outer_ct = bucket_at + 8
    nested_ct = outer_ct + 24
    set_field = nested_ct + 24
    for offset, width in [
        (2, 2),
        (inner_at + 2, 2),
        (inner_at + 16, 2),
        (bucket_at, 2),
        (bucket_at + 2, 2),
        (outer_ct + 2, 2),
        (nested_ct + 2, 2),
        (set_field + 2, 2),
        (set_field + 7, 1),
    ]:
        assert found.get(offset) == width, (offset, width)
    assert struct.unpack_from("!H", data, set_field)[0] == of.constants.OFPAT_SET_FIELD


def test_the_framing_oracle_stops_where_a_framer_must() -> None:
    a, b = of.encode(of.EchoRequest(b"a"), 1), of.encode(of.BarrierReply(), 2)
    assert fuzz._expected_frames(a + b + a[:5]) == [a, b]
    garbage = b[:2] + b"\x00\x03" + b[4:]
    assert fuzz._expected_frames(a + garbage + b) == [a]


def test_short_manifest_and_watch_fuzz_runs_meet_their_goals() -> None:
    from bench.scenarios import fuzz_text

    manifests = fuzz_text.fuzz_manifests(600, seed=3)
    assert manifests["unexpected_exceptions"] == 0, manifests["unexpected_examples"]
    assert manifests["problems_reported"] > 0 and manifests["valid_objects"] > 0
    watch = fuzz_text.fuzz_watch(2000, seed=3)
    assert watch["unexpected_exceptions"] == 0, watch["unexpected_examples"]
    assert watch["framing_mismatches"] == 0
    assert watch["decoded"] > 0
