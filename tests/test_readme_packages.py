"""The package tables match the folders, one line a package or module: the README's has a
row for every package and top-level module of src/ovsproxy, docs/modules.md one for every
package (at any depth) and module, named by its path (``agent/``, ``agent/core``,
``config``); each row says what it owns, and no row names a module that is gone, so a
newcomer finds each job by its module name."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "ovsproxy"
README = ROOT / "README.md"
MODULES = ROOT / "docs" / "modules.md"
README_HEADER = "| package | owns | Antrea's counterpart |"
MODULES_HEADER = "| module | owns | Antrea's counterpart |"
LONGEST_ROW = 240
DEFINITIONS = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def table(doc: Path, header: str) -> str:
    text = doc.read_text()
    assert header in text, f"{doc.name}: no table headed {header}"
    return text[text.index(header) :].split("\n\n", 1)[0]


def table_rows(doc: Path, header: str) -> dict[str, str]:
    """``{module path: what it owns}`` from a package table, in order."""
    rows: dict[str, str] = {}
    for line in table(doc, header).splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        names = re.fullmatch(r"`([^`]+)`", cells[0])
        assert names, f"{doc.name} package table: a row's first cell is not one `module`: {line}"
        assert names.group(1) not in rows, (
            f"{doc.name} package table: two rows for {names.group(1)}"
        )
        rows[names.group(1)] = cells[1]
    return rows


def source_modules() -> list[str]:
    """Every package (``name/``) and module (``name``) of src/ovsproxy, as table paths."""
    found: list[str] = []

    def walk(folder: Path, prefix: str) -> None:
        for path in sorted(folder.iterdir()):
            if path.is_dir():
                if (path / "__init__.py").exists() and not path.name.startswith((".", "_")):
                    found.append(f"{prefix}{path.name}/")
                    walk(path, f"{prefix}{path.name}/")
                continue  # data (the example manifests), caches
            if path.suffix != ".py":
                continue
            if path.name == "__init__.py":
                # a package's __init__ has a row where it defines a class or function
                body = ast.parse(path.read_text()).body
                if prefix and any(isinstance(n, DEFINITIONS) for n in body):
                    found.append(f"{prefix}__init__")
            elif not path.name.startswith("_") or path.name == "__main__.py":
                found.append(f"{prefix}{path.stem}")

    walk(PACKAGE, "")
    return found


def test_the_readme_has_a_row_for_every_package_and_top_level_module() -> None:
    rows = table_rows(README, README_HEADER)
    top = [m for m in source_modules() if "/" not in m.rstrip("/")]
    missing = [m for m in top if m not in rows]
    assert not missing, f"README package table: no row for {missing}"
    extra = [name for name in rows if name not in top]
    assert not extra, f"README package table: {extra} are no package or module of src/ovsproxy"
    assert all(rows.values()), "README package table: a row says nothing"


def test_docs_modules_has_a_row_for_every_package_and_module() -> None:
    rows = table_rows(MODULES, MODULES_HEADER)
    modules = source_modules()
    missing = [m for m in modules if m not in rows]
    assert not missing, f"docs/modules.md: no row for {missing}"
    extra = [name for name in rows if name not in modules]
    assert not extra, f"docs/modules.md: {extra} are no package or module of src/ovsproxy"
    empty = [name for name, owns in rows.items() if not owns]
    assert not empty, f"docs/modules.md: the rows {empty} say nothing"


def test_rows_are_one_line_a_module_and_readable() -> None:
    for doc, header in ((README, README_HEADER), (MODULES, MODULES_HEADER)):
        long = [line[:60] for line in table(doc, header).splitlines() if len(line) > LONGEST_ROW]
        assert not long, f"{doc.name} package table: rows over {LONGEST_ROW} characters: {long}"
