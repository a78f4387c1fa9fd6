"""The code base stays ruff-clean and strictly typed: a lint or type regression fails the suite
(and so CI), not just a pre-commit hook."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _ruff() -> list[str]:
    exe = Path(sys.executable).with_name("ruff")
    return [str(exe)] if exe.exists() else [shutil.which("ruff") or "ruff"]


def test_ruff_check_is_clean() -> None:
    result = subprocess.run(
        [*_ruff(), "check", "src", "tests", "bench", "support"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_is_clean() -> None:
    # Files, strictness and the few untyped third-party modules: [tool.mypy] in pyproject.toml.
    # The cache (.mypy_cache) makes reruns fast; a clean checkout pays for one full check.
    result = subprocess.run(
        [sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
