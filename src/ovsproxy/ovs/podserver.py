"""The workload of a sandbox pod: HTTP (and UDP) servers that answer with the pod's name.

Run inside the pod's network namespace: ``python -m ovsproxy.ovs.podserver --name web-1
--http 8080 --udp 5353``. Every socket listens on IPv4 and IPv6 at once. The HTTP answer's body
is the pod name; the header ``X-Served-Port`` names the port that answered, so tests can check a
Service port's targetPort mapping. A UDP datagram is answered with ``<name>:<port>``.

Sized for the tests' parallelism: a thread per connection (a slow client holds only its own
thread; the accepting thread never waits on one) and a listen backlog of ``LISTEN_BACKLOG``
(socketserver's default, 5, overflows with a few parallel clients: the kernel then drops the
handshake's last ACK and the client's connection waits for a retransmission). The namespace's
``net.core.somaxconn`` caps any backlog, so it is raised to the backlog when lower.
"""

from __future__ import annotations

import argparse
import http.server
import signal
import socket
import socketserver
import sys
import threading
from pathlib import Path

LISTEN_BACKLOG = 1024
SOMAXCONN = Path("/proc/sys/net/core/somaxconn")  # this network namespace's


def ensure_somaxconn(backlog: int = LISTEN_BACKLOG, path: Path = SOMAXCONN) -> int:
    """The namespace's listen-backlog cap, raised to ``backlog`` when lower; returns it."""
    current = int(path.read_text())
    if current < backlog:
        path.write_text(f"{backlog}\n")
        current = int(path.read_text())
    if current < backlog:
        raise RuntimeError(f"net.core.somaxconn is {current} < the backlog {backlog}")
    return current


class DualStackHTTPServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    address_family = socket.AF_INET6
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = LISTEN_BACKLOG

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


def _handler(pod_name: str, port: int) -> type[http.server.BaseHTTPRequestHandler]:
    body = pod_name.encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # one request per connection: each is a new conntrack entry

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("X-Served-Port", str(port))
            self.send_header("X-Client", self.client_address[0])
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


def serve_udp(pod_name: str, port: int) -> None:
    sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("::", port))
    reply = f"{pod_name}:{port}".encode()
    while True:
        _, peer = sock.recvfrom(2048)
        sock.sendto(reply, peer)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--name", required=True)
    parser.add_argument("--http", type=int, action="append", default=[])
    parser.add_argument("--udp", type=int, action="append", default=[])
    parser.add_argument("--ready-file")
    args = parser.parse_args(argv)

    threads = []
    if args.http:
        ensure_somaxconn()
    for port in args.http:
        server = DualStackHTTPServer(("::", port), _handler(args.name, port))
        threads.append(threading.Thread(target=server.serve_forever, daemon=True))
    for port in args.udp:
        threads.append(threading.Thread(target=serve_udp, args=(args.name, port), daemon=True))
    for thread in threads:
        thread.start()
    if args.ready_file:
        Path(args.ready_file).write_text("ready\n")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
