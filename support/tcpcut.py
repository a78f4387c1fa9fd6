"""A TCP forwarder a test owns, between a client and the real API server, that can cut.

The real kube-apiserver can not be asked to drop one client's watch while it keeps serving
everyone else; a network path can. ``Forwarder`` listens on 127.0.0.1 and relays bytes (TLS
passes through untouched: the client still verifies the server's certificate) to a target.
``cut()`` closes every relayed connection and refuses new ones until ``resume()``: to the
client, the server is unreachable, while the test changes objects through its own (direct)
connection. Runs in the test's event loop.

``listen``: a listening socket made elsewhere, to serve on instead of a new one on 127.0.0.1.
A socket belongs to the network namespace it was made in, while the connections to the
target are made by the loop's thread: a socket made in a node's namespace relays that
namespace's clients to the target on the test's own (root) namespace's loopback, with no
address or route added anywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket


class Forwarder:
    def __init__(
        self, target_host: str, target_port: int, *, listen: socket.socket | None = None
    ) -> None:
        self.target = (target_host, target_port)
        self._listen = listen
        self.port = 0
        self.connections = 0  # accepted while open
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self._cut = False
        self._relays: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> Forwarder:
        if self._listen is not None:
            self._server = await asyncio.start_server(self._relay, sock=self._listen)
        else:
            self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        sock: socket.socket = self._server.sockets[0]
        self.port = sock.getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._relays):
            task.cancel()
        await asyncio.gather(*self._relays, return_exceptions=True)

    @property
    def open_connections(self) -> int:
        return len(self._open) // 2

    def cut(self) -> None:
        """Close every relayed connection; refuse (accept and close) new ones."""
        self._cut = True
        for writer in list(self._open):
            writer.transport.abort()  # a reset, not a polite close
        self._open.clear()

    def resume(self) -> None:
        self._cut = False

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._cut:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._relays.add(task)
        pair = {writer, up_writer}
        self._open |= pair
        try:
            await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))
        finally:
            self._open -= pair
            self._relays.discard(task)
            for w in pair:
                w.transport.abort()

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        with contextlib.suppress(OSError):
            writer.transport.abort()
