"""The OVS pipeline: the one place that names tables, priorities, registers, marks, zones and
cookies. Everything else imports these; no other module writes a table number.

Standalone mode (the default; what the sandbox and demo use) — ovsproxy owns the whole bridge::

    table  name              what it does
    -----  ----------------  ----------------------------------------------------------------
      0    Classifier        ARP and IPv6 neighbour discovery -> NORMAL (200); a local pod's
                             port -> mark FROM_POD (reg0 bit 0) and go on (LOW); a source
                             that is one of the node's IPs -> mark FROM_NODE (reg0 bit 1) and
                             go on (LOW); a local pod's address from any other port -> drop
                             (SPOOFED: a node kernel routing one of our packets back in);
                             everything else -> ConntrackZone
     10    ConntrackZone     IP: ct(zone=Z, nat, table=ConntrackState) — un-NATs replies and
                             re-applies DNAT to established Service connections; a hairpin
                             reply (to the virtual Service IP) is first un-SNATed in zone H, a
                             reply to the host-SNAT address in zone S (HIGH)
     11    ConntrackState    +inv -> drop, except a TCP RST without ACK (INVALID_RST: to the
                             agent, which flushes its conntrack entry, and on to Forwarding,
                             NATed like its connection) and a TCP SYN-ACK (INVALID_SYN_ACK:
                             marked STALE in reg4 and resubmitted; STALE_ENTRY:
                             ct(commit, force, zone=Z) deletes its entry, then dropped, or
                             forwarded when a local pod sent it outside a Service
                             connection) and a TCP SYN without ACK
                             (INVALID_SYN: on to Forwarding, NATed like its entry);
                             established/related -> Forwarding
                             (skip Service selection); new -> SessionAffinity; standalone,
                             MID_STREAM: a new TCP segment without SYN or RST (conntrack
                             picking a connection up mid-stream, after a vswitchd restart)
                             first probes L3Forwarding (PROBE: does it go to a local pod?)
     12    SessionAffinity   learned flows (ClientIP affinity): client+Service -> the endpoint
                             it used last (reg3/xxreg3, reg4), idle timeout = the affinity
                             timeout (refreshed by each new connection); miss: "to select"
     13    ServiceLB         per frontend (ClusterIP/external IP/LB IP, protocol, port; a
                             NodePort is the virtual NodePort IP, protocol, nodePort), priority
                             LOW: -> group:G (without affinity, each bucket translates:
                             ct(commit, zone=Z, nat(dst=IP:PORT), table=Forwarding); with
                             affinity a bucket loads the endpoint into registers and resubmits
                             here to learn it), or with no usable endpoint the reject action
                             (metered controller) / drop; externalTrafficPolicy Local, priority
                             SHORT_CIRCUIT: an external frontend's in-cluster clients (reg0:
                             from a pod or from the node) -> the cluster endpoints' group;
                             with affinity, NORMAL: "selected,
                             learn it" -> learn + EndpointDNAT, and one flow per endpoint
                             accepting a learned choice that is still valid -> EndpointDNAT
                             (a stale one falls to LOW: the group picks and learns anew);
                             standalone, MID_STREAM: per TCP endpoint (IP, port), a probed
                             segment from it to a local pod (TO_LOCAL_POD): with exactly one
                             frontend for that endpoint -> ct(commit, zone=Z,
                             nat(src=frontend), ct_mark, table=Forwarding) (the translation
                             re-created from the server's side), with more -> drop (the
                             client's next packet picks it up through the group);
                             standalone, COMMIT: a new non-Service connection (from a pod,
                             the gateway or the node) -> ct(commit, zone=Z, table=Forwarding)
     14    EndpointDNAT      (affinity only) one flow per (endpoint IP, port, protocol) of a
                             Service port with ClientIP affinity, shared between Services:
                             ct(commit, zone=Z, nat(dst=IP:PORT), table=Forwarding)
     20    L3Forwarding      (standalone only) local pod IP -> set eth_dst to the pod MAC,
                             output to its port (NORMAL); hairpin (source = destination pod,
                             after DNAT) -> ct(commit, zone=H, nat(src=virtual Service IP))
                             and out the port it came in on (HAIRPIN_SNAT, HAIRPIN_OUT); sent
                             to the virtual MAC by the node (see below): HOST_SNAT_OUT,
                             TO_NODE, HOST_SNAT; the mid-stream probe: to a local pod ->
                             mark TO_LOCAL_POD (LOCAL_POD_PROBE), any other -> nothing
                             (PROBE_END); other -> NORMAL

Zones: Z = 0xfff0 (IPv4) / 0xffe6 (IPv6) for Service DNAT (and the commits of non-Service
connections), H = 0xfff1 / 0xffe7 for hairpin SNAT, S = 0xfff2 / 0xffe8
for host SNAT. The virtual Service IP 169.254.0.253 / fc01::aabb:ccdd:eeff (MAC
aa:bb:cc:dd:ee:ff) is the next hop of the node's Service routes and of the steering table's policy
route, and the hairpin SNAT source. NodePort traffic arrives DNATed by the node's steering table
to the virtual NodePort IP 169.254.0.252 / fc01::aabb:ccdd:eefe, its port kept.

Packet paths in standalone mode, on a node whose pods share its pod CIDR, other nodes' pod
CIDRs routed by the node's kernel via their node IPs (host-gw; the lab, ``ovsproxy.lab.cluster``,
builds exactly this). "The gateway" is the node's internal port (gw0); "NORMAL" delivers by MAC
(a pod addresses its gateway's MAC, so what a pod sends off-node goes out the gateway)::

    client          endpoint         path (request; the reply retraces it)
    --------------  ---------------  ------------------------------------------------------------
    local pod       local pod        Classifier (FROM_POD) -> ct(Z, nat): new -> ServiceLB ->
                                     group: its bucket's ct(commit, Z, nat(dst)) (with affinity:
                                     EndpointDNAT's) -> L3Forwarding: pod MAC, its port. Reply:
                                     ct(Z, nat) un-DNATs -> established -> L3Forwarding ->
                                     client's port.
    local pod       remote pod       as above to the DNAT; L3Forwarding: not a local pod ->
                                     NORMAL -> gateway -> node kernel -> underlay -> the
                                     endpoint's node (next row). Reply arrives from the gateway,
                                     un-DNATed in zone Z, -> client's port.
    remote (any)    local pod        arrives from the gateway, already DNATed on the client's
                                     node (destination = the pod): ct(Z): new, no frontend ->
                                     ServiceLB COMMIT (not FROM_POD) -> L3Forwarding -> pod.
                                     The pod's SYN-ACK is then a reply of a known connection
                                     (uncommitted, conntrack would call it invalid and drop it);
                                     it leaves through NORMAL -> gateway.
    the node        local pod        the node's Service route sends it to the virtual next hop
                                     (eth_dst = virtual MAC) through the gateway: Service
                                     selection and DNAT as for a pod -> L3Forwarding -> pod. The
                                     pod replies to the gateway's address; un-DNAT -> gateway.
    the node        remote pod       after DNAT, L3Forwarding: to the virtual MAC, -rpl, Service
                                     ct_mark -> HOST_SNAT: ct(commit, S, nat(src=host-SNAT IP))
                                     -> HOST_SNAT_OUT: eth_dst = the sender (eth_src), eth_src =
                                     virtual MAC, out the port it came in on (the gateway) ->
                                     node kernel forwards it (its source is not the node's own)
                                     -> endpoint's node. The reply is addressed to the host-SNAT
                                     IP, which the other nodes route to this node (it is in its
                                     pod CIDR) and this node resolves to the virtual MAC on the
                                     gateway (the agent's neighbour entry): ConntrackZone
                                     un-SNATs it (zone S), un-DNATs it (zone Z) -> L3Forwarding:
                                     to the virtual MAC, +rpl, Service ct_mark -> TO_NODE: back
                                     out the gateway to the node's MAC.
    outside         any              the node's steering table (``ovsproxy.steering``) marks it and,
      (NodePort,                     for a NodePort, DNATs it to the virtual NodePort IP; the
      LB IP,                         mark's policy route sends it to the virtual next hop through
      external IP)                   the gateway: it arrives as the node's own traffic does
                                     (eth_dst = virtual MAC) and takes the rows "the node ...".
                                     externalTrafficPolicy Cluster: the node's kernel has
                                     masqueraded it (source = the gateway's address; the steering
                                     table's nat-postrouting), and one DNATed to another node
                                     also gets the host SNAT; Local: a local endpoint sees the
                                     client's address.
                                     Reply: un-DNATed in OVS, out the gateway, un-DNATed by the
                                     node's kernel, back to the client. externalTrafficPolicy
                                     Local: the external set has this node's endpoints only
                                     (none: drop), but FROM_POD / FROM_NODE clients are
                                     short-circuited to the cluster endpoints (SHORT_CIRCUIT).
    local pod       any              to this node's IP:nodePort: matched in ServiceLB as a
      (NodePort)                     frontend of the cluster endpoints (it never leaves OVS).
    pod itself      the same pod     hairpin: after DNAT, HAIRPIN_SNAT ct(commit, H,
      (hairpin)                      nat(src=virtual Service IP)) -> HAIRPIN_OUT: out its own
                                     port. The reply (to the virtual Service IP) is un-SNATed in
                                     zone H, then un-DNATed in zone Z. With endpoints also on
                                     other nodes, the group picks per connection: the hairpin
                                     path for itself, the rows above for the others.
    local pod       (no Service)     ServiceLB COMMIT, then L3Forwarding: a local pod, or NORMAL
                                     (off-node). Pod to pod on this node too: after a vswitchd
                                     restart only a lost entry's packets are new, which is how
                                     MID_STREAM tells a Service connection's (a DNATed connection
                                     whose reply tuple such an entry holds gets another source
                                     port from conntrack's NAT).

After an ovs-vswitchd restart (conntrack empty, the agent replays every flow and group with the
same bucket ids, weights and order): a client's next segment is new, the group's hash picks the
endpoint it had, its bucket (or EndpointDNAT) commits afresh; an endpoint's segment to a local
pod is new and MID_STREAM re-creates its translation (or drops it). A segment of either side
arriving from the gateway on the endpoint's node is a plain connection there (COMMIT).

The host-SNAT address of a family (``PipelineConfig.host_snat_ips``) is chosen by the agent
at start (``agent.hostsnat``): ``--host-snat-ip`` when given, else the reserved address of the
node's pod CIDR, the one just below its last (``model.hostsnat``; 10.244.1.254 in
10.244.1.0/24), the pod CIDR being the gateway's connected prefix. The agent also installs its
permanent neighbour entry to VIRTUAL_MAC on the gateway (``routes.hostsnat``), and for
steered traffic makes the gateway's IPv4 rp_filter loose when it is strict (the replies
above leave OVS through the gateway with the virtual NodePort IP or an external address as
source; ``routes.rpfilter``). Without an address for a family (none derivable, or a local pod
has it: reported in /status and ``ovsproxy_unserved_paths``), the node's own and steered
connections to Services of that family reach local endpoints only; those DNATed to an
endpoint on another node are not sent anywhere (without the SNAT the endpoint would answer
the node's own address directly, past OVS, and the reply would never be un-DNATed).

Integrated mode — another controller (a CNI) manages the bridge: ovsproxy owns only the five
tables ConntrackZone..EndpointDNAT, starting at ``first_table``; the CNI sends packets there
(``goto_table``/``resubmit``), and ovsproxy hands every packet it is done with to
``next_table`` (the CNI's forwarding). No Classifier or L3Forwarding flows are installed, and
only groups in ``[group_id_min, group_id_max]`` are ours.

Registers (Antrea's layout; the endpoint and selection registers are loaded only by the
buckets of a Service port with ClientIP affinity, whose learn action reads them)::

    reg0 bit 0    standalone: the packet came from a local pod's port (FROM_POD)
    reg0 bit 1    standalone: its source is one of the node's IPs (FROM_NODE)
    reg0 bit 2    standalone: a mid-stream TCP segment probing L3Forwarding (PROBE)
    reg0 bit 3    standalone: the probe found a local pod as its destination (TO_LOCAL_POD)
    reg3          endpoint IPv4 address
    xxreg3        endpoint IPv6 address (= reg12..reg15)
    reg4[0..15]   endpoint port
    reg4[16..18]  selection state: 1 = endpoint to select, 2 = endpoint selected,
                  3 = endpoint selected, learn it (session affinity); 4 = a conntrack-invalid
                  SYN-ACK whose entry ConntrackState deletes (STALE)
    ct_mark       bit 4 (0x10): connection was load-balanced by a Service

Cookies: ``app (16 bits) | generation (16) | category (8) | unused (24)``. A restarted agent
installs with a new generation and then deletes the flows of older ones; generation 0 is for
learned flows, which must survive an agent restart (session affinity state).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ovsproxy.model import IPAddress, IPFamily, node
from ovsproxy.openflow.protocol import CT_INV, CT_TRK

# -- conntrack ----------------------------------------------------------------------------
CT_ZONE_V4 = 0xFFF0  # Antrea's SNAT-free Service zones; distinct per family
CT_ZONE_V6 = 0xFFE6
CT_MARK_SERVICE = 0x10
CT_MARK_SERVICE_MASK = 0x10
# The ct_state match (value, mask) of a packet conntrack tracked and called invalid.
CT_STATE_INVALID = (CT_TRK | CT_INV, CT_TRK | CT_INV)

# -- rejecting (no usable endpoint) --------------------------------------------------------
# ServiceLB sends the first packet of a connection to a Service without endpoints to the agent
# (controller action, metered), which answers with a TCP RST or an ICMP port unreachable.
REJECT_METER_ID = 0x5E71  # pktps meter limiting reject packet-ins (<= OVS's 262,144 meters)
REJECT_METER_RATE = 100  # packets per second
REJECT_METER_BURST = 200
REJECT_MAX_LEN = 256  # bytes of the rejected packet sent to the agent (headers + ICMP quote)
REJECT_USERDATA = b"ovsp-rej"  # marks our reject packet-ins (8 bytes: no padding)
# Marks the packet-ins of invalid TCP RSTs (datapath.stale_reset); they share the reject meter.
INVALID_RST_USERDATA = b"ovsp-rst"
INVALID_RST_MAX_LEN = 128  # bytes of the RST sent to the agent (headers only are read)


# Hairpin (a pod reaching itself through a Service, standalone mode): the DNATed packet is also
# SNATed to the virtual Service IP in its own zone, so the pod's reply comes back through OVS.
HAIRPIN_CT_ZONE_V4 = 0xFFF1
HAIRPIN_CT_ZONE_V6 = 0xFFE7
# The node's virtual Service IP (Antrea's): next hop of the Service routes and hairpin SNAT
# source. Nobody owns it; a permanent neighbour entry resolves it to VIRTUAL_MAC. Defined in
# ovsproxy.model.node, below both of its users (this pipeline and the route backends).
VIRTUAL_SERVICE_IP: dict[IPFamily, IPAddress] = node.VIRTUAL_SERVICE_IP
VIRTUAL_MAC: str = node.VIRTUAL_MAC

# -- node-side steering (NodePort, external IPs, LB IPs; ovsproxy.steering) -------------------
# The node's nftables table DNATs NodePort traffic (dst = an allowed node IP:nodePort) to the
# virtual NodePort address, keeping the port; OVS then matches (that address, protocol,
# nodePort) in ServiceLB. The mark and route table are the policy routing that takes every
# steered packet to gw0 (routes layer). Defined in ovsproxy.model.node, below their three
# users (this pipeline, the steering table, the route backends).
VIRTUAL_NODEPORT_IP: dict[IPFamily, IPAddress] = node.VIRTUAL_NODEPORT_IP
NODE_STEERING_MARK: int = node.NODE_STEERING_MARK
NODE_STEERING_ROUTE_TABLE: int = node.NODE_STEERING_ROUTE_TABLE


# Host SNAT (standalone): a connection the node itself sent to a Service and that was DNATed to
# an endpoint on another node is SNATed to the node's host-SNAT address (one per family: the
# reserved address of the node's pod CIDR, ``model.hostsnat``, or ``--host-snat-ip``; the agent
# makes the gateway resolve it to VIRTUAL_MAC), so the endpoint's reply is routed back to this
# node and into OVS.
HOST_SNAT_CT_ZONE_V4 = 0xFFF2
HOST_SNAT_CT_ZONE_V6 = 0xFFE8


# Every conntrack zone of ours, and the timeout policy the agent gives them (OVSDB
# CT_Timeout_Policy, ``OVSDB.ensure_zone_timeouts``). Open vSwitch's userspace conntrack
# forgets a closed TCP connection after 30 s ("tcp_close"; "tcp_time_wait" is its state with
# both FINs sent, not yet acknowledged), while its endpoint (Linux) holds the 4-tuple in
# TIME_WAIT for 60 s. A client port reused within that gap for another Service IP mapping to
# the same endpoint is then DNATed to a 4-tuple the endpoint still holds (conntrack's NAT
# would have moved it to another source port had it remembered): the endpoint answers with
# the old connection's ACK, and the handshake needs a retransmission, or fails (docs/DESIGN.md,
# "Reused 4-tuples"). 120 s: Linux conntrack's TIME_WAIT timeout, which kube-proxy relies on.
CT_ZONES = (
    CT_ZONE_V4,
    CT_ZONE_V6,
    HAIRPIN_CT_ZONE_V4,
    HAIRPIN_CT_ZONE_V6,
    HOST_SNAT_CT_ZONE_V4,
    HOST_SNAT_CT_ZONE_V6,
)
CT_TIMEOUT_POLICY: tuple[tuple[str, int], ...] = (("tcp_close", 120), ("tcp_time_wait", 120))


def host_snat_ct_zone(family: IPFamily) -> int:
    return HOST_SNAT_CT_ZONE_V4 if family == IPFamily.IPv4 else HOST_SNAT_CT_ZONE_V6


def hairpin_ct_zone(family: IPFamily) -> int:
    return HAIRPIN_CT_ZONE_V4 if family == IPFamily.IPv4 else HAIRPIN_CT_ZONE_V6


def ct_zone(family: IPFamily) -> int:
    return CT_ZONE_V4 if family == IPFamily.IPv4 else CT_ZONE_V6


# -- registers ----------------------------------------------------------------------------
ENDPOINT_IP_REG = "reg3"
ENDPOINT_IP6_REG = "xxreg3"
ENDPOINT_PORT_REG = "reg4"
ENDPOINT_PORT_MASK = 0x0000FFFF
SELECTION_REG = "reg4"
SELECTION_SHIFT = 16
SELECTION_MASK = 0x7 << SELECTION_SHIFT
# Standalone: set by the Classifier on packets from a local pod's port (the rest came from the
# gateway or the bridge's own port).
FROM_POD_REG = "reg0"
FROM_POD = 0x1
# Standalone: set by the Classifier on packets whose source is one of the node's IPs (the node
# itself, through the gateway). With FROM_POD it makes a client "in-cluster": such clients of
# an external frontend with externalTrafficPolicy Local are short-circuited to the cluster
# endpoints (kube-proxy's), not held to this node's.
FROM_NODE_REG = FROM_POD_REG
FROM_NODE = 0x2
# Standalone, after an ovs-vswitchd restart (see PRIORITY_MID_STREAM): ConntrackState marks a
# new TCP segment without SYN (a connection conntrack picked up mid-stream) PROBE and resubmits
# it to L3Forwarding, which only answers whether its destination is a local pod (TO_LOCAL_POD);
# ServiceLB then re-creates (or drops) the translation of one that an endpoint sent.
PROBE_REG = FROM_POD_REG
PROBE = 0x4
TO_LOCAL_POD_REG = FROM_POD_REG
TO_LOCAL_POD = 0x8


class Selection(enum.IntEnum):
    """reg4[16..18]: where the endpoint selection of a new connection stands."""

    TO_SELECT = 0b001
    SELECTED = 0b010
    TO_LEARN = 0b011
    # ConntrackState: a conntrack-invalid SYN-ACK whose entry is to be deleted (no selection)
    STALE = 0b100

    @property
    def value_bits(self) -> int:
        return int(self) << SELECTION_SHIFT


def endpoint_ip_reg(family: IPFamily) -> str:
    return ENDPOINT_IP_REG if family == IPFamily.IPv4 else ENDPOINT_IP6_REG


# -- priorities ---------------------------------------------------------------------------
# L3Forwarding, standalone: a PROBE packet to a local pod marks TO_LOCAL_POD; any other PROBE
# packet ends there (the probe forwards nothing).
PRIORITY_LOCAL_POD_PROBE = 230
PRIORITY_PROBE_END = 225
PRIORITY_HAIRPIN_SNAT = 220
# ConntrackState: a TCP RST conntrack calls invalid is not dropped (see datapath.stale_reset:
# after a vswitchd restart, the RST that ends an endpoint's TIME_WAIT for a reused 4-tuple).
PRIORITY_INVALID_RST = 215
# ConntrackState: a TCP SYN-ACK conntrack calls invalid is marked Selection.STALE and
# resubmitted; at STALE_ENTRY it deletes its entry (ct commit, force; Open vSwitch refuses a
# commit in a flow that matches +inv) and is dropped: the entry of stale_reset, undone by the
# switch itself when no agent flushed it (an agent restart).
PRIORITY_INVALID_SYN_ACK = 216
PRIORITY_INVALID_POD_SYN_ACK = 217  # a local pod's, outside a Service connection: forwarded
# ConntrackState: a TCP SYN conntrack calls invalid (an entry of an earlier connection with
# the same tuple, not seen to end) goes on to forwarding, NATed like that entry.
PRIORITY_INVALID_SYN = 214
PRIORITY_STALE_ENTRY = 218
PRIORITY_HIGH = 210
PRIORITY_HAIRPIN_OUT = 205
PRIORITY_NORMAL = 200
PRIORITY_HOST_SNAT_OUT = 197
PRIORITY_TO_NODE = 195
PRIORITY_SHORT_CIRCUIT = 192  # ServiceLB: in-cluster clients of eTP Local external frontends
PRIORITY_LOW = 190
PRIORITY_SPOOFED = 185
PRIORITY_HOST_SNAT = PRIORITY_LOW
# ConntrackState (standalone): a new TCP segment without SYN or RST is probed (PROBE, above)
# before Service selection; ServiceLB: such a segment from an endpoint's address and TCP port
# to a local pod is a Service connection's whose entry the switch lost (a vswitchd restart).
# When exactly one frontend maps to that endpoint, ct(commit, nat(src=frontend)) re-creates
# the translation from the server's side (the entry's reply direction is then the client's
# packet to the frontend); otherwise it is dropped and the client's next packet recovers it
# (the group picks the same endpoint). Between COMMIT and the frontends' LOW.
PRIORITY_MID_STREAM = 100
PRIORITY_COMMIT = 1
PRIORITY_MISS = 0

# -- cookies ------------------------------------------------------------------------------
COOKIE_APP = 0x5E71  # "service": marks every flow ovsproxy installs
COOKIE_APP_SHIFT = 48
COOKIE_GENERATION_SHIFT = 32
COOKIE_CATEGORY_SHIFT = 24
COOKIE_APP_MASK = 0xFFFF << COOKIE_APP_SHIFT
COOKIE_GENERATION_MASK = 0xFFFF << COOKIE_GENERATION_SHIFT
COOKIE_APP_GENERATION_MASK = COOKIE_APP_MASK | COOKIE_GENERATION_MASK
LEARNED_GENERATION = 0  # learned (affinity) flows: kept across agent restarts


class Category(enum.IntEnum):
    PIPELINE = 1  # table-miss and fixed flows
    SERVICE = 2  # ServiceLB flows
    ENDPOINT = 3  # EndpointDNAT (affinity) and mid-stream flows
    FORWARDING = 4  # L3Forwarding flows for local pods (standalone)
    LEARNED = 5  # session-affinity flows created by learn actions


def cookie(generation: int, category: Category) -> int:
    if not 0 < generation <= 0xFFFF:
        raise ValueError(f"generation must be 1..65535, not {generation}")
    return (
        (COOKIE_APP << COOKIE_APP_SHIFT)
        | (generation << COOKIE_GENERATION_SHIFT)
        | (int(category) << COOKIE_CATEGORY_SHIFT)
    )


# A learned (session-affinity) flow's cookie carries the Service's affinity timeout in its low
# 23 bits, and bit 23 when the agent, not OVS, expires it (timeouts above OVS's 16-bit limit):
# the sweeper reads both from the switch alone, across agent restarts.
LEARNED_TIMEOUT_MASK = (1 << 23) - 1
LEARNED_SWEPT = 1 << 23
LEARNED_CATEGORY_MASK = COOKIE_APP_MASK | COOKIE_GENERATION_MASK | (0xFF << COOKIE_CATEGORY_SHIFT)
OVS_MAX_TIMEOUT = 0xFFFF  # OpenFlow idle/hard timeouts are 16-bit seconds


def learned_cookie(timeout: int = 0, swept: bool = False) -> int:
    if not 0 <= timeout <= LEARNED_TIMEOUT_MASK:
        raise ValueError(f"affinity timeout {timeout} out of range")
    return (
        (COOKIE_APP << COOKIE_APP_SHIFT)
        | (int(Category.LEARNED) << COOKIE_CATEGORY_SHIFT)
        | (LEARNED_SWEPT if swept else 0)
        | timeout
    )


def learned_cookie_timeout(value: int) -> tuple[int, bool]:
    """(affinity timeout, agent-swept) of a learned flow's cookie."""
    return value & LEARNED_TIMEOUT_MASK, bool(value & LEARNED_SWEPT)


