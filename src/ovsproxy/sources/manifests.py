"""Services and EndpointSlices from YAML manifest files, watched for changes.

Files and directories (recursively: ``*.yaml``, ``*.yml``, ``*.json``; names starting with a
dot are skipped, which also skips the ``..data`` links of a mounted ConfigMap) hold
multi-document YAML; a document may be a ``List`` (or ``ServiceList``...) with ``items``.
Documents of other kinds are ignored.

Every ``poll_interval`` the files are stat()ed; a file whose (mtime, size, inode) changed is
read and hashed, and parsed only when its bytes changed. Then the objects of the changed
files are diffed against what the handler was given, one object at a time, so an object
that moved from one file to another in between is not deleted and re-added.

A file that stops parsing keeps its last good content in force; the parse error, with file
and line, is reported once per broken version. An object that fails validation is reported
(with the line of the bad field) and its last valid version stays in force. When two files
define the same object, the first in path order wins and the other is reported.

Hostile files are one file's problem, never the scan's: only regular files are read (a
symlink is followed only to one; a FIFO or a device is reported and skipped, never opened),
at most ``max_file_bytes`` of them (a larger file is reported, its last good content stays);
a YAML document whose aliases would expand past ``MAX_ALIAS_EXPANSION`` nodes is refused
before it is constructed; any failure to parse or convert is reported with the file and line.
A file that cannot be read for any reason but "not there" (EIO, EACCES, EMFILE...) keeps its
last good content in force and is reported, until it reads again or is removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import logging
import os
import stat as stat_mode
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ovsproxy.gcpause import gc_paused
from ovsproxy.model import EndpointSlice, Service
from ovsproxy.model.handler import SYNC_ENDPOINT_SLICES, SYNC_SERVICES, SourceHandler
from ovsproxy.model.problems import (
    FieldPath,
    InvalidObject,
    InvalidObjectError,
    Problem,
    SourceError,
    SourceLocation,
    ValidationError,
)
from ovsproxy.sources import fastyaml
from ovsproxy.sources.convert import (
    ParsedIPs,
    check_service_proxy_name,
    convert_endpoint_slice,
    convert_service,
    object_key,
    service_ignored_reason,
)

log = logging.getLogger(__name__)

SOURCE = "manifests"
MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
_API_VERSIONS = {"Service": "v1", "EndpointSlice": "discovery.k8s.io/v1"}


# Service converters also take service_proxy_name=.
_CONVERTERS: dict[str, Callable[..., Service | EndpointSlice]] = {
    "Service": convert_service,
    "EndpointSlice": convert_endpoint_slice,
}
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when available

ObjectKey = tuple[str, str, str]  # (kind, namespace, name)
# A manifest file larger than this is refused (reported; its last good content stays).
DEFAULT_MAX_FILE_BYTES = 64 << 20
# Nodes an alias may add to a document beyond the ones written: a Kubernetes manifest rarely
# has aliases, and a "billion laughs" document expands to billions.
MAX_ALIAS_EXPANSION = 100_000


@dataclass(frozen=True, slots=True)
class ManifestObject:
    """One Service or EndpointSlice found in a file, converted or not."""

    kind: str
    key: ObjectKey | None  # None when the object has no usable namespace/name
    location: SourceLocation
    value: Service | EndpointSlice | None  # None when invalid
    errors: tuple[ValidationError, ...] = ()
    ignored: str | None = None  # why the proxy ignores this Service (headless, ...)


@dataclass(frozen=True, slots=True)
class ParsedManifest:
    """Everything one file says: its objects, or why it could not be read."""

    path: str
    objects: tuple[ManifestObject, ...] = ()
    problems: tuple[Problem, ...] = ()  # the parse error and every validation error
    parse_failed: bool = False
    other_documents: int = 0  # documents of kinds the proxy does not use


def parse_manifest(
    data: bytes | str,
    path: str,
    *,
    service_proxy_name: str | None = None,
    ips: ParsedIPs | None = None,
) -> ParsedManifest:
    """Parse and validate one file's content (no file system access). Services are
    ignored as a proxy named ``service_proxy_name`` ignores them (``service_ignored_reason``);
    ``ips``: the caller's address memo, kept across files (else one for this file).

    Files the fast path (``fastyaml``) vouches for and that have no problem are read with
    it; everything else, and every file with a problem, with PyYAML: the result is the same,
    and the problems are PyYAML's, with the line of each bad field."""
    raw = data.encode() if isinstance(data, str) else data
    ips = ips if ips is not None else ParsedIPs()
    try:
        documents = fastyaml.documents(raw)
        if documents is not None:
            parsed = _parse_documents(documents, path, service_proxy_name, ips)
            if parsed is not None:
                return parsed
        return _parse_with_pyyaml(data, path, service_proxy_name, ips)
    except Exception as exc:  # a failure not foreseen: this file's problem
        log.debug("parsing %s failed", path, exc_info=True)
        message = f"cannot be read: {type(exc).__name__}: {exc}"
        return ParsedManifest(
            path, (), (SourceError(SOURCE, message, SourceLocation(path)),), parse_failed=True
        )


