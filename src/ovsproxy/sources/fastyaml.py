"""A fast path for reading manifest files: rapidyaml, only where it gives exactly what PyYAML's
SafeLoader gives.

PyYAML builds every node and every value in Python; rapidyaml parses in C++, emits each
document as JSON and msgspec decodes that, together many times faster. The two differ: PyYAML
implements YAML 1.1 (``yes``, ``010``, ``1:30``, ``2001-12-14`` and ``~`` are a bool, an octal
int, a sexagesimal int, a date and null), rapidyaml YAML 1.2 and JSON (strings), and rapidyaml
accepts some text PyYAML rejects. So ``documents`` answers only for files it can vouch for and
returns None for anything else, for the caller to read with PyYAML:

* files with anything but printable ASCII and newlines (tabs, CR, control characters,
  non-ASCII line breaks), with anchors, aliases, tags, directives, merge keys, complex keys,
  escapes JSON does not have, or the reserved indicators ``@`` and backquote;
* files where a plain (unquoted) token could resolve differently under YAML 1.1: the bool,
  null, int, float and timestamp forms PyYAML has beyond JSON's (``_RISKY``, over the source
  text where a node can start, so a quoted ``"2024-01-01T00:00:00Z"`` is fine);
* documents that are not mappings, plain scalars starting with ``]``, ``}`` or ``,`` outside
  flow collections (rapidyaml reads text where PyYAML refuses), flow collections over several
  lines unless the file is JSON, and anything rapidyaml or the JSON decoder rejects.

rapidyaml writes its parse errors to standard error (``_quiet_stderr``).

Lines: PyYAML reports an object at its node's first token; here that is the first key of the
mapping (or the ``{`` before it for a flow mapping), found from where rapidyaml's key points
into the parsed buffer.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec

try:
    import ryml
except ImportError:  # pragma: no cover - the fallback is PyYAML, the result the same
    ryml = None

__all__ = ["AVAILABLE", "FastDocument", "documents"]

AVAILABLE = ryml is not None

# Every byte the fast path reads itself: printable ASCII and "\n", less the indicators of
# anchors, aliases and tags (tabs, CR, control characters and non-ASCII line breaks are
# PyYAML's to read or refuse).
_SUPPORTED_BYTES = bytes(sorted(set(range(0x20, 0x7F)) - set(b"&*!") | {0x0A}))
# The escapes JSON has, less surrogates (PyYAML keeps a pair as two characters).
_JSON_ESCAPE = re.compile(rb'\\(?:["\\/nrtbf]|u(?![dD][89abAB])[0-9a-fA-F]{4})')
# Merge keys, directives, complex keys.
_UNSUPPORTED = re.compile(rb"<<|^%|(?:^|[ \[{,])\?(?:[ \n]|$)", re.MULTILINE)

# A plain token PyYAML 1.1 could resolve unlike JSON, where a node can start: at a line's
# indentation, after ": ", "- ", "[", "{", "," or a quoted key's ":". Conservative: a match in
# a comment, a quoted string or a longer scalar only sends the file to PyYAML.
# One character consumed, then looked behind at: a pattern that starts with a character set
# is scanned for in C, several times faster.
_START = rb"[\n\[{,:\"'-](?:(?<=[\n\[{,])|(?<=[-:]) |(?<=[\"']):) *"
_END = rb"(?=[ \n,\]}:#]|$)"
_RISKY = re.compile(
    _START
    + rb"(?=[yYnNoOtTfF~=iI0-9+.@`:?-])"  # fail fast on the other first letters
    + rb"(?:(?:yes|Yes|YES|no|No|NO|on|On|ON|off|Off|OFF|True|TRUE|False|FALSE"
    + rb"|~|Null|NULL|="  # nulls; "=" is YAML 1.1's value key
    + rb"|inf|Inf|INF|nan|NaN|NAN"  # rapidyaml writes these as .inf and .nan
    + rb"|[-+]?0[0-9_]+|[-+]?0[bx][0-9a-fA-F_]*"  # octal, binary, hex
    + rb"|[-+]?[0-9][0-9.]*_[0-9_.]*(?:[eE][-+]?[0-9]*)?"  # digits with underscores
    + rb"|[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?"  # sexagesimal: 1:30 is 90
    + rb"|[-+]?[0-9][0-9_.]*[eE][-+]?[0-9]*"  # exponents: 1e3 is a string in YAML 1.1
    + rb")"
    + _END
    # reserved indicators (PyYAML refuses them), +1, .5, dates
    + rb"|[@`]|\+|[-+]?\.[0-9a-zA-Z_]|[0-9][0-9][0-9][0-9]-[0-9][0-9]?-[0-9]"
    # keys PyYAML makes numbers, bools or None (JSON's keys are strings)
    + rb"|(?:[-+]?\.?[0-9][^:\n,\[\]{} #]*|true|false|null):(?=[ \n,\]}]|$)"
    + rb"|[:?][^ \n]"  # ":x" and "?x": libyaml refuses some where rapidyaml reads text
    + rb"|:(?=[ \n,\]}]|$))",  # an empty key
)
# A plain scalar starting with a closing bracket or a comma where PyYAML refuses it and
# rapidyaml reads text. Inside a flow collection ("[a, ]", "{}", a JSON file's closing lines)
# they are structure, so a file whose documents are all flow collections is only checked for
# them after ": " and "- ".
_STRAY_IN_BLOCK = re.compile(rb"(?:\n|- |: |[\"']:) *[\]},]")
_STRAY_IN_FLOW = re.compile(rb"(?:- |: ) *[\]},]")
# "k:?", "port:}" in a flow collection: libyaml refuses a plain scalar's ":" before a flow
# indicator there (and only there: kubectl's "k:{...}" keys and JSON in block scalars are fine).
_COLON_BEFORE_FLOW_INDICATOR = re.compile(rb":[,?\[\]{}]")
# "[" or "{" not closed at once: maybe a flow collection with something in it.
_FLOW_OPENER = re.compile(rb"[\[{](?![\]}])")
# A key alone in a flow mapping ({0}, {true}) that PyYAML makes a number or a bool.
_LONE_KEY = re.compile(rb"[{,] *(?:[-+]?\.?[0-9][^:,\]}\n #]*|true|false|null) *(?=[,}])")
# A block scalar's header other than "|", ">", their indentation and chomping indicators and
# a comment (libyaml refuses "> -", rapidyaml reads it).
_ODD_BLOCK_HEADER = re.compile(rb"[|>](?<=[:\-] [|>])(?![-+]?[1-9]?[-+]?(?: +#[^\n]*)? *\n)")

_json = msgspec.json.Decoder()


@dataclass(frozen=True, slots=True)
class FastDocument:
    """One document of a file, as PyYAML would construct it, and where it starts."""

    number: int  # 1-based, counting every document of the file
    value: dict[str, Any]
    line: int  # 1-based line of the mapping's first token
    item_lines: tuple[int, ...] = ()  # the same for each item of a ``List``'s ``items``


class _PyBuffer(ctypes.Structure):
    _fields_ = (
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.py_object),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    )


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = (ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int)
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = (ctypes.POINTER(_PyBuffer),)


def _address(buffer: Any) -> int:
    """Where a buffer's bytes are (rapidyaml's scalars are read-only views into ours)."""
    view = _PyBuffer()
    _get_buffer(buffer, ctypes.byref(view), 0)
    try:
        return int(view.buf or 0)
    finally:
        _release_buffer(ctypes.byref(view))


class _Unsure(Exception):
    """This file is for PyYAML."""


class _Lines:
    """1-based line of an offset into the original text."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.offset = 0
        self.line = 1

    def of(self, offset: int) -> int:
        if offset >= self.offset:
            self.line += self.data.count(b"\n", self.offset, offset)
        else:
            self.line -= self.data.count(b"\n", offset, self.offset)
        self.offset = offset
        return self.line


