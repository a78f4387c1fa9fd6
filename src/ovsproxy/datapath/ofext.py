"""Two OpenFlow pieces the codec does not model yet, built on its public base classes:

* ``MeteredController``: NX ``controller(...,meter_id=N)`` (controller2 with the METER_ID
  property, OVS 2.13+). OVS applies the meter in the datapath before the packet reaches the
  slow path, so a flood costs nothing beyond the meter. A flow naming a meter that does not
  exist (yet) is still accepted, unmetered (OVS logs "unknown meter id").
* ``MeterMod``: OFPT_METER_MOD with drop bands (``ovs-ofctl add-meter``).

Both print as ``ovs-ofctl`` does (oracle tests in tests/semantics/test_ofext.py). They could
move into ``openflow.protocol`` unchanged.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable

from ovsproxy.openflow import protocol as of
from ovsproxy.openflow.protocol import constants as c

_U16 = struct.Struct("!H")
_PROP_U32 = struct.Struct("!HHI")
NX_CTLR_NO_METER = 0


class MeteredController(of.Action):
    """``controller(max_len=...,userdata=...,meter_id=N)``."""

    __slots__ = ()
    _fields = ("controller", "meter_id")
    controller: of.Controller
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
        base = of.Controller(max_len, controller_id=controller_id, userdata=userdata, pause=False)
        wire = base.wire
        if meter_id != NX_CTLR_NO_METER:
            if not userdata:  # controller2 is only used with userdata or pause by the codec
                raise ValueError("MeteredController needs userdata")
            if not 0 < meter_id <= 0xFFFFFFFF:
                raise ValueError(f"meter id {meter_id} out of range")
            prop = _PROP_U32.pack(c.NXAC2PT_METER_ID, 8, meter_id)
            length = len(wire) + len(prop)
            wire = wire[:2] + _U16.pack(length) + wire[4:] + prop
        return tuple.__new__(cls, (wire, base, meter_id))

    def to_text(self) -> str:
        text = self[1].to_text()
        if self[2] == NX_CTLR_NO_METER:
            return text
        if text.startswith("CONTROLLER:"):
            return f"controller(max_len={text.split(':', 1)[1]},meter_id={self[2]})"
        return f"{text[:-1]},meter_id={self[2]})"


class MeterFlags(enum.IntFlag):
    KBPS = 1
    PKTPS = 2
    BURST = 4
    STATS = 8


class MeterCommand(enum.IntEnum):
    ADD = 0
    MODIFY = 1
    DELETE = 2


OFPMBT_DROP = 1
_METER_MOD = struct.Struct("!HHI")
_DROP_BAND = struct.Struct("!HHII4x")


class MeterMod(of.Message):
    """OFPT_METER_MOD with drop bands ``(rate, burst_size)``."""

    __slots__ = ()
    _fields = ("command", "meter_id", "flags", "bands")
    command: int
    meter_id: int
    flags: int
    bands: tuple[tuple[int, int], ...]
    msg_type = c.MsgType.METER_MOD
    raw_name = "OFPT_METER_MOD"

    def __new__(
        cls,
        command: int,
        meter_id: int,
        flags: int = MeterFlags.PKTPS | MeterFlags.BURST | MeterFlags.STATS,
        bands: Iterable[tuple[int, int]] = (),
    ) -> MeterMod:
        bands = tuple((int(r), int(b)) for r, b in bands)
        wire = _METER_MOD.pack(command, flags, meter_id) + b"".join(
            _DROP_BAND.pack(OFPMBT_DROP, 16, rate, burst) for rate, burst in bands
        )
        return tuple.__new__(cls, (wire, int(command), meter_id, int(flags), bands))

    def to_text(self, xid: int = 0) -> str:
        """As ``ovs-ofctl ofp-print`` prints it (``ofputil_format_meter_mod``; a delete is
        decoded without flags or bands)."""
        command = {0: "ADD", 1: "MOD", 2: "DEL"}.get(self[1], f"cmd:{self[1]}")
        text = f" {command} meter={self[2]} "
        if self[1] == MeterCommand.DELETE:
            return text + "bands="
        flags = self[3]
        for bit, name in ((1, "kbps"), (2, "pktps"), (4, "burst"), (8, "stats")):
            if flags & bit:
                text += f"{name} "
        text += "bands="
        for rate, burst in self[4]:
            text += f"\ntype=drop rate={rate}"
            if flags & MeterFlags.BURST:
                text += f" burst_size={burst}"
        return text


def meter_add(meter_id: int, rate: int, burst: int, command: int = MeterCommand.ADD) -> MeterMod:
    return MeterMod(command, meter_id, bands=[(rate, burst)])
