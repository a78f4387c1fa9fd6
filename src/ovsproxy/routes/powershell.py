"""Running PowerShell commands, for real or from a recorded transcript.

The Windows backend only ever talks to a ``PowerShellRunner``: one command string in, stdout
(JSON from ``ConvertTo-Json``), stderr and an exit code out. ``SubprocessPowerShell`` runs
``powershell.exe``; ``ReplayPowerShell`` plays back a transcript -- a list of (command, stdout,
exit code) -- and fails the test on any command it did not expect, in order;
``RecordingPowerShell`` wraps a real runner and writes such a transcript on a Windows host.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

# Prepended by SubprocessPowerShell, never part of a transcript: cmdlet errors terminate the
# command with exit code 1 (instead of printing and carrying on), no progress bars on stdout,
# UTF-8 output whatever the console code page.
PREAMBLE = (
    "$ErrorActionPreference = 'Stop'; $ProgressPreference = 'SilentlyContinue'; "
    "[Console]::OutputEncoding = [System.Text.Encoding]::UTF8; "
)


@dataclass(frozen=True, slots=True)
class PowerShellResult:
    stdout: str
    exit_code: int = 0
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass(frozen=True, slots=True)
class TranscriptEntry:
    """One recorded command: what was run and what PowerShell answered."""

    command: str
    stdout: str = ""
    exit_code: int = 0
    stderr: str = ""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TranscriptEntry:
        stdout = data.get("stdout", "")
        if not isinstance(stdout, str):  # hand-written transcripts may inline the JSON value
            stdout = json.dumps(stdout, separators=(",", ":"))
        return cls(
            command=data["command"],
            stdout=stdout,
            exit_code=int(data.get("exit_code", 0)),
            stderr=data.get("stderr", ""),
        )

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"command": self.command, "stdout": self.stdout}
        if self.exit_code:
            data["exit_code"] = self.exit_code
        if self.stderr:
            data["stderr"] = self.stderr
        return data


@runtime_checkable
class PowerShellRunner(Protocol):
    async def run(self, command: str) -> PowerShellResult: ...


class SubprocessPowerShell:
    """Runs each command in a fresh ``powershell.exe -NonInteractive -Command``."""

    def __init__(self, executable: str = "powershell.exe", *, timeout: float = 60.0) -> None:
        self.executable = executable
        self.timeout = timeout

    async def run(self, command: str) -> PowerShellResult:
        proc = await asyncio.create_subprocess_exec(
            self.executable,
            "-NoLogo",
            "-NoProfile",
            "-NonInteractive",
            "-ExecutionPolicy",
            "Bypass",
            "-Command",
            PREAMBLE + command,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self.timeout)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return PowerShellResult("", 124, f"timed out after {self.timeout}s: {command}")
        return PowerShellResult(
            out.decode("utf-8", "replace"),
            proc.returncode if proc.returncode is not None else -1,
            err.decode("utf-8", "replace"),
        )


class UnexpectedCommand(AssertionError):
    """The code under test ran a command the transcript does not have at this point."""


class ReplayPowerShell:
    """Plays a transcript back, strictly in order.

    Any command that differs from the next recorded one (or comes after the end) raises
    ``UnexpectedCommand`` AND is remembered, because the route manager turns backend errors
    into logged results: ``assert_complete()`` (call it at the end of every test) fails on a
    remembered mismatch and on recorded commands that were never run.
    """

    def __init__(self, transcript: Iterable[TranscriptEntry | Mapping[str, Any]]) -> None:
        self.transcript: list[TranscriptEntry] = [
            e if isinstance(e, TranscriptEntry) else TranscriptEntry.from_dict(e)
            for e in transcript
        ]
        self.position = 0
        self.failures: list[str] = []
        self.ran: list[str] = []

    @classmethod
    def from_file(cls, path: str | Path) -> ReplayPowerShell:
        data = json.loads(Path(path).read_text())
        entries = data["entries"] if isinstance(data, dict) else data
        return cls(entries)

    async def run(self, command: str) -> PowerShellResult:
        self.ran.append(command)
        if self.position >= len(self.transcript):
            message = f"unexpected command after the end of the transcript:\n  {command}"
            self.failures.append(message)
            raise UnexpectedCommand(message)
        expected = self.transcript[self.position]
        if command != expected.command:
            message = (
                f"unexpected command at step {self.position}:\n"
                f"  expected: {expected.command}\n  got:      {command}"
            )
            self.failures.append(message)
            raise UnexpectedCommand(message)
        self.position += 1
        return PowerShellResult(expected.stdout, expected.exit_code, expected.stderr)

    @property
    def remaining(self) -> Sequence[TranscriptEntry]:
        return self.transcript[self.position :]

    def assert_complete(self) -> None:
        if self.failures:
            raise UnexpectedCommand("\n".join(self.failures))
        if self.remaining:
            missing = "\n  ".join(e.command for e in self.remaining)
            raise UnexpectedCommand(f"recorded commands never run:\n  {missing}")


class RecordingPowerShell:
    """Wraps a real runner and keeps every exchange, to save as a transcript."""

    def __init__(self, inner: PowerShellRunner) -> None:
        self.inner = inner
        self.entries: list[TranscriptEntry] = []

    async def run(self, command: str) -> PowerShellResult:
        result = await self.inner.run(command)
        self.entries.append(
            TranscriptEntry(command, result.stdout, result.exit_code, result.stderr)
        )
        return result

    def save(self, path: str | Path, description: str = "") -> None:
        payload = {
            "description": description,
            "provenance": "recorded with RecordingPowerShell",
            "entries": [e.to_dict() for e in self.entries],
        }
        Path(path).write_text(json.dumps(payload, indent=2) + "\n")
