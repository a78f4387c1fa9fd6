"""The OpenFlow message base: the header, ``Message``, ``encode(msg, xid)`` and ``to_text``.

A message value's wire is its body (everything after the 8-byte header), encoded once;
``encode`` only prepends the header for a given xid. ``to_text()`` renders a message the
way ``ovs-ofctl ofp-print`` does (``header_text`` gives the ``OFPT_... (OF1.5) (xid=..):``
prefix), so the same strings serve logs, the dump command and oracle tests. Each message
family has its module (``switch``, ``flows``, ``groups``, ``packets``, ``bundles``,
``multipart``, ``meters``, ``nicira``); ``decode`` turns bytes back into values.
"""

from __future__ import annotations

import struct
from typing import ClassVar, NamedTuple

from . import constants as c
from ._value import Value
from .errors import MessageTooLarge

_HEADER = struct.Struct("!BBHI")


class Header(NamedTuple):
    version: int
    msg_type: int
    length: int
    xid: int


class Message(Value):
    """Base of all messages. ``msg_type`` is the OFPT_* type in the header."""

    __slots__ = ()
    msg_type: ClassVar[int]
    # Name ovs-ofctl prints in the header line (ofpraw name).
    raw_name: ClassVar[str] = ""

    def encode(self, xid: int) -> bytes:
        body: bytes = self[0]
        length = 8 + len(body)
        if length > c.OFP_MAX_MESSAGE_LEN:
            raise MessageTooLarge(type(self).__name__, length, c.OFP_MAX_MESSAGE_LEN)
        return _HEADER.pack(c.OFP_VERSION, self.msg_type, length, xid) + body

    @property
    def length(self) -> int:
        """The encoded length, header included."""
        return 8 + len(self[0])

    def header_text(self, xid: int) -> str:
        return f"{self.raw_name} (OF1.5) (xid={xid:#x}):"

    def to_text(self, xid: int = 0) -> str:
        """The body as ``ovs-ofctl ofp-print`` prints it after the header line (``xid``
        only matters for messages that embed another message)."""
        return ""


def encode(msg: Message, xid: int) -> bytes:
    """The bytes of ``msg`` with transaction id ``xid``."""
    return msg.encode(xid)


def to_text(msg: Message, xid: int | None = None) -> str:
    """``ofp-print`` text of a message; with ``xid``, including its header line."""
    if xid is None:
        return msg.to_text().strip()
    return (msg.header_text(xid) + msg.to_text(xid)).rstrip()


# Message kinds for counters and logs, by header type.
MESSAGE_KIND: dict[int, str] = {t: t.name for t in c.MsgType}


def message_kind(msg_type: int) -> str:
    return MESSAGE_KIND.get(msg_type, f"TYPE_{msg_type}")
