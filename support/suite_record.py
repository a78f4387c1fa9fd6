"""The test suite's own figures, recorded so that the docs quote them rendered, never typed.

With ``OVSPROXY_RECORD_RESULTS=1`` a whole-suite run (no paths, no ``-k``/``-m`` selection)
writes ``bench/results/<date>-suite[-fast].json``: its wall time, the outcome counts, the
workers and the commit. ``suite_sentence`` is the README's sentence made from the newest such
files (``python -m support.suite_record`` writes it there), and ``tests/test_readme_suite.py``
checks that the README holds exactly it. A run of the conformance package alone (``make
conformance``) writes ``<date>-conformance.json`` the same way, with every test's outcome;
a whole-suite run writes it too, from the package's tests within it.
``conformance_sentence`` is tests/README.md's line made from the newest one.
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


CONFORMANCE = "tests/conformance"
OUTCOMES = ("passed", "failed", "skipped")


def _kind(config: pytest.Config) -> str | None:
    """``suite`` or ``suite-fast`` for a whole-suite run (``make test``/``make test-fast``: no
    paths given, so pytest runs the ``testpaths``), ``conformance`` for the conformance
    package alone (``make conformance``), None for any other selection."""
    if config.option.keyword:
        return None
    marks = config.option.markexpr
    if config.args_source == pytest.Config.ArgsSource.ARGS:
        paths = {os.path.relpath(os.path.abspath(a), REPO).rstrip("/") for a in config.args}
        return "conformance" if paths == {CONFORMANCE} and not marks else None
    if not marks:
        return "suite"
    return "suite-fast" if marks.replace(" ", "") == "notslow" else None


def _outcomes(stats: dict[str, list[Any]], prefix: str = "") -> dict[str, str]:
    """Each test's outcome (its call phase; an error in any phase), by node id."""
    outcomes = {
        r.nodeid: outcome
        for outcome in ("passed", "failed", "skipped")
        for r in stats.get(outcome, [])
        if r.when == "call" and r.nodeid.startswith(prefix)
    }
    outcomes |= {r.nodeid: "error" for r in stats.get("error", []) if r.nodeid.startswith(prefix)}
    return dict(sorted(outcomes.items()))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if os.environ.get("OVSPROXY_RECORD_RESULTS") != "1" or hasattr(config, "workerinput"):
        return
    kind = _kind(config)
    if kind is None or _STARTED not in config.stash:
        return
    stats = terminalreporter.stats
    head = {
        "date": datetime.date.today().isoformat(),
        "commit": _git("rev-parse", "HEAD"),
        "tree_clean": _git("status", "--porcelain", "--untracked-files=no") == "",
        "cpus": os.cpu_count(),
        "workers": getattr(config.option, "numprocesses", None) or 0,
        "exit_status": int(exitstatus),
        "seconds": round(time.monotonic() - config.stash[_STARTED], 1),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    if kind != "conformance":
        _write(f"{head['date']}-{kind}.json", {**head, **_counts(_outcomes(stats))})
    if kind in ("conformance", "suite"):  # the whole suite runs the conformance package too
        tests = _outcomes(stats, CONFORMANCE + "/")
        if tests:
            _write(
                f"{head['date']}-conformance.json",
                {**head, "run": kind, **_counts(tests), "tests": tests},
            )


def _counts(outcomes: dict[str, str]) -> dict[str, int]:
    values = list(outcomes.values())
    return {o + ("s" if o == "error" else ""): values.count(o) for o in (*OUTCOMES, "error")}


def _write(name: str, record: dict[str, Any]) -> None:
    (RESULTS / name).write_text(json.dumps(record, indent=2) + "\n")


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


def conformance_sentence() -> str:
    """What the newest recorded ``make conformance`` run passed, and at which commit."""
    found = newest("conformance")
    if found is None:
        return "(not yet recorded: `make conformance`)"
    path, rec = found
    failed = [name for name, outcome in rec["tests"].items() if outcome in ("failed", "error")]
    text = (
        f"{rec['passed']:,} passed, {rec['failed'] + rec['errors']} failed and"
        f" {rec['skipped']} skipped of {len(rec['tests'])} at commit {rec['commit'][:7]}"
        f" on {rec['date']} (`bench/results/{path.name}`)"
    )
    if failed:
        text += "; failed: " + ", ".join(f"`{name.split('::')[-1]}`" for name in failed)
    return text


def render_between(doc: Path, mark: str, sentence: str) -> None:
    """Write ``sentence`` between ``doc``'s ``<!-- mark -->`` and ``<!-- /mark -->``."""
    text = doc.read_text()
    start, end = f"<!-- {mark} -->", f"<!-- /{mark} -->"
    head, rest = text.split(start, 1)
    _old, tail = rest.split(end, 1)
    doc.write_text(f"{head}{start}{sentence}{end}{tail}")


def render_readme(readme: Path = REPO / "README.md") -> None:
    """Write ``suite_sentence()`` between the README's ``<!-- suite -->`` marks."""
    render_between(readme, "suite", suite_sentence())


if __name__ == "__main__":
    render_readme()
    render_between(REPO / "tests" / "README.md", "conformance", conformance_sentence())
