"""The sans-I/O OpenFlow session without sockets: bytes and times in, events and bytes out.

Every error path the live tests meet over a real socket (tests/openflow/test_live.py) is
driven here message by message: version mismatch, error replies, bundle errors naming the
failed message, multipart reassembly, unknown xids, echo timeouts, the connection closing
in every phase, and frames split at random points.
"""

from __future__ import annotations

import math
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ovsproxy.openflow import protocol as of
from ovsproxy.openflow import session as ses
from ovsproxy.openflow.errors import (
    BundleError,
    ChannelError,
    ChannelNotReady,
    ConnectionLost,
    OpenFlowError,
    RequestTimeout,
    VersionMismatch,
)

PEER = "unix:/run/test.mgmt"
DPID = 0xABCDEF
GROUP_EXISTS = of.Error(6, 0)  # OFPET_GROUP_MOD_FAILED/OFPGMFC_GROUP_EXISTS
BAD_TABLE = of.Error(5, 9)  # OFPET_FLOW_MOD_FAILED/OFPFMFC_BAD_TABLE_ID (code as sent by OVS)


def sent(session: ses.Session) -> list[tuple[int, of.Message]]:
    """What the session wants written, decoded as the switch would read it."""
    parser = of.Parser()
    parser.feed(session.data_to_send())
    return [(struct.unpack_from("!I", raw, 4)[0], of.decode(raw)) for raw in parser]


def new_session(**kw: float) -> ses.Session:
    session = ses.Session(PEER, **kw)  # type: ignore[arg-type]
    session.connection_made(0.0)
    return session


def handshake(session: ses.Session, now: float = 0.0) -> list[ses.Event]:
    """The switch's side of a good handshake; returns the events of its last step."""
    (hello,) = sent(session)
    assert isinstance(hello[1], of.Hello) and hello[1].versions == (of.OFP_VERSION,)
    assert session.receive_data(of.Hello([1, 4, 6]).encode(1), now) == []
    out = sent(session)
    assert [type(m).__name__ for _, m in out] == [
        "SetConfig",
        "SetPacketInFormat",
        "FeaturesRequest",
    ]
    assert out[0][1] == of.SetConfig(0, 0xFFFF)
    assert session.receive_data(of.FeaturesReply(DPID).encode(out[2][0]), now) == []
    ((barrier_xid, barrier),) = sent(session)
    assert isinstance(barrier, of.BarrierRequest)
    return session.receive_data(of.BarrierReply().encode(barrier_xid), now)


def open_session(**kw: float) -> ses.Session:
    session = new_session(**kw)
    assert handshake(session) == [ses.Ready(DPID)]
    return session


def flow(table: int = 10, reg: int = 1) -> of.FlowMod:
    return of.FlowMod(table, 100, of.Match(reg1=reg), actions=[of.Output(1)], cookie=0x51)


# -- handshake -------------------------------------------------------------------------------


def test_handshake_negotiates_1_5_and_reports_the_datapath() -> None:
    session = new_session()
    assert session.phase is ses.Phase.HELLO
    assert handshake(session) == [ses.Ready(DPID)]
    assert session.phase is ses.Phase.OPEN and session.is_open
    assert session.datapath_id == DPID
    counters = session.counters.snapshot()
    assert counters["sent"]["HELLO"]["messages"] == 1
    assert counters["received"]["BARRIER_REPLY"]["messages"] == 1


def test_a_bridge_without_1_5_is_a_version_mismatch_and_nothing_else_is_sent() -> None:
    session = new_session()
    sent(session)
    events = session.receive_data(of.Hello([1, 4]).encode(1), 0.0)
    ((event),) = events
    assert isinstance(event, ses.HandshakeFailed)
    assert isinstance(event.error, VersionMismatch)
    assert "protocols=OpenFlow15" in str(event.error) and "OpenFlow13" in str(event.error)
    assert sent(session) == []  # no features request to a switch that cannot speak 1.5
    assert session.connection_lost(0.1) == []  # reported once, not again as a lost connection


def test_a_refused_hello_is_a_version_mismatch() -> None:
    session = new_session()
    sent(session)
    error = of.Error(of.constants.OFPET_HELLO_FAILED, 0)
    (event,) = session.receive_data(error.encode(1), 0.0)
    assert isinstance(event, ses.HandshakeFailed) and isinstance(event.error, VersionMismatch)
    assert "refused the OpenFlow 1.5 hello" in str(event.error)


def test_an_error_reply_to_the_features_request_fails_the_handshake() -> None:
    session = new_session()
    sent(session)
    session.receive_data(of.Hello([6]).encode(1), 0.0)
    features_xid = sent(session)[2][0]
    (event,) = session.receive_data(of.Error(1, 1).encode(features_xid), 0.0)
    assert isinstance(event, ses.HandshakeFailed) and isinstance(event.error, OpenFlowError)
    assert event.error.xid == features_xid and "FEATURES_REPLY" in str(event.error)


