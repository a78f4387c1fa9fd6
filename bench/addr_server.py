"""``python -m bench.addr_server PORT READY_FILE`` (run inside a backend pod's namespace): a TCP
server that answers every connection with the address it was reached at, then closes it.

The pod holds a whole endpoint range as a local route (``ip route add local ... dev lo``), so
one listener on 0.0.0.0 answers for every endpoint address of the cluster; the answer names the
endpoint the proxy chose, which is how ``peer-kube-proxy`` checks that a ClusterIP answers from
all its endpoints and when a new endpoint starts receiving connections.
"""

from __future__ import annotations

import signal
import socket
import sys
from pathlib import Path

from ovsproxy.ovs.podserver import LISTEN_BACKLOG, ensure_somaxconn


def main(argv: list[str]) -> int:
    port, ready = int(argv[0]), Path(argv[1])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    ensure_somaxconn()
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", port))
    server.listen(LISTEN_BACKLOG)
    ready.write_text("ready\n")
    while True:
        conn, _ = server.accept()
        try:
            conn.sendall(conn.getsockname()[0].encode() + b"\n")
        except OSError:
            pass
        finally:
            conn.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
