"""Which frontends map to each TCP endpoint, for the mid-stream flows (standalone mode).

After an ovs-vswitchd restart conntrack is empty; a segment an endpoint sends first on a
Service connection is new and, delivered as it is, reaches the client from the endpoint's
address, which its socket does not know (it answers with an RST). ServiceLB re-creates the
translation from the server's side when exactly one frontend maps to the endpoint, and drops
the segment otherwise (``service_flows.mid_stream_flow``). Whether one frontend maps to an
endpoint depends on every Service port that has it, so this index, kept by the proxier as
Service ports are staged, holds what each TCP Service port contributes (its endpoints and
their frontends) and which ports hold each endpoint.

The flows are staged per Service port (one datapath owner, ``(MID_STREAM_OWNER, name)``,
holding the flow of each of its endpoints): a change restages that port's flows and, for an
endpoint other ports hold too, theirs (each holder stages the same flow for it, computed
from every holder's frontends, so the holders agree and the flow is shared). An owner per
Service port, not per endpoint: a 10,000 x 10 cluster has 100,000 TCP endpoints, and an
owner costs the datapath a record and the streamed commit a write each.

The frontends counted are those a local pod can send to: ClusterIPs, external and
load-balancer IPs, and node IP:nodePort; the virtual NodePort IP is the node's steering
table's, whose clients are not local pods.

Whether there are mid-stream flows at all is decided once, at start (``choose``): they help
only where conntrack goes with ovs-vswitchd, the userspace datapath (``netdev``). The kernel
datapath (``system``) keeps its conntrack in the kernel, which outlives an ovs-vswitchd
restart, so there a connection never loses its entry and the flows (one per TCP endpoint,
most of what a switch holds, and most of an added endpoint's bytes) would cost memory,
start-up time and bytes for nothing. The configuration can force either (``mid_stream_flows``).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath import service_flows as svc
from ovsproxy.datapath.desired import encoded_flow
from ovsproxy.datapath.flow_context import Context
from ovsproxy.datapath.service_flows import EndpointKey, endpoint_key
from ovsproxy.datapath.switch_sync import SwitchSync
from ovsproxy.model import IPAddress

Address = tuple[IPAddress, int]
Frontends = frozenset[Address]
# One Service port's part: each of its TCP endpoints (``endpoint_key``) -> its frontends
Contribution = dict[EndpointKey, Frontends]

MID_STREAM_OWNER = "mid-stream"
_VIRTUAL_NODEPORT_IPS = frozenset(pl.VIRTUAL_NODEPORT_IP.values())

# The configuration's ``mid_stream_flows``: by the bridge's datapath type, or forced
MID_STREAM_SETTINGS = ("auto", "on", "off")
# The datapath whose conntrack outlives ovs-vswitchd (the kernel's); any other type -- the
# userspace "netdev", or one we do not know -- gets the flows under "auto".
_CONNTRACK_OUTLIVES_VSWITCHD = frozenset({"system"})


@dataclass(frozen=True, slots=True)
class MidStreamChoice:
    """Whether this run installs mid-stream flows, and why (shown in /status)."""

    on: bool
    setting: str  # one of MID_STREAM_SETTINGS
    datapath_type: str | None  # the bridge's, as read at start (None: not read)
    reason: str

    def status(self) -> dict[str, Any]:
        return {
            "on": self.on,
            "setting": self.setting,
            "datapath_type": self.datapath_type,
            "reason": self.reason,
        }


def choose(setting: str, datapath_type: str | None, standalone: bool = True) -> MidStreamChoice:
    """Mid-stream flows for a bridge of ``datapath_type`` under the configuration's
    ``setting`` (see the module docstring). Integrated mode never has them: the CNI forwards,
    and the probe needs our L3Forwarding."""
    if setting not in MID_STREAM_SETTINGS:
        raise ValueError(f"mid_stream_flows: {setting!r} is not one of auto, on, off")
    if not standalone:
        return MidStreamChoice(False, setting, datapath_type, "integrated mode: standalone only")
    if setting != "auto":
        return MidStreamChoice(setting == "on", setting, datapath_type, f"configured {setting}")
    if datapath_type is None:
        return MidStreamChoice(True, setting, None, "datapath type unknown: on, to be safe")
    if datapath_type in _CONNTRACK_OUTLIVES_VSWITCHD:
        reason = f"datapath {datapath_type}: the kernel's conntrack outlives ovs-vswitchd"
        return MidStreamChoice(False, setting, datapath_type, reason)
    reason = f"datapath {datapath_type}: its conntrack goes with ovs-vswitchd"
    return MidStreamChoice(True, setting, datapath_type, reason)


def contribution(frontend_endpoints: dict[Address, frozenset[Address]]) -> Contribution:
    """Invert a Service port's frontend -> endpoints map (``InstalledService.
    frontend_endpoints``) into endpoint -> frontends, leaving the virtual NodePort IP out.
    Endpoints with the same frontends share one frozenset."""
    relevant = [
        (frontend, endpoints)
        for frontend, endpoints in frontend_endpoints.items()
        if frontend[0] not in _VIRTUAL_NODEPORT_IPS and endpoints
    ]
    if len(relevant) == 1:  # the usual case: one ClusterIP
        frontend, endpoints = relevant[0]
        one = frozenset((frontend,))
        return {endpoint_key(ip, port): one for ip, port in endpoints}
    fronts_of: dict[EndpointKey, set[Address]] = {}
    for frontend, endpoints in relevant:
        for ip, port in endpoints:
            fronts_of.setdefault(endpoint_key(ip, port), set()).add(frontend)
    shared: dict[Frontends, Frontends] = {}
    out: Contribution = {}
    for key, fronts in fronts_of.items():
        frozen = frozenset(fronts)
        out[key] = shared.setdefault(frozen, frozen)
    return out


# The Service ports holding an endpoint: one (the usual case), or several
Holders = Hashable | frozenset[Hashable]


class MidStreamIndex:
    """What each TCP Service port contributes, the ports holding each endpoint, and the ports
    whose mid-stream flows are to be staged again."""

    def __init__(self) -> None:
        self._ports: dict[Hashable, Contribution] = {}
        self._holders: dict[EndpointKey, Holders] = {}
        self._dirty: set[Hashable] = set()

    def update(self, name: Hashable, new: Contribution) -> None:
        """The Service port ``name`` contributes ``new`` now (``{}``: nothing, or gone)."""
        old = self._ports.get(name, {})
        if old == new:
            return
        holders, dirty = self._holders, self._dirty
        if not old and holders.keys().isdisjoint(new):  # a new port, endpoints of its own
            holders.update(dict.fromkeys(new, name))
            self._ports[name] = new
            dirty.add(name)
            return
        for key, fronts in old.items():
            if key in new:
                if new[key] != fronts:  # the other holders' flow for it may change
                    dirty.update(self._other_holders(key, name))
                continue
            rest = self._other_holders(key, name)
            if not rest:
                del holders[key]
            else:  # others keep it: one fewer holder, their flow may change
                holders[key] = next(iter(rest)) if len(rest) == 1 else rest
                dirty.update(rest)
        for key in new.keys() - old.keys():
            held = holders.get(key)
            if held is None:
                holders[key] = name
            else:
                others = held if isinstance(held, frozenset) else frozenset((held,))
                holders[key] = others | {name}
                dirty.update(others)
        if new:
            self._ports[name] = new
        else:
            self._ports.pop(name, None)
        dirty.add(name)

    def _other_holders(self, key: EndpointKey, name: Hashable) -> frozenset[Hashable]:
        """The Service ports other than ``name`` (one of them) holding the endpoint."""
        held = self._holders[key]
        if isinstance(held, frozenset):
            return held - {name}
        return frozenset()

    def frontends(self, key: EndpointKey) -> Frontends:
        """Every frontend mapping to the endpoint, over every Service port holding it."""
        held = self._holders.get(key)
        if held is None:
            return frozenset()
        if not isinstance(held, frozenset):
            return self._ports[held][key]
        return frozenset().union(*(self._ports[name][key] for name in held))

    def stage(self, datapath: SwitchSync, ctx: Context) -> int:
        """Stage the mid-stream flows of every Service port whose flows may have changed;
        returns how many ports."""
        dirty, self._dirty = self._dirty, set()
        ports, holders = self._ports, self._holders
        wire_of = svc.mid_stream_wire
        for name in dirty:
            contributed = ports.get(name)
            flows = []
            if contributed:
                for key, fronts in contributed.items():
                    held = holders[key]
                    if held is not name and held != name:  # others hold it too: all their
                        fronts = self.frontends(key)  # frontends
                    # kept as its encoding only, as the EndpointDNAT flows
                    flows.append(encoded_flow(wire_of(ctx, key, fronts)))
            datapath.stage((MID_STREAM_OWNER, name), (), flows)
        return len(dirty)
