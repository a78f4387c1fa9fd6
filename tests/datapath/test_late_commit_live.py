"""A commit the agent gave up on, committed late by a busy ovs-vswitchd (antrea#8190's
failure class), against a real switch.

ovs-vswitchd is stopped (SIGSTOP) the moment our COMMIT is queued, before it can read it;
our commit times out; then it is resumed (SIGCONT) and applies the bundle after the agent
has called it failed. The switch's state is then unknown to the agent: whatever it commits
next must leave the switch holding exactly the desired state, with no refused message (a
GROUP_EXISTS or UNKNOWN_GROUP loop) and nothing left behind or missing.

The only seam is the moment: the session's queueing of a bundle's COMMIT is wrapped to stop
the switch then (tests/README.md). Switch, bundle and timeout are real.
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import pytest

from ovsproxy.openflow import protocol as of
from ovsproxy.openflow.errors import RequestTimeout
from ovsproxy.ovs.sandbox import Sandbox
from tests.datapath.test_switch_sync_live import Rig, eps, make_rig

pytestmark = [pytest.mark.ovs, pytest.mark.shared_sandbox]

# Our commit gives up after this long; the switch is stopped for all of it.
COMMIT_TIMEOUT = 0.5


@pytest.fixture
async def rig(sandbox: Sandbox) -> AsyncIterator[Rig]:
    r = await make_rig(sandbox)
    yield r
    await r.channel.close()


@contextmanager
def switch_stopped_at_commit(rig: Rig) -> Iterator[list[int]]:
    """Stop ovs-vswitchd as our next bundle COMMIT is queued (it has not read it yet), and
    resume it on leaving: it then commits that bundle, after our commit gave up on it."""
    assert rig.sandbox.record is not None
    pid = rig.sandbox.record.pids["ovs-vswitchd"]
    conn = rig.channel._conn
    assert conn is not None
    session = conn.session
    queue = session._control
    stopped: list[int] = []

    def control(bundle: object, ctrl: of.BundleCtrlType) -> int:
        if ctrl is of.BundleCtrlType.COMMIT_REQUEST and not stopped:
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
        return queue(bundle, ctrl)  # type: ignore[arg-type]

    session._control = control  # type: ignore[method-assign]
    timeout = rig.channel.bundle_timeout
    rig.channel.bundle_timeout = COMMIT_TIMEOUT
    try:
        yield stopped
    finally:
        del session._control
        rig.channel.bundle_timeout = timeout
        if stopped:
            os.kill(pid, signal.SIGCONT)


async def commit_late(rig: Rig) -> None:
    """Commit what is staged; the switch applies it only after our commit timed out."""
    with switch_stopped_at_commit(rig) as stopped:
        with pytest.raises(Exception) as failed:
            await rig.datapath.commit()
        assert stopped, "the commit never reached the switch"
        assert isinstance(failed.value.__cause__, RequestTimeout), failed.value
    await rig.channel.barrier()  # the switch has applied the late bundle now


def ours(rig: Rig) -> tuple[list[str], list[str]]:
    """The switch's groups and the flows of the Service's address (the dumps)."""
    return rig.groups(), [f for f in rig.flows() if "10.96.0.10" in f]


async def test_a_group_deleted_by_a_late_commit_is_there_once_it_is_wanted_again(rig: Rig) -> None:
    """The Service goes (its group and flows deleted), the switch applies that late, and the
    Service comes back as it was: today's agent believed the switch still held it and sent
    nothing, so the Service stayed missing from the switch."""
    rig.stage_service("web", "10.96.0.10", eps(3), gid=1)
    await rig.datapath.commit()
    groups, flows = ours(rig)
    assert len(groups) == 1 and flows

    rig.datapath.unstage(rig.stage_service("web", "10.96.0.10", eps(3), gid=1))
    await commit_late(rig)
    assert ours(rig) == ([], []), "the late commit deleted the Service on the switch"

    rig.stage_service("web", "10.96.0.10", eps(3), gid=1)
    await rig.datapath.commit()
    assert ours(rig) == (groups, flows)
    # ...and a change after it is a plain incremental one, accepted.
    rig.stage_service("web", "10.96.0.10", eps(4), gid=1)
    await rig.datapath.commit()
    (group,) = rig.groups()
    assert group.count("bucket=") == 4


async def test_a_group_changed_by_a_late_commit_is_rewritten_not_added(rig: Rig) -> None:
    """A new Service's group is added by a bundle the switch commits late: the next commit
    (its endpoints changed) must not ADD it again (GROUP_EXISTS, antrea#8190)."""
    rig.stage_service("web", "10.96.0.10", eps(3), gid=1)
    await commit_late(rig)
    assert len(rig.groups()) == 1, "the late commit added the group"

    rig.stage_service("web", "10.96.0.10", eps(2), gid=1)
    await rig.datapath.commit()
    (group,) = rig.groups()
    assert group.count("bucket=") == 2


async def test_flows_added_by_a_late_commit_are_deleted_once_unwanted(rig: Rig) -> None:
    """A Service is added by a bundle the switch commits late, then removed before the agent
    commits again: the switch must not keep its flows (a ClusterIP still served) or group."""
    await rig.datapath.commit()  # the pipeline's own flows
    before = rig.flows()
    spn = rig.stage_service("web", "10.96.0.10", eps(3), gid=1)
    await commit_late(rig)
    groups, flows = ours(rig)
    assert groups and flows, "the late commit added the Service"

    rig.datapath.unstage(spn)
    await rig.datapath.commit()
    assert rig.groups() == [] and rig.flows() == before
    assert rig.datapath.installed_groups == {}
