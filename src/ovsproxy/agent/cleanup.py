"""Removing everything of ours from a node: ``ovsproxy cleanup`` (one shot: no Kubernetes API,
no sync, safe to repeat) and ``ovsproxy run --cleanup`` (on exit) run the same steps, except
that ``--cleanup`` leaves the virtual next hop (its host route and neighbour entries) for a
later agent, as it always did.

Ours, told by construction (nothing else is touched):

* the switch: every flow whose cookie carries our app bits (``pipeline.COOKIE_APP``: every
  generation, learned affinity flows too), every group in our id range that the switch lists
  or the group-id registry records, the reject meter (``pipeline.REJECT_METER_ID``), and the
  keys agents write to the bridge's external_ids (``ovs.ovsdb.AGENT_KEYS``)
  (``remove_switch_state``);
* the node's routes: the Service routes (our route protocol on the gateway,
  ``RouteManager.uninstall``), our on-link host routes on the gateway (the virtual next hop's,
  a host-SNAT address's),
  and, in standalone mode, every permanent neighbour entry on the gateway that resolves to the
  virtual MAC (the next hop's and a host-SNAT address's) (``remove_routes``);
* node-side steering: the ``inet ovsproxy`` nftables table, the fwmark rule and the routes of
  our table (``remove_steering``).

Left on purpose (``deliberately_left``, printed by the command and listed in the docs): the
bridge, its ports and the gateway device (the CNI's or the operator's), conntrack entries
(they expire with their connections), in standalone mode the gateway's rp_filter as the agent
left it (loosened where strict), and in integrated mode the neighbour entries to the virtual
MAC (a CNI makes the same ones: Antrea uses the same address and MAC).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from ovsproxy.agent.wiring import build_route_backend, route_backend_name
from ovsproxy.config import AgentConfig, ConfigError
from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath.reject import Rejector
from ovsproxy.datapath.switch_sync import SwitchSync
from ovsproxy.model import IPFamily
from ovsproxy.openflow.connection import Channel
from ovsproxy.ovs.ovsdb import OVSDB, OVSDBGroupRegistry, encode_id_ranges
from ovsproxy.routes import RouteManager
from ovsproxy.routes.backend import GatewayNotFoundError
from ovsproxy.routes.steering import SteeringRoutes
from ovsproxy.steering import SteeringTable


@dataclass(slots=True)
class CleanupReport:
    """What a cleanup removed, what it leaves on purpose, what failed (and why)."""

    removed: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def text(self) -> str:
        lines = [f"removed: {item}" for item in self.removed]
        if not self.removed:
            lines.append("nothing removed" if self.errors else "nothing of ours to remove")
        lines += [f"note: {item}" for item in self.notes]
        lines += [f"left on purpose: {item}" for item in self.left]
        lines += [f"error: {item}" for item in self.errors]
        return "\n".join(lines)


def deliberately_left(config: AgentConfig, *, on_exit: bool = False) -> list[str]:
    """What a cleanup does not remove, and why (the docs list the same); ``on_exit``: of
    ``--cleanup``, which also leaves the virtual next hop."""
    left = []
    if on_exit:
        left.append(
            f"the virtual next hop's host route and neighbour entries to the virtual MAC on "
            f"{config.gateway} (a later agent reuses them; `ovsproxy cleanup` removes them)"
        )
    left += [
        f"the bridge {config.bridge}, its ports and the gateway device {config.gateway} "
        "with its addresses (the CNI's or the operator's)",
        "conntrack entries of Service connections (Open vSwitch's zones and the kernel's NAT "
        "of captured ones): they expire with their connections",
    ]
    if config.mode == pl.Mode.STANDALONE:
        left.append(
            f"net.ipv4.conf.{config.gateway}.rp_filter as the agent may have left it (2, loose, "
            "where it found it strict; the value before is not recorded)"
        )
    if config.mode == pl.Mode.INTEGRATED:
        left.append(
            f"permanent neighbour entries on {config.gateway} to the virtual MAC "
            f"{pl.VIRTUAL_MAC}: the CNI makes the same ones (Antrea: the same address and MAC)"
        )
    return left


# -- the steps, shared with --cleanup ---------------------------------------------------------
async def remove_switch_state(
    datapath: SwitchSync,
    rejector: Rejector,
    ovsdb: OVSDB | None,
    bridge: str,
    report: CleanupReport,
) -> None:
    """Our flows and groups (``SwitchSync.remove_all``), then the reject meter (deleting it
    would delete the flows naming it), then our keys in the bridge's external_ids."""
    try:
        removal = await datapath.remove_all()
        cookie = pl.COOKIE_APP << pl.COOKIE_APP_SHIFT
        if removal.flows:
            report.removed.append(
                f"{removal.flows} flow(s) with cookie {cookie:#x}/{pl.COOKIE_APP_MASK:#x} "
                f"on {bridge}"
            )
        if removal.groups:
            report.removed.append(
                f"{len(removal.groups)} group(s) on {bridge}: {encode_id_ranges(removal.groups)}"
            )
    except Exception as exc:
        report.errors.append(f"flows and groups of {bridge}: {type(exc).__name__}: {exc}")
    try:
        if await rejector.remove_meter():
            report.removed.append(f"meter {rejector.meter_id} (the reject limiter) on {bridge}")
    except Exception as exc:
        report.errors.append(f"meter {rejector.meter_id} of {bridge}: {type(exc).__name__}: {exc}")
    if ovsdb is None:
        return
    try:
        keys = await asyncio.to_thread(ovsdb.forget_agent, bridge)
        if keys:
            report.removed.append(f"external_ids {', '.join(keys)} of bridge {bridge}")
    except Exception as exc:
        report.errors.append(f"external_ids of bridge {bridge}: {type(exc).__name__}: {exc}")
    try:
        zones = await asyncio.to_thread(ovsdb.remove_zone_timeouts)
        if zones:
            report.removed.append(
                f"conntrack timeout policies of zones {', '.join(map(str, zones))}"
            )
    except Exception as exc:
        report.errors.append(f"conntrack zone timeout policies: {type(exc).__name__}: {exc}")


