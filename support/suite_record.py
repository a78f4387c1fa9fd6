"""The test suite's own figures, recorded so that the docs quote them rendered, never typed.

With ``OVSPROXY_RECORD_RESULTS=1`` a whole-suite run (no paths, no ``-k``/``-m`` selection)
writes ``bench/results/<date>-suite[-fast].json``: its wall time, the outcome counts, the
workers and the commit. ``suite_sentence`` is the README's sentence made from the newest such
files (``python -m support.suite_record`` writes it there), and ``tests/test_readme_suite.py``
checks that the README holds exactly it.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
_STARTED = pytest.StashKey[float]()


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_STARTED] = time.monotonic()


def _kind(config: pytest.Config) -> str | None:
    """``suite`` or ``suite-fast`` for a whole-suite run (``make test``/``make test-fast``),
    None for any other selection."""
    if config.args or config.option.keyword:
        return None
    marks = config.option.markexpr
    if not marks:
        return "suite"
    return "suite-fast" if marks.replace(" ", "") == "notslow" else None


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if os.environ.get("OVSPROXY_RECORD_RESULTS") != "1" or hasattr(config, "workerinput"):
        return
    kind = _kind(config)
    if kind is None or _STARTED not in config.stash:
        return
    counts = {
        outcome: len([r for r in terminalreporter.stats.get(outcome, []) if r.when == "call"])
        for outcome in ("passed", "failed", "skipped")
    }
    counts["errors"] = len(terminalreporter.stats.get("error", []))
    today = datetime.date.today().isoformat()
    record = {
        "date": today,
        "commit": _git("rev-parse", "HEAD"),
        "tree_clean": _git("status", "--porcelain", "--untracked-files=no") == "",
        "cpus": os.cpu_count(),
        "workers": getattr(config.option, "numprocesses", None) or 0,
        "exit_status": int(exitstatus),
        "seconds": round(time.monotonic() - config.stash[_STARTED], 1),
        **counts,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{today}-{kind}.json").write_text(json.dumps(record, indent=2) + "\n")


def newest(kind: str) -> tuple[Path, dict[str, Any]] | None:
    """The newest committed-style record of ``kind`` (``suite`` or ``suite-fast``)."""
    found = sorted(RESULTS.glob(f"*-{kind}.json"))
    if not found:
        return None
    return found[-1], json.loads(found[-1].read_text())


def suite_sentence() -> str:
    """How long ``make test`` (and ``make test-fast``) took, from the newest records."""
    whole = newest("suite")
    if whole is None:
        return "(not yet recorded: `OVSPROXY_RECORD_RESULTS=1 make test`)"
    path, rec = whole
    text = (
        f"{rec['seconds'] / 60:.1f} minutes on {rec['cpus']} cores with {rec['workers']}"
        f" workers at commit {rec['commit'][:7]}, {rec['passed']:,} passed and"
        f" {rec['failed'] + rec['errors']} failed (`bench/results/{path.name}`)"
    )
    fast = newest("suite-fast")
    if fast is not None:
        fpath, frec = fast
        text += (
            f"; `make test-fast` skips the slow ones: {frec['seconds'] / 60:.1f} minutes"
            f" (`bench/results/{fpath.name}`)"
        )
    return text


def render_readme(readme: Path = REPO / "README.md") -> None:
    """Write ``suite_sentence()`` between the README's ``<!-- suite -->`` marks."""
    text = readme.read_text()
    start, end = "<!-- suite -->", "<!-- /suite -->"
    head, rest = text.split(start, 1)
    _old, tail = rest.split(end, 1)
    readme.write_text(f"{head}{start}{suite_sentence()}{end}{tail}")


if __name__ == "__main__":
    render_readme()
