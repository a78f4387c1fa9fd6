"""Which frontends map to each TCP endpoint, for the mid-stream flows (standalone mode).

After an ovs-vswitchd restart conntrack is empty; a segment an endpoint sends first on a
Service connection is new and, delivered as it is, reaches the client from the endpoint's
address, which its socket does not know (it answers with an RST). ServiceLB re-creates the
translation from the server's side when exactly one frontend maps to the endpoint, and drops
the segment otherwise (``service_flows.mid_stream_flow``). Whether one frontend maps to an endpoint
depends on every Service that has it, so this index, kept by the proxier as Services are
staged, counts the (frontend address, port) pairs per (endpoint address, port) and restages
the mid-stream flow of each endpoint whose frontends changed (one datapath owner per endpoint:
a change touches only its endpoints' flows).

The frontends counted are those a local pod can send to: ClusterIPs, external and
load-balancer IPs, and node IP:nodePort; the virtual NodePort IP is the node's steering
table's, whose clients are not local pods.
"""

from __future__ import annotations

from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath import service_flows as svc
from ovsproxy.datapath.flow_context import Context
from ovsproxy.datapath.switch_sync import SwitchSync, encoded_flow
from ovsproxy.model import IPAddress

Address = tuple[IPAddress, int]
Contribution = dict[Address, frozenset[Address]]  # endpoint -> frontends, of one Service port

MID_STREAM_OWNER = "mid-stream"
_VIRTUAL_NODEPORT_IPS = frozenset(pl.VIRTUAL_NODEPORT_IP.values())


def contribution(frontend_endpoints: dict[Address, frozenset[Address]]) -> Contribution:
    """Invert a Service port's frontend -> endpoints map (``InstalledService.
    frontend_endpoints``) into endpoint -> frontends, leaving the virtual NodePort IP out."""
    out: dict[Address, set[Address]] = {}
    for frontend, endpoints in frontend_endpoints.items():
        if frontend[0] in _VIRTUAL_NODEPORT_IPS:
            continue
        for endpoint in endpoints:
            out.setdefault(endpoint, set()).add(frontend)
    return {ep: frozenset(fronts) for ep, fronts in out.items()}


class MidStreamIndex:
    """Frontend counts per TCP endpoint over every Service port, and the endpoints whose
    mid-stream flow is to be staged again."""

    def __init__(self) -> None:
        self._frontends: dict[Address, dict[Address, int]] = {}
        self._dirty: set[Address] = set()

    def update(self, old: Contribution, new: Contribution) -> None:
        """One Service port's contribution changed from ``old`` to ``new``."""
        if old == new:
            return
        for endpoint, fronts in old.items():
            if new.get(endpoint) == fronts:
                continue
            counts = self._frontends[endpoint]
            for frontend in fronts:
                left = counts[frontend] - 1
                if left:
                    counts[frontend] = left
                else:
                    del counts[frontend]
            if not counts:
                del self._frontends[endpoint]
            self._dirty.add(endpoint)
        for endpoint, fronts in new.items():
            if old.get(endpoint) == fronts:
                continue
            counts = self._frontends.setdefault(endpoint, {})
            for frontend in fronts:
                counts[frontend] = counts.get(frontend, 0) + 1
            self._dirty.add(endpoint)

    def frontends(self, endpoint: Address) -> tuple[Address, ...]:
        return tuple(self._frontends.get(endpoint, ()))

    def stage(self, datapath: SwitchSync, ctx: Context) -> int:
        """Stage the mid-stream flow of every endpoint that changed; returns how many."""
        dirty, self._dirty = self._dirty, set()
        for endpoint in dirty:
            owner = (MID_STREAM_OWNER, *endpoint)
            fronts = self._frontends.get(endpoint)
            if fronts:
                # kept as its encoding only, as the EndpointDNAT flows (one per endpoint)
                wire = svc.mid_stream_wire(ctx, endpoint[0], endpoint[1], fronts)
                datapath.stage(owner, (), (encoded_flow(wire),))
            else:
                datapath.stage(owner, (), ())
        return len(dirty)
