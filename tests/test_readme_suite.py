"""The README's figure for the suite's time is the newest recorded run, rendered (never typed):
``support.suite_record``."""

from __future__ import annotations

import re
from pathlib import Path

from support.suite_record import suite_sentence

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_suite_time_in_the_readme_is_the_recorded_one() -> None:
    found = re.search(r"<!-- suite -->(.*?)<!-- /suite -->", README.read_text(), re.S)
    assert found, "README.md marks the suite's figure with <!-- suite --> ... <!-- /suite -->"
    assert " ".join(found.group(1).split()) == suite_sentence()