@pytest.mark.parametrize("step", [0, 1, 2])
def test_each_handshake_step_times_out_on_its_own(step: int) -> None:
    session = new_session(connect_timeout=5.0)
    sent(session)
    now = 0.0
    if step >= 1:
        now = 4.0  # just inside the HELLO step: the next step gets its own 5 s
        session.receive_data(of.Hello([6]).encode(1), now)
        features_xid = sent(session)[2][0]
    if step >= 2:
        now = 8.0
        session.receive_data(of.FeaturesReply(DPID).encode(features_xid), now)
    assert session.next_deadline() == now + 5.0
    assert session.poll(now + 4.9) == []
    (event,) = session.poll(now + 5.0)
    assert isinstance(event, ses.MustClose) and isinstance(event.error, RequestTimeout)
    assert session.phase.value in str(event.error)
    assert session.next_deadline() == math.inf and session.poll(now + 10) == []
    (failed,) = session.connection_lost(now + 5.0)
    assert isinstance(failed, ses.HandshakeFailed) and failed.error is event.error


def test_requests_before_the_handshake_is_done_are_refused() -> None:
    session = new_session()
    with pytest.raises(ChannelNotReady, match="handshake in progress"):
        session.request(of.BarrierRequest())
    with pytest.raises(ChannelNotReady):
        session.open_bundle(0)


# -- requests and replies --------------------------------------------------------------------


def test_replies_are_matched_by_xid_in_any_order_and_unknown_ones_dropped() -> None:
    session = open_session()
    a = session.request(of.BarrierRequest())
    b = session.request(of.EchoRequest(b"b"))
    assert [xid for xid, _ in sent(session)] == [a, b]
    assert session.receive_data(of.BarrierReply().encode(0x7777), 1.0) == []  # nobody's
    assert session.ignored == 1 and session.outstanding == 2
    assert session.receive_data(of.EchoReply(b"b").encode(b), 1.0) == [
        ses.Reply(b, of.EchoReply(b"b"))
    ]
    assert session.receive_data(of.BarrierReply().encode(a), 1.0) == [
        ses.Reply(a, of.BarrierReply())
    ]
    assert session.receive_data(of.BarrierReply().encode(a), 1.0) == []  # answered already
    assert session.outstanding == 0


def test_a_forgotten_request_drops_its_late_reply() -> None:
    session = open_session()
    xid = session.request(of.BarrierRequest())
    session.forget(xid)  # e.g. its caller timed out
    assert session.receive_data(of.BarrierReply().encode(xid), 1.0) == []
    assert session.ignored == 1


def test_an_error_reply_fails_its_request_and_names_it() -> None:
    session = open_session()
    request = of.FlowDescRequest(200)
    xid = session.request(request)
    (event,) = session.receive_data(BAD_TABLE.encode(xid), 1.0)
    assert isinstance(event, ses.RequestFailed) and event.xid == xid
    assert isinstance(event.error, OpenFlowError)
    assert event.error.name == BAD_TABLE.name and event.error.message == request
    assert event.error.request == of.to_text(request)


def test_errors_for_tracked_messages_are_attributed_and_others_are_unsolicited() -> None:
    session = open_session()
    bad = flow(table=250)
    tracked = session.send(bad)
    untracked = session.send(flow(), track=False)
    (failed,) = session.receive_data(BAD_TABLE.encode(tracked), 1.0)
    assert isinstance(failed, ses.RequestFailed) and failed.xid == tracked
    assert failed.error.message == bad  # type: ignore[attr-defined]
    (stray,) = session.receive_data(BAD_TABLE.encode(untracked), 1.0)
    assert isinstance(stray, ses.UnsolicitedError) and stray.error.xid == untracked
    (stray,) = session.receive_data(BAD_TABLE.encode(0x5555), 1.0)
    assert isinstance(stray, ses.UnsolicitedError)


def test_an_undecodable_reply_fails_its_request_and_is_ignored_otherwise() -> None:
    session = open_session()
    xid = session.request(of.BarrierRequest())
    unknown_type = bytes([of.OFP_VERSION, 99, 0, 8]) + xid.to_bytes(4, "big")
    (event,) = session.receive_data(unknown_type, 1.0)
    assert isinstance(event, ses.RequestFailed) and isinstance(event.error, ChannelError)
    assert "undecodable reply" in str(event.error)
    assert session.receive_data(unknown_type[:4] + bytes(4), 1.0) == []  # nobody's
    assert session.ignored == 1


def test_multipart_replies_are_reassembled_across_many_parts() -> None:
    session = open_session()
    dump = session.request(of.FlowDescRequest())
    other = session.request(of.BarrierRequest())
    descs = [of.FlowDesc(flow(reg=i)) for i in range(120)]
    parts = [of.FlowDescReply(descs[i : i + 7], more=i + 7 < 120) for i in range(0, 120, 7)]
    events: list[ses.Event] = []
    for i, part in enumerate(parts):
        events += session.receive_data(part.encode(dump), 1.0)
        if i == 3:  # another reply in the middle of the dump
            events += session.receive_data(of.BarrierReply().encode(other), 1.0)
    assert events[0] == ses.Reply(other, of.BarrierReply())
    (reply,) = events[1:]
    assert isinstance(reply, ses.Reply) and reply.xid == dump and len(reply.reply) == len(parts)
    assert [f.flow for part in reply.reply for f in part.flows] == [d.flow for d in descs]
    assert session.counters.snapshot()["received"]["MULTIPART_REPLY"]["messages"] == len(parts)


