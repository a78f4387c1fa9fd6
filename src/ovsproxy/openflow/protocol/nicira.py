"""Nicira extensions: NXT_SET_PACKET_IN_FORMAT, and ``controller(...,meter_id=N)``.

``MeteredController`` is controller2 with the METER_ID property (OVS 2.13+): OVS applies the
meter in the datapath before the packet reaches the slow path, so a flood costs nothing
beyond the meter. A flow naming a meter that does not exist (yet) is still accepted,
unmetered (OVS logs "unknown meter id"). Prints as ``ovs-ofctl`` does (oracle tests in
tests/semantics/test_openflow_pieces.py).
"""

from __future__ import annotations

import struct

from . import constants as c
from .actions import Action, Controller
from .errors import OpenFlowEncodeError
from .message import Message

_U32 = struct.Struct("!I")


_NX_MSG = struct.Struct("!II")


class SetPacketInFormat(Message):
    """NXT_SET_PACKET_IN_FORMAT: ask for NXT_PACKET_IN2 packet-ins (which carry userdata)."""

    __slots__ = ()
    _fields = ("packet_in_format",)
    packet_in_format: int
    msg_type = c.MsgType.EXPERIMENTER
    raw_name = "NXT_SET_PACKET_IN_FORMAT"

    def __new__(cls, packet_in_format: int = c.NXPIF_NXT_PACKET_IN2) -> SetPacketInFormat:
        wire = _NX_MSG.pack(c.NX_VENDOR_ID, c.NXT_SET_PACKET_IN_FORMAT) + _U32.pack(
            packet_in_format
        )
        return tuple.__new__(cls, (wire, packet_in_format))

    def to_text(self, xid: int = 0) -> str:
        names = {0: "standard", 1: "nxt_packet_in", 2: "nxt_packet_in2"}
        return f" format={names.get(self[1], str(self[1]))}"


_U16 = struct.Struct("!H")
_PROP_U32 = struct.Struct("!HHI")
NX_CTLR_NO_METER = 0


class MeteredController(Action):
    """``controller(max_len=...,userdata=...,meter_id=N)``."""

    __slots__ = ()
    _fields = ("controller", "meter_id")
    controller: Controller
    meter_id: int

    def __new__(
        cls,
        max_len: int = 0xFFFF,
        *,
        userdata: bytes = b"",
        meter_id: int = NX_CTLR_NO_METER,
        controller_id: int = 0,
    ) -> MeteredController:
        # Build the controller2 action, then append the METER_ID property (OVS puts it last).
        base = Controller(max_len, controller_id=controller_id, userdata=userdata, pause=False)
        wire = base.wire
        if meter_id != NX_CTLR_NO_METER:
            if not userdata:  # controller2 is only used with userdata or pause by the codec
                raise OpenFlowEncodeError("controller: a meter_id needs userdata")
            if not 0 < meter_id <= 0xFFFFFFFF:
                raise OpenFlowEncodeError(f"controller: meter id {meter_id} is out of range")
            prop = _PROP_U32.pack(c.NXAC2PT_METER_ID, 8, meter_id)
            length = len(wire) + len(prop)
            wire = wire[:2] + _U16.pack(length) + wire[4:] + prop
        return tuple.__new__(cls, (wire, base, meter_id))

    def to_text(self) -> str:
        text = self.controller.to_text()
        if self[2] == NX_CTLR_NO_METER:
            return text
        if text.startswith("CONTROLLER:"):
            return f"controller(max_len={text.split(':', 1)[1]},meter_id={self[2]})"
        return f"{text[:-1]},meter_id={self[2]})"
