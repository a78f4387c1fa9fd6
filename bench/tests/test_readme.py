"""The README's benchmark figures are the committed result files, rendered (not typed)."""

from __future__ import annotations

import re
from pathlib import Path

from bench.readme import render_files, section_of, splice

ROOT = Path(__file__).resolve().parents[2]


def test_readme_bench_section_is_rendered_from_committed_results() -> None:
    readme = (ROOT / "README.md").read_text()
    section = section_of(readme)
    named = re.findall(r"`(bench/results/[0-9-]+-all(?:-quick)?\.json)`", section)
    assert named, "the section names the result file it comes from"
    result = ROOT / named[0]
    quick = ROOT / named[0].replace("-all.json", "-all-quick.json")
    assert result.exists(), f"{result} is not committed"
    rendered = render_files(result, quick if quick.exists() else None)
    assert section_of(splice(f"{readme}", rendered)) == section
    for image in re.findall(r"\]\((bench/results/[^)]+\.png)\)", section):
        assert (ROOT / image).exists(), image
    # bench/README.md is the same rendering.
    assert (ROOT / "bench" / "README.md").read_text().strip() == rendered.strip()