def test_a_packet_in_is_an_event() -> None:
    session = open_session()
    packet_in = of.PacketIn(of.PacketInReason.ACTION, 13, 0, of.Match(in_port=7), b"x" * 60)
    (event,) = session.receive_data(packet_in.encode(0), 1.0)
    assert isinstance(event, ses.PacketInReceived) and event.message.in_port == 7


def test_an_echo_request_from_the_switch_is_answered_with_its_xid_and_data() -> None:
    session = open_session()
    assert session.receive_data(of.EchoRequest(b"ping").encode(0x42), 1.0) == []
    assert sent(session) == [(0x42, of.EchoReply(b"ping"))]


# -- bundles ------------------------------------------------------------------------------------

OPEN, CLOSE = of.BundleCtrlType.OPEN_REQUEST, of.BundleCtrlType.CLOSE_REQUEST
COMMIT, DISCARD = of.BundleCtrlType.COMMIT_REQUEST, of.BundleCtrlType.DISCARD_REQUEST
BAD_ID = of.Error(17, 2)  # OFPET_BUNDLE_FAILED/OFPBFC_BAD_ID
BUNDLE_FAILED = of.Error(17, 14)  # OFPET_BUNDLE_FAILED/OFPBFC_MSG_FAILED


def open_bundle(session: ses.Session) -> ses.BundleState:
    bundle = session.open_bundle(of.BundleFlags.ATOMIC | of.BundleFlags.ORDERED)
    ((xid, ctrl),) = sent(session)
    assert xid == bundle.open_xid and isinstance(ctrl, of.BundleCtrl)
    assert ctrl.ctrl_type == OPEN
    return bundle


def controls(session: ses.Session) -> list[tuple[int, of.BundleCtrlType]]:
    """The bundle control requests the session wrote (adds left out), as (xid, request)."""
    return [
        (xid, of.BundleCtrlType(m.ctrl_type))
        for xid, m in sent(session)
        if isinstance(m, of.BundleCtrl)
    ]


def answer(bundle: ses.BundleState, xid: int, ctrl: of.BundleCtrlType) -> bytes:
    """The switch's reply to a bundle control request (OPEN_REQUEST -> OPEN_REPLY, ...)."""
    reply = of.BundleCtrlType(int(ctrl) + 1)
    return of.BundleCtrl(bundle.bundle_id, reply, bundle.flags).encode(xid)


def commit(session: ses.Session, bundle: ses.BundleState) -> list[ses.Event]:
    """Commit with a switch that accepts it all: OPEN and CLOSE answered, then COMMIT."""
    session.commit_bundle(bundle)
    ((close, ctrl),) = controls(session)
    assert ctrl is CLOSE and bundle.state is ses.BundleStatus.CLOSING
    both = answer(bundle, bundle.open_xid, OPEN) + answer(bundle, close, CLOSE)
    assert session.receive_data(both, 1.0) == []
    ((xid, ctrl),) = controls(session)
    assert ctrl is COMMIT and bundle.state is ses.BundleStatus.COMMITTING
    return session.receive_data(answer(bundle, xid, COMMIT), 1.0)


def test_a_committed_bundle_is_one_event_and_counts_its_messages_by_kind() -> None:
    session = open_session()
    bundle = open_bundle(session)
    messages = [flow(reg=i) for i in range(5)]
    for m in messages:
        session.bundle_add(bundle, m)
    assert session.pending_output == sum(m.length + of.BUNDLE_ADD_HEADER_LEN for m in messages)
    assert "FLOW_MOD" not in session.counters.snapshot()["bundled"]  # not before the commit
    assert commit(session, bundle) == [ses.BundleCommitted(bundle.bundle_id)]
    assert bundle.state is ses.BundleStatus.COMMITTED and bundle.state == "committed"
    counters = session.counters.snapshot()
    assert counters["bundled"]["FLOW_MOD"] == {
        "messages": 5,
        "bytes": sum(m.length for m in messages),
    }
    assert counters["sent"]["BUNDLE_ADD_MESSAGE"]["messages"] == 5
    with pytest.raises(ChannelError, match="is committed"):
        session.bundle_add(bundle, flow())
    with pytest.raises(ChannelError, match="is committed"):
        session.commit_bundle(bundle)
    assert session.outstanding == 0 and session._controls == {}


