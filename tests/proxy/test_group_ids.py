"""GroupIDs (pure): a port gets exactly the group keys it asks for; kept keys keep their ids,
new ones take the lowest ids nobody holds, in the order asked; a fresh allocator numbers from
the first id (what a restarted agent's full sync hands out); running out changes nothing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ovsproxy.model import IPFamily, Protocol, ServicePortName
from ovsproxy.proxy.group_ids import CLUSTER_IPS, EXTERNAL, IN_CLUSTER, ROLES, GroupIDs, GroupKey

FIRST, LAST = 5, 14  # (few: running out is tried too)
NAMES = [ServicePortName("ns", f"svc-{i}", "", Protocol.TCP) for i in range(4)]
ALL_KEYS: list[GroupKey] = [(f, role) for f in IPFamily for role in ROLES]

# One step: a port asks for a subset of the keys (in key order), or is released (None).
steps = st.lists(
    st.tuples(
        st.sampled_from(NAMES),
        st.none() | st.lists(st.sampled_from(ALL_KEYS), unique=True).map(sorted),
    ),
    max_size=30,
)


def _held(groups: GroupIDs, but: ServicePortName | None = None) -> set[int]:
    return {gid for n, ids in groups.assigned().items() if n != but for gid in ids.values()}


@given(steps)
def test_assign_keeps_what_stays_and_gives_the_lowest_free_ids(program) -> None:
    groups = GroupIDs(FIRST, LAST)
    for name, wanted in program:
        before = groups.assigned().get(name, {})
        if wanted is None:
            groups.release(name)
            assert name not in groups.assigned()
            continue
        others = _held(groups, but=name)
        capacity = LAST - FIRST + 1 - len(others)
        if len(wanted) > capacity:
            with pytest.raises(RuntimeError, match="used up"):
                groups.assign(name, wanted)
            assert groups.assigned().get(name, {}) == before  # nothing changed
            continue
        ids = groups.assign(name, wanted)
        assert list(ids) == wanted
        assert all(ids[key] == before[key] for key in wanted if key in before)
        new = [ids[key] for key in wanted if key not in before]
        kept = {ids[key] for key in wanted if key in before}
        free = (gid for gid in range(FIRST, LAST + 1) if gid not in others | kept)
        assert new == [next(free) for _ in new]  # the lowest free ones, in the order asked
        held = [gid for ids in groups.assigned().values() for gid in ids.values()]
        assert len(held) == len(set(held)) and all(FIRST <= gid <= LAST for gid in held)


def test_a_fresh_allocator_numbers_ports_in_the_order_they_are_assigned() -> None:
    """A restarted agent's first sync assigns every port from an empty allocator: the same
    ports in the same order get the same ids as the agent before it gave them from start."""
    v4, v6 = IPFamily.IPv4, IPFamily.IPv6
    wanted = {
        NAMES[0]: [(v4, CLUSTER_IPS)],
        NAMES[1]: [(v4, CLUSTER_IPS), (v4, IN_CLUSTER), (v4, EXTERNAL)],
        NAMES[2]: [(v4, CLUSTER_IPS), (v6, CLUSTER_IPS)],
    }
    groups = GroupIDs(FIRST, LAST)
    ids = {name: groups.assign(name, keys) for name, keys in wanted.items()}
    assert [gid for each in ids.values() for gid in each.values()] == list(range(FIRST, FIRST + 6))
    assert groups.ids_of(NAMES[1], EXTERNAL) == {v4: FIRST + 3}
    assert groups.ids_of(NAMES[2]) == {v4: FIRST + 4, v6: FIRST + 5}


def test_a_port_changing_shape_frees_its_unwanted_ids_before_taking_new_ones() -> None:
    v4, v6 = IPFamily.IPv4, IPFamily.IPv6
    groups = GroupIDs(FIRST, LAST)
    groups.assign(NAMES[0], [(v4, CLUSTER_IPS), (v6, CLUSTER_IPS)])  # FIRST, FIRST + 1
    groups.assign(NAMES[1], [(v4, CLUSTER_IPS)])  # FIRST + 2
    # v6 dropped, an external group wanted: it takes the id the v6 group gave back
    ids = groups.assign(NAMES[0], [(v4, CLUSTER_IPS), (v4, EXTERNAL)])
    assert ids == {(v4, CLUSTER_IPS): FIRST, (v4, EXTERNAL): FIRST + 1}
    assert groups.assign(NAMES[0], []) == {}
    assert groups.assign(NAMES[3], [(v4, CLUSTER_IPS)]) == {(v4, CLUSTER_IPS): FIRST}
