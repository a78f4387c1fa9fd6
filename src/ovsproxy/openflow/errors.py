"""The OpenFlow connection's exceptions: its own failures (``ChannelError`` and subclasses)
and errors the switch reported (``OpenFlowError``, ``BundleError``).

They live here, not beside the asyncio driver, so the sans-I/O session, the driver and the
datapath above all name the same classes without importing any I/O code.
"""

from __future__ import annotations

from collections.abc import Sequence

from ovsproxy.openflow import protocol as of


class ChannelError(Exception):
    """Base of the channel's own failures (not errors reported by the switch)."""


class ConnectionLost(ChannelError):
    """The connection closed (or was found dead) while a request was in flight."""


class ChannelNotReady(ChannelError):
    """Not connected, or the on_connected hook has not finished: retry later."""


class VersionMismatch(ChannelError):
    """The switch does not allow OpenFlow 1.5 on this bridge."""


class RequestTimeout(ChannelError, TimeoutError):
    """No reply within the timeout."""


class OpenFlowError(Exception):
    """An OFPT_ERROR from the switch, decoded.

    ``name`` is ``TYPE/CODE`` (e.g. ``OFPET_GROUP_MOD_FAILED/OFPGMFC_GROUP_EXISTS``),
    ``xid`` the transaction id, ``request`` the text of the message that failed (when the
    channel knows it), ``message`` that message itself, and ``error`` the decoded ``of.Error``.
    """

    def __init__(
        self,
        error: of.Error,
        xid: int,
        request: str | None = None,
        message: of.Message | None = None,
    ) -> None:
        self.error = error
        self.xid = xid
        self.message = message
        self.name = error.name
        self.code_name = error.code_name
        self.request = request
        text = f"{error.name} (xid={xid:#x})"
        if request:
            text += f": {request}"
        super().__init__(text)


class BundleError(OpenFlowError):
    """A bundle was refused; nothing from it was applied (it was discarded).

    ``failures`` lists an ``OpenFlowError`` for each message the switch rejected (usually
    one), ``error`` is the first of them (or the bundle-level error if none was reported).
    """

    def __init__(
        self,
        bundle_id: int,
        error: of.Error,
        xid: int,
        failures: Sequence[OpenFlowError],
        stage: str,
    ) -> None:
        self.bundle_id = bundle_id
        self.failures = list(failures)
        self.stage = stage
        first = self.failures[0] if self.failures else None
        super().__init__(
            first.error if first else error,
            first.xid if first else xid,
            first.request if first else f"bundle {bundle_id:#x} {stage}",
        )
        more = f" (+{len(self.failures) - 1} more)" if len(self.failures) > 1 else ""
        self.args = (f"bundle {bundle_id:#x} failed at {stage}: {self.args[0]}{more}",)