def test_add_errors_discard_the_bundle_and_name_the_messages_that_failed() -> None:
    session = open_session()
    bundle = open_bundle(session)
    messages = [flow(reg=i) for i in range(10)]
    xids = [session.bundle_add(bundle, m) for m in messages]
    adds = sent(session)
    assert [x for x, _ in adds] == xids
    assert all(isinstance(m, of.BundleAdd) and m.bundle_id == bundle.bundle_id for _, m in adds)
    # The OPEN's reply is the session's own business: no event.
    assert session.receive_data(answer(bundle, bundle.open_xid, OPEN), 1.0) == []
    # Two adds fail (OVS reports an add's error under the add's xid), then CLOSE is answered.
    assert session.receive_data(GROUP_EXISTS.encode(xids[3]) + BAD_TABLE.encode(xids[7]), 1.0) == []
    session.commit_bundle(bundle)
    ((close, _),) = controls(session)
    assert session.receive_data(answer(bundle, close, CLOSE), 1.0) == []
    # No COMMIT: a DISCARD, and the failure is reported once the switch has answered it.
    ((discard, ctrl),) = controls(session)
    assert ctrl is DISCARD and bundle.state is ses.BundleStatus.DISCARDING
    (event,) = session.receive_data(answer(bundle, discard, DISCARD), 1.0)
    assert isinstance(event, ses.BundleFailed) and event.bundle_id == bundle.bundle_id
    failure = event.error
    assert isinstance(failure, BundleError)
    assert [f.message for f in failure.failures] == [messages[3], messages[7]]
    assert failure.name == GROUP_EXISTS.name and failure.xid == xids[3]
    assert of.to_text(messages[3]) in str(failure) and "(+1 more)" in str(failure)
    assert f"bundle {bundle.bundle_id:#x} failed at add" in str(failure)
    assert bundle.state is ses.BundleStatus.FAILED
    assert "FLOW_MOD" not in session.counters.snapshot()["bundled"]  # nothing was installed


def test_a_refused_open_is_the_bundle_level_error_and_the_close_refused_after_it_is_absorbed() -> (
    None
):
    session = open_session()
    bundle = open_bundle(session)
    session.bundle_add(bundle, flow())
    sent(session)
    # Refused while the bundle is still being streamed: remembered, nothing to report yet.
    assert session.receive_data(BAD_ID.encode(bundle.open_xid), 1.0) == []
    assert bundle.state is ses.BundleStatus.OPEN
    session.commit_bundle(bundle)
    (close, first), (discard, then) = controls(session)
    assert (first, then) == (CLOSE, DISCARD)
    assert session.receive_data(BAD_ID.encode(close), 1.0) == []  # not an UnsolicitedError
    (event,) = session.receive_data(BAD_ID.encode(discard), 1.0)  # refused too: still ended
    assert isinstance(event, ses.BundleFailed) and isinstance(event.error, BundleError)
    assert event.error.failures == [] and event.error.xid == bundle.open_xid
    assert "failed at open/close" in str(event.error)


def test_a_refused_close_discards_and_a_refused_commit_does_not() -> None:
    session = open_session()
    bundle = open_bundle(session)
    session.commit_bundle(bundle)
    ((close, _),) = controls(session)
    data = answer(bundle, bundle.open_xid, OPEN) + BUNDLE_FAILED.encode(close)
    assert session.receive_data(data, 1.0) == []
    ((discard, ctrl),) = controls(session)
    assert ctrl is DISCARD
    (event,) = session.receive_data(answer(bundle, discard, DISCARD), 1.0)
    assert isinstance(event, ses.BundleFailed) and event.error.xid == close  # type: ignore[attr-defined]
    assert "failed at open/close" in str(event.error)

    bundle = open_bundle(session)
    session.commit_bundle(bundle)
    ((close, _),) = controls(session)
    both = answer(bundle, bundle.open_xid, OPEN) + answer(bundle, close, CLOSE)
    session.receive_data(both, 1.0)
    ((xid, ctrl),) = controls(session)
    assert ctrl is COMMIT
    (event,) = session.receive_data(BUNDLE_FAILED.encode(xid), 1.0)
    assert isinstance(event, ses.BundleFailed) and "failed at commit" in str(event.error)
    assert controls(session) == []  # Open vSwitch discards a bundle whose commit fails
    assert bundle.state is ses.BundleStatus.FAILED


def test_a_discarded_bundle_sends_discard_and_its_late_answers_are_absorbed() -> None:
    session = open_session()
    bundle = open_bundle(session)
    session.bundle_add(bundle, flow())
    sent(session)
    session.discard_bundle(bundle)
    ((discard, ctrl),) = controls(session)
    assert ctrl is DISCARD and bundle.state is ses.BundleStatus.DISCARDED
    session.discard_bundle(bundle)  # again: nothing
    assert controls(session) == []
    data = answer(bundle, bundle.open_xid, OPEN) + answer(bundle, discard, DISCARD)
    assert session.receive_data(data, 1.0) == []
    assert session.ignored == 0 and session._controls == {}
    with pytest.raises(ChannelError, match="is discarded"):
        session.commit_bundle(bundle)

    # Given up with its COMMIT out (a timeout): whether the switch committed it is unknown,
    # so no DISCARD, and the late answer brings no event.
    bundle = open_bundle(session)
    session.commit_bundle(bundle)
    ((close, _),) = controls(session)
    session.receive_data(answer(bundle, bundle.open_xid, OPEN) + answer(bundle, close, CLOSE), 1.0)
    ((xid, _),) = controls(session)
    session.discard_bundle(bundle)
    assert controls(session) == [] and bundle.state is ses.BundleStatus.FAILED
    assert session.receive_data(answer(bundle, xid, COMMIT), 1.0) == []
    assert "FLOW_MOD" not in session.counters.snapshot()["bundled"]


