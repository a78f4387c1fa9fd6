"""Sandbox start-up waits until each daemon answers, not until its socket file exists.

A daemon's socket file appears when it binds, before it listens; a client connecting in that
window gets "Connection refused". These tests widen the window on purpose: each socket path
already holds a socket that nobody listens on (bound, never listening) and the daemon execs
late, so only a wait that asks the daemon for an answer gets through.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from ovsproxy.ovs.sandbox import Sandbox, SandboxError

pytestmark = pytest.mark.ovs


class LateSandbox(Sandbox):
    """A sandbox whose daemons start `delays[key]` seconds late, their sockets there before."""

    def __init__(self, delays: dict[str, float], timeout: float = 20.0) -> None:
        super().__init__()
        self.delays = delays
        self.start_timeout = timeout
        self.unlistened: list[socket.socket] = []

    def _bind_unlistened(self, path: Path) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(path))  # bound, never listening: connect() is refused
        self.unlistened.append(sock)

    def _spawn(self, key: str, cmd: list[str]) -> None:
        paths = {
            "ovsdb-server": ["db.sock", "ovsdb-server.ctl"],
            "ovs-vswitchd": ["ovs-vswitchd.ctl", f"{self.bridge}.mgmt"],
        }[key]
        for name in paths:
            self._bind_unlistened(self.rundir / name)
        # `sh` execs the daemon: the pid recorded is the daemon's, its command line names
        # the run directory as the sandbox's bookkeeping expects.
        delay = self.delays.get(key, 0.0)
        super()._spawn(key, ["sh", "-c", f'sleep {delay}; exec "$@"', "sh", *cmd])

    def down(self) -> None:
        super().down()
        for sock in self.unlistened:
            sock.close()


def test_start_up_waits_for_daemons_that_listen_late() -> None:
    with LateSandbox({"ovsdb-server": 1.0, "ovs-vswitchd": 1.0}) as sb:
        # Everything answers as soon as up() returns.
        assert "Bridge br0" in sb.vsctl("show")
        assert "ovs-vswitchd" in sb.appctl("version")
        assert "(gw0)" in sb.ofctl("show")
        # A restarted ovs-vswitchd is waited for the same way.
        sb.restart_vswitchd()
        assert "ovs-vswitchd" in sb.appctl("version")
        assert "(gw0)" in sb.ofctl("show")


def test_ovsdb_server_that_never_answers_is_named_with_the_refusal() -> None:
    sb = LateSandbox({"ovsdb-server": 60.0}, timeout=1.5)
    with pytest.raises(SandboxError) as caught:
        sb.up()
    message = str(caught.value)
    assert f"ovsdb-server on unix:{sb.rundir / 'db.sock'} did not answer within 1.5s" in message
    assert "Connection refused" in message
    assert not sb.rundir.exists()  # up() cleaned up after itself


def test_ovs_vswitchd_that_never_answers_is_named_with_the_refusal() -> None:
    sb = LateSandbox({"ovs-vswitchd": 60.0}, timeout=1.5)
    with pytest.raises(SandboxError) as caught:
        sb.up()
    message = str(caught.value)
    assert f"ovs-vswitchd on {sb.rundir / 'ovs-vswitchd.ctl'} did not answer within 1.5s" in (
        message
    )
    assert "Connection refused" in message
    assert not sb.rundir.exists()
