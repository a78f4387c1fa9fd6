"""The one fake OpenFlow switch: the ``switch_sync.Switch`` protocol without OVS.

It exists for fault injection at the Switch seam — a bundle refused at commit, a commit that
times out, staging while a bundle is in flight, a planning error mid-stream — and to see
exactly which messages a commit sent, in order. The real path (``Channel`` against a real
ovs-vswitchd) is covered by tests/openflow/test_live.py and tests/datapath/test_switch_sync_live.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence

from ovsproxy.datapath.switch_sync import Switch
from ovsproxy.openflow import protocol as of

_ENCODED: dict[int, type[of.EncodedFlowMod] | type[of.EncodedGroupMod]] = {
    int(of.MsgType.FLOW_MOD): of.EncodedFlowMod,
    int(of.MsgType.GROUP_MOD): of.EncodedGroupMod,
}


class FakeBundle:
    """A streamed bundle: collects the messages; ``commit`` hands them to the switch."""

    backlog = 0  # ``backlog``: what the socket has not taken yet (set by tests)

    def __init__(self, switch: FakeSwitch) -> None:
        self.switch = switch
        self.messages: list[of.Message] = []
        self.state = "open"

    def add(self, msg: of.Message) -> int:
        assert self.state == "open", f"add to a {self.state} bundle"
        if type(msg) in (of.EncodedFlowMod, of.EncodedGroupMod) and self.switch.keep:
            msg = msg.decoded()  # what the tests read: the flow's or group's value
        self.messages.append(msg)
        return len(self.messages)

    def add_bodies(self, msg_type: int, bodies: Sequence[bytes]) -> None:
        """Messages by their encodings (the datapath's bulk path), kept as ``add`` keeps them."""
        for body in bodies:
            self.add(_ENCODED[msg_type](body))

    async def drain(self) -> None:
        self.switch.drains += 1

    async def commit(self) -> None:
        assert self.state == "open", f"commit of a {self.state} bundle"
        self.state = "committing"
        await self.switch._take(self.messages)
        self.state = "committed"

    async def discard(self) -> None:
        self.state = "discarded"
        self.switch.discarded += 1


class FakeSwitch:
    """Accepts every bundle (or fails the next one, ``fail``) and records what it got.

    * ``bundles``: the committed bundles' messages, in order (kept unless ``keep=False``);
    * ``log``: ``("bundle", messages)`` and ``("send", messages)`` entries in order, for
      tests that interleave commits with other calls;
    * ``fail``: raised by the next commit (then cleared), e.g. a ``BundleError`` or a
      ``RequestTimeout``;
    * ``during``: callables run while a commit is in flight (before it yields);
    * ``present_groups``/``cookies``: what ``group_ids``/``flow_cookies`` report;
    * ``opened``/``drains``/``discarded``: how the streaming API was used.
    """

    connected = True

    def __init__(self, *, keep: bool = True) -> None:
        self.keep = keep
        self.bundles: list[list[of.Message]] = []
        self.log: list[tuple[str, object]] = []
        self.fail: BaseException | None = None
        self.during: list[Callable[[], object]] = []
        self.present_groups: set[int] = set()
        self.cookies: list[int] = []  # flows of ours it holds, by cookie alone
        self.held_flows: list[tuple[int, bytes]] = []  # ...and by cookie and key
        self.opened = 0
        self.drains = 0
        self.discarded = 0

    def bundle(self) -> FakeBundle:
        self.opened += 1
        return FakeBundle(self)

    async def commit_bundle(self, messages: Sequence[of.Message]) -> None:
        """``Channel.commit_bundle``: one bundle of these messages."""
        bundle = self.bundle()
        for msg in messages:
            bundle.add(msg)
        await bundle.commit()

    async def _take(self, messages: list[of.Message]) -> None:
        for hook in self.during:
            hook()
        await asyncio.sleep(0)
        if self.fail is not None:
            fail, self.fail = self.fail, None
            raise fail
        if self.keep:
            self.bundles.append(messages)
            self.log.append(("bundle", messages))

    async def send(self, messages: Iterable[of.Message]) -> None:
        """``Channel.send``: messages outside a bundle."""
        self.log.append(("send", list(messages)))

    async def group_ids(self) -> set[int]:
        return set(self.present_groups)

    async def flow_cookies(self, cookie: int, mask: int) -> list[int]:
        return [*self.cookies, *(c for c, _ in self.held_flows)]

    async def flow_keys(self, cookie: int, mask: int) -> list[tuple[int, bytes]]:
        # a cookie of ``cookies`` stands for a flow whose key nothing stages
        return [*((c, b"") for c in self.cookies), *self.held_flows]

    def kinds(self) -> list[str]:
        """The kinds of the ``log`` entries, in order."""
        return [kind for kind, _ in self.log]

    def take(self, kind: str) -> list[object]:
        """The ``log`` entries of one kind; clears the log."""
        out = [value for k, value in self.log if k == kind]
        self.log.clear()
        return out


def _conforms(switch: FakeSwitch) -> Switch:
    return switch  # the type checker holds FakeSwitch to the Switch protocol
