"""bench/README.md is the committed result files, rendered (not typed), and the only copy of
the figures: the top README and docs/ link to it and quote none of its lines."""

from __future__ import annotations

import re
from pathlib import Path

from bench.readme import render_files

ROOT = Path(__file__).resolve().parents[2]
BENCH_README = ROOT / "bench" / "README.md"


def test_bench_readme_is_rendered_from_committed_results() -> None:
    text = BENCH_README.read_text()
    named = re.findall(r"`(bench/results/[0-9-]+-all(?:-quick)?\.json)`", text)
    assert named, "bench/README.md names the result file it comes from"
    result = ROOT / named[0]
    quick = ROOT / named[0].replace("-all.json", "-all-quick.json")
    assert result.exists(), f"{result} is not committed"
    rendered = render_files(result, quick if quick.exists() else None)
    assert text.strip() == rendered.strip()
    images = re.findall(r"\]\((results/[^)]+\.png)\)", text)
    assert images, "the plots are linked relative to bench/"
    for image in images:
        assert (BENCH_README.parent / image).exists(), image


def test_the_figures_have_one_copy() -> None:
    """No other document repeats a line of bench/README.md's figures (a table row, a figure
    sentence): they would go stale with the next run."""
    figures = {
        line.strip()
        for line in BENCH_README.read_text().splitlines()
        if len(line.strip()) > 40 and re.search(r"\d", line)
    }
    assert figures
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        lines = {line.strip() for line in doc.read_text().splitlines()}
        copied = sorted(figures & lines)
        assert not copied, f"{doc.relative_to(ROOT)} copies bench/README.md: {copied[:3]}"
