"""Records the fuzz corpus: real Open vSwitch messages, as OVS sent them.

    sudo .venv/bin/python -m bench.fuzz_corpus      # writes bench/fuzz-corpus.json

Starts a private sandbox, fills it with flows, groups and meters (ours through the codec,
and ``ovs-ofctl`` ones with fields and actions the codec does not model), then talks to the
switch over a plain socket and keeps every message it receives, byte for byte: HELLO,
FEATURES_REPLY, echo and barrier replies, errors, bundle replies, flow/group/port/table/meter
multipart replies and NXT_PACKET_IN2. ``python -m bench fuzz`` mutates these (and messages
of our own) and feeds them to the decoder.
"""

from __future__ import annotations

import datetime as dt
import json
import socket
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

from ovsproxy.openflow import protocol as of
from ovsproxy.openflow.protocol import constants as c
from ovsproxy.ovs.sandbox import Sandbox, SandboxError

CORPUS = Path(__file__).parent / "fuzz-corpus.json"

# Flows ovs-ofctl installs: fields and actions beyond what the codec models, so the switch's
# replies carry unknown OXM fields and raw actions.
OFCTL_FLOWS = [
    "table=3,priority=5,tun_id=0x5,actions=note:0102030405,output:1",
    "table=3,priority=6,dl_vlan=10,actions=mod_vlan_vid:20,strip_vlan,output:1",
    "table=3,priority=7,mpls,mpls_label=5,actions=pop_mpls:0x0800,resubmit(,4)",
    "table=3,priority=8,ipv6,ipv6_src=fd00::/64,nw_tos=16,actions=dec_ttl,push_vlan:0x8100,output:1",
    "table=3,priority=9,tcp,tcp_flags=+syn-ack,actions=ct(commit,zone=5,exec(set_field:1->ct_mark,"
    "set_field:0x1/0x1->ct_label)),resubmit(,5)",
    "table=3,priority=10,ip,ct_state=+trk+est-rel,ct_zone=3,ct_mark=0x1/0x1,"
    "actions=ct(table=6,zone=NXM_NX_REG5[0..15],nat),multipath(eth_src,50,modulo_n,1,0,NXM_NX_REG0[])",
    "table=3,priority=11,conj_id=5,ip,actions=clone(set_field:1->reg1,resubmit(,7)),output:1",
    "table=3,priority=12,udp,tp_dst=53,actions=learn(table=9,idle_timeout=30,hard_timeout=60,"
    "priority=100,eth_type=0x800,NXM_OF_ETH_SRC[],NXM_OF_IP_DST[]=NXM_OF_IP_SRC[],"
    "load:NXM_NX_REG3[]->NXM_NX_REG4[],output:NXM_OF_IN_PORT[]),"
    "controller(userdata=01.02.03,pause)",
    "table=3,priority=13,arp,arp_op=1,actions=move:NXM_OF_ETH_SRC[]->NXM_OF_ETH_DST[],"
    "load:0x2->NXM_OF_ARP_OP[],IN_PORT",
    "table=3,priority=14,ip,nw_src=10.0.0.0/8,actions=meter:1,set_queue:3,enqueue:1:2,"
    "sample(probability=100,collector_set_id=1)",
    "table=3,priority=15,in_port=1,dl_src=aa:bb:cc:00:00:00/ff:ff:ff:00:00:00,"
    "actions=bundle(eth_src,0,active_backup,ofport,members:1),push:NXM_NX_REG0[],"
    "pop:NXM_NX_REG1[],exit",
    "table=4,priority=16,icmp6,icmpv6_type=135,nd_target=fd00::1,actions=drop",
    "table=4,priority=17,sctp,tp_src=1000,actions=ct_clear,set_field:10.0.0.1->ip_dst,"
    "controller:64",
    "table=4,priority=18,pkt_mark=0x5,xxreg3=0x1/0x1,metadata=0x55,actions=write_metadata:0x1,"
    "goto_table:5",
    "table=4,priority=19,actions=clear_actions,write_actions(output:1)",
]
OFCTL_GROUPS = [
    "group_id=100,type=select,selection_method=hash,fields(ip_src,tcp_dst),"
    "bucket=bucket_id:1,weight:10,actions=output:1,bucket=bucket_id:2,weight:20,actions=output:2",
    "group_id=101,type=all,bucket=actions=output:1,bucket=actions=set_field:1->reg0,resubmit(,3)",
    "group_id=102,type=ff,bucket=watch_port:1,actions=output:1,bucket=watch_port:2,actions=output:2",
    "group_id=103,type=indirect,bucket=actions=ct(commit,nat(src=10.0.0.1-10.0.0.9:1000-2000))",
]


