"""The OpenFlow pieces of the semantics against ovs-ofctl (encoder and ofp-print oracle):
NXT_CT_FLUSH, METER_MOD, the metered controller action, the affinity learn flows."""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
import subprocess
import tempfile
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath import service_flows as svc
from ovsproxy.datapath.flow_context import Context
from ovsproxy.model import Endpoint, Protocol, ServicePort, ServicePortName
from ovsproxy.openflow import protocol as of
from ovsproxy.openflow.protocol import MeterCommand, MeteredController, MeterMod
from ovsproxy.openflow.protocol import constants as c
from ovsproxy.openflow.protocol import ct_flush as ctf
from ovsproxy.openflow.protocol.ct_flush import CtFlush, Tuple
from tests.openflow.ofctl import OVS_OFCTL, encode_flow, ofp_print

pytestmark = pytest.mark.skipif(OVS_OFCTL is None, reason="needs ovs-ofctl")

TABLES = pl.Tables.for_config(pl.PipelineConfig())


def printed(msg: of.Message, xid: int = 5) -> tuple[str, str]:
    return ofp_print(msg.encode(xid)), (msg.header_text(xid) + msg.to_text(xid)).rstrip()


def ip(text: str):
    return ipaddress.ip_address(text)


def _decode_tuple(data: bytes) -> Tuple:
    values: list[Any] = [None, None, 0, 0]
    pos = 0
    while pos + 4 <= len(data):
        ptype, length = ctf._PROP.unpack_from(data, pos)
        if length < 4 or pos + length > len(data):
            raise ValueError("bad ct_flush tuple property")
        payload = data[pos + 4 : pos + length]
        if ptype in (ctf.NXT_CT_TUPLE_SRC, ctf.NXT_CT_TUPLE_DST):
            ip = ipaddress.IPv6Address(payload[:16])
            mapped = ip.ipv4_mapped
            values[ptype] = mapped if mapped is not None else ip
        elif ptype in (ctf.NXT_CT_TUPLE_SRC_PORT, ctf.NXT_CT_TUPLE_DST_PORT):
            values[ptype] = int.from_bytes(payload[:2], "big")
        pos += (length + 7) // 8 * 8
    return tuple(values)  # type: ignore[return-value]


def decode_ct_flush(data: bytes) -> CtFlush:
    """A whole ctf.NXT_CT_FLUSH message (header included) back into a value."""
    if len(data) < 24 or ctf._NX_MSG.unpack_from(data, 8) != (c.NX_VENDOR_ID, ctf.NXT_CT_FLUSH):
        raise ValueError("not an NXT_CT_FLUSH")
    ip_proto = data[16]
    values: dict[str, Any] = {"ip_proto": ip_proto}
    pos = 24
    while pos + 4 <= len(data):
        ptype, length = ctf._PROP.unpack_from(data, pos)
        if length < 4 or pos + length > len(data):
            raise ValueError("bad ct_flush property")
        payload = data[pos + 4 : pos + length]
        if ptype == ctf.NXT_CT_ORIG_TUPLE:
            values["orig"] = _decode_tuple(payload[4:])
        elif ptype == ctf.NXT_CT_REPLY_TUPLE:
            values["reply"] = _decode_tuple(payload[4:])
        elif ptype == ctf.NXT_CT_ZONE_ID:
            values["zone"] = int.from_bytes(payload[:2], "big")
        pos += (length + 7) // 8 * 8
    return CtFlush(**values)


CT_FLUSHES = [
    CtFlush(0xFFF0, 17, (None, ip("10.96.0.40"), 0, 53), (ip("10.244.0.5"), None, 5353, 0)),
    CtFlush(0xFFE6, 17, (None, ip("fd00:10:96::40"), 0, 53), (ip("fd00:10:244::5"), None, 53, 0)),
    CtFlush(0xFFF0, 17, (None, ip("10.96.0.40"), 0, 53)),
    CtFlush(None, 6, (ip("10.0.0.1"), ip("10.0.0.2"), 1, 2)),
    CtFlush(7),
    CtFlush(),
]


@pytest.mark.parametrize("msg", CT_FLUSHES, ids=str)
def test_ct_flush_prints_as_ovs_reads_it_and_round_trips(msg: CtFlush) -> None:
    theirs, ours = printed(msg)
    assert theirs == ours
    assert decode_ct_flush(msg.encode(1)) == msg


address = st.one_of(
    st.none(),
    st.integers(1, 2**32 - 1).map(ipaddress.IPv4Address),
)
address6 = st.one_of(
    st.none(),
    st.integers(1, 2**128 - 1)
    .map(ipaddress.IPv6Address)
    .filter(lambda a: a.ipv4_mapped is None),  # OVS reads a mapped address as IPv4
)


