"""One OpenFlow 1.5 connection as a sans-I/O state machine (the h11 split).

``Session`` owns everything about the protocol and nothing about I/O: received bytes go in
(``receive_data``) and come out as events; requests go in and come out as bytes to write
(``data_to_send``); time is a number the caller passes in. It does

* the handshake: HELLO with version negotiation (OpenFlow 1.5 or ``VersionMismatch``), the
  packet-in configuration, FEATURES (the datapath id) and a BARRIER, then ``Ready``;
* xid bookkeeping: each request's reply (or ``OFPT_ERROR``) is matched to it by xid,
  multipart replies are reassembled, replies nobody waits for are dropped;
* bundles: OPEN (pipelined), the adds, then on ``commit_bundle`` CLOSE; once the OPEN and
  CLOSE replies are in (so is every add's error), COMMIT, or DISCARD when anything failed.
  The outcome is one event, ``BundleCommitted`` or ``BundleFailed`` (a ``BundleError`` naming
  the failed messages: the adds are remembered by xid). ``BundleStatus`` says where each
  bundle stands;
* keepalive as decisions: ``poll(now)`` sends an echo when the line has been quiet for
  ``echo_interval`` and reports the peer dead when nothing came back for ``echo_timeout``;
  the handshake's steps each have ``connect_timeout``. ``next_deadline()`` says when to poll;
* the end: ``connection_lost`` fails every outstanding request with a ``ConnectionLost``
  that says what happened (closed or reset by the peer, or dropped by us and why; during
  which handshake step, or after how long connected).

The asyncio driver (``openflow.connection.Channel``) owns sockets, timers, futures and
reconnection.
"""

from __future__ import annotations

import enum
import itertools
import math
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ovsproxy.openflow import protocol as of
from ovsproxy.openflow.counters import WireCounters
from ovsproxy.openflow.errors import (
    BundleError,
    ChannelError,
    ChannelNotReady,
    ConnectionLost,
    OpenFlowError,
    RequestTimeout,
    VersionMismatch,
)

_MULTIPART_REPLY = int(of.MsgType.MULTIPART_REPLY)
_ECHO_REQUEST = int(of.MsgType.ECHO_REQUEST)
_ECHO_REPLY = int(of.MsgType.ECHO_REPLY)
_HELLO = int(of.MsgType.HELLO)
_ERROR = int(of.MsgType.ERROR)
_KEEPALIVE_DATA = b"ovsproxy"
_ADD_HEADER = of.BUNDLE_ADD_HEADER_LEN
_encode_bundle_add = of.encode_bundle_add

_VERSION = int(of.OFP_VERSION)
_BUNDLE_ADD = int(of.MsgType.BUNDLE_ADD_MESSAGE)
_ADD_OUTER = _ADD_HEADER + 8  # BUNDLE_ADD header + bundle part + the inner header
_MAX_BODY = of.OFP_MAX_MESSAGE_LEN - _ADD_OUTER
# What a message added by its body is named as when a failure must name it.
_ENCODED_KINDS: dict[int, Any] = {
    int(of.MsgType.FLOW_MOD): of.EncodedFlowMod,
    int(of.MsgType.GROUP_MOD): of.EncodedGroupMod,
}
_HEADER = struct.Struct("!BBHI")
# One multipart reply, all its parts: a dump of every flow of a large switch is tens of
# megabytes; a peer that never ends one is refused past this instead of kept until the timeout.
MAX_REPLY_BYTES = 256 << 20


class Phase(enum.Enum):
    """Where the session stands; the handshake phases' values say what it waits for."""

    HELLO = "waiting for the switch's HELLO"
    FEATURES = "waiting for FEATURES_REPLY"
    BARRIER = "waiting for the handshake's BARRIER_REPLY"
    OPEN = "open"
    CLOSED = "closed"


_HANDSHAKE = (Phase.HELLO, Phase.FEATURES, Phase.BARRIER)


# -- events -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ready:
    """The handshake is done: requests may be sent."""

    datapath_id: int


@dataclass(frozen=True, slots=True)
class HandshakeFailed:
    """The handshake cannot finish (``VersionMismatch``, an error reply, a timeout or the
    connection closing). Reported once; the driver drops the connection."""

    error: Exception


@dataclass(frozen=True, slots=True)
class Reply:
    """The reply to request ``xid``: a message, or for a multipart request the list of all
    its reply messages in order."""

    xid: int
    reply: Any


@dataclass(frozen=True, slots=True)
class RequestFailed:
    """Request (or tracked message) ``xid`` failed: an ``OpenFlowError`` from the switch,
    a ``ChannelError`` for an undecodable reply, or ``ConnectionLost``."""

    xid: int
    error: Exception