def _ours() -> list[of.Message]:
    """Flows and groups as the datapath builds them (select groups, DNAT, learn, reject)."""
    ip = 0x0A600001
    messages: list[of.Message] = []
    buckets = [
        of.Bucket(
            i,
            [
                of.SetField("reg3", 0x0AF40000 + i),
                of.SetField("reg4", 0x10000 | 8080, 0x7FFFF),
                of.Resubmit(40),
            ],
        )
        for i in range(40)
    ]
    messages.append(
        of.GroupMod(of.GroupModCommand.ADD, 7, buckets=buckets, selection_method="hash")
    )
    messages.append(
        of.GroupMod(of.GroupModCommand.ADD, 8, buckets=buckets[:3], selection_method="dp_hash")
    )
    messages.append(
        of.FlowMod(
            10,
            200,
            of.Match(eth_type=0x800, ip_proto=6, ipv4_dst=ip, tcp_dst=80),
            actions=[of.SetField("reg4", 1 << 16, 1 << 16), of.GroupAction(7)],
            cookie=0x123,
        )
    )
    for i in range(3):
        messages.append(
            of.FlowMod(
                40,
                200,
                of.Match(eth_type=0x800, ip_proto=6, reg3=0x0AF40000 + i, reg4=(8080, 0xFFFF)),
                actions=[
                    of.CT(
                        commit=True,
                        zone=65520,
                        table=50,
                        nat=of.NAT(dst=True, ip_min=0x0AF40000 + i, port_min=8080),
                        actions=[of.SetField("ct_mark", 2, 2)],
                    )
                ],
                cookie=0x124,
            )
        )
    messages.append(
        of.FlowMod(
            30,
            100,
            of.Match(eth_type=0x800, ip_proto=17, ipv4_dst=ip, udp_dst=53),
            actions=[
                of.Learn(
                    31,
                    [
                        of.LearnMatchField("eth_type"),
                        of.LearnMatchField("ip_proto"),
                        of.LearnMatchField("ipv4_src"),
                        of.LearnLoadField("reg3", "reg3"),
                    ],
                    idle_timeout=10800,
                    cookie=0x125,
                ),
                of.Controller(256, userdata=b"ovsp-rej"),
            ],
        )
    )
    return messages


