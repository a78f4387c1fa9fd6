"""diagnostics.compare: the desired state of a fresh agent against a switch's, pure.

Both sides are built by a real ``SwitchSync`` over a ``RecordingSwitch``: the "installed" one
plays a running agent (another generation, other group ids, endpoints added one by one so
its bucket ids are not 0..n-1), the desired one a fresh agent."""

from __future__ import annotations

import asyncio
import ipaddress

from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath import service_flows as svc
from ovsproxy.datapath.fixed_flows import pipeline_flows
from ovsproxy.datapath.flow_context import Context
from ovsproxy.datapath.switch_sync import SwitchSync
from ovsproxy.diagnostics import compare
from ovsproxy.model import Endpoint, IPFamily, Protocol, ServicePort, ServicePortName
from ovsproxy.openflow import protocol as of

CONFIG = pl.PipelineConfig()


def port(name: str, ip: str) -> ServicePort:
    return ServicePort(
        ServicePortName("ns", name, "http", Protocol.TCP), (ipaddress.ip_address(ip),), 80
    )


def eps(*last: int) -> list[Endpoint]:
    return [Endpoint(ipaddress.ip_address(f"10.244.0.{n}"), 8080) for n in last]


WEB, API = port("web", "10.96.0.10"), port("api", "10.96.0.20")


def build(
    generation: int, services: list[tuple[ServicePort, list[Endpoint], int]]
) -> tuple[dict[bytes, of.FlowMod], dict[int, compare.GroupView]]:
    """Commit the Services one by one (each endpoint list grown one at a time)."""

    async def run() -> SwitchSync:
        dp = SwitchSync(compare.RecordingSwitch(), CONFIG, generation)
        ctx = Context(tables=dp.tables, generation=generation)
        dp.stage(("pipeline",), (), pipeline_flows(ctx))
        for sp, endpoints, gid in services:
            for n in range(1, len(endpoints) + 1):
                objects = svc.service_objects(ctx, sp, endpoints[:n], {IPFamily.IPv4: gid})
                dp.stage(sp.name, objects.groups, objects.flows)
                await dp.commit()
        return dp

    dp = asyncio.run(run())
    groups = {gid: compare.desired_group_view(g) for gid, g in dp.installed_groups.items()}
    return dict(dp.installed_flows), groups


def diff(desired: tuple, installed: tuple) -> list[str]:
    return [str(d) for d in compare.compare_switch(*desired, *installed)]


def test_same_input_other_generation_and_group_ids_is_clean() -> None:
    desired = build(1, [(WEB, eps(11, 12, 13), 1), (API, eps(14), 2)])
    installed = build(7, [(API, eps(14), 5), (WEB, eps(13, 11, 12), 9)])
    assert diff(desired, installed) == []
    # ...and the generation is reported separately, against what OVSDB records.
    (gen,) = compare.generation_differences(installed[0], 6)
    assert gen.kind == "differs" and "cookie generation 7; OVSDB records generation 6" in gen.detail
    assert compare.generation_differences(installed[0], 7) == []


def test_missing_flow_is_named_and_its_group_still_matched() -> None:
    desired = build(1, [(WEB, eps(11, 12), 1)])
    flows, groups = build(3, [(WEB, eps(11, 12), 4)])
    lb = next(k for k, f in flows.items() if f.table_id == 13 and "group:4" in of.format_flow(f))
    del flows[lb]
    (line,) = diff(desired, (flows, groups))
    # The missing ServiceLB flow is shown with the group the switch has (4), not the fresh 1.
    assert line.startswith("missing flow: cookie=0x5e71000102000000, table=13, priority=190,")
    assert "nw_dst=10.96.0.10" in line and line.endswith("actions=group:4")


def test_changed_bucket_and_extra_bucket_are_shown_per_bucket() -> None:
    desired = build(1, [(WEB, eps(11, 12), 1)])
    installed = build(2, [(WEB, eps(11, 99), 3)])
    lines = diff(desired, installed)
    group = next(line for line in lines if line.startswith("differs group: group_id=3,"))
    # The buckets translate (no affinity): the endpoint is named in each bucket's DNAT.
    assert "bucket missing: weight:100,actions=ct(commit,table=20,zone=65520," in group
    assert "nat(dst=10.244.0.12:8080)" in group.split("bucket missing:")[1]
    assert "nat(dst=10.244.0.99:8080)" in group.split("bucket unexpected:")[1]
    # and only there: no EndpointDNAT flow to differ
    others = [line for line in lines if not line.startswith("differs group:")]
    assert not any("10.244.0.12" in line or "10.244.0.99" in line for line in others)


def test_unexpected_and_missing_groups_and_a_changed_action() -> None:
    desired = build(1, [(WEB, eps(11), 1)])
    flows, groups = build(2, [(WEB, eps(11), 1), (API, eps(14), 2)])
    lines = diff(desired, (flows, groups))
    assert "unexpected group: group_id=2,type=select,selection_method=hash," in "\n".join(lines)
    del groups[1]
    lines = diff(desired, (flows, groups))
    assert any(line.startswith("missing group: group_id=1,") for line in lines)
    # A flow whose actions were changed by hand: "differs", with both action lists.
    flows, groups = build(2, [(WEB, eps(11), 1)])
    key = next(
        k for k, f in flows.items() if f.table_id == 13 and "10.96.0.10" in of.format_flow(f)
    )
    flows[key] = flows[key].replace(instructions=(of.ApplyActions(()),))
    (line,) = diff(desired, (flows, groups))
    assert line.startswith("differs flow: ") and "actions=drop, wanted actions=group:1" in line


def test_group_too_large_to_dump_compares_its_bucket_count() -> None:
    desired = build(1, [(WEB, eps(11, 12, 13), 1)])
    flows, _ = build(2, [(WEB, eps(11, 12, 13), 1)])
    same = {1: compare.undescribed_group_view(1, 3)}
    assert diff(desired, (flows, same)) == []
    fewer = {1: compare.undescribed_group_view(1, 2)}
    (line,) = diff(desired, (flows, fewer))
    assert "too large to dump" in line and "2 buckets, wanted 3" in line


def test_recording_switch_keeps_each_committed_bundle_when_asked() -> None:
    from tests.fakes.switch import FakeSwitch

    async def commit(switch: object) -> None:
        dp = SwitchSync(switch, CONFIG, 1)  # type: ignore[arg-type]
        ctx = Context(tables=dp.tables, generation=1)
        for sp, gid in ((WEB, 1), (API, 2)):
            objects = svc.service_objects(ctx, sp, eps(1, 2), {IPFamily.IPv4: gid})
            dp.stage(sp.name, objects.groups, objects.flows)
            await dp.commit()

    kept, fake, plain = compare.RecordingSwitch(keep=True), FakeSwitch(), compare.RecordingSwitch()
    for switch in (kept, fake, plain):
        asyncio.run(commit(switch))
    assert len(kept.bundles) == 2
    assert [[m.encode(0) for m in b] for b in kept.bundles] == [
        [m.encode(0) for m in b] for b in fake.bundles
    ]
    assert plain.bundles == [] and plain.messages == kept.messages == sum(map(len, kept.bundles))