@dataclass(frozen=True, slots=True)
class PacketInReceived:
    message: of.PacketIn


@dataclass(frozen=True, slots=True)
class UnsolicitedError:
    """An OFPT_ERROR for an xid the session does not know (or no longer tracks)."""

    error: OpenFlowError


@dataclass(frozen=True, slots=True)
class MustClose:
    """The session cannot go on (garbage on the stream, a dead peer, a handshake step that
    timed out): the driver must drop the connection, then call ``connection_lost``."""

    error: ChannelError


@dataclass(frozen=True, slots=True)
class Closed:
    """An open session ended; ``error`` says how (see ``connection_lost``)."""

    error: ConnectionLost


@dataclass(frozen=True, slots=True)
class BundleCommitted:
    """The switch committed bundle ``bundle_id``: everything in it is installed."""

    bundle_id: int


@dataclass(frozen=True, slots=True)
class BundleFailed:
    """Bundle ``bundle_id`` will never be committed: ``error`` is a ``BundleError`` (refused at
    OPEN, at an add, at CLOSE or at COMMIT; the switch holds nothing from it), or a
    ``ConnectionLost`` when its connection closed while it was being committed."""

    bundle_id: int
    error: Exception


Event = (
    Ready
    | HandshakeFailed
    | Reply
    | RequestFailed
    | PacketInReceived
    | UnsolicitedError
    | MustClose
    | Closed
    | BundleCommitted
    | BundleFailed
)


# -- bundles ------------------------------------------------------------------------------------


class BundleMessages(Mapping[int, of.Message]):
    """A bundle's messages by xid. Those added one by one are kept as given; a run added by
    their bodies (``Session.bundle_add_bodies``: consecutive xids) is kept as the list of
    bodies, and each is made a message only when read (to name a failure), so a full sync
    keeps no object per message."""

    __slots__ = ("_in_runs", "_runs", "single")

    def __init__(self) -> None:
        self.single: dict[int, of.Message] = {}
        self._runs: list[tuple[int, int, Sequence[bytes]]] = []  # first xid, type, bodies
        self._in_runs = 0

    def add_run(self, first_xid: int, msg_type: int, bodies: Sequence[bytes]) -> None:
        self._runs.append((first_xid, msg_type, bodies))
        self._in_runs += len(bodies)

    def _run_item(self, xid: int) -> tuple[int, bytes] | None:
        for first, msg_type, bodies in self._runs:
            if first <= xid < first + len(bodies):
                return msg_type, bodies[xid - first]
        return None

    def __getitem__(self, xid: int) -> of.Message:
        msg = self.single.get(xid)
        if msg is not None:
            return msg
        found = self._run_item(xid)
        if found is None:
            raise KeyError(xid)
        msg_type, body = found
        kind = _ENCODED_KINDS.get(msg_type)
        if kind is not None:
            encoded: of.Message = kind(body)
            return encoded
        return of.decode(_HEADER.pack(_VERSION, msg_type, 8 + len(body), xid) + body)

    def __contains__(self, xid: object) -> bool:
        if xid in self.single:
            return True
        return type(xid) is int and self._run_item(xid) is not None

    def __iter__(self) -> Iterator[int]:
        yield from self.single
        for first, _, bodies in self._runs:
            yield from range(first, first + len(bodies))

    def __len__(self) -> int:
        return len(self.single) + self._in_runs


class BundleStatus(enum.StrEnum):
    """Where a bundle stands. ``OPEN`` (messages may be added) -> ``CLOSING`` (CLOSE sent;
    waiting for the OPEN and CLOSE replies) -> ``COMMITTING`` (COMMIT sent) -> ``COMMITTED``;
    or, when anything failed, ``DISCARDING`` (DISCARD sent) -> ``FAILED`` (also a refused
    COMMIT: the switch discards it itself). ``DISCARDED``: thrown away by the caller; ``LOST``:
    its connection closed first. A ``str`` (its value), so a bundle's ``state`` reads as text.
    """

    OPEN = "open"
    CLOSING = "closing"
    COMMITTING = "committing"
    DISCARDING = "discarding"
    COMMITTED = "committed"
    FAILED = "failed"
    DISCARDED = "discarded"
    LOST = "lost"


_ENDED = frozenset(
    (BundleStatus.COMMITTED, BundleStatus.FAILED, BundleStatus.DISCARDED, BundleStatus.LOST)
)
_OPEN = BundleStatus.OPEN
_OPEN_REQUEST = of.BundleCtrlType.OPEN_REQUEST
_CLOSE_REQUEST = of.BundleCtrlType.CLOSE_REQUEST
_COMMIT_REQUEST = of.BundleCtrlType.COMMIT_REQUEST
_DISCARD_REQUEST = of.BundleCtrlType.DISCARD_REQUEST


