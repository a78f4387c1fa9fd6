"""The README's package table matches the folders: every package and top-level module of
src/ovsproxy has a row, and each row names every module of its package, so a newcomer finds
each job by its module name."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "ovsproxy"


def package_rows() -> dict[str, str]:
    """``{package or module name: the rest of its row}`` from the README's package table."""
    text = (ROOT / "README.md").read_text()
    table = text[text.index("| package | owns (modules) |") :].split("\n\n", 1)[0]
    rows: dict[str, str] = {}
    for line in table.splitlines()[2:]:
        first, _, rest = line.strip("|").partition("|")
        for name in re.findall(r"`([^`]+)`", first):
            rows[name.rstrip("/")] = rest
    return rows


def test_every_package_and_module_has_a_row_naming_its_modules() -> None:
    rows = package_rows()
    for path in sorted(PACKAGE.iterdir()):
        if path.name.startswith((".", "_")) and path.name != "__main__.py":
            continue
        if path.is_dir() and not (path / "__init__.py").exists():
            continue  # data (the example manifests)
        if path.suffix not in (".py", "") or path.name.endswith(".egg-info"):
            continue
        name = path.stem
        assert name in rows, f"README package table: no row for {name}"
        if path.is_dir():
            children = sorted(
                p.stem if p.suffix == ".py" else p.name
                for p in path.iterdir()
                if (p.suffix == ".py" and not p.name.startswith("_"))
                or (p.is_dir() and (p / "__init__.py").exists())
            )
            missing = [
                c for c in children if f"`{c}`" not in rows[name] and f"`{c}/`" not in rows[name]
            ]
            assert not missing, f"README row {name}/ does not name {missing}"