def _parse_documents(
    documents: list[fastyaml.FastDocument],
    path: str,
    service_proxy_name: str | None,
    ips: ParsedIPs,
) -> ParsedManifest | None:
    """The fast path's documents as a ``ParsedManifest``, or None when anything is wrong
    (PyYAML then says where, field by field)."""
    objects: list[ManifestObject] = []
    problems: list[Problem] = []
    other = 0
    for document in documents:
        obj = document.value
        where = SourceLocation(path, document.line, document.number)
        kind = obj.get("kind")
        if not isinstance(kind, str):
            return None
        items = obj.get("items")
        if kind.endswith("List") and isinstance(items, list):
            for index, item in enumerate(items):
                line = (
                    document.item_lines[index]
                    if index < len(document.item_lines)
                    else document.line
                )
                item_where = SourceLocation(path, line, document.number, item=index)
                other += _add_object(
                    item,
                    None,
                    item_where,
                    objects,
                    problems,
                    service_proxy_name=service_proxy_name,
                    ips=ips,
                )
        else:
            other += _add_object(
                obj, None, where, objects, problems, service_proxy_name=service_proxy_name, ips=ips
            )
        if problems:
            return None
    keys = [obj.key for obj in objects if obj.key is not None]
    if len(set(keys)) != len(keys):
        return None  # a duplicate in the file: PyYAML's path reports it
    return ParsedManifest(path, tuple(objects), (), other_documents=other)


