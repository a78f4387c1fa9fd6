"""OFPT_METER_MOD with drop bands (``ovs-ofctl add-meter``); prints as ``ovs-ofctl`` does."""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable

from . import constants as c
from .message import Message


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


class MeterMod(Message):
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