def test_closing_under_bundles_fails_the_one_being_committed_and_loses_the_streamed_one() -> None:
    session = open_session()
    streamed, committing = open_bundle(session), open_bundle(session)
    session.commit_bundle(committing)
    sent(session)
    events = session.connection_lost(5.0)
    assert [type(e) for e in events] == [ses.BundleFailed, ses.Closed]
    failed, closed = events
    assert failed.bundle_id == committing.bundle_id  # type: ignore[union-attr]
    assert isinstance(failed.error, ConnectionLost)  # type: ignore[union-attr]
    assert str(failed.error) == (  # type: ignore[union-attr]
        f"bundle {committing.bundle_id:#x} was lost with its connection: {closed.error}"  # type: ignore[union-attr]
    )
    assert streamed.state is committing.state is ses.BundleStatus.LOST
    session.discard_bundle(streamed)  # nothing to send on a closed connection
    assert streamed.state is ses.BundleStatus.LOST and session.data_to_send() == b""


@st.composite
def switch_answers(draw: st.DrawFn) -> dict[str, object]:
    """How a switch answers one bundle: each control request accepted or refused, some adds
    refused, and the bytes it sends cut anywhere."""
    return {
        "adds": draw(st.integers(min_value=0, max_value=6)),
        "refused_adds": draw(st.sets(st.integers(min_value=0, max_value=5), max_size=3)),
        "refuse": draw(st.sets(st.sampled_from([OPEN, CLOSE, COMMIT, DISCARD]))),
        "cuts": draw(st.lists(st.integers(min_value=1, max_value=40), max_size=8)),
    }


@settings(max_examples=300, deadline=None)
@given(switch_answers())
def test_a_bundle_ends_in_exactly_one_outcome_whatever_the_switch_answers(
    plan: dict[str, object],
) -> None:
    """The sequence as a whole: the switch answers each request in order (refusing the ones
    in ``refuse``), its bytes split anywhere. COMMIT is sent only when OPEN, every add and
    CLOSE succeeded, and is the last request; otherwise DISCARD is. Exactly one outcome."""
    adds = plan["adds"]
    refused_adds: set[int] = {i for i in plan["refused_adds"] if i < adds}  # type: ignore[attr-defined]
    refuse: set[of.BundleCtrlType] = plan["refuse"]  # type: ignore[assignment]
    cuts: list[int] = plan["cuts"]  # type: ignore[assignment]
    session = open_session()
    bundle = session.open_bundle(of.BundleFlags.ATOMIC | of.BundleFlags.ORDERED)
    messages = [flow(reg=i) for i in range(adds)]  # type: ignore[arg-type]
    for m in messages:
        session.bundle_add(bundle, m)
    session.commit_bundle(bundle)
    requests: list[of.BundleCtrlType] = []
    events: list[ses.Event] = []
    while out := sent(session):
        reply = b""
        add = 0
        for xid, msg in out:
            if isinstance(msg, of.BundleAdd):
                if add in refused_adds:
                    reply += BAD_TABLE.encode(xid)
                add += 1
                continue
            assert isinstance(msg, of.BundleCtrl)
            ctrl = of.BundleCtrlType(msg.ctrl_type)
            requests.append(ctrl)
            reply += BAD_ID.encode(xid) if ctrl in refuse else answer(bundle, xid, ctrl)
        pos = 0
        for size in [*cuts, len(reply)]:
            events += session.receive_data(reply[pos : pos + size], 1.0)
            pos += size
    goes_through = not refused_adds and not refuse & {OPEN, CLOSE}
    assert requests == [OPEN, CLOSE, COMMIT if goes_through else DISCARD]
    (event,) = events
    if goes_through and COMMIT not in refuse:
        assert event == ses.BundleCommitted(bundle.bundle_id)
        assert bundle.state is ses.BundleStatus.COMMITTED
        bundled = session.counters.snapshot()["bundled"].get("FLOW_MOD", {"messages": 0})
        assert bundled["messages"] == adds
    else:
        assert isinstance(event, ses.BundleFailed) and isinstance(event.error, BundleError)
        assert bundle.state is ses.BundleStatus.FAILED
        assert "FLOW_MOD" not in session.counters.snapshot()["bundled"]
        named = [f.message for f in event.error.failures]
        # decided at a refused OPEN's answer: the adds' errors come after it
        assert named == ([] if OPEN in refuse else [messages[i] for i in sorted(refused_adds)])
        stage = "commit" if goes_through else "add" if not refuse & {OPEN, CLOSE} else "open/close"
        assert f"failed at {stage}" in str(event.error)
    assert session._bundles == {} and session._controls == {} and session.ignored == 0


