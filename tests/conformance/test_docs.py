"""The conformance tests and tests/README.md's table of them agree (no lab needed)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

HERE = Path(__file__).parent
TESTS_README = HERE.parent / "README.md"


def upstream_names() -> dict[str, str]:
    """test function -> the upstream test name its docstring quotes."""
    found = {}
    for path in sorted(HERE.glob("test_*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                doc = ast.get_docstring(node) or ""
                match = re.search(r'Upstream: "\[sig-network\] ([^"]+)"', " ".join(doc.split()))
                if match:
                    found[node.name] = match.group(1)
    return found


def test_every_conformance_test_quotes_its_upstream_name() -> None:
    names = upstream_names()
    tests = [
        node.name
        for path in sorted(HERE.glob("test_*.py"))
        if path.name != "test_docs.py"
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
    ]
    assert tests and set(tests) == set(names), set(tests) - set(names)


def test_the_tests_readme_table_lists_every_conformance_test() -> None:
    text = TESTS_README.read_text()
    section = text[text.index("\n## Kubernetes conformance") :]
    rows = {
        line.split("|")[1].strip()
        for line in section.splitlines()
        if line.startswith("| should") or line.startswith("| Service")
    }
    for test, upstream in upstream_names().items():
        bare = re.sub(r"^(Services|Conntrack|Service endpoints latency) ", "", upstream)
        bare = bare.replace(" [LinuxOnly]", "")
        if upstream.startswith("Service endpoints latency"):
            bare = upstream
        assert bare in rows, (test, bare)