def documents(data: bytes) -> list[FastDocument] | None:
    """Every document of ``data`` with its line, or None when PyYAML has to read it."""
    if (
        ryml is None
        or data.translate(None, _SUPPORTED_BYTES)
        or (b"\\" in data and b"\\" in _JSON_ESCAPE.sub(b"", data))
        or ((b"<<" in data or b"%" in data or b"?" in data) and _UNSUPPORTED.search(data))
        or _RISKY.search(b"\n" + data)
        or ((b"|" in data or b">" in data) and _ODD_BLOCK_HEADER.search(data + b"\n"))
    ):
        return None
    buffer = bytearray(data)
    try:
        with _quiet_stderr():
            tree = ryml.parse_in_place(buffer)
    except Exception:  # rapidyaml's parse errors: PyYAML reports them its own way
        return None
    try:
        with _quiet_stderr():  # (its emitter writes errors too: too deep a nesting)
            return _documents(tree, data, _address(buffer))
    except Exception:  # _Unsure, msgspec.DecodeError, a shape not foreseen: PyYAML reads it
        return None


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """rapidyaml writes each parse error to standard error before raising it; PyYAML then
    reports the file properly. Silenced in a single-threaded process (``ovsproxy check``):
    in one with other threads (the agent) their output would be lost too, so it shows."""
    if threading.active_count() > 1:
        yield
        return
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _documents(tree: Any, data: bytes, base: int) -> list[FastDocument]:
    root = tree.root_id()
    if tree.is_stream(root):
        nodes = list(ryml.children(tree, root))
    elif tree.is_map(root):
        nodes = [root]
    else:
        raise _Unsure
    stray = _STRAY_IN_FLOW if all(tree.is_flow(node) for node in nodes) else _STRAY_IN_BLOCK
    if stray.search(b"\n" + data):
        raise _Unsure
    if _FLOW_OPENER.search(data) and _has_flow_content(tree):  # the walk only if need be
        # Only flow collections have these (JSON in a block scalar or a string has them too).
        if _COLON_BEFORE_FLOW_INDICATOR.search(data) or _LONE_KEY.search(data):
            raise _Unsure
        # A flow collection over several lines: libyaml refuses keys over two lines and
        # document markers in it, rapidyaml reads them. Valid JSON has neither.
        if _spans_lines(data):
            _json.decode(data)
    lines = _Lines(data)
    found: list[FastDocument] = []
    out = bytearray(1 << 16)
    for number, node in enumerate(nodes, 1):
        if not tree.is_map(node) or not tree.has_children(node):
            raise _Unsure  # scalars, sequences, empty documents: PyYAML's to count and read
        # Into our buffer: ryml.emit_json's own (malloc'd) buffer is never freed.
        failed, size = ryml.emit_json_to_substr(tree, node, out)
        if failed:
            out = bytearray(size * 2)
            failed, size = ryml.emit_json_to_substr(tree, node, out)
            if failed:
                raise _Unsure
        value = _json.decode(memoryview(out)[:size])
        if not isinstance(value, dict):
            raise _Unsure
        item_lines: tuple[int, ...] = ()
        items = tree.find_child(node, b"items")
        if items != ryml.NONE and tree.is_seq(items):
            item_lines = tuple(
                _line(tree, item, data, base, lines) for item in ryml.children(tree, items)
            )
        found.append(FastDocument(number, value, _line(tree, node, data, base, lines), item_lines))
    return found