def _parse_with_pyyaml(
    data: bytes | str, path: str, service_proxy_name: str | None, ips: ParsedIPs | None = None
) -> ParsedManifest:
    ips = ips if ips is not None else ParsedIPs()
    objects: list[ManifestObject] = []
    problems: list[Problem] = []
    other = 0
    loader = _Loader(data)
    try:
        document = 0
        while loader.check_node():
            node = loader.get_node()
            document += 1
            where = SourceLocation(path, node.start_mark.line + 1, document)
            expanded = expanded_size(node, MAX_ALIAS_EXPANSION)
            if expanded is None:
                message = f"aliases expand to more than {MAX_ALIAS_EXPANSION:,} extra nodes"
                problems.append(SourceError(SOURCE, message, where))
                continue
            try:
                obj = loader.construct_document(node)
            except (ValueError, OverflowError) as exc:
                # A scalar YAML 1.1 resolves but cannot build (a plain date such as 2024-13-45):
                # this document is the problem, the file's other documents still count.
                problems.append(SourceError(SOURCE, f"a value does not construct: {exc}", where))
                continue
            if obj is None:
                continue  # an empty document
            if not isinstance(obj, dict) or not isinstance(obj.get("kind"), str):
                problems.append(SourceError(SOURCE, "not a Kubernetes object (no kind)", where))
                continue
            kind = obj["kind"]
            if kind.endswith("List") and isinstance(obj.get("items"), list):
                items_node = _child(node, "items")
                for index, item in enumerate(obj["items"]):
                    item_node = _item(items_node, index) or node
                    item_where = SourceLocation(
                        path, item_node.start_mark.line + 1, document, item=index
                    )
                    other += _add_object(
                        item,
                        item_node,
                        item_where,
                        objects,
                        problems,
                        service_proxy_name=service_proxy_name,
                        ips=ips,
                    )
            else:
                other += _add_object(
                    obj,
                    node,
                    where,
                    objects,
                    problems,
                    service_proxy_name=service_proxy_name,
                    ips=ips,
                )
    except yaml.YAMLError as exc:
        # Where the parser stopped, and what it was in the middle of (often the real typo).
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = mark.line + 1 if mark is not None else None
        message = f"YAML does not parse: {getattr(exc, 'problem', None) or exc}"
        if mark is not None:
            message += f" (column {mark.column + 1})"
        context, context_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
        if context and context_mark is not None and context_mark is not mark:
            started = f"line {context_mark.line + 1}, column {context_mark.column + 1}"
            message += f", {context} started at {started}"
        error = SourceError(SOURCE, message, SourceLocation(path, line))
        return ParsedManifest(path, (), (*problems, error), parse_failed=True)
    finally:
        loader.dispose()
    first: dict[ObjectKey, ManifestObject] = {}
    for obj in objects:
        if obj.key is not None and first.setdefault(obj.key, obj) is not obj:
            problems.append(duplicate_problem(first[obj.key], obj))
    return ParsedManifest(path, tuple(objects), tuple(problems), other_documents=other)