# -- keepalive --------------------------------------------------------------------------------


def test_an_echo_is_due_after_a_quiet_interval_and_its_reply_clears_it() -> None:
    session = open_session(echo_interval=5.0, echo_timeout=15.0)
    assert session.next_deadline() == 5.0
    assert session.poll(4.9) == [] and sent(session) == []
    assert session.poll(5.0) == []
    ((xid, echo),) = sent(session)
    assert isinstance(echo, of.EchoRequest)
    assert session.next_deadline() == 20.0
    assert session.receive_data(of.EchoReply(echo.data).encode(xid), 6.0) == []  # no event
    assert session.next_deadline() == 11.0  # quiet since 6.0: next echo at 11.0
    assert session.poll(10.0) == [] and sent(session) == []


def test_traffic_postpones_the_echo() -> None:
    session = open_session(echo_interval=5.0)
    xid = session.request(of.BarrierRequest())
    session.receive_data(of.BarrierReply().encode(xid), 4.0)
    sent(session)
    assert session.poll(5.0) == [] and sent(session) == []
    assert session.next_deadline() == 9.0


def test_a_silent_peer_is_dead_after_the_echo_timeout() -> None:
    session = open_session(echo_interval=5.0, echo_timeout=15.0)
    session.poll(5.0)
    sent(session)
    assert session.poll(19.9) == []
    (event,) = session.poll(20.0)
    assert isinstance(event, ses.MustClose) and isinstance(event.error, ConnectionLost)
    assert "silent for 20.0s" in str(event.error) and "dead peer" in str(event.error)
    (closed,) = session.connection_lost(20.0)
    assert isinstance(closed, ses.Closed) and "dead peer" in str(closed.error)


def test_anything_received_after_the_echo_proves_liveness() -> None:
    session = open_session(echo_interval=5.0, echo_timeout=15.0)
    xid = session.request(of.FlowDescRequest())  # a long dump: the echo reply waits behind it
    session.poll(5.0)
    sent(session)
    for t in (10.0, 18.0, 30.0):
        session.receive_data(of.FlowDescReply([], more=True).encode(xid), t)
        assert session.poll(t + 14.9) == []
    (event,) = session.poll(45.0)
    assert isinstance(event, ses.MustClose)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(min_value=0.0, max_value=8.0), st.sampled_from("-tr")),
        min_size=1,
        max_size=40,
    )
)
def test_keepalive_decisions_follow_the_quiet_time(steps: list[tuple[float, str]]) -> None:
    """Random timelines of polls, other traffic (t) and echo replies (r): an echo only
    after a quiet interval, never two outstanding, and death only after echo_timeout of
    silence since both the echo and the last byte received."""
    interval, timeout = 5.0, 15.0
    session = open_session(echo_interval=interval, echo_timeout=timeout)
    now, last_receive, echo_at, echo_xid = 0.0, 0.0, None, 0
    for delta, action in steps:
        now += delta
        if action == "t":
            xid = session.request(of.BarrierRequest())
            session.receive_data(of.BarrierReply().encode(xid), now)
            last_receive = now
        elif action == "r" and echo_at is not None:
            assert session.receive_data(of.EchoReply(b"ovsproxy").encode(echo_xid), now) == []
            last_receive, echo_at = now, None
        session.data_to_send()
        events = session.poll(now)
        echoes = [(x, m) for x, m in sent(session) if isinstance(m, of.EchoRequest)]
        if events:
            (event,) = events
            assert isinstance(event, ses.MustClose)
            assert echo_at is not None and now >= max(echo_at, last_receive) + timeout
            return
        if echoes:
            assert echo_at is None and now >= last_receive + interval
            ((echo_xid, _),) = echoes
            echo_at = now
        else:
            assert echo_at is not None or now < last_receive + interval
        assert session.next_deadline() > now


# -- the end -----------------------------------------------------------------------------------


def _to_phase(phase: ses.Phase) -> ses.Session:
    session = new_session()
    sent(session)
    if phase is ses.Phase.HELLO:
        return session
    session.receive_data(of.Hello([6]).encode(1), 0.5)
    if phase is ses.Phase.FEATURES:
        return session
    session.receive_data(of.FeaturesReply(DPID).encode(sent(session)[2][0]), 0.5)
    return session


@pytest.mark.parametrize("phase", [ses.Phase.HELLO, ses.Phase.FEATURES, ses.Phase.BARRIER])
def test_closing_during_the_handshake_says_which_step(phase: ses.Phase) -> None:
    session = _to_phase(phase)
    (event,) = session.connection_lost(2.0)
    assert isinstance(event, ses.HandshakeFailed) and isinstance(event.error, ConnectionLost)
    assert str(event.error) == (
        f"{PEER}: connection closed by the peer during the handshake "
        f"({phase.value}, 2.0s after connecting)"
    )
    assert session.phase is ses.Phase.CLOSED and session.connection_lost(3.0) == []


