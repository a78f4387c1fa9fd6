"""A TCP/UDP probe for the steering tests, run inside a namespace with ``python -m``.

``serve PORT ADDRESS...``: answer every TCP connection on PORT (both families) and every UDP
datagram to PORT on one of the ADDRESSes (one socket each, so the reply leaves from the
address the datagram was sent to) with ``<peer address>|<local address>|<local port>``.
``connect HOST PORT [SOURCE] [udp]``: print the answer, or ``timeout`` / ``error <errno>``.
"""

from __future__ import annotations

import signal
import socket
import sys
import threading


def _answer(peer: tuple, local: tuple) -> bytes:
    host = peer[0].removeprefix("::ffff:")
    return f"{host}|{local[0].removeprefix('::ffff:')}|{local[1]}".encode()


def serve(port: int, addresses: list[str]) -> None:
    tcp = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    tcp.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    tcp.bind(("::", port))
    tcp.listen(64)

    def udp_loop(udp: socket.socket) -> None:
        while True:
            _, peer = udp.recvfrom(2048)
            udp.sendto(_answer(peer, udp.getsockname()), peer)

    for address in addresses:
        udp = socket.socket(
            socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_DGRAM
        )
        udp.bind((address, port))
        threading.Thread(target=udp_loop, args=(udp,), daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print("ready", flush=True)
    while True:
        conn, peer = tcp.accept()
        with conn:
            conn.sendall(_answer(peer, conn.getsockname()))


def connect(host: str, port: int, source: str | None, udp: bool) -> str:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    kind = socket.SOCK_DGRAM if udp else socket.SOCK_STREAM
    with socket.socket(family, kind) as sock:
        sock.settimeout(1.5)
        if source:
            sock.bind((source, 0))
        try:
            sock.connect((host, port))
            if udp:
                sock.send(b"?")
            return sock.recv(256).decode()
        except TimeoutError:
            return "timeout"
        except OSError as exc:
            return f"error {exc.errno}"


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]), sys.argv[3:])
    else:
        args = sys.argv[2:]
        udp = args[-1] == "udp"
        if udp:
            args = args[:-1]
        print(connect(args[0], int(args[1]), args[2] if len(args) > 2 else None, udp))