def expanded_size(root: yaml.Node, max_extra: int) -> int | None:
    """How many nodes ``root`` stands for with every alias expanded (a composed document shares
    an aliased node), or None when that is more than ``max_extra`` beyond the nodes it has (or
    endless: an alias inside its own anchor).
    Linear in the nodes it has: each node's expanded size is counted once."""
    sizes: dict[int, int] = {}
    visiting: set[int] = set()  # on the path from the root
    composed = 0
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:  # depth first; a node's size once its children's are known
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        if not children_done:
            if id(node) in visiting:
                return None  # an alias inside its own anchor: expands without end
            visiting.add(id(node))
            stack.append((node, True))
            stack.extend((child, False) for child in _children(node) if id(child) not in sizes)
            continue
        visiting.discard(id(node))
        composed += 1
        size = 1 + sum(sizes[id(child)] for child in _children(node))
        if size > composed + max_extra:
            return None
        sizes[id(node)] = size
    return sizes[id(root)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _add_object(
    obj: Any,
    node: yaml.Node | None,
    where: SourceLocation,
    objects: list[ManifestObject],
    problems: list[Problem],
    *,
    service_proxy_name: str | None,
    ips: ParsedIPs,
) -> int:
    """Convert one object into ``objects``; returns 1 for an object of another kind."""
    kind = obj.get("kind") if isinstance(obj, dict) else None
    if kind not in _CONVERTERS:
        if not isinstance(kind, str):
            problems.append(SourceError(SOURCE, "not a Kubernetes object (no kind)", where))
        return 1
    key = object_key(obj)
    full_key = (kind, *key) if key else None
    api_version = obj.get("apiVersion")
    errors: list[ValidationError] = []
    value: Service | EndpointSlice | None = None
    try:
        # Both through _CONVERTERS: the cold-start bench times conversion there.
        if kind == "Service":
            value = _CONVERTERS[kind](
                obj, location=where, service_proxy_name=service_proxy_name, ips=ips
            )
        else:
            value = _CONVERTERS[kind](obj, location=where, ips=ips)
    except InvalidObjectError as exc:
        errors.extend(exc.errors)
    except Exception as exc:  # one object's problem, never the file's
        namespace, name = key or ("", "<unnamed>")
        message = f"cannot be read: {exc}"
        errors.append(ValidationError(kind, namespace, name, (), None, message, where))
    if api_version != _API_VERSIONS[kind]:
        namespace, name = key or ("", "<unnamed>")
        expected = _API_VERSIONS[kind]
        errors.insert(
            0,
            ValidationError(
                kind, namespace, name, ("apiVersion",), api_version, f"must be {expected}", where
            ),
        )
        value = None
    # Point each error at the line of its own field, not just the object's first line.
    if node is not None:
        errors = [_at_field_line(error, node) for error in errors]
    problems.extend(errors)
    ignored = (
        service_ignored_reason(obj, service_proxy_name)
        if kind == "Service" and value is not None
        else None
    )
    objects.append(ManifestObject(kind, full_key, where, value, tuple(errors), ignored))
    return 0


def _at_field_line(error: ValidationError, node: yaml.Node) -> ValidationError:
    if error.location is None:
        return error
    line = _line_of(node, error.path)
    location = SourceLocation(
        error.location.file, line, error.location.document, error.location.item
    )
    return ValidationError(
        error.kind, error.namespace, error.name, error.path, error.value, error.message, location
    )


def _line_of(node: yaml.Node, path: FieldPath) -> int:
    """1-based line of the deepest part of ``path`` present under ``node``."""
    line = node.start_mark.line
    for part in path:
        if isinstance(part, str):
            found = _child(node, part, with_key=True)
            if found is None:
                break
            key_node, node = found
            line = key_node.start_mark.line
        else:
            item = _item(node, part)
            if item is None:
                break
            node = item
            line = node.start_mark.line
    return line + 1


def _child(node: yaml.Node | None, key: str, *, with_key: bool = False) -> Any:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.value == key:
                return (key_node, value_node) if with_key else value_node
    return None


def _item(node: yaml.Node | None, index: int) -> yaml.Node | None:
    if isinstance(node, yaml.SequenceNode) and 0 <= index < len(node.value):
        item: yaml.Node = node.value[index]
        return item
    return None


@dataclass(frozen=True, slots=True)
class Discovery:
    """What a look at the paths found: the manifest files in a stable order, the paths that
    are not there, and the directories that could not be listed (their files are kept)."""

    files: list[Path]
    missing: list[SourceError]
    unlisted: list[tuple[Path, SourceError]]

    def listed(self, path: Path) -> bool:
        """Whether ``path`` was looked for: not under a directory that could not be listed."""
        return not any(path == top or top in path.parents for top, _ in self.unlisted)


def discover_files(paths: Iterable[str | os.PathLike[str]]) -> Discovery:
    """The manifest files under ``paths``; a path that is not there is a problem, a directory
    that cannot be listed (EACCES, EMFILE...) another: its files are not gone."""
    files: list[Path] = []
    problems: list[SourceError] = []
    unlisted: list[tuple[Path, SourceError]] = []
    seen: set[Path] = set()

    def cannot_list(exc: OSError) -> None:
        where = Path(exc.filename or "")
        message = f"cannot be listed: {exc.strerror or exc}"
        unlisted.append((where, SourceError(SOURCE, message, SourceLocation(str(where)))))

    for root in map(Path, paths):
        try:
            is_dir = stat_mode.S_ISDIR(root.stat().st_mode)
        except FileNotFoundError:
            problems.append(
                SourceError(SOURCE, "no such file or directory", SourceLocation(str(root)))
            )
            continue
        except OSError as exc:
            cannot_list(exc)
            continue
        if is_dir:
            found: list[Path] = []
            for directory, subdirs, names in os.walk(root, onerror=cannot_list):
                subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
                found.extend(
                    Path(directory, name)
                    for name in names
                    if name.endswith(MANIFEST_SUFFIXES) and not name.startswith(".")
                )
            candidates = sorted(found)
        else:
            candidates = [root]
        for path in candidates:
            if path not in seen:
                seen.add(path)
                files.append(path)
    return Discovery(files, problems, unlisted)


def duplicate_problem(kept: ManifestObject, dropped: ManifestObject) -> SourceError:
    kind, namespace, name = dropped.key or (dropped.kind, "", "")
    message = f"{kind} {namespace}/{name} is also defined at {kept.location}; that one is used"
    return SourceError(SOURCE, message, dropped.location)


class UnreadableFile(OSError):
    """A manifest path that is not to be read: not a regular file, or larger than the cap."""


def _refusal(mode: int, size: int, max_bytes: int) -> str | None:
    if not stat_mode.S_ISREG(mode):
        return f"not a regular file ({_file_type(mode)}): not read"
    if size > max_bytes:
        return _too_large(max_bytes)
    return None


def _too_large(max_bytes: int) -> str:
    return f"larger than the {max_bytes:,}-byte limit (manifest_max_bytes): not read"


def _file_type(mode: int) -> str:
    for test, name in (
        (stat_mode.S_ISDIR, "a directory"),
        (stat_mode.S_ISFIFO, "a FIFO"),
        (stat_mode.S_ISCHR, "a character device"),
        (stat_mode.S_ISBLK, "a block device"),
        (stat_mode.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a file"


def check_readable(status: os.stat_result, max_bytes: int) -> None:
    """Raises ``UnreadableFile`` for anything but a regular file of at most ``max_bytes``."""
    refusal = _refusal(status.st_mode, status.st_size, max_bytes)
    if refusal is not None:
        raise UnreadableFile(errno.EINVAL, refusal)


def read_regular_file(path: Path, max_bytes: int) -> bytes:
    """The bytes of ``path`` if it is a regular file (a symlink to one) of at most
    ``max_bytes``, else ``UnreadableFile``. Opened non-blocking, and checked again once open:
    a FIFO swapped in after a ``stat`` never blocks the reader."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        check_readable(os.fstat(fd), max_bytes)
        chunks: list[bytes] = []
        left = max_bytes + 1  # a file that grows past the limit while read is refused too
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        if left <= 0:
            raise UnreadableFile(errno.EFBIG, _too_large(max_bytes))
        return b"".join(chunks)
    finally:
        os.close(fd)


Signature = tuple[int, int, int]  # (mtime_ns, size, inode)
_RACY_NS = 2_000_000_000  # coarse file systems keep mtime in (up to) 2 s steps


@dataclass(slots=True)
class _FileState:
    signature: Signature
    digest: bytes
    parsed: ParsedManifest
    # The objects of the last content that parsed, valid or not, by key.
    objects: dict[ObjectKey, ManifestObject] = field(default_factory=dict)

    @property
    def keys(self) -> set[ObjectKey]:
        return set(self.objects)


@dataclass(frozen=True, slots=True)
class _FileUpdate:
    path: Path
    signature: Signature | None  # None: the file is gone
    digest: bytes = b""
    parsed: ParsedManifest | None = None  # None: bytes unchanged, nothing to parse
    # Why the file could not be read (its last good content stays); signature is None then.
    unreadable: SourceError | None = None


class ManifestSource:
    """Delivers the objects of manifest files to a ``SourceHandler`` and keeps them current.

    ``await start()`` loads everything, reports both kinds synced, then polls in a task;
    ``await stop()`` ends polling. ``await rescan()`` checks the files once, now.
    Also an async context manager.
    """

    def __init__(
        self,
        paths: Sequence[str | os.PathLike[str]],
        handler: SourceHandler,
        *,
        poll_interval: float = 0.5,
        service_proxy_name: str | None = None,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    ) -> None:
        if max_file_bytes < 1:
            raise ValueError(f"max_file_bytes must be at least 1, got {max_file_bytes}")
        self.paths = [Path(p) for p in paths]
        self.max_file_bytes = max_file_bytes
        self.service_proxy_name = check_service_proxy_name(service_proxy_name)
        self.handler = handler
        self.poll_interval = poll_interval
        self._files: dict[Path, _FileState] = {}
        self._order: dict[Path, int] = {}
        self._definers: dict[ObjectKey, set[Path]] = {}
        self._current: dict[ObjectKey, tuple[Path, ManifestObject]] = {}
        self._duplicates: dict[ObjectKey, SourceError] = {}
        self._missing: list[SourceError] = []
        self._unreadable: dict[Path, SourceError] = {}  # files, and directories not listed
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self.scans = 0
        self.parses = 0
        self._ips = ParsedIPs()  # endpoint addresses repeat across files and rescans

    async def __aenter__(self) -> ManifestSource:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        await self.rescan()
        self.handler.on_synced(SYNC_SERVICES)
        self.handler.on_synced(SYNC_ENDPOINT_SLICES)
        self._task = asyncio.create_task(self._poll(), name="manifest-source")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    @property
    def problems(self) -> list[Problem]:
        """Every problem in force now: missing paths, parse and validation errors, duplicates."""
        found: list[Problem] = [*self._missing, *self._unreadable.values()]
        for state in self._files.values():
            found.extend(state.parsed.problems)
        found.extend(self._duplicates.values())
        return found

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            try:
                await self.rescan()
            except Exception as exc:  # a scan must never end the watching
                log.exception("manifest scan failed")
                self.handler.on_error(SourceError(SOURCE, f"scan failed: {exc}"))

    async def rescan(self) -> bool:
        """Look at the files once; deliver what changed. True when anything was delivered."""
        async with self._lock:
            # Reading and parsing are pure and may take a while: off the event loop.
            files, missing, updates = await asyncio.to_thread(self._read_changes)
            self.scans += 1
            if missing != self._missing:
                for problem in missing:
                    if problem not in self._missing:
                        self._report(problem)
                self._missing = missing
            self._order = {path: index for index, path in enumerate(files)}
            return self._apply(updates)

    def _read_changes(self) -> tuple[list[Path], list[SourceError], list[_FileUpdate]]:
        with gc_paused():
            return self._read_changes_now()

    def _read_changes_now(self) -> tuple[list[Path], list[SourceError], list[_FileUpdate]]:
        found = discover_files(self.paths)
        files, missing = found.files, found.missing
        updates = [_FileUpdate(top, None, unreadable=problem) for top, problem in found.unlisted]
        # A file written within the mtime granularity of the last look can change again
        # with the same size and mtime: until it is older than that, hash it every time.
        racy_after = time.time_ns() - _RACY_NS
        for path in files:
            state = self._files.get(path)
            try:
                stat = path.stat()
                check_readable(stat, self.max_file_bytes)  # before opening: never a FIFO
                signature = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
                unchanged = state is not None and state.signature == signature
                if unchanged and stat.st_mtime_ns < racy_after and path not in self._unreadable:
                    continue
                data = read_regular_file(path, self.max_file_bytes)
            except FileNotFoundError:
                updates.append(_FileUpdate(path, None))  # vanished between listing and reading
                continue
            except OSError as exc:
                # EIO, EACCES, EMFILE, a FIFO, too large: not gone, its last content stays.
                why = f"cannot be read: {exc.strerror or exc}"
                problem = SourceError(SOURCE, why, SourceLocation(str(path)))
                updates.append(_FileUpdate(path, None, unreadable=problem))
                continue
            digest = hashlib.blake2b(data, digest_size=16).digest()
            if state is not None and state.digest == digest:
                updates.append(_FileUpdate(path, signature, digest))  # touched, not changed
            else:
                parsed = parse_manifest(
                    data, str(path), service_proxy_name=self.service_proxy_name, ips=self._ips
                )
                updates.append(_FileUpdate(path, signature, digest, parsed))
        listed = set(files)
        updates.extend(
            _FileUpdate(path, None)
            for path in [*self._files, *self._unreadable]
            if path not in listed and found.listed(path)
        )
        return files, missing, updates

    def _apply(self, updates: list[_FileUpdate]) -> bool:
        candidates: set[ObjectKey] = set()
        for update in updates:
            state = self._files.get(update.path)
            if update.unreadable is not None:
                if self._unreadable.get(update.path) != update.unreadable:
                    self._unreadable[update.path] = update.unreadable
                    self._report(update.unreadable)
                continue
            if self._unreadable.pop(update.path, None) is not None:
                log.info("%s: readable again", update.path)
            if update.signature is None:
                if state is not None:
                    del self._files[update.path]
                    self._set_definers(update.path, state.keys, set())
                    candidates |= state.keys
                continue
            parsed = update.parsed
            if parsed is None:
                if state is not None:
                    state.signature = update.signature
                continue
            self.parses += 1
            self._report_parse(parsed)
            if state is None:
                state = _FileState(update.signature, update.digest, parsed)
                self._files[update.path] = state
            else:
                state.signature, state.digest, state.parsed = (
                    update.signature,
                    update.digest,
                    parsed,
                )
            if parsed.parse_failed:
                continue  # the last good content of this file stays in force
            objects: dict[ObjectKey, ManifestObject] = {}
            for obj in parsed.objects:
                if obj.key is not None:
                    objects.setdefault(obj.key, obj)  # a duplicate in the file: first wins
            old_keys = state.keys
            state.objects = objects
            self._set_definers(update.path, old_keys, state.keys)
            candidates |= old_keys | state.keys
        delivered = False
        for key in sorted(candidates):
            delivered |= self._resolve(key)
        return delivered

    def _set_definers(self, path: Path, old: set[ObjectKey], new: set[ObjectKey]) -> None:
        for key in old - new:
            definers = self._definers.get(key)
            if definers is not None:
                definers.discard(path)
                if not definers:
                    del self._definers[key]
        for key in new - old:
            self._definers.setdefault(key, set()).add(path)

    def _resolve(self, key: ObjectKey) -> bool:
        """Decide which definition of ``key`` is in force and deliver it if it changed."""
        definers = sorted(self._definers.get(key, ()), key=lambda p: self._order.get(p, 1 << 30))
        current = self._current.get(key)
        chosen: tuple[Path, ManifestObject] | None = None
        if definers:
            winner = self._files[definers[0]].objects[key]
            # Invalid now: its last valid version stays in force.
            chosen = (definers[0], winner) if winner.value is not None else current
            duplicate = None
            if len(definers) > 1:
                duplicate = duplicate_problem(winner, self._files[definers[1]].objects[key])
            if duplicate != self._duplicates.get(key):
                if duplicate is None:
                    self._duplicates.pop(key, None)
                else:
                    self._duplicates[key] = duplicate
                    self._report(duplicate)
        else:
            self._duplicates.pop(key, None)

        old_value = current[1].value if current else None
        new_value = chosen[1].value if chosen else None
        if chosen is None:
            self._current.pop(key, None)
        else:
            self._current[key] = chosen
        if old_value == new_value:
            return False
        self._deliver(key, old_value, new_value)
        return True

    def _deliver(
        self,
        key: ObjectKey,
        old: Service | EndpointSlice | None,
        new: Service | EndpointSlice | None,
    ) -> None:
        kind, namespace, name = key
        handler = self.handler
        if isinstance(new, Service):
            (handler.on_service_update if old else handler.on_service_add)(new)
        elif isinstance(new, EndpointSlice):
            (handler.on_endpoint_slice_update if old else handler.on_endpoint_slice_add)(new)
        elif kind == "Service":
            handler.on_service_delete(namespace, name)
        else:
            handler.on_endpoint_slice_delete(namespace, name)

    def _report(self, problem: SourceError) -> None:
        log.warning("%s", problem)
        self.handler.on_error(problem)

    def _report_parse(self, parsed: ParsedManifest) -> None:
        """Log every problem of a freshly parsed file; tell the handler once per object."""
        for problem in parsed.problems:
            if isinstance(problem, SourceError):
                self._report(problem)
            else:
                log.warning("%s", problem)
        for obj in parsed.objects:
            if obj.errors:
                self.handler.on_error(InvalidObject(obj.errors))