def test_closing_after_the_handshake_fails_everything_outstanding_and_says_how_long() -> None:
    session = open_session()
    plain = session.request(of.BarrierRequest())
    dump = session.request(of.FlowDescRequest())
    session.receive_data(of.FlowDescReply([], more=True).encode(dump), 1.0)  # half a dump
    tracked = session.send(flow())
    sent(session)
    bundle = open_bundle(session)
    session.bundle_add(bundle, flow())
    events = session.connection_lost(123.4)
    closed = events[-1]
    assert isinstance(closed, ses.Closed)
    assert str(closed.error) == f"{PEER}: connection closed by the peer after 123.4s connected"
    failed = {e.xid: e.error for e in events if isinstance(e, ses.RequestFailed)}
    assert set(failed) == {plain, dump, tracked}  # (the bundle's OPEN is the session's own)
    assert all(isinstance(e, ConnectionLost) for e in failed.values())
    assert bundle.state is ses.BundleStatus.LOST
    # A bundle still being streamed learns how its connection ended (not just "lost").
    lost_with = f"bundle {bundle.bundle_id:#x} was lost with its connection: {closed.error}"
    with pytest.raises(ConnectionLost) as added:
        session.bundle_add(bundle, flow())
    assert str(added.value) == lost_with
    with pytest.raises(ConnectionLost) as committed:
        session.commit_bundle(bundle)
    assert str(committed.value) == lost_with
    assert session.lost is closed.error
    with pytest.raises(ConnectionLost):
        session.request(of.BarrierRequest())
    assert session.data_to_send() == b""


def test_a_reset_and_our_own_close_are_told_apart() -> None:
    session = open_session()
    (closed,) = session.connection_lost(7.0, ConnectionResetError(104, "reset"))
    assert "connection reset by the peer after 7.0s connected" in str(closed.error)  # type: ignore[union-attr]
    session = open_session()
    session.close("the channel was closed", 3.0)
    with pytest.raises(ConnectionLost, match="closed by us"):
        session.request(of.BarrierRequest())
    assert session.receive_data(of.BarrierReply().encode(1), 3.5) == []  # nothing after it
    (closed,) = session.connection_lost(4.0)
    assert str(closed.error) == (  # type: ignore[union-attr]
        f"{PEER}: connection closed by us (the channel was closed) after 3.0s connected"
    )


def test_garbage_and_a_desynchronized_stream_must_close() -> None:
    session = open_session()
    (event,) = session.receive_data(bytes([6, 0, 0, 4, 0, 0, 0, 1]), 1.0)  # length 4 < header
    assert isinstance(event, ses.MustClose) and "garbage from the switch" in str(event.error)
    assert session.receive_data(of.BarrierReply().encode(1), 1.0) == []  # ignored from now on
    session = open_session()
    xid = session.request(of.BarrierRequest())
    wrong_version = bytes([4, 21, 0, 8]) + xid.to_bytes(4, "big")
    (event,) = session.receive_data(wrong_version + of.BarrierReply().encode(xid), 1.0)
    assert isinstance(event, ses.MustClose) and "out of sync (version 0x4)" in str(event.error)
    (lost,) = [e for e in session.connection_lost(1.0) if isinstance(e, ses.RequestFailed)]
    assert lost.xid == xid and "out of sync" in str(lost.error)


# -- framing ------------------------------------------------------------------------------------


def _switch_script(xids: dict[str, int]) -> bytes:
    """Everything a switch sends in a session, as one byte string."""
    parts = [
        of.EchoRequest(b"keepalive").encode(0x99),
        of.Error(1, 1).encode(xids["tracked"]),
        *(
            of.FlowDescReply([of.FlowDesc(flow(reg=i))], more=i < 30).encode(xids["dump"])
            for i in range(31)
        ),
        of.PacketIn(of.PacketInReason.ACTION, 13, 0, of.Match(in_port=3), b"p" * 90).encode(0),
        of.BarrierReply().encode(xids["barrier"]),
    ]
    return b"".join(parts)


def _comparable(events: list[ses.Event]) -> list[tuple[object, ...]]:
    """Events with their exceptions as (type, text): exceptions compare by identity."""
    out: list[tuple[object, ...]] = []
    for event in events:
        error = getattr(event, "error", None)
        if error is None:
            out.append((event,))
        else:
            out.append((type(event), getattr(event, "xid", None), type(error), str(error)))
    return out


def _run(cuts: list[int]) -> tuple[list[tuple[object, ...]], bytes]:
    """A session fed the switch's script cut into pieces of the given sizes (the rest in
    one piece): its events and what it wrote back."""
    session = open_session()
    xids = {
        "dump": session.request(of.FlowDescRequest()),
        "tracked": session.send(flow()),
        "barrier": session.request(of.BarrierRequest()),
    }
    session.data_to_send()
    script = _switch_script(xids)
    events: list[ses.Event] = []
    pos = 0
    for size in [*cuts, len(script)]:
        events += session.receive_data(script[pos : pos + size], 1.0)
        pos += size
    return _comparable(events), session.data_to_send()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=400), max_size=60))