def _has_flow_content(tree: Any) -> bool:
    """Whether any flow collection (other than an empty one) holds a scalar."""
    is_container, is_flow, has_children = tree.is_container, tree.is_flow, tree.has_children
    return any(
        is_container(node) and is_flow(node) and has_children(node) for node in range(tree.size())
    )


def _spans_lines(data: bytes) -> bool:
    """Whether a line opens more brackets than it closes, or the other way (a flow collection
    over several lines, or brackets in text: either way, to be checked)."""
    return any(
        line.count(b"{") + line.count(b"[") != line.count(b"}") + line.count(b"]")
        for line in data.split(b"\n")
    )


def _line(tree: Any, node: int, data: bytes, base: int, lines: _Lines) -> int:
    """The line PyYAML's node would start on: the first key of a mapping, or its ``{``."""
    if not tree.is_map(node) or not tree.has_children(node):
        raise _Unsure
    key = tree.first_child(node)
    if not tree.has_key(key) or tree.key(key) is None:
        raise _Unsure
    offset = _address(tree.key(key)) - base
    if not 0 <= offset < len(data):
        raise _Unsure
    if tree.is_flow(node):
        offset = data.rfind(b"{", 0, offset)
        if offset < 0 or data[offset + 1 : _address(tree.key(key)) - base].strip(b" \n\"'"):
            raise _Unsure
    return lines.of(offset)