class _Switch:
    """A blocking OpenFlow connection that records every message the switch sends."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(path)
        self.parser = of.Parser()
        self.received: list[tuple[str, bytes]] = []
        self.xid = 100

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def request(self, what: str, *messages: of.Message | bytes) -> list[bytes]:
        """Sends the messages and a barrier; returns (and records) what came back."""
        for msg in messages:
            self.xid += 1
            self.send(msg if isinstance(msg, bytes) else of.encode(msg, self.xid))
        self.xid += 1
        barrier = self.xid
        self.send(of.encode(of.BarrierRequest(), barrier))
        replies = []
        while True:
            for raw in self._read():
                _version, msg_type, _, xid = struct.unpack_from("!BBHI", raw)
                if msg_type == c.MsgType.ECHO_REQUEST:
                    self.send(raw[:1] + bytes([c.MsgType.ECHO_REPLY]) + raw[2:])
                self.received.append((what, raw))
                if msg_type == c.MsgType.BARRIER_REPLY and xid == barrier:
                    return replies
                replies.append(raw)

    def _read(self) -> list[bytes]:
        data = self.sock.recv(1 << 16)
        if not data:
            raise ConnectionError("the switch closed the connection")
        self.parser.feed(data)
        return list(self.parser)


def _multipart_request(mp_type: int, body: bytes = b"") -> bytes:
    payload = struct.pack("!HH4x", mp_type, 0) + body
    return struct.pack("!BBHI", 6, c.MsgType.MULTIPART_REQUEST, 8 + len(payload), 0) + payload


def _udp_frame() -> bytes:
    eth = bytes.fromhex("0200000000010200000000020800")
    ip = bytes.fromhex("4500001c00004000401100000a0000010a600001")
    udp = struct.pack("!HHHH", 1234, 53, 8, 0)
    return eth + ip + udp


def record(sandbox: Sandbox) -> list[dict[str, Any]]:
    sandbox.ofctl("add-meter", "meter=1,pktps,burst,band=type=drop,rate=100,burst_size=10")
    for command, items in (("add-flow", OFCTL_FLOWS), ("add-group", OFCTL_GROUPS)):
        for item in items:
            try:
                sandbox.ofctl(command, item)
            except SandboxError as exc:  # an OVS without that feature: record the rest
                print(f"skipped: {exc}", file=sys.stderr)
    switch = _Switch(sandbox.openflow.removeprefix("unix:"))
    switch.send(of.encode(of.Hello(), 1))
    switch.request("hello and features", of.FeaturesRequest())
    switch.request("set config", of.SetConfig(miss_send_len=0xFFFF), of.SetPacketInFormat())
    switch.request("ours", *_ours())
    switch.request("echo", of.EchoRequest(b"fuzz-corpus"))
    switch.request("flow desc", of.FlowDescRequest())
    switch.request("group desc", of.GroupDescRequest())
    switch.request("group stats", of.GroupStatsRequest())
    for name, mp_type, body in [
        ("desc", 0, b""),
        (
            "flow stats",
            1,
            struct.pack("!B3xII4xQQ", 0xFF, c.OFPP_ANY, c.OFPG_ANY, 0, 0)
            + bytes.fromhex("00010004" + "00000000"),
        ),
        (
            "aggregate",
            2,
            struct.pack("!B3xII4xQQ", 0xFF, c.OFPP_ANY, c.OFPG_ANY, 0, 0)
            + bytes.fromhex("00010004" + "00000000"),
        ),
        ("table stats", 3, b""),
        ("port stats", 4, struct.pack("!I4x", c.OFPP_ANY)),
        ("group features", 8, b""),
        ("meter stats", 9, struct.pack("!I4x", 0xFFFFFFFF)),
        ("meter config", 10, struct.pack("!I4x", 0xFFFFFFFF)),
        ("meter features", 11, b""),
        ("port desc", 13, struct.pack("!I4x", c.OFPP_ANY)),
        ("table desc", 14, b""),
        ("queue desc", 15, struct.pack("!II", c.OFPP_ANY, 0xFFFFFFFF)),
    ]:
        switch.request(f"multipart {name}", _multipart_request(mp_type, body))
    # Packet-ins: a packet-out whose action sends the packet back to us.
    switch.request(
        "packet in",
        of.PacketOut([of.Controller(0xFFFF, userdata=b"corpus")], _udp_frame()),
        of.PacketOut([of.Controller(64)], _udp_frame()),
    )
    # Errors: an existing group, a bad table, a bad action, an unknown message type, a
    # bundle message for a bundle that is not open, a bad multipart type.
    switch.request(
        "errors",
        of.GroupMod(of.GroupModCommand.ADD, 7, buckets=[of.Bucket(0, [of.Output(1)])]),
        of.FlowMod(255, 1, actions=[of.Output(1)]),
        of.FlowMod(0, 1, actions=[of.GroupAction(999)]),
        struct.pack("!BBHI", 6, 99, 8, 0),
        of.BundleCtrl(77, c.BundleCtrlType.COMMIT_REQUEST),
        _multipart_request(200),
        of.GroupMod(of.GroupModCommand.INSERT_BUCKET, 555, buckets=[of.Bucket(9, [of.Output(1)])]),
    )
    # A bundle: open, add, commit (and one that fails at commit).
    switch.request(
        "bundle",
        of.BundleCtrl(1, c.BundleCtrlType.OPEN_REQUEST),
        of.BundleAdd(1, of.FlowMod(20, 5, actions=[of.Output(2)])),
        of.BundleCtrl(1, c.BundleCtrlType.COMMIT_REQUEST),
        of.BundleCtrl(2, c.BundleCtrlType.OPEN_REQUEST),
        of.BundleAdd(2, of.GroupMod(of.GroupModCommand.DELETE, 555)),
        of.BundleAdd(2, of.GroupMod(of.GroupModCommand.MODIFY, 556, buckets=[])),
        of.BundleCtrl(2, c.BundleCtrlType.COMMIT_REQUEST),
    )
    switch.sock.close()
    return [{"what": what, "hex": raw.hex()} for what, raw in switch.received]


def main() -> int:
    with Sandbox() as sandbox:
        messages = record(sandbox)
    version = subprocess.run(
        ["ovs-vswitchd", "--version"], capture_output=True, text=True, check=False
    ).stdout.split()
    corpus = {
        "recorded": dt.date.today().isoformat(),
        "openvswitch": version[3] if len(version) > 3 else "?",
        "how": "python -m bench.fuzz_corpus (every message a live ovs-vswitchd sent us)",
        "messages": messages,
    }
    CORPUS.write_text(json.dumps(corpus, indent=1) + "\n")
    kinds = sorted({m["what"] for m in messages})
    print(f"{len(messages)} messages ({', '.join(kinds)}) -> {CORPUS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
