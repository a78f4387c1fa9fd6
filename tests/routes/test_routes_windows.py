"""The same route manager on the Windows backend, against PowerShell transcripts.

Each transcript in ``transcripts/`` lists, in order, the exact commands the backend must run
and what PowerShell answered. The replay runner fails the test on any command that is not the
next one in the transcript, and on recorded commands left unrun.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from ovsproxy.model import IPFamily
from ovsproxy.routes import RouteManager
from ovsproxy.routes.backend import (
    KernelRoute,
    RouteAbsentError,
    RouteBackendError,
    RouteExistsError,
)
from ovsproxy.routes.powershell import (
    PowerShellResult,
    RecordingPowerShell,
    ReplayPowerShell,
    TranscriptEntry,
    UnexpectedCommand,
)
from ovsproxy.routes.windows import ROUTE_METRIC, WindowsRouteBackend, quote
from ovsproxy.servicecidr import ServiceCIDRDiscoverer

TRANSCRIPTS = Path(__file__).parent / "transcripts"
GW = "antrea-gw0"
SEED = ["10.96.0.1", "10.96.0.10", "10.96.1.70", "10.96.10.217"]
net = ipaddress.ip_network


class Replay:
    """A manager on a replayed transcript; checks the transcript was followed exactly."""

    def __init__(self, name: str) -> None:
        self.runner = ReplayPowerShell.from_file(TRANSCRIPTS / f"{name}.json")
        self.manager = RouteManager(WindowsRouteBackend(self.runner), GW, sync_interval=None)

    def commands(self, verb: str) -> list[str]:
        return [c for c in self.runner.ran if c.startswith(verb)]


@pytest.fixture
def replay() -> Iterator[type[Replay]]:
    made: list[Replay] = []

    def factory(name: str) -> Replay:
        r = Replay(name)
        made.append(r)
        return r

    yield factory  # type: ignore[misc]
    for r in made:
        r.runner.assert_complete()


async def test_seed_per_ip_routes_in_both_spellings_are_all_kept(replay) -> None:
    r = replay("seed_per_ip_routes_both_spellings")
    async with r.manager as m:
        changes = await m.reconcile(
            ["10.96.0.1", "10.96.0.10/32", ipaddress.ip_address("10.96.1.70"), "10.96.10.217/32"]
        )
    assert changes.deleted == ()
    assert set(changes.kept) == {net(ip) for ip in SEED}
    assert r.commands("Remove-") == []
    assert r.commands("New-") == []


async def test_restart_with_the_aggregated_route_present_runs_no_mutation(replay) -> None:
    r = replay("restart_aggregated_route_present")
    d = ServiceCIDRDiscoverer()
    d.add_cluster_ips(f"{ip}/32" if i % 2 else ip for i, ip in enumerate(SEED))
    d.cluster_ips_synced()
    async with r.manager as m:
        changes = await m.reconcile(d.desired)
    assert changes.kept == (net("10.96.0.0/20"),)
    assert m.mutations == 0
    assert r.commands("Remove-") == r.commands("New-") == []


async def test_leftovers_removed_after_the_new_route_and_foreign_kept(replay) -> None:
    r = replay("leftovers_removed_foreign_kept")
    d = ServiceCIDRDiscoverer()
    d.add_cluster_ips(SEED)
    d.cluster_ips_synced()
    async with r.manager as m:
        changes = await m.reconcile(d.desired)
    assert changes.added == (net("10.96.0.0/20"),)
    assert set(changes.deleted) == {
        *(net(ip) for ip in SEED),
        net("10.96.5.0/24"),
        net("10.0.0.0/8"),
        net("192.168.100.0/24"),
    }
    removes = r.commands("Remove-NetRoute")
    assert all(f"-RouteMetric {ROUTE_METRIC}" in c for c in removes)
    assert not any("10.96.7.0/24" in c or "172.16.0.0/16" in c for c in removes)  # foreign
    # make-before-break: the new route precedes every removal
    ran = r.runner.ran
    new_route = ran.index(
        next(c for c in ran if "New-NetRoute -DestinationPrefix '10.96.0.0/20'" in c)
    )
    assert all(ran.index(c) > new_route for c in removes)
    # the virtual next hop was created: a permanent neighbour and an on-link host route
    assert len(r.commands("New-NetNeighbor")) == 1
    assert any(
        "'169.254.0.253/32'" in c and "-NextHop '0.0.0.0'" in c for c in r.commands("New-NetRoute")
    )


async def test_growth_sequence_is_make_before_break(replay) -> None:
    r = replay("growth_make_before_break")
    d = ServiceCIDRDiscoverer()
    d.cluster_ips_synced()
    async with r.manager as m:
        await m.reconcile(d.desired)
        for ip in ["10.10.0.1", "10.10.0.2", "10.10.0.5", "10.10.0.4"]:
            for change in d.add_cluster_ip(ip):
                await m.apply(change)
    mutations = [
        c.split(" -InterfaceAlias")[0]
        for c in r.runner.ran
        if c.startswith(("New-NetRoute", "Remove-NetRoute"))
    ]
    assert mutations == [
        "New-NetRoute -DestinationPrefix '169.254.0.253/32'",
        "New-NetRoute -DestinationPrefix '10.10.0.1/32'",
        "New-NetRoute -DestinationPrefix '10.10.0.0/30'",
        "Remove-NetRoute -DestinationPrefix '10.10.0.1/32'",
        "New-NetRoute -DestinationPrefix '10.10.0.0/29'",
        "Remove-NetRoute -DestinationPrefix '10.10.0.0/30'",
    ]


async def test_ipv6_leftovers_removed_and_dynamic_neighbour_made_permanent(replay) -> None:
    r = replay("ipv6_leftovers_removed_foreign_kept")
    d = ServiceCIDRDiscoverer()
    d.add_cluster_ips(["fd00:10:96::1", "fd00:10:96::a/128", "fd00:10:96::146", "FD00:10:96::A:D9"])
    d.cluster_ips_synced()
    async with r.manager as m:
        changes = await m.reconcile(d.desired)
    assert changes.added == (net("fd00:10:96::/108"),)
    assert set(changes.deleted) == {
        net("fd00:10:96::1/128"),
        net("fd00:10:96::500/120"),
        net("fd00::/16"),
    }
    assert len(r.commands("Remove-NetNeighbor")) == 1  # the Reachable entry with another MAC
    assert len(r.commands("New-NetNeighbor")) == 1
    assert not any(
        "fd00:10:96::700/120" in c or "fd00:aaaa::/64" in c for c in r.commands("Remove-")
    )


async def test_sync_readds_a_removed_route_and_an_absent_remove_is_fine(replay) -> None:
    r = replay("sync_readds_and_absent_remove")
    async with r.manager as m:
        await m.reconcile(["10.96.0.0/16"])
        # the route was removed by hand between these two steps (see the transcript)
        synced = await m.sync()
        assert synced.added == (net("10.96.0.0/16"),)
        grown = await m.ensure("10.96.0.0/12")
    assert grown.added == (net("10.96.0.0/12"),)
    assert grown.deleted == (net("10.96.0.0/16"),)  # absent already: the goal is reached
    assert grown.errors == ()
    assert m.count("delete", "absent") == 1


async def test_a_failed_new_route_removes_nothing(replay) -> None:
    r = replay("failed_add_keeps_narrower")
    async with r.manager as m:
        await m.reconcile(["10.96.0.0/16"])
        changes = await m.ensure("10.96.0.0/12")
    assert changes.errors and "Access is denied" in changes.errors[0]
    assert changes.skipped_deletes == (net("10.96.0.0/16"),)
    assert r.commands("Remove-") == []


# -- the replay runner itself -------------------------------------------------------------


async def test_replay_fails_on_an_unexpected_command() -> None:
    runner = ReplayPowerShell([TranscriptEntry("Get-Thing", "[]")])
    with pytest.raises(UnexpectedCommand, match="expected: Get-Thing"):
        await runner.run("Remove-Thing")
    with pytest.raises(UnexpectedCommand):
        runner.assert_complete()  # the mismatch is remembered even if someone caught it


async def test_replay_fails_on_leftover_and_extra_commands() -> None:
    runner = ReplayPowerShell([{"command": "A", "stdout": [1]}, {"command": "B"}])
    assert (await runner.run("A")).stdout == "[1]"  # inline JSON values are serialised
    with pytest.raises(UnexpectedCommand, match="never run"):
        runner.assert_complete()
    await runner.run("B")
    runner.assert_complete()
    with pytest.raises(UnexpectedCommand, match="after the end"):
        await runner.run("C")


async def test_a_manager_swallowing_errors_still_fails_the_transcript() -> None:
    """Backend errors become logged results in the manager; the runner must still catch a
    wrong command sequence at the end."""
    runner = ReplayPowerShell([TranscriptEntry("Get-Something-Else", "[]")])
    async with RouteManager(WindowsRouteBackend(runner), GW, sync_interval=None) as m:
        changes = await m.reconcile(["10.96.0.0/16"])
    assert changes.errors
    with pytest.raises(UnexpectedCommand):
        runner.assert_complete()


async def test_recording_runner_round_trips(tmp_path: Path) -> None:
    inner = ReplayPowerShell([TranscriptEntry("X", '{"a":1}'), TranscriptEntry("Y", "", 1, "boom")])
    recorder = RecordingPowerShell(inner)
    await recorder.run("X")
    await recorder.run("Y")
    recorder.save(tmp_path / "t.json", "demo")
    again = ReplayPowerShell.from_file(tmp_path / "t.json")
    assert (await again.run("X")).stdout == '{"a":1}'
    result = await again.run("Y")
    assert (result.exit_code, result.stderr) == (1, "boom")
    again.assert_complete()
    assert json.loads((tmp_path / "t.json").read_text())["description"] == "demo"


# -- the backend's parsing and guard rails --------------------------------------------------


class Scripted:
    def __init__(self, *results: PowerShellResult) -> None:
        self.results = list(results)
        self.ran: list[str] = []

    async def run(self, command: str) -> PowerShellResult:
        self.ran.append(command)
        return self.results.pop(0)


async def test_single_object_and_empty_json_answers() -> None:
    one = '{"DestinationPrefix":"10.96.0.0/16","NextHop":"169.254.0.253","RouteMetric":155}'
    backend = WindowsRouteBackend(Scripted(PowerShellResult(one), PowerShellResult("")))
    assert await backend.list_routes(GW, IPFamily.IPv4) == [
        KernelRoute(
            net("10.96.0.0/16"), ipaddress.ip_address("169.254.0.253"), True, "metric 155", 155
        )
    ]
    assert await backend.list_routes(GW, IPFamily.IPv4) == []
    bad = WindowsRouteBackend(Scripted(PowerShellResult("WARNING: not json")))
    with pytest.raises(RouteBackendError, match="did not answer JSON"):
        await bad.list_routes(GW, IPFamily.IPv4)


@pytest.mark.parametrize(
    ("stderr", "error"),
    [
        ("New-NetRoute : Instance MSFT_NetRoute already exists", RouteExistsError),
        ("Remove-NetRoute : No matching MSFT_NetRoute objects found", RouteAbsentError),
        ("Something else broke", RouteBackendError),
    ],
)
async def test_error_mapping(stderr: str, error: type[Exception]) -> None:
    backend = WindowsRouteBackend(Scripted(PowerShellResult("", 1, stderr)))
    with pytest.raises(error):
        await backend.add_route(GW, net("10.96.0.0/16"))


async def test_refuses_foreign_routes_and_unsafe_aliases() -> None:
    backend = WindowsRouteBackend(Scripted())
    foreign = KernelRoute(net("10.96.0.0/16"), ipaddress.ip_address("169.254.0.253"), False)
    with pytest.raises(RouteBackendError, match="not ours"):
        await backend.delete_route(GW, foreign)
    with pytest.raises(ValueError, match="unsafe"):
        backend.cmd_list_routes("gw0'; Remove-Item C:\\ -Recurse; '\n", IPFamily.IPv4)
    assert quote("vEthernet (it's)") == "'vEthernet (it''s)'"


def test_quote_doubles_typographic_quotes_too() -> None:
    assert quote("a\u2019b") == "'a\u2019\u2019b'"