async def remove_routes(
    manager: RouteManager, *, next_hop: bool, neighbours: bool, report: CleanupReport
) -> None:
    """Our Service routes, then with ``next_hop`` the virtual next hop (its host route; with
    ``neighbours``, the permanent neighbour entries to the virtual MAC)."""
    try:
        changes = await manager.uninstall()
        for dst in changes.deleted:
            hop = manager.backend.next_hop(IPFamily.of(dst))
            report.removed.append(f"route {dst} via {hop} dev {manager.gateway}")
        report.errors += [f"Service routes: {error}" for error in changes.errors]
    except Exception as exc:
        report.errors.append(f"Service routes: {type(exc).__name__}: {exc}")
    if not next_hop:
        return
    try:
        report.removed += await manager.remove_next_hop(neighbours=neighbours)
    except Exception as exc:
        report.errors.append(f"virtual next hop: {type(exc).__name__}: {exc}")


async def remove_steering(
    table: SteeringTable, routes: SteeringRoutes, report: CleanupReport, *, required: bool = True
) -> None:
    """The ``inet ovsproxy`` table, then the steering table's policy rules and routes. Without
    ``required``, a node whose libnftables binding is missing gets a note, not an error (no
    agent with this configuration could have made the table)."""
    try:
        if await table.listing() is not None:
            await table.cleanup()
            report.removed.append("nftables table inet ovsproxy")
    except Exception as exc:
        if not required and "binding is missing" in str(exc):
            report.notes.append(f"nftables not checked: {exc}")
        else:
            report.errors.append(f"nftables table inet ovsproxy: {type(exc).__name__}: {exc}")
    try:
        report.removed += await routes.remove()
    except Exception as exc:
        report.errors.append(f"capture policy routing: {type(exc).__name__}: {exc}")


# -- the one-shot command ---------------------------------------------------------------------
async def cleanup_node(config: AgentConfig, *, timeout: float = 30.0) -> CleanupReport:
    """``ovsproxy cleanup``: every step above against the configured OVS and node, with
    nothing but the configuration (no Kubernetes API, no sync)."""
    if config.embedded:
        raise ConfigError(
            "cleanup needs the node's OVS: give --ovsdb and --openflow (as to `ovsproxy run`); "
            "the embedded sandbox removes itself when the agent stops"
        )
    report = CleanupReport()
    await _clean_switch(config, report, timeout)
    gateway_present = await _clean_routes(config, report)
    if route_backend_name(config.route_backend) == "linux":
        await _clean_steering(config, report)
    if not gateway_present:
        report.notes.append(
            f"no gateway device {config.gateway}: no Service routes or neighbour entries "
            "on it (they went with it)"
        )
    report.left = deliberately_left(config)
    return report


async def _clean_switch(config: AgentConfig, report: CleanupReport, timeout: float) -> None:
    assert config.ovsdb is not None and config.openflow is not None
    ovsdb: OVSDB | None = None
    try:
        ovsdb = await asyncio.to_thread(OVSDB, config.ovsdb, timeout)
    except Exception as exc:
        report.errors.append(
            f"OVSDB at {config.ovsdb}: {exc} (the group-id registry and the bridge's "
            "external_ids are not read: groups are found by listing the switch)"
        )
    registry = OVSDBGroupRegistry(ovsdb, config.bridge) if ovsdb is not None else None
    channel = Channel(config.openflow)
    try:
        await channel.start(timeout=timeout)
    except Exception as exc:
        report.errors.append(
            f"OpenFlow at {config.openflow}: {type(exc).__name__}: {exc} "
            "(flows, groups and the meter are not removed)"
        )
    else:
        datapath = SwitchSync(channel, config.pipeline, 1, registry=registry)
        await remove_switch_state(datapath, Rejector(channel), ovsdb, config.bridge, report)
    finally:
        await channel.close()
        if registry is not None:
            await registry.close()
        if ovsdb is not None:
            await asyncio.to_thread(ovsdb.close)


async def _clean_routes(config: AgentConfig, report: CleanupReport) -> bool:
    """Service routes and the next hop; False when the gateway device does not exist."""
    backend = build_route_backend(config, config.netns)
    manager = RouteManager(backend, config.gateway, sync_interval=None)
    try:
        await backend.open()
        await backend.list_routes(config.gateway, IPFamily.IPv4)
        await manager.start()  # (the backend is open already)
    except GatewayNotFoundError:
        await backend.close()
        return False
    except Exception as exc:
        report.errors.append(f"routes: {type(exc).__name__}: {exc}")
        await manager.stop()
        return True
    try:
        standalone = config.mode == pl.Mode.STANDALONE
        await remove_routes(manager, next_hop=True, neighbours=standalone, report=report)
    finally:
        await manager.stop()
    return True


async def _clean_steering(config: AgentConfig, report: CleanupReport) -> None:
    table = SteeringTable(config.netns)
    routes = SteeringRoutes(config.gateway, config.netns)
    try:
        await routes.open()
        await remove_steering(table, routes, report, required=config.steers)
    except Exception as exc:
        report.errors.append(f"capture policy routing: {type(exc).__name__}: {exc}")
    finally:
        await table.close()
        with contextlib.suppress(Exception):
            await routes.close()