class BundleState:
    """One bundle's bookkeeping: its messages by xid (to name failures), the errors the
    switch reported for them, the replies to its OPEN and CLOSE, and per-kind tallies
    counted when it commits. ``state``: a ``BundleStatus``, changed only by the ``Session``.
    """

    __slots__ = (
        "_inner",
        "answered",
        "bundle_id",
        "errors",
        "failure_error",
        "flags",
        "lost",
        "messages",
        "open_xid",
        "state",
    )

    def __init__(self, bundle_id: int, flags: int) -> None:
        self.bundle_id = bundle_id
        self.flags = flags
        self.messages = BundleMessages()
        self.errors: list[OpenFlowError] = []
        self.state = BundleStatus.OPEN
        self.open_xid = 0
        # OPEN_REQUEST/CLOSE_REQUEST -> None (answered) or the switch's error for it
        self.answered: dict[of.BundleCtrlType, OpenFlowError | None] = {}
        self.failure_error: BundleError | None = None  # why it is being discarded
        self.lost: ConnectionLost | None = None
        self._inner: dict[int, list[int]] = {}  # msg_type -> [messages, bytes]

    @property
    def ended(self) -> bool:
        return self.state in _ENDED

    def not_open(self) -> ChannelError:
        """Why nothing more can be added to (or committed from) this bundle: for a bundle
        whose connection closed, a ``ConnectionLost`` that says how the connection ended."""
        if self.lost is not None:
            return _lost_with(self.bundle_id, self.lost)
        return ChannelError(f"bundle {self.bundle_id:#x} is {self.state.value}")

    def failure(self, error: OpenFlowError | None, stage: str) -> BundleError:
        """The ``BundleError`` for this bundle: the messages that failed, or ``error`` (the
        failed OPEN/CLOSE/COMMIT) when none did."""
        base = error if error is not None else self.errors[0]
        return BundleError(self.bundle_id, base.error, base.xid, self.errors, stage)

    def _record_error(self, xid: int, error: of.Error) -> None:
        msg = self.messages.get(xid)
        text = of.to_text(msg) if msg is not None else None
        self.errors.append(OpenFlowError(error, xid, text, msg))


def _lost_with(bundle_id: int, lost: ConnectionLost) -> ConnectionLost:
    return ConnectionLost(f"bundle {bundle_id:#x} was lost with its connection: {lost}")


@dataclass(slots=True)
class _Pending:
    request: of.Message | None
    wants_reply: bool  # False: tracked only so that an error for it is attributed
    parts: list[of.Message] | None = None  # multipart replies so far
    parts_bytes: int = 0  # their size on the wire


# -- the session ------------------------------------------------------------------------------


