"""Sans-I/O stream framer: bytes in, complete OpenFlow messages out."""

from __future__ import annotations

import struct
from collections.abc import Iterator

from .constants import OFP_HEADER_LEN
from .errors import OpenFlowDecodeError

_LENGTH = struct.Struct("!H")


class Parser:
    """Splits a byte stream into OpenFlow messages.

    ``feed(data)`` then iterate: each item is the bytes of one complete message (decode it
    with ``decode``). A header whose length is shorter than a header means the stream is
    garbage; that raises ``OpenFlowDecodeError`` and the connection should be dropped.
    """

    __slots__ = ("_buffer", "_offset")

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._offset = 0

    def feed(self, data: bytes) -> None:
        if self._offset and self._offset >= len(self._buffer) // 2:
            # Compact occasionally rather than on every message: O(n) overall.
            del self._buffer[: self._offset]
            self._offset = 0
        self._buffer += data

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as messages."""
        return len(self._buffer) - self._offset

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        buffer = self._buffer
        offset = self._offset
        if len(buffer) - offset < OFP_HEADER_LEN:
            raise StopIteration
        length = _LENGTH.unpack_from(buffer, offset + 2)[0]
        if length < OFP_HEADER_LEN:
            raise OpenFlowDecodeError(f"message length {length} is shorter than a header")
        end = offset + length
        if end > len(buffer):
            raise StopIteration
        self._offset = end
        return bytes(buffer[offset:end])
