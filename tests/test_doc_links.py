"""The README is a front page, and every document it leads to is reachable and whole: the
README is at most 250 lines, links each moved document, and every relative link in README.md,
docs/*.md and the folders' READMEs names a file that exists (and a heading there, for an
anchor)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FRONT_PAGE_LINES = 250
# What left the README for documents of their own; each must stay one link away.
MOVED = (
    "docs/configuration.md",
    "docs/operations.md",
    "docs/semantics.md",
    "docs/observability.md",
    "docs/byhand.md",
    "docs/evidence.md",
    "docs/limits.md",
    "docs/modules.md",
    "deploy/README.md",
    "tests/README.md",
    "bench/README.md",
)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
CODE = re.compile(r"`[^`\n]*`")


FOLDER_READMES = (
    "deploy/README.md",
    "tests/README.md",
    "tests/conformance/README.md",
    "bench/README.md",
)


def documents() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md")), *(ROOT / f for f in FOLDER_READMES)]


def links(text: str) -> list[str]:
    """The link targets of a Markdown text, code blocks and code spans left out."""
    prose = CODE.sub("", FENCE.sub("", text))
    return LINK.findall(prose)


def anchors(text: str) -> set[str]:
    """GitHub's ids of a document's headings (lower case, punctuation dropped, spaces to
    hyphens; a repeated heading gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6} (.+)$", FENCE.sub("", text), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def test_the_readme_is_a_front_page() -> None:
    lines = README.read_text().count("\n")
    assert lines <= FRONT_PAGE_LINES, f"README.md has {lines} lines (at most {FRONT_PAGE_LINES})"


def test_every_moved_document_is_linked_from_the_readme() -> None:
    linked = {
        (README.parent / target.partition("#")[0]).resolve() for target in links(README.read_text())
    }
    for moved in MOVED:
        assert (ROOT / moved).resolve() in linked, f"README.md does not link {moved}"


def test_every_relative_link_resolves() -> None:
    broken = []
    for doc in documents():
        text = doc.read_text()
        for target in links(text):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            where = f"{doc.relative_to(ROOT)}: ({target})"
            if not dest.exists():
                broken.append(f"{where}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
                broken.append(f"{where}: no such heading")
    assert not broken, "\n".join(broken)


def test_the_anchors_are_githubs() -> None:
    text = "# Removing it from a node: `ovsproxy cleanup`\n## Step by step\n## Step by step\n"
    assert anchors(text) == {
        "removing-it-from-a-node-ovsproxy-cleanup",
        "step-by-step",
        "step-by-step-1",
    }
