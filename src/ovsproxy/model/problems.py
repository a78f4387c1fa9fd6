"""What can go wrong in a source, as plain values a person can read.

A ``ValidationError`` names one bad field of one object; an ``InvalidObject`` is one
rejected object with all its bad fields; a ``SourceError`` is a problem of a whole source (a
file that does not parse, an API server that does not answer). They carry a
``SourceLocation`` when they come from a file. None of them stops the other objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ovsproxy.model import ServicePortName

# A field path as a tuple: ("spec", "ports", 1, "port") renders as spec.ports[1].port.
FieldPath = tuple[str | int, ...]


def render_path(path: FieldPath) -> str:
    """Kubernetes' own notation: ``spec.ports[1].port``, ``metadata.labels[a.b/c]``."""
    out: list[str] = []
    for part in path:
        if isinstance(part, int) or "." in part or "/" in part:
            out.append(f"[{part}]")
        else:
            out.append(f".{part}" if out else part)
    return "".join(out)


@dataclass(frozen=True, slots=True)
class SourceLocation:
    """Where an object or a problem is in a manifest file (line and document are 1-based)."""

    file: str
    line: int | None = None
    document: int | None = None  # which YAML document of the file
    item: int | None = None  # index in the document's ``items`` when it is a List

    def __str__(self) -> str:
        text = self.file if self.line is None else f"{self.file}:{self.line}"
        where = []
        if self.document is not None:
            where.append(f"document {self.document}")
        if self.item is not None:
            where.append(f"item {self.item}")
        return f"{text} ({', '.join(where)})" if where else text


@dataclass(frozen=True, slots=True)
class ValidationError:
    """One bad field of one object: which object, which field, which value, and why."""

    kind: str  # "Service", "EndpointSlice"
    namespace: str
    name: str
    path: FieldPath
    value: Any = field(hash=False)  # the offending value as found (None when missing)
    message: str
    location: SourceLocation | None = None

    @property
    def field(self) -> str:
        return render_path(self.path)

    @property
    def object(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"

    def __str__(self) -> str:
        value = "" if self.value is None else f" (got {_short(self.value)})"
        # (an error of the whole object, with no field path, names no field)
        field = f"{self.field}: " if self.path else ""
        text = f"{self.object}: {field}{self.message}{value}"
        return f"{self.location}: {text}" if self.location else text


@dataclass(frozen=True, slots=True)
class SourceError:
    """A problem of a whole source: an unparsable file, an unreachable API server."""

    source: str  # "manifests", "kubernetes/services", ...
    message: str
    location: SourceLocation | None = None

    def __str__(self) -> str:
        return f"{self.location}: {self.message}" if self.location else self.message


@dataclass(frozen=True, slots=True)
class InvalidObject:
    """One rejected object with all its bad fields: what a source reports to its handler."""

    errors: tuple[ValidationError, ...]  # at least one, all of the same object

    @property
    def kind(self) -> str:
        return self.errors[0].kind

    @property
    def object(self) -> str:
        return self.errors[0].object

    def __str__(self) -> str:
        return "; ".join(str(e) for e in self.errors)


# What a handler is told.
SourceProblem = InvalidObject | SourceError


class InvalidObjectError(ValueError):
    """An object failed validation; ``errors`` lists every bad field, not only the first."""

    def __init__(self, errors: tuple[ValidationError, ...]) -> None:
        super().__init__("; ".join(str(e) for e in errors))
        self.errors = errors


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True, slots=True)
class PortConflict:
    """Two Services claim one port (the same nodePort, healthCheckNodePort, or address:port):
    the older keeps it and this port of the newer is refused, as an API server's allocator
    would have refused the newer Service. ``claim`` says what both want."""

    refused: ServicePortName
    owner: ServicePortName  # the older Service's port that keeps the claim
    claim: str  # "nodePort 30080/TCP", "healthCheckNodePort 32000", "10.96.0.10:80/TCP"
    location: SourceLocation | None = None  # of the refused Service (manifests)
    owner_location: SourceLocation | None = None

    @property
    def object(self) -> str:
        return f"Service {self.refused.namespace}/{self.refused.name}"

    def __str__(self) -> str:
        owner = f"Service {self.owner.namespace}/{self.owner.name} (port {_port_label(self.owner)}"
        owner += f", at {self.owner_location})" if self.owner_location else ")"
        text = (
            f"{self.object}: port {_port_label(self.refused)}: {self.claim} is already "
            f"claimed by the older {owner}; this port is refused"
        )
        return f"{self.location}: {text}" if self.location else text


def _port_label(name: ServicePortName) -> str:
    return f"{name.port}/{name.protocol}" if name.port else str(name.protocol)


# A line a person reads (``ovsproxy check``, status).
Problem = ValidationError | SourceError | PortConflict
