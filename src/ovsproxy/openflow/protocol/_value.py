"""The base of every codec value.

A value is an immutable tuple ``(wire, field1, field2, ...)`` whose element 0 is its
canonical OpenFlow encoding, computed once when the value is built. Consequences:

* encoding a message is a ``b"".join`` of already-encoded parts (a group re-encode never
  re-encodes its buckets);
* equality and hashing compare the encodings, which are canonical (a decoded value equals
  the value that was encoded, whatever spelling was used to build it: an
  ``IPv4Address`` or an ``int``, ``xxreg3`` or ``reg12..reg15``);
* values are frozen and hashable, and cheap to build (a tuple, no ``__dict__``); they keep
  fields by name and addresses packed (properties give the objects back), and a match only
  its encoding, so they stay small.

Note for big caches: CPython never untracks tuple subclasses, so a process holding hundreds
of thousands of values pays for them in every full garbage collection; ``gc.freeze()`` after
a full sync (or building it with the collector paused) avoids that.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any, ClassVar, Self


def _rebuild(cls: type[Value], items: tuple[Any, ...]) -> Value:
    return tuple.__new__(cls, items)


class Value(tuple[Any, ...]):
    """Immutable codec value; element 0 is the canonical wire encoding."""

    __slots__ = ()
    # Names of the tuple elements after the wire, in order; each becomes a read-only property.
    _fields: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("_fields")
        if own is not None:
            for index, name in enumerate(own, start=1):
                if name not in cls.__dict__:  # a class may define a converting property
                    setattr(cls, name, property(itemgetter(index), doc=f"the {name} field"))

    @property
    def wire(self) -> bytes:
        """The canonical OpenFlow encoding of this value (for a message: its body)."""
        wire: bytes = self[0]
        return wire

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self[0] == other[0]

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash(self[0])

    def __repr__(self) -> str:
        args = ", ".join(
            f"{name}={value!r}" for name, value in zip(self._fields, self[1:], strict=True)
        )
        return f"{type(self).__name__}({args})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), tuple(self)))

    def __copy__(self) -> Self:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Self:
        return self

    def asdict(self) -> dict[str, Any]:
        """The fields (not the wire) as a dict."""
        return dict(zip(self._fields, self[1:], strict=True))

    def replace(self, **changes: Any) -> Self:
        """A copy with some fields changed (re-validated and re-encoded)."""
        kwargs = self.asdict()
        kwargs.update(changes)
        return type(self)(**kwargs)
