"""Group ids kept in OVSDB: compact ranges, and a live round trip through a real ovsdb-server."""

from __future__ import annotations

import asyncio
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ovsproxy.ovs.ovsdb import (
    GENERATION_KEY,
    GROUP_IDS_KEY,
    MAX_RECORDED_GROUP_IDS,
    OVSDB,
    OVSDBGroupRegistry,
    decode_id_ranges,
    encode_id_ranges,
)
from ovsproxy.ovs.sandbox import Sandbox


@given(st.sets(st.integers(1, 5000), max_size=300))
def test_ranges_round_trip(ids: set[int]) -> None:
    text = encode_id_ranges(ids)
    assert decode_id_ranges(text) == ids
    assert len(text.split(",")) <= len(ids) or not ids


def test_ranges_are_compact() -> None:
    assert encode_id_ranges(range(1, 10001)) == "1-10000"
    assert encode_id_ranges({7, 1, 2, 3, 9}) == "1-3,7,9"
    with pytest.raises(ValueError):
        decode_id_ranges("5-3")


@pytest.mark.parametrize(
    "record",
    [
        "1-4000000000",
        "1-4294967295",
        f"1-{MAX_RECORDED_GROUP_IDS + 1}",
        "1-10," * 200_000,
        "x",
        "-5",
        "1-",
        "9" * 5000,
    ],
)
def test_a_bad_record_is_refused_before_any_id_is_made(record: str) -> None:
    """Issue 35: "1-4000000000" made four billion ints (out of memory)."""
    started = time.process_time()
    with pytest.raises(ValueError):
        decode_id_ranges(record)
    assert time.process_time() - started < 1


@pytest.mark.ovs
async def test_a_hostile_record_in_the_bridge_is_reported_not_fatal(sandbox: Sandbox) -> None:
    sandbox.vsctl("set", "bridge", "br0", f'external_ids:{GROUP_IDS_KEY}="1-4000000000"')
    with sandbox.ovsdb_client() as db:
        registry = OVSDBGroupRegistry(db, "br0")
        assert await registry.load() is None  # no record: the synchroniser lists the switch
        assert registry.status()["last_error"] == (
            f"external_ids:{GROUP_IDS_KEY} unreadable: more than 1,048,576 ids (at '1-4000000000')"
        )
        await registry.save({1, 2})  # and the next save replaces it
    assert f'{GROUP_IDS_KEY}="1-2"' in sandbox.vsctl("get", "bridge", "br0", "external_ids")


@pytest.mark.ovs
async def test_registry_survives_in_the_bridge(sandbox: Sandbox) -> None:
    with sandbox.ovsdb_client() as db:
        registry = OVSDBGroupRegistry(db, "br0")
        assert await registry.load() is None  # never saved: the caller must list
        await registry.save({1, 2, 3, 10})
    with sandbox.ovsdb_client() as db:  # a new agent, a new connection
        assert await OVSDBGroupRegistry(db, "br0").load() == {1, 2, 3, 10}
    assert f'{GROUP_IDS_KEY}="1-3,10"' in sandbox.vsctl("get", "bridge", "br0", "external_ids")


def set_generation(db: OVSDB, value: str) -> None:
    db.api.db_set("Bridge", "br0", ("external_ids", {GENERATION_KEY: value})).execute(
        check_error=True
    )


@pytest.mark.ovs
def test_cookie_generation_counts_up_on_the_bridge_and_wraps(sandbox: Sandbox) -> None:
    with sandbox.ovsdb_client() as db:
        first = db.next_generation("br0")
        assert db.next_generation("br0") == first + 1
        # (through the same connection: its cache sees the write before the next read)
        set_generation(db, "65535")
        assert db.next_generation("br0") == 1  # 1..65535: never 0
        set_generation(db, "garbage")
        assert db.next_generation("br0") == 1
    assert f'{GENERATION_KEY}="1"' in sandbox.vsctl("get", "bridge", "br0", "external_ids")


@pytest.mark.ovs
async def test_registry_save_while_ovsdb_server_is_away_is_kept_and_written_after(
    sandbox: Sandbox,
) -> None:
    """A save never fails nor waits for a missing ovsdb-server: the ids are kept (and loaded
    back by this agent) and written once it answers again; the newest ids win."""
    with sandbox.ovsdb_client() as db:
        registry = OVSDBGroupRegistry(db, "br0", retry_initial=0.05, retry_max=0.2)
        await registry.save({1, 2})
        assert db.connected and registry.status()["saved"]
        await asyncio.to_thread(sandbox.stop_ovsdb_server)
        for _ in range(100):  # the IDL notices the closed socket at once
            if not db.connected:
                break
            await asyncio.sleep(0.02)
        started = time.monotonic()
        await registry.save({1, 2, 3})
        await registry.save({1, 2, 3, 4})
        assert time.monotonic() - started < 1  # not OVSDB's 10 s transaction timeout
        assert registry.status()["saved"] is False
        assert await registry.load() == {1, 2, 3, 4}  # what this agent installed meanwhile
        await asyncio.to_thread(sandbox.start_ovsdb_server)
        for _ in range(200):
            if registry.status()["saved"]:
                break
            await asyncio.sleep(0.05)
        assert registry.status()["saved"], registry.status()
        await registry.close()
    with sandbox.ovsdb_client() as db:
        assert await OVSDBGroupRegistry(db, "br0").load() == {1, 2, 3, 4}