class Session:
    """One OpenFlow 1.5 connection's protocol state (see the module docstring).

    ``peer`` names the endpoint in messages; ``counters`` (shared across reconnections by
    the driver) counts every message in and out.
    """

    def __init__(
        self,
        peer: str,
        counters: WireCounters | None = None,
        *,
        miss_send_len: int = 0xFFFF,
        connect_timeout: float = 5.0,
        echo_interval: float = 5.0,
        echo_timeout: float = 15.0,
        max_reply_bytes: int = MAX_REPLY_BYTES,
    ) -> None:
        self.peer = peer
        self.max_reply_bytes = max_reply_bytes
        self.counters = counters if counters is not None else WireCounters()
        self.miss_send_len = miss_send_len
        self.connect_timeout = connect_timeout
        self.echo_interval = echo_interval
        self.echo_timeout = echo_timeout
        self.phase = Phase.HELLO
        self.datapath_id: int | None = None
        self.started_at = 0.0
        self.opened_at: float | None = None
        self.last_receive = 0.0
        self.ignored = 0  # replies for no request, and messages we cannot decode
        self._phase_started = 0.0
        self._parser = of.Parser()
        self._out: list[bytes] = []
        self.pending_output = 0  # bytes waiting in data_to_send
        # BUNDLE_ADDs in _out (counted when taken), and the bytes of everything else.
        self._adds_out = 0
        self._others_out_bytes = 0
        self._last_xid = 0  # xids are 1..2**32-1, then wrap
        self._bundle_ids = itertools.count(1)
        # A BUNDLE_ADD's layout per inner body size (outer header, bundle id and flags, inner
        # header, then the body): the bodies of a run are mostly of a few sizes.
        self._add_structs: dict[int, struct.Struct] = {}
        self._pending: dict[int, _Pending] = {}
        self._bundles: dict[int, BundleState] = {}  # not ended yet, by bundle id
        # xid of an OPEN/CLOSE/COMMIT/DISCARD -> its bundle and what it asked (answered here,
        # never as a Reply; late answers for a bundle that ended are absorbed)
        self._controls: dict[int, tuple[BundleState, of.BundleCtrlType]] = {}
        self._handshake_xid = 0
        self._handshake_reported = False
        self._echo_xid = 0
        self._echo_sent_at: float | None = None
        self._closing: ChannelError | None = None  # why we are dropping the connection
        self.lost: ConnectionLost | None = None  # how the connection ended, once it has

    # -- output ---------------------------------------------------------------------------

    def data_to_send(self) -> bytes:
        """The bytes to write, in order (and forgets them)."""
        if not self._out:
            return b""
        out = self._out
        data = out[0] if len(out) == 1 else b"".join(out)
        adds = self._adds_out
        if adds:
            size = len(data) - self._others_out_bytes
            self.counters.count_sent("BUNDLE_ADD_MESSAGE", size, adds)
        out.clear()
        self.pending_output = self._adds_out = self._others_out_bytes = 0
        return data

    def _queue(self, data: bytes, kind: str) -> None:
        size = len(data)
        self._out.append(data)
        self.pending_output += size
        self._others_out_bytes += size
        self.counters.count_sent(kind, size)

    def _next_xid(self) -> int:
        xid = self._last_xid + 1
        if xid > 0xFFFFFFFF:
            xid = 1
        self._last_xid = xid
        return xid

    def _take_xids(self, count: int) -> int:
        """``count`` consecutive xids (none of them 0); returns the first."""
        first = self._last_xid + 1
        if first + count - 1 > 0xFFFFFFFF:
            first = 1
        self._last_xid = first + count - 1
        return first

    def _write(self, msg: of.Message) -> int:
        xid = self._next_xid()
        self._queue(msg.encode(xid), of.message_kind(msg.msg_type))
        return xid

    # -- lifecycle ------------------------------------------------------------------------

    def connection_made(self, now: float) -> None:
        """The transport is up: say HELLO (offering OpenFlow 1.5 only)."""
        self.started_at = self._phase_started = self.last_receive = now
        self._write(of.Hello([of.OFP_VERSION]))

    @property
    def is_open(self) -> bool:
        return self.phase is Phase.OPEN and self._closing is None

    def close(self, reason: str, now: float) -> None:
        """We are dropping the connection ourselves (``reason``): what ``connection_lost``
        then reports. Nothing more is sent or received."""
        if self._closing is None and self.phase is not Phase.CLOSED:
            self._closing = ConnectionLost(
                f"{self.peer}: connection closed by us ({reason}) {self._when(now)}"
            )

    def connection_lost(self, now: float, exc: BaseException | None = None) -> list[Event]:
        """The transport closed (``exc`` as asyncio reports it: None for an orderly close).
        Fails everything outstanding with one ``ConnectionLost`` that says what happened."""
        if self.phase is Phase.CLOSED:
            return []
        error: ChannelError
        if self._closing is not None:
            error = self._closing
        elif exc is None:
            error = ConnectionLost(f"{self.peer}: connection closed by the peer {self._when(now)}")
        elif isinstance(exc, ConnectionResetError):
            error = ConnectionLost(f"{self.peer}: connection reset by the peer {self._when(now)}")
        else:
            error = ConnectionLost(f"{self.peer}: connection lost ({exc}) {self._when(now)}")
        lost = error if isinstance(error, ConnectionLost) else ConnectionLost(str(error))
        self.lost = lost
        events: list[Event] = []
        handshaking = self.phase in _HANDSHAKE
        self.phase = Phase.CLOSED
        events.extend(RequestFailed(xid, lost) for xid in self._pending)
        self._pending.clear()
        for bundle in self._bundles.values():
            if bundle.state is not BundleStatus.OPEN:  # its committer waits for the outcome
                events.append(BundleFailed(bundle.bundle_id, _lost_with(bundle.bundle_id, lost)))
            bundle.state = BundleStatus.LOST
            bundle.lost = lost
        self._bundles.clear()
        self._controls.clear()
        self._out.clear()
        self.pending_output = self._adds_out = self._others_out_bytes = 0
        if handshaking:
            if not self._handshake_reported:
                self._handshake_reported = True
                events.append(HandshakeFailed(error))
        else:
            events.append(Closed(lost))
        return events

    def _when(self, now: float) -> str:
        if self.phase is Phase.OPEN and self.opened_at is not None:
            return f"after {now - self.opened_at:.1f}s connected"
        if self.phase in _HANDSHAKE:
            return (
                f"during the handshake ({self.phase.value}, "
                f"{now - self.started_at:.1f}s after connecting)"
            )
        return ""

    def _must_close(self, error: ChannelError) -> MustClose:
        if self._closing is None:
            self._closing = error
        return MustClose(error)

    # -- time -----------------------------------------------------------------------------

    def next_deadline(self) -> float:
        """When ``poll`` has something to decide next (``math.inf``: never)."""
        if self._closing is not None or self.phase is Phase.CLOSED:
            return math.inf
        if self.phase is not Phase.OPEN:
            return self._phase_started + self.connect_timeout
        if self._echo_sent_at is not None:
            return max(self._echo_sent_at, self.last_receive) + self.echo_timeout
        return self.last_receive + self.echo_interval

    def poll(self, now: float) -> list[Event]:
        """Keepalive and handshake timeouts at time ``now``: queues an echo when the line has
        been quiet for ``echo_interval``; ``MustClose`` when a handshake step took over
        ``connect_timeout`` or the peer sent nothing for ``echo_timeout`` after an echo
        (anything received proves liveness, e.g. replies behind a long bundle)."""
        if self._closing is not None or self.phase is Phase.CLOSED:
            return []
        if self.phase is not Phase.OPEN:
            if now >= self._phase_started + self.connect_timeout:
                return [
                    self._must_close(
                        RequestTimeout(
                            f"{self.peer}: handshake timed out ({self.phase.value}, "
                            f"nothing within {self.connect_timeout}s)"
                        )
                    )
                ]
            return []
        if self._echo_sent_at is not None:
            # The same sums as next_deadline(): at that time, poll() decides.
            if now >= max(self._echo_sent_at, self.last_receive) + self.echo_timeout:
                return [
                    self._must_close(
                        ConnectionLost(
                            f"{self.peer}: silent for {now - self.last_receive:.1f}s "
                            f"(no echo reply within {self.echo_timeout}s): dead peer"
                        )
                    )
                ]
        elif now >= self.last_receive + self.echo_interval:
            self._echo_xid = self._write(of.EchoRequest(_KEEPALIVE_DATA))
            self._echo_sent_at = now
        return []

    # -- requests -------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closing is not None:
            raise ConnectionLost(str(self._closing))
        if self.phase is not Phase.OPEN:
            if self.phase is Phase.CLOSED:
                raise ConnectionLost(str(self.lost or f"{self.peer}: connection closed"))
            raise ChannelNotReady(f"{self.peer}: handshake in progress ({self.phase.value})")

    def request(self, msg: of.Message) -> int:
        """Queues a message that has a reply; its ``Reply`` or ``RequestFailed`` will carry
        the returned xid."""
        self._check_open()
        xid = self._write(msg)
        self._pending[xid] = _Pending(msg, True)
        return xid

    def send(self, msg: of.Message, *, track: bool = True) -> int:
        """Queues a message without a reply. Tracked (until ``forget``), an error for it is
        a ``RequestFailed`` naming it; untracked, an ``UnsolicitedError``."""
        self._check_open()
        xid = self._write(msg)
        if track:
            self._pending[xid] = _Pending(msg, False)
        return xid

    def forget(self, xid: int) -> None:
        """Stop tracking ``xid`` (its caller gave up): a late reply is dropped."""
        self._pending.pop(xid, None)

    @property
    def outstanding(self) -> int:
        """Requests and tracked messages not yet answered or forgotten."""
        return len(self._pending)

    # -- bundles --------------------------------------------------------------------------

    def open_bundle(self, flags: int) -> BundleState:
        """Queues a bundle OPEN (pipelined: adds follow at once, its reply is checked when
        the bundle is committed)."""
        self._check_open()
        bundle = BundleState(next(self._bundle_ids) & 0xFFFFFFFF, int(flags))
        bundle.open_xid = self._control(bundle, _OPEN_REQUEST)
        self._bundles[bundle.bundle_id] = bundle
        return bundle

    def _control(self, bundle: BundleState, ctrl: of.BundleCtrlType) -> int:
        xid = self._write(of.BundleCtrl(bundle.bundle_id, ctrl, bundle.flags))
        self._controls[xid] = (bundle, ctrl)
        return xid

    def bundle_add(self, bundle: BundleState, msg: of.Message) -> int:
        """Queues a FLOW_MOD, GROUP_MOD or PACKET_OUT into the bundle; returns its xid."""
        # The hot path of a full sync (one call per message): kept inline.
        if bundle.state is not _OPEN:
            raise bundle.not_open()
        xid = self._next_xid()
        data = _encode_bundle_add(bundle.bundle_id, msg, xid, bundle.flags)
        bundle.messages.single[xid] = msg
        size = len(data)
        row = bundle._inner.get(msg.msg_type)
        if row is None:
            bundle._inner[msg.msg_type] = [1, size - _ADD_HEADER]
        else:
            row[0] += 1
            row[1] += size - _ADD_HEADER
        self._out.append(data)
        self.pending_output += size
        self._adds_out += 1
        return xid

    def _add_struct(self, body_size: int) -> struct.Struct:
        found = self._add_structs.get(body_size)
        if found is None:
            found = struct.Struct(f"!BBHII2xHBBHI{body_size}s")
            if len(self._add_structs) < 1024:
                self._add_structs[body_size] = found
        return found

    def bundle_add_bodies(self, bundle: BundleState, msg_type: int, bodies: Sequence[bytes]) -> int:
        """Queues one message per body (the encoding of a ``msg_type`` message without its
        header: ``FlowMod.wire``, ``GroupMod.wire``) into the bundle, with consecutive xids;
        returns the first. The bundle keeps ``bodies`` (not copied: do not change it) and
        names a failing one as ``EncodedFlowMod``/``EncodedGroupMod`` (other types: decoded).
        The bulk path of a full sync: one loop, no object per message but its headers."""
        if bundle.state is not _OPEN:
            raise bundle.not_open()
        count = len(bodies)
        if not count:
            return 0
        longest = max(map(len, bodies))
        if longest > _MAX_BODY:
            raise of.MessageTooLarge(
                f"{of.message_kind(msg_type)} in a bundle", 8 + longest, of.MAX_BUNDLED_MESSAGE_LEN
            )
        first = xid = self._take_xids(count)
        bundle_id, flags = bundle.bundle_id, bundle.flags
        inner = sum(map(len, bodies)) + 8 * count
        # Headers and body packed in place, one call per message (bodies of a run are mostly
        # of a few sizes: one struct per size).
        data = bytearray(inner + (_ADD_HEADER * count))
        at = 0
        size = -1
        pack_into: Any = None
        for body in bodies:
            if len(body) != size:
                size = len(body)
                pack_into = self._add_struct(size).pack_into
            pack_into(
                data,
                at,
                _VERSION,
                _BUNDLE_ADD,
                size + _ADD_OUTER,
                xid,
                bundle_id,
                flags,
                _VERSION,
                msg_type,
                size + 8,
                xid,
                body,
            )
            at += size + _ADD_OUTER
            xid += 1
        bundle.messages.add_run(first, msg_type, bodies)
        row = bundle._inner.get(msg_type)
        if row is None:
            bundle._inner[msg_type] = [count, inner]
        else:
            row[0] += count
            row[1] += inner
        self._out.append(bytes(data))
        self.pending_output += len(data)
        self._adds_out += count
        return first

    def commit_bundle(self, bundle: BundleState) -> None:
        """Queues the bundle's CLOSE; the rest of the sequence runs on the switch's replies
        (COMMIT once OPEN and CLOSE succeeded and no add failed, else DISCARD) and ends in
        one ``BundleCommitted`` or ``BundleFailed``. CLOSE's reply comes after every add was
        processed, so every add error is in by then."""
        if bundle.state is not BundleStatus.OPEN:
            raise bundle.not_open()
        self._check_open()
        self._control(bundle, _CLOSE_REQUEST)
        bundle.state = BundleStatus.CLOSING
        self._advance(bundle)

    def discard_bundle(self, bundle: BundleState) -> None:
        """The caller gives the bundle up (an error while adding, a commit that timed out or
        was cancelled): no event will come for it. Unless its COMMIT is out, a DISCARD is
        queued (the switch then holds nothing from it) and it ends ``DISCARDED``; one whose
        COMMIT is out ends ``FAILED`` (whether the switch committed it is unknown). Ended
        bundles are left as they are."""
        if bundle.ended:
            return
        if bundle.state in (BundleStatus.COMMITTING, BundleStatus.DISCARDING):
            self._end(bundle, BundleStatus.FAILED)
            return
        if self.is_open:
            self._control(bundle, _DISCARD_REQUEST)
        self._end(bundle, BundleStatus.DISCARDED)

    def _advance(self, bundle: BundleState) -> None:
        """A CLOSING bundle's next step, once its OPEN and CLOSE replies say enough."""
        answered = bundle.answered
        if _OPEN_REQUEST not in answered:
            return  # waiting for the OPEN's reply
        refused = answered[_OPEN_REQUEST]
        if refused is None:  # opened: wait for the CLOSE's reply
            if _CLOSE_REQUEST not in answered:
                return
            refused = answered[_CLOSE_REQUEST]
        if refused is not None:
            self._fail(bundle, bundle.failure(refused, "open/close"))
        elif bundle.errors:
            self._fail(bundle, bundle.failure(None, "add"))
        else:
            self._control(bundle, _COMMIT_REQUEST)
            bundle.state = BundleStatus.COMMITTING

    def _fail(self, bundle: BundleState, error: BundleError) -> None:
        """Discard the bundle on the switch; ``BundleFailed`` comes with DISCARD's answer."""
        bundle.failure_error = error
        self._control(bundle, _DISCARD_REQUEST)
        bundle.state = BundleStatus.DISCARDING

    def _end(self, bundle: BundleState, state: BundleStatus) -> None:
        """The bundle is finished; a committed bundle's messages are counted as ``bundled``
        by their kind."""
        bundle.state = state
        self._bundles.pop(bundle.bundle_id, None)
        if state is BundleStatus.COMMITTED:
            for msg_type, (messages, size) in bundle._inner.items():
                self.counters.count_bundled(of.message_kind(msg_type), size, messages)

    def _on_bundle_answer(self, xid: int, error: of.Error | None, events: list[Event]) -> None:
        """A reply (``error`` None) or an error for one of a bundle's OPEN, CLOSE, COMMIT or
        DISCARD requests."""
        bundle, ctrl = self._controls.pop(xid)
        if bundle.ended:
            return  # given up, or decided already (e.g. a CLOSE after a refused OPEN)
        failed = None
        if error is not None:
            failed = OpenFlowError(error, xid, f"bundle {bundle.bundle_id:#x} {ctrl.name}")
        if ctrl is _OPEN_REQUEST or ctrl is _CLOSE_REQUEST:
            bundle.answered[ctrl] = failed
            if bundle.state is BundleStatus.CLOSING:
                self._advance(bundle)
        elif ctrl is _COMMIT_REQUEST:
            if failed is None:
                self._end(bundle, BundleStatus.COMMITTED)
                events.append(BundleCommitted(bundle.bundle_id))
            else:  # Open vSwitch has discarded the bundle (it always does at commit)
                self._end(bundle, BundleStatus.FAILED)
                events.append(BundleFailed(bundle.bundle_id, bundle.failure(failed, "commit")))
        elif bundle.state is BundleStatus.DISCARDING and bundle.failure_error is not None:
            # DISCARD answered, refused or not: either way the switch holds nothing of it.
            self._end(bundle, BundleStatus.FAILED)
            events.append(BundleFailed(bundle.bundle_id, bundle.failure_error))

    # -- input ----------------------------------------------------------------------------

    def receive_data(self, data: bytes, now: float) -> list[Event]:
        """Bytes from the switch, in any chunking: the events they complete."""
        events: list[Event] = []
        if self._closing is not None or self.phase is Phase.CLOSED:
            return events
        self.last_receive = now
        self._parser.feed(data)
        try:
            for raw in self._parser:
                self._on_message(raw, now, events)
                if self._closing is not None:
                    break
        except of.OpenFlowDecodeError as exc:
            events.append(
                self._must_close(ConnectionLost(f"{self.peer}: garbage from the switch: {exc}"))
            )
        return events

    def _on_message(self, raw: bytes, now: float, events: list[Event]) -> None:
        msg_type = raw[1]
        if raw[0] != of.OFP_VERSION and msg_type not in (_HELLO, _ERROR):
            # Only a desynchronized stream gets here (e.g. a reply whose 16-bit length
            # overflowed): nothing after it can be framed reliably.
            events.append(
                self._must_close(
                    ConnectionLost(f"{self.peer}: stream out of sync (version {raw[0]:#x})")
                )
            )
            return
        self.counters.count_received(of.message_kind(msg_type), len(raw))
        xid = int.from_bytes(raw[4:8], "big")
        if msg_type == _ECHO_REQUEST:
            reply = bytearray(raw)
            reply[1] = _ECHO_REPLY
            self._queue(bytes(reply), "ECHO_REPLY")
            return
        if msg_type == _ECHO_REPLY and xid == self._echo_xid and self._echo_sent_at is not None:
            self._echo_sent_at = None
            return
        try:
            msg = of.decode(raw)
        except of.OpenFlowDecodeError as exc:
            pending = self._pending.pop(xid, None)
            if pending is not None and pending.wants_reply:
                events.append(RequestFailed(xid, ChannelError(f"undecodable reply: {exc}")))
            else:
                if pending is not None:
                    self._pending[xid] = pending
                self.ignored += 1
            return
        if isinstance(msg, of.Hello):  # the decoder's value for every HELLO
            if self.phase is Phase.HELLO:
                self._on_hello(msg, now, events)
            return
        if isinstance(msg, of.Error):  # the decoder's value for every ERROR
            self._on_error(xid, msg, events)
            return
        if isinstance(msg, of.PacketIn):
            events.append(PacketInReceived(msg))
            return
        if self.phase in _HANDSHAKE and xid == self._handshake_xid:
            self._on_handshake_reply(msg, now, events)
            return
        if xid in self._controls:
            self._on_bundle_answer(xid, None, events)
            return
        pending = self._pending.get(xid)
        if pending is None or not pending.wants_reply:
            self.ignored += 1
            return
        if msg_type == _MULTIPART_REPLY:
            if pending.parts is None:
                pending.parts = []
            pending.parts.append(msg)
            pending.parts_bytes += len(raw)
            if pending.parts_bytes > self.max_reply_bytes:
                # Its later parts find no request: ignored, one at a time, nothing kept.
                del self._pending[xid]
                error = ChannelError(
                    f"{self.peer}: multipart reply to request {xid} exceeds "
                    f"{self.max_reply_bytes:,} bytes; dropped"
                )
                events.append(RequestFailed(xid, error))
                return
            if getattr(msg, "more", False):
                return
            del self._pending[xid]
            events.append(Reply(xid, pending.parts))
            return
        del self._pending[xid]
        events.append(Reply(xid, msg))

    def _on_hello(self, hello: of.Hello, now: float, events: list[Event]) -> None:
        if of.OFP_VERSION not in hello.versions:
            allowed = ", ".join(of.constants.VERSION_NAMES.get(v, str(v)) for v in hello.versions)
            self._handshake_failed(
                VersionMismatch(
                    f"{self.peer}: the bridge does not allow OpenFlow 1.5 (it offers {allowed}); "
                    "set protocols=OpenFlow15 on the bridge, e.g. "
                    "`ovs-vsctl set bridge br0 protocols=OpenFlow13,OpenFlow15`"
                ),
                events,
            )
            return
        # A management (service) connection gets packet-ins only with a nonzero
        # miss_send_len; NXT_PACKET_IN2 carries the controller action's userdata.
        self._write(of.SetConfig(0, self.miss_send_len))
        self._write(of.SetPacketInFormat(of.constants.NXPIF_NXT_PACKET_IN2))
        self._handshake_xid = self._write(of.FeaturesRequest())
        self.phase, self._phase_started = Phase.FEATURES, now

    def _on_handshake_reply(self, msg: of.Message, now: float, events: list[Event]) -> None:
        if self.phase is Phase.FEATURES and isinstance(msg, of.FeaturesReply):
            self.datapath_id = msg.datapath_id
            self._handshake_xid = self._write(of.BarrierRequest())
            self.phase, self._phase_started = Phase.BARRIER, now
        elif self.phase is Phase.BARRIER and isinstance(msg, of.BarrierReply):
            self.phase = Phase.OPEN
            self.opened_at = self.last_receive = now
            self._handshake_reported = True
            events.append(Ready(self.datapath_id or 0))
        else:
            self.ignored += 1

    def _handshake_failed(self, error: Exception, events: list[Event]) -> None:
        if not self._handshake_reported:
            self._handshake_reported = True
            events.append(HandshakeFailed(error))
        if self._closing is None:
            self._closing = error if isinstance(error, ChannelError) else ConnectionLost(f"{error}")

    def _on_error(self, xid: int, error: of.Error, events: list[Event]) -> None:
        if self.phase in _HANDSHAKE:
            if error.type == of.constants.OFPET_HELLO_FAILED:
                self._handshake_failed(
                    VersionMismatch(
                        f"{self.peer}: the switch refused the OpenFlow 1.5 hello "
                        f"({error.code_name}); set protocols=OpenFlow15 on the bridge"
                    ),
                    events,
                )
                return
            if xid == self._handshake_xid:
                self._handshake_failed(
                    OpenFlowError(error, xid, f"handshake ({self.phase.value})"), events
                )
                return
        if xid in self._controls:
            self._on_bundle_answer(xid, error, events)
            return
        pending = self._pending.pop(xid, None)
        if pending is not None:
            text = of.to_text(pending.request) if pending.request is not None else None
            events.append(RequestFailed(xid, OpenFlowError(error, xid, text, pending.request)))
            return
        for bundle in self._bundles.values():
            if xid in bundle.messages:
                bundle._record_error(xid, error)
                return
        events.append(UnsolicitedError(OpenFlowError(error, xid)))
