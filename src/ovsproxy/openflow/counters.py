"""Wire counters of one channel: messages and bytes by message kind, in and out."""

from __future__ import annotations


class WireCounters:
    """Messages and bytes sent and received, by message kind (``FLOW_MOD``...).

    ``sent``/``received`` map kind -> [messages, bytes]; ``bundled`` counts the messages
    carried inside BUNDLE_ADD by their own kind. ``snapshot()`` is a plain dict.
    """

    def __init__(self) -> None:
        self.sent: dict[str, list[int]] = {}
        self.received: dict[str, list[int]] = {}
        self.bundled: dict[str, list[int]] = {}

    @staticmethod
    def _add(table: dict[str, list[int]], kind: str, messages: int, size: int) -> None:
        row = table.get(kind)
        if row is None:
            table[kind] = [messages, size]
        else:
            row[0] += messages
            row[1] += size

    def count_sent(self, kind: str, size: int, messages: int = 1) -> None:
        self._add(self.sent, kind, messages, size)

    def count_received(self, kind: str, size: int) -> None:
        self._add(self.received, kind, 1, size)

    def count_bundled(self, kind: str, size: int, messages: int = 1) -> None:
        self._add(self.bundled, kind, messages, size)

    def snapshot(self) -> dict[str, dict[str, dict[str, int]]]:
        return {
            name: {k: {"messages": v[0], "bytes": v[1]} for k, v in table.items()}
            for name, table in (
                ("sent", self.sent),
                ("received", self.received),
                ("bundled", self.bundled),
            )
        }

    def total(self, direction: str = "sent") -> tuple[int, int]:
        table = self.sent if direction == "sent" else self.received
        return sum(v[0] for v in table.values()), sum(v[1] for v in table.values())