def cookie_generation(value: int) -> int | None:
    """The generation of one of our cookies; None for a cookie that is not ours."""
    if value >> COOKIE_APP_SHIFT != COOKIE_APP:
        return None
    return (value >> COOKIE_GENERATION_SHIFT) & 0xFFFF


# -- tables -------------------------------------------------------------------------------
class Mode(enum.StrEnum):
    STANDALONE = "standalone"
    INTEGRATED = "integrated"


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    mode: Mode = Mode.STANDALONE
    first_table: int = 10
    # Integrated: the CNI's table that takes every packet we are done with. Standalone: our
    # L3Forwarding table.
    next_table: int = 20
    group_id_min: int = 1
    group_id_max: int = 0xFFFFFF00 - 1  # OFPG_MAX
    # Standalone: the host-SNAT address per family (at most one each; see HOST_SNAT_CT_ZONE_V4)
    host_snat_ips: tuple[IPAddress, ...] = ()
    # Standalone: the node's own IPs (the Classifier marks their packets "from the node")
    node_ips: tuple[IPAddress, ...] = ()

    def __post_init__(self) -> None:
        families = [IPFamily.of(ip) for ip in self.host_snat_ips]
        if len(set(families)) != len(families):
            raise ValueError("host_snat_ip: at most one address per IP family")
        if not 0 <= self.first_table <= 254 - 4:
            raise ValueError(f"first_table {self.first_table}: needs 5 tables below 255")
        own = range(self.first_table, self.first_table + 5)
        if self.next_table in own or not 0 <= self.next_table <= 254:
            raise ValueError(f"next_table {self.next_table} must be a table outside {own}")
        if self.mode == Mode.STANDALONE and (self.first_table == 0 or self.next_table == 0):
            raise ValueError("standalone mode uses table 0 as its Classifier")
        if not 1 <= self.group_id_min <= self.group_id_max <= 0xFFFFFF00:
            raise ValueError("group id range must lie in 1..0xffffff00")


@dataclass(frozen=True, slots=True)
class Tables:
    classifier: int | None
    conntrack_zone: int
    conntrack_state: int
    session_affinity: int
    service_lb: int
    endpoint_dnat: int
    forwarding: int  # next_table: our L3Forwarding (standalone) or the CNI's (integrated)

    @classmethod
    def for_config(cls, config: PipelineConfig) -> Tables:
        first = config.first_table
        standalone = config.mode == Mode.STANDALONE
        return cls(
            classifier=0 if standalone else None,
            conntrack_zone=first,
            conntrack_state=first + 1,
            session_affinity=first + 2,
            service_lb=first + 3,
            endpoint_dnat=first + 4,
            forwarding=config.next_table,
        )