@settings(max_examples=40, deadline=None)
@given(
    zone=st.one_of(st.none(), st.integers(0, 0xFFFF)),
    v6=st.booleans(),
    data=st.data(),
)
def test_random_ct_flushes_print_as_ovs_reads_them(zone, v6, data) -> None:
    addr = address6 if v6 else address
    ports = st.integers(0, 0xFFFF)
    orig = (data.draw(addr), data.draw(addr), data.draw(ports), data.draw(ports))
    reply = (data.draw(addr), data.draw(addr), data.draw(ports), data.draw(ports))
    msg = CtFlush(zone, data.draw(st.sampled_from([6, 17, 132])), orig, reply)
    theirs, ours = printed(msg)
    assert theirs == ours
    assert decode_ct_flush(msg.encode(9)) == msg


def test_ct_flush_refuses_what_ovs_would() -> None:
    with pytest.raises(ValueError):
        CtFlush(0, 0, (None, ip("10.0.0.1"), 0, 53))  # ports without a protocol
    with pytest.raises(ValueError):
        CtFlush(0, 17, (ip("10.0.0.1"), ip("fd00::1"), 0, 0))  # mixed families


def test_ct_flush_bytes_equal_what_ovs_ofctl_sends() -> None:
    """ovs-ofctl ct-flush against a fake switch that records the message."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "sw.sock")
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)
        server.listen(1)
        got: list[bytes] = []

        def switch() -> None:
            conn, _ = server.accept()
            with conn:
                conn.sendall(of.Hello().encode(1))
                buf = b""
                while True:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                    while len(buf) >= 8 and len(buf) >= struct.unpack_from("!H", buf, 2)[0]:
                        length = struct.unpack_from("!H", buf, 2)[0]
                        msg, buf = buf[:length], buf[length:]
                        if msg[1] == of.MsgType.BARRIER_REQUEST:
                            conn.sendall(bytes([6, of.MsgType.BARRIER_REPLY, 0, 8]) + msg[4:8])
                        elif msg[1] != of.MsgType.HELLO:
                            got.append(msg)

        thread = threading.Thread(target=switch, daemon=True)
        thread.start()
        subprocess.run(
            [
                OVS_OFCTL,
                "-O",
                "OpenFlow15",
                "ct-flush",
                f"unix:{path}",
                "zone=65520",
                "ct_nw_dst=10.96.0.40,ct_nw_proto=17,ct_tp_dst=53",
                "ct_nw_src=10.244.0.5,ct_tp_src=5353",
            ],
            check=True,
            capture_output=True,
            timeout=20,
        )
        thread.join(5)
        server.close()
    (theirs,) = got
    ours = CT_FLUSHES[0].encode(struct.unpack_from("!I", theirs, 4)[0])
    assert ours == theirs


@pytest.mark.parametrize("command", list(MeterCommand))
def test_meter_mod_prints_as_ovs_reads_it(command: MeterCommand) -> None:
    bands = [] if command == MeterCommand.DELETE else [(100, 200)]
    theirs, ours = printed(MeterMod(command, pl.REJECT_METER_ID, bands=bands))
    assert theirs == ours


def test_metered_controller_flow_bytes_equal_ovs_ofctl() -> None:
    action = MeteredController(256, userdata=pl.REJECT_USERDATA, meter_id=pl.REJECT_METER_ID)
    flow = of.FlowMod(
        table_id=13,
        priority=190,
        match=of.Match(eth_type=0x800),
        instructions=(of.ApplyActions((action,)),),
    )
    text = f"table=13,priority=190,ip,actions={action.to_text()}"
    assert encode_flow(text) == flow.encode(1)
    assert "meter_id=24177" in ofp_print(flow.encode(1))


@pytest.mark.parametrize(
    ("timeout", "max_ovs"), [(10800, pl.OVS_MAX_TIMEOUT), (86400, pl.OVS_MAX_TIMEOUT), (3, 1)]
)
@pytest.mark.parametrize("cluster_ip", ["10.96.0.20", "fd00:10:96::20"])
def test_affinity_flows_equal_what_ovs_ofctl_encodes(timeout, max_ovs, cluster_ip) -> None:
    ctx = Context(TABLES, 1, max_ovs_timeout=max_ovs)
    name = ServicePortName("ns", "web", "p", Protocol.TCP)
    port = ServicePort(name, (ip(cluster_ip),), 80, affinity_timeout=timeout)
    family = ip(cluster_ip).version
    ep_ip = ip("10.244.0.5") if family == 4 else ip("fd00:10:244::5")
    objects = svc.service_objects(ctx, port, [Endpoint(ep_ip, 8080)], {family: 1})
    idle, swept = svc.affinity_timeouts(timeout, max_ovs)
    assert swept == (timeout > max_ovs)
    learn_flows = [f for f in objects.flows if "learn(" in f.to_text()]
    assert len(learn_flows) == 1
    for flow in objects.flows:
        assert encode_flow(of.format_flow(flow)) == flow.encode(1), of.format_flow(flow)
    text = of.format_flow(learn_flows[0])
    assert (f"idle_timeout={idle}" in text) == (not swept)
    assert f"cookie={pl.learned_cookie(timeout, swept):#x}" in text
