"""The OpenFlow write buffer is bounded (issue 35): a switch that stops reading while it still
sends (echo requests, which we answer) is dropped with a clear error once the bytes it has not
taken pass ``max_write_buffer``, instead of the buffer growing until a request times out.

The switch here is a small peer on a Unix socket (``_DeafSwitch``): a real ovs-vswitchd cannot
be made to stop reading its OpenFlow connection while it goes on sending."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

from ovsproxy.openflow import protocol as of
from ovsproxy.openflow.connection import Channel

ECHO_DATA = b"e" * 60_000


class _DeafSwitch:
    """Completes the handshake, then sends echo requests and never reads again."""

    def __init__(self) -> None:
        self.sent = 0
        self.closed = asyncio.Event()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        parser = of.Parser()
        try:
            replies = {
                of.Hello: None,
                of.FeaturesRequest: of.FeaturesReply(0xD),
                of.BarrierRequest: of.BarrierReply(),
            }
            writer.write(of.Hello([of.OFP_VERSION]).encode(1))
            done = False
            while not done:
                parser.feed(await reader.read(65536))
                for raw in parser:
                    msg = of.decode(raw)
                    xid = struct.unpack_from("!I", raw, 4)[0]
                    reply = replies.get(type(msg))
                    if reply is not None:
                        writer.write(reply.encode(xid))
                    done |= isinstance(msg, of.BarrierRequest)
            xid = 100
            while True:  # never reads again
                writer.write(of.EchoRequest(ECHO_DATA).encode(xid))
                self.sent += len(ECHO_DATA)
                xid += 1
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            self.closed.set()
            writer.close()


async def test_a_switch_that_stops_reading_is_dropped_past_the_bound(tmp_path: Path) -> None:
    switch = _DeafSwitch()
    path = tmp_path / "br0.mgmt"
    server = await asyncio.start_unix_server(switch.serve, path)
    channel = Channel(f"unix:{path}", max_write_buffer=8 << 20, echo_interval=3600)
    try:
        await channel.start(timeout=5)
        await asyncio.wait_for(switch.closed.wait(), 20)
        assert "the switch is not reading" in str(channel.last_error), channel.last_error
        assert "(limit 8,388,608)" in str(channel.last_error)
    finally:
        await channel.close()
        server.close()
        await server.wait_closed()