def test_frames_split_anywhere_give_the_same_events(cuts: list[int]) -> None:
    whole_events, whole_out = _run([])
    kinds = [e[0] if isinstance(e[0], type) else type(e[0]) for e in whole_events]
    assert kinds == [ses.RequestFailed, ses.Reply, ses.PacketInReceived, ses.Reply]
    assert len(whole_events[1][0].reply) == 31  # type: ignore[attr-defined]
    events, out = _run(cuts)
    assert events == whole_events
    assert out == whole_out  # the echo reply, whatever the chunking


def test_no_event_before_a_frame_is_complete() -> None:
    session = open_session()
    xid = session.request(of.BarrierRequest())
    reply = of.BarrierReply().encode(xid)
    for i in range(len(reply) - 1):
        assert session.receive_data(reply[i : i + 1], 1.0) == []
    assert session.receive_data(reply[-1:], 1.0) == [ses.Reply(xid, of.BarrierReply())]


def test_a_run_of_bodies_is_the_same_adds_and_names_its_failures() -> None:
    """``bundle_add_bodies``: the bytes of one ``bundle_add`` per message (consecutive
    xids), counted alike; a failing one is named by its encoding, and decodes to it."""
    other_size = of.FlowMod(7, 100, of.Match(reg1=3, reg2=4), actions=[of.Output(1)])
    messages = [flow(reg=i) for i in range(6)] + [other_size]
    by_one, by_run = open_session(), open_session()
    one, run = open_bundle(by_one), open_bundle(by_run)
    xids = [by_one.bundle_add(one, m) for m in messages]
    first = by_run.bundle_add_bodies(run, int(of.MsgType.FLOW_MOD), [m[0] for m in messages])
    assert first == xids[0] and len(run.messages) == len(messages) == len(one.messages)
    assert by_run.pending_output == by_one.pending_output
    assert by_run.data_to_send() == by_one.data_to_send()
    assert (
        list(run.messages) == xids and xids[3] in run.messages and xids[-1] + 1 not in run.messages
    )
    for at in (0, 3, 6):  # the first, one inside, the last
        assert run.messages[xids[at]].decoded() == messages[at]  # type: ignore[attr-defined]
    assert by_run.counters.snapshot()["sent"] == by_one.counters.snapshot()["sent"]
    assert session_next_xid(by_run) == session_next_xid(by_one)
    for state, session in ((run, by_run), (one, by_one)):
        assert commit(session, state) == [ses.BundleCommitted(state.bundle_id)]
    assert by_run.counters.snapshot()["bundled"] == by_one.counters.snapshot()["bundled"]
    # A failing one is named by its encoding.
    run = open_bundle(by_run)
    first = by_run.bundle_add_bodies(run, int(of.MsgType.FLOW_MOD), [m[0] for m in messages])
    by_run.data_to_send()
    assert by_run.receive_data(BAD_TABLE.encode(first + 6), 1.0) == []
    (failure,) = run.errors
    assert failure.message is not None and failure.message.decoded() == messages[6]  # type: ignore[attr-defined]
    assert of.to_text(messages[6]) in str(run.failure(None, "add"))


def test_a_run_of_bodies_never_takes_xid_zero_and_refuses_an_oversized_body() -> None:
    session = open_session()
    bundle = open_bundle(session)
    session._last_xid = 0xFFFFFFFF - 1  # two xids left before the wrap
    first = session.bundle_add_bodies(bundle, int(of.MsgType.FLOW_MOD), [flow()[0]] * 3)
    assert first == 1 and list(bundle.messages)[-3:] == [1, 2, 3]
    with pytest.raises(of.MessageTooLarge):
        session.bundle_add_bodies(bundle, int(of.MsgType.FLOW_MOD), [b"\0" * 0xFFFF])


def session_next_xid(session: ses.Session) -> int:
    return session._next_xid()


def test_a_multipart_reply_past_the_bound_fails_its_request_and_keeps_nothing() -> None:
    """Issue 35: a peer that never ends a multipart reply was kept until the request timed
    out, every part in memory. Past ``max_reply_bytes`` the request fails at once; later
    parts are ignored one by one, and the session goes on."""
    session = open_session(max_reply_bytes=10_000)
    dump = session.request(of.FlowDescRequest())
    part = of.FlowDescReply([of.FlowDesc(flow(reg=i)) for i in range(20)], more=True).encode(dump)
    events: list[ses.Event] = []
    fed = 0
    while not events:
        events += session.receive_data(part, 1.0)
        fed += len(part)
    assert fed - len(part) <= 10_000 < fed
    (failed,) = events
    assert isinstance(failed, ses.RequestFailed) and failed.xid == dump
    assert str(failed.error) == (
        f"{PEER}: multipart reply to request {dump} exceeds 10,000 bytes; dropped"
    )
    assert session.receive_data(part * 50, 1.0) == []  # the rest of it: nobody's
    assert session.ignored == 50
    barrier = session.request(of.BarrierRequest())
    reply = session.receive_data(of.BarrierReply().encode(barrier), 1.0)
    assert reply == [ses.Reply(barrier, of.BarrierReply())]
