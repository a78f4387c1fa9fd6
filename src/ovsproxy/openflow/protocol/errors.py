"""Exceptions raised by the codec."""

from __future__ import annotations


class OpenFlowCodecError(Exception):
    """Base class of everything the codec raises on purpose."""


class OpenFlowEncodeError(OpenFlowCodecError, ValueError):
    """A value cannot be expressed in OpenFlow 1.5 (bad field, out-of-range number...)."""


class MessageTooLarge(OpenFlowEncodeError):
    """The encoding exceeds a 16-bit OpenFlow length field.

    OpenFlow messages are limited to 65,535 bytes (65,519 inside a bundle, whose
    BUNDLE_ADD header takes 16). Callers must split the content: for a select group,
    ADD/MODIFY with the first buckets followed by INSERT_BUCKET messages (the datapath's
    ``ovsproxy.datapath.groups.group_mod_chunks``).
    """

    def __init__(self, what: str, length: int, limit: int) -> None:
        super().__init__(
            f"{what} is {length} bytes, over the OpenFlow limit of {limit} bytes; "
            "split it into several messages (e.g. GroupMod ADD + INSERT_BUCKET chunks)"
        )
        self.length = length
        self.limit = limit


class OpenFlowDecodeError(OpenFlowCodecError):
    """Bytes that are not a well-formed OpenFlow 1.5 message we understand.

    ``msg_type`` and ``xid`` are set when the header could be read, so a channel can
    skip a message it does not model without dropping the connection.
    """

    def __init__(self, message: str, *, msg_type: int | None = None, xid: int | None = None):
        super().__init__(message)
        self.msg_type = msg_type
        self.xid = xid
