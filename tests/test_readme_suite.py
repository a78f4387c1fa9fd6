"""The README's figure for the suite's time is the newest recorded run, rendered (never
typed), and so is tests/README.md's line of the last conformance run: ``support.suite_record``.
A record is written only for the runs it describes: ``make test``, ``make test-fast`` and
``make conformance``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from _pytest.config import _prepareconfig
from support.suite_record import _kind, conformance_sentence, suite_sentence

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TESTS_README = ROOT / "tests" / "README.md"


def _between(doc: Path, mark: str) -> str:
    found = re.search(rf"<!-- {mark} -->(.*?)<!-- /{mark} -->", doc.read_text(), re.S)
    assert found, f"{doc.name} marks its figure with <!-- {mark} --> ... <!-- /{mark} -->"
    return " ".join(found.group(1).split())


def test_the_suite_time_in_the_readme_is_the_recorded_one() -> None:
    assert _between(README, "suite") == suite_sentence()


def test_the_conformance_line_in_the_tests_readme_is_the_recorded_one() -> None:
    assert _between(TESTS_README, "conformance") == conformance_sentence()


@pytest.mark.parametrize(
    ("args", "kind"),
    [
        ([], "suite"),  # make test: no paths, pytest runs the testpaths
        (["-n", "2", "--dist", "loadfile"], "suite"),
        (["-m", "not slow"], "suite-fast"),
        (["tests/conformance", "-rxXf"], "conformance"),
        (["tests/conformance/"], "conformance"),
        (["tests/conformance", "-k", "affinity"], None),
        (["tests/sources"], None),
        (["-k", "route"], None),
        (["-m", "ovs"], None),
    ],
)
def test_a_record_is_kept_only_for_the_runs_it_describes(args: list[str], kind: str | None) -> None:
    config = _prepareconfig(args)
    try:
        assert _kind(config) == kind
    finally:
        config._ensure_unconfigure()
