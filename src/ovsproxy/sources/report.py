"""Where the checks of one object's conversion say what is wrong: ``Report.bad(path, value,
why)``.

One converter (``sources.convert``) runs every check and calls ``bad`` for each failure; the
report decides what that costs. ``every=False`` (the agent's API path) refuses the object at
its first bad field; ``every=True`` (manifests, ``ovsproxy check``) collects every bad field
and ``done`` refuses the object with all of them, the first ``NAMED_FIELDS`` named and the
rest counted in one last line. Either way the refusal is an
``InvalidObjectError`` naming the object (kind, namespace/name) and each field; paths and
``ValidationError`` values are made only when something is wrong.
"""

from __future__ import annotations

from typing import Any

from ovsproxy.model.problems import (
    FieldPath,
    InvalidObjectError,
    SourceLocation,
    ValidationError,
)

UNNAMED = "<unnamed>"
# How many bad fields of one object are named. Each is a line of the log (a manifest file's
# problems are logged when it is read) and of ``ovsproxy check``, kept until the object
# changes: an EndpointSlice of 20,000 bad endpoints would be 20,000 lines at every read. The
# first hundred say what is wrong; past them, the count says how much.
NAMED_FIELDS = 100


class Report:
    """The bad fields of one object of ``kind``; ``namespace`` and ``name`` are set by the
    converter once it has read them. (A report that stops at the first error keeps none, so
    it may serve several objects one after another, unless ``convert.structure`` filled it.)"""

    __slots__ = (
        "covered",
        "errors",
        "every",
        "kind",
        "location",
        "name",
        "namespace",
        "typed",
        "unnamed",
    )

    def __init__(self, kind: str, *, every: bool, location: SourceLocation | None = None) -> None:
        self.kind = kind
        self.every = every
        self.location = location
        self.namespace = ""
        self.name = ""
        self.errors: list[ValidationError] = []
        self.unnamed = 0  # bad fields past the first NAMED_FIELDS
        # Fields already reported as the wrong type (``schema.structure``): the converter,
        # reading them as missing, must not report them a second time.
        self.covered: frozenset[FieldPath] = frozenset()
        # Those fields' errors, reported when the converter comes to them (``typed_bad``):
        # the fields of a Service the proxy ignores are not errors.
        self.typed: list[tuple[FieldPath, Any, str]] = []

    def bad(self, path: FieldPath, value: Any, why: str) -> None:
        """Field ``path`` of the object holds ``value``, which is wrong because ``why``."""
        if self.covered and _covered(path, self.covered):
            return
        if len(self.errors) >= NAMED_FIELDS:
            self.unnamed += 1
            return
        error = ValidationError(
            kind=self.kind,
            namespace=self.namespace,
            name=self.name or UNNAMED,
            path=path,
            value=value,
            message=why,
            location=self.location,
        )
        if not self.every:
            # (nothing kept: one report serves a whole page of objects, one after another)
            raise InvalidObjectError((error,))
        self.errors.append(error)

    def typed_bad(self, prefix: FieldPath = ()) -> None:
        """Report the fields of the wrong type under ``prefix`` (all of them by default)."""
        now, self.typed = self._split(prefix)
        covered, self.covered = self.covered, frozenset()
        try:
            for path, value, why in now:
                self.bad(path, value, why)
        finally:
            self.covered = covered

    def drop_typed(self, prefix: FieldPath) -> None:
        """Forget the fields of the wrong type under ``prefix``: the converter does not read
        them (a Service's ``sessionAffinityConfig`` without ClientIP affinity)."""
        self.typed = self._split(prefix)[1]

    def _split(
        self, prefix: FieldPath
    ) -> tuple[list[tuple[FieldPath, Any, str]], list[tuple[FieldPath, Any, str]]]:
        under: list[tuple[FieldPath, Any, str]] = []
        others: list[tuple[FieldPath, Any, str]] = []
        for error in self.typed:
            (under if error[0][: len(prefix)] == prefix else others).append(error)
        return under, others

    def done(self) -> None:
        """Refuse the object if anything was reported."""
        if self.unnamed:
            more = ValidationError(
                kind=self.kind,
                namespace=self.namespace,
                name=self.name or UNNAMED,
                path=(),
                value=None,
                message=f"{self.unnamed} more bad fields, not named (the first {NAMED_FIELDS} are)",
                location=self.location,
            )
            raise InvalidObjectError((*self.errors, more))
        if self.errors:
            raise InvalidObjectError(tuple(self.errors))


def _covered(path: FieldPath, covered: frozenset[FieldPath]) -> bool:
    """``path`` is a covered field, or lies in a covered list item (a path through an index:
    the item stood in for by an empty one, whose own fields say nothing). A look-up per
    prefix, not a scan of ``covered``: an object may have thousands of them."""
    if path in covered:
        return True
    return any(type(path[at]) is int and path[: at + 1] in covered for at in range(len(path)))
