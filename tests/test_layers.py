"""The import structure of src/ovsproxy: no circles, and every import points down the layers.

Read from the source (``ast``), not by importing: every ``import`` and ``from ... import`` in a
module counts, wherever it is (module level, inside a function, under ``if TYPE_CHECKING:``).
``from package import name`` counts as an import of ``package.name`` when that is a module, and
of ``package`` (its ``__init__``) otherwise. Importing ``a.b`` is not counted as importing ``a``
as well (Python runs ``a/__init__`` first, but that is the package's own business).

The layer order is the README's ("Layers"); a top-level package or module not listed here fails
the test until it is given a place.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT_PACKAGE = "ovsproxy"

# Top to bottom. A module may import modules of its own top-level package, and of any layer
# below its own; nothing sideways (except SIDEWAYS) and nothing up.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("__main__",),  # entry points: python -m ovsproxy runs the command line
    ("cli",),
    ("agent",),  # one run of the agent: wiring, sync, pods, observability, lifecycle
    ("config",),  # the agent's validated settings (they name pipeline values: mode, tables)
    ("proxy", "routes", "steering"),  # steering: the node's nftables table; routes: its routes
    # read-side: compare and trace read the datapath's values, agent and cli use them
    ("diagnostics",),
    # healthcheck imports only the model: it sits below the proxy, which is to feed it
    ("datapath", "sources", "servicecidr", "healthcheck", "ovs", "lab"),
    ("openflow",),
    # the bottom: shared values, and leaf helpers that import nothing of ovsproxy
    # ("" is the package itself: ovsproxy.__version__)
    ("model", "gcpause", "heap", "metrics", "netns", ""),
    # the bounded HTTP server under metrics' endpoints and the healthCheckNodePort servers
    ("httpserver",),
)
# Allowed imports between two packages of the same layer, (importer, imported), with why.
SIDEWAYS: Mapping[tuple[str, str], str] = {
    ("lab", "ovs"): "the example lab builds its pods in the OVS sandbox",
}


# Downward, yet wrong: value types that crossed layers through an I/O module or a sibling.
WRONG_WAY: Mapping[tuple[str, str], str] = {
    ("proxy", "sources"): "sources deliver to the tracker through model.handler",
    ("proxy", "ovs"): "pod ports reach the proxier as model.node values, OVSDB stays below",
    ("routes", "datapath"): "the virtual next hop is model.node's, shared with the pipeline",
}


def module_sources(src: Path = SRC) -> dict[str, str]:
    """``{dotted module name: source text}`` of every module under ``src/ovsproxy``."""
    out: dict[str, str] = {}
    for path in sorted((src / ROOT_PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path.read_text()
    return out


def _packages(modules: Iterable[str]) -> set[str]:
    """Modules that are packages: a prefix of another module."""
    names = set(modules)
    return {name.rsplit(".", 1)[0] for name in names if "." in name} & names


@functools.cache
def _imports(module: str, here: str, text: str) -> tuple[str, ...]:
    """Every ovsproxy name ``module`` imports (``here``: the package relative imports start
    from), each as module or as ``package.name`` candidates (resolved by ``import_graph``)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            names.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")[: len(here.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names.extend(f"{target}\0{alias.name}" for alias in node.names)
    return tuple(n for n in names if n.split(".")[0].split("\0")[0] == ROOT_PACKAGE)


def import_graph(sources: Mapping[str, str]) -> dict[str, set[str]]:
    """``{module: the ovsproxy modules it imports}``."""
    known = set(sources)
    packages = _packages(known)
    graph: dict[str, set[str]] = {}
    for module, text in sources.items():
        here = module if module in packages else module.rsplit(".", 1)[0]
        deps: set[str] = set()
        for name in _imports(module, here, text):
            target, _, attr = name.partition("\0")
            sub = f"{target}.{attr}"
            deps.add(sub if attr and sub in known else target)
        graph[module] = {d for d in deps if d in known and d != module}
    return graph


def top_level(module: str) -> str:
    """``ovsproxy.datapath.groups`` -> ``datapath``; the package itself -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer_of(name: str) -> int | None:
    for rank, layer in enumerate(LAYERS):
        if name in layer:
            return rank
    return None


def layer_violations(graph: Mapping[str, set[str]]) -> list[str]:
    problems: list[str] = []
    for module in sorted(graph):
        if layer_of(top_level(module)) is None:
            problems.append(f"{module}: top-level {top_level(module)!r} has no layer in LAYERS")
    for module, deps in sorted(graph.items()):
        mine = top_level(module)
        for dep in sorted(deps):
            theirs = top_level(dep)
            if theirs == mine:
                continue
            rank, dep_rank = layer_of(mine), layer_of(theirs)
            if rank is None or dep_rank is None:
                continue  # reported above
            if (mine, theirs) in WRONG_WAY:
                problems.append(
                    f"{module} imports {dep}: {WRONG_WAY[mine, theirs]} ({mine!r} -> {theirs!r})"
                )
                continue
            if dep_rank > rank or (mine, theirs) in SIDEWAYS:
                continue
            where = "up" if dep_rank < rank else "sideways"
            problems.append(f"{module} imports {dep}: {where} ({mine!r} -> {theirs!r})")
    return problems


def circles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The import circles: strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for dep in sorted(graph.get(node, ())):
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def package_circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Circles between the children of each package (its subpackages, modules and its own
    ``__init__``), counting every import from anywhere inside one child into another."""
    found: list[list[str]] = []
    for package in sorted(_packages(graph)):
        prefix = package + "."

        def child(module: str, package: str = package, prefix: str = prefix) -> str | None:
            if module == package:
                return package + ".__init__"
            if not module.startswith(prefix):
                return None
            return prefix + module[len(prefix) :].split(".", maxsplit=1)[0]

        children: dict[str, set[str]] = {}
        for module, deps in graph.items():
            src = child(module)
            if src is None:
                continue
            for dep in deps:
                dst = child(dep)
                if dst is not None and dst != src:
                    children.setdefault(src, set()).add(dst)
        found.extend(circles(children))
    return found


def test_every_module_has_a_layer_and_imports_only_downward() -> None:
    assert layer_violations(import_graph(module_sources())) == []


def test_no_import_circle_between_modules() -> None:
    assert circles(import_graph(module_sources())) == []


def test_no_import_circle_between_packages() -> None:
    assert package_circles(import_graph(module_sources())) == []


def _with(extra: Mapping[str, str]) -> dict[str, set[str]]:
    """The real tree's import graph with ``extra`` source appended to some modules."""
    sources = module_sources()
    for module, text in extra.items():
        sources[module] = sources.get(module, "") + text
    return import_graph(sources)


def test_the_checks_catch_an_injected_bad_import() -> None:
    """The same checks on the real tree with one bad import added: each one is reported."""
    # upward, and only for the type checker: still counts
    graph = _with(
        {
            "ovsproxy.model.node": "\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from ovsproxy.proxy.proxier import Proxier\n"
        }
    )
    assert "ovsproxy.model.node imports ovsproxy.proxy.proxier: up ('model' -> 'proxy')" in (
        layer_violations(graph)
    )
    assert any("ovsproxy.model.node" in circle for circle in circles(graph))
    # sideways, inside a function
    graph = _with(
        {"ovsproxy.sources.convert": "\ndef f():\n    from ovsproxy.datapath import pipeline\n"}
    )
    assert layer_violations(graph) == [
        "ovsproxy.sources.convert imports ovsproxy.datapath.pipeline: sideways "
        "('sources' -> 'datapath')"
    ]
    # a module circle inside one package (the old reject <-> semantics one)
    graph = _with({"ovsproxy.datapath.reject": "\nfrom ovsproxy.datapath.semantics import x\n"})
    assert circles(graph) == [["ovsproxy.datapath.reject", "ovsproxy.datapath.semantics"]]
    # a package circle through modules that form no module circle: servicecidr.aggregate ->
    # routes.backend, while routes.manager -> servicecidr.aggregate
    graph = _with({"ovsproxy.servicecidr.aggregate": "\nfrom ovsproxy.routes.backend import x\n"})
    assert circles(graph) == []
    assert package_circles(graph) == [["ovsproxy.routes", "ovsproxy.servicecidr"]]
    # down, but a known wrong way
    graph = _with({"ovsproxy.proxy.tracker": "\nfrom ovsproxy.sources.convert import x\n"})
    assert layer_violations(graph) == [
        "ovsproxy.proxy.tracker imports ovsproxy.sources.convert: sources deliver to the tracker "
        "through model.handler ('proxy' -> 'sources')"
    ]
    # a module with no place in the layers
    graph = _with({"ovsproxy.newthing": ""})
    assert layer_violations(graph) == [
        "ovsproxy.newthing: top-level 'newthing' has no layer in LAYERS"
    ]


def test_relative_and_from_package_imports_resolve_to_modules() -> None:
    sources = {
        "ovsproxy": "",
        "ovsproxy.model": "",
        "ovsproxy.datapath": "",
        "ovsproxy.datapath.pipeline": "from ..model import X\nfrom . import groups\n",
        "ovsproxy.datapath.groups": "from ovsproxy.datapath import pipeline as pl\n",
    }
    graph = import_graph(sources)
    assert graph["ovsproxy.datapath.pipeline"] == {"ovsproxy.model", "ovsproxy.datapath.groups"}
    assert graph["ovsproxy.datapath.groups"] == {"ovsproxy.datapath.pipeline"}
    assert circles(graph) == [["ovsproxy.datapath.groups", "ovsproxy.datapath.pipeline"]]


# -- no process-global mutable state ------------------------------------------------------------

# Methods that change a dict, list, set or deque in place.
_MUTATORS = frozenset(
    {
        "add",
        "append",
        "appendleft",
        "clear",
        "discard",
        "extend",
        "extendleft",
        "insert",
        "pop",
        "popitem",
        "popleft",
        "remove",
        "reverse",
        "setdefault",
        "sort",
        "update",
    }
)
# What makes a module-level name a mutable container (besides literals and comprehensions).
_MUTABLE_TYPES = frozenset(
    {
        "Counter",
        "OrderedDict",
        "WeakKeyDictionary",
        "WeakSet",
        "WeakValueDictionary",
        "bytearray",
        "defaultdict",
        "deque",
        "dict",
        "list",
        "set",
    }
)
_CACHE_DECORATORS = frozenset({"cache", "lru_cache"})

# Module-level caches still waiting for an owner, (module, name) with why. Each is a memo of a
# pure function of constants inside a value constructor that has no codec object yet.
NOT_YET_OWNED: Mapping[tuple[str, str], str] = {
    ("ovsproxy.openflow.protocol.fields", "_PLANS"): (
        "Match(**fields): the encoding plan per keyword set"
    ),
    ("ovsproxy.openflow.protocol.templates", "_SELECTION_PROPS"): (
        "the selection method property per (method, fields)"
    ),
    ("ovsproxy.datapath.groups", "_OVERHEADS"): "a GroupMod's size per selection method",
}

_Function = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda


def _called_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _mutable_globals(tree: ast.Module) -> set[str]:
    """Module-level names bound to a mutable container."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        mutable = isinstance(
            value, ast.Dict | ast.List | ast.Set | ast.DictComp | ast.ListComp | ast.SetComp
        ) or (isinstance(value, ast.Call) and _called_name(value) in _MUTABLE_TYPES)
        if mutable:
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def _mutated(function: _Function, names: set[str]) -> set[str]:
    """Which of the module-level ``names`` ``function`` changes in place, directly or through
    a local alias (``last = _MEMO; last[:] = ...``)."""
    aliases = {name: name for name in names}
    for node in ast.walk(function):
        value = node.value if isinstance(node, ast.Assign) else None
        if isinstance(value, ast.Name) and value.id in aliases:
            for target in node.targets:  # type: ignore[attr-defined]
                if isinstance(target, ast.Name):
                    aliases[target.id] = aliases[value.id]
    found: set[str] = set()
    for node in ast.walk(function):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign | ast.Delete):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            for part in ast.walk(target):
                if (
                    isinstance(part, ast.Subscript)
                    and isinstance(part.value, ast.Name)
                    and part.value.id in aliases
                ):
                    found.add(aliases[part.value.id])
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _MUTATORS
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in aliases
        ):
            found.add(aliases[node.func.value.id])
    return found


def _import_time_only(tree: ast.Module, name: str, others: Iterable[str]) -> bool:
    """A private function of the module that runs only while it is imported: named nowhere
    but in the module's own top-level statements (a table built row by row)."""
    named = re.compile(rf"\b{re.escape(name)}\b")
    if not name.startswith("_") or any(named.search(text) for text in others):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            body = node.body if isinstance(node.body, list) else [node.body]
            for statement in body:
                for part in ast.walk(statement):
                    if isinstance(part, ast.Name) and part.id == name:
                        return False
    return True


def module_state_violations(sources: Mapping[str, str]) -> list[str]:
    """Process-global mutable state in ``sources``: ``functools.cache``/``lru_cache``,
    ``global`` rebinding, and module-level containers that functions change (caches belong
    to an object their owner holds). Tables filled while the module is imported are fine."""
    problems: list[str] = []
    for module, text in sorted(sources.items()):
        tree = ast.parse(text)
        names = _mutable_globals(tree)
        others = [t for m, t in sources.items() if m != module]
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for decorator in node.decorator_list:
                if _called_name(decorator) in _CACHE_DECORATORS:
                    problems.append(
                        f"{module}.{node.name}: a process-wide cache "
                        f"({_called_name(decorator)}); make it a field of its owner"
                    )
            for part in ast.walk(node):
                if isinstance(part, ast.Global):
                    problems.append(
                        f"{module}.{node.name}: rebinds module state (global "
                        f"{', '.join(part.names)})"
                    )
            changed = _mutated(node, names)
            if changed and _import_time_only(tree, node.name, others):
                continue
            for name in sorted(changed):
                if (module, name) not in NOT_YET_OWNED:
                    problems.append(
                        f"{module}.{node.name} changes module-level {name}: a cache belongs "
                        "to an object its owner holds"
                    )
    return sorted(set(problems))


def test_src_keeps_no_process_global_mutable_state() -> None:
    assert module_state_violations(module_sources()) == []


def test_the_state_check_catches_planted_caches() -> None:
    """The same check on the real tree with one cache of each kind planted."""
    planted = {
        "ovsproxy.sources.convert": "\n_SEEN: dict[str, int] = {}\n\n"
        "def remember(text):\n    _SEEN[text] = 1\n",
        "ovsproxy.openflow.session": "\n_LAST = [None]\n\n"
        "def last(x):\n    memo = _LAST\n    memo[:] = [x]\n",
        "ovsproxy.datapath.service_flows": "\nimport functools\n\n"
        "@functools.lru_cache(maxsize=8)\ndef cached(x):\n    return x\n",
        "ovsproxy.model.node": "\n_COUNT = 0\n\ndef bump():\n    global _COUNT\n    _COUNT += 1\n",
        "ovsproxy.sources.kubejson": "\n_NAMES = set()\n\n"
        "class Codec:\n    def see(self, name):\n        _NAMES.add(name)\n",
    }
    sources = module_sources()
    for module, text in planted.items():
        sources[module] += text
    assert module_state_violations(sources) == sorted(
        [
            "ovsproxy.sources.convert.remember changes module-level _SEEN: a cache belongs to "
            "an object its owner holds",
            "ovsproxy.openflow.session.last changes module-level _LAST: a cache belongs to an "
            "object its owner holds",
            "ovsproxy.datapath.service_flows.cached: a process-wide cache (lru_cache); make it a "
            "field of its owner",
            "ovsproxy.model.node.bump: rebinds module state (global _COUNT)",
            "ovsproxy.sources.kubejson.see changes module-level _NAMES: a cache belongs to an "
            "object its owner holds",
        ]
    )
    # A table filled row by row while the module is imported is not a cache; the same
    # function called at run time is.
    table = (
        "\n_ROWS: list[int] = []\n\ndef _row(n):\n    _ROWS.append(n)\n    return n\n\n"
        "A = _row(1)\n"
    )
    sources = module_sources()
    sources["ovsproxy.model.node"] += table
    assert module_state_violations(sources) == []
    sources["ovsproxy.model.node"] += "\ndef later():\n    return _row(2)\n"
    assert module_state_violations(sources) == [
        "ovsproxy.model.node._row changes module-level _ROWS: a cache belongs to an object "
        "its owner holds"
    ]


# -- tests, benchmarks and what they share ------------------------------------------------------

ROOT = SRC.parent
# Each tree, and the top-level packages it must not import: tests and bench share only
# `support` (and the product); support is shared, so it imports neither.
NOT_FROM: Mapping[str, frozenset[str]] = {
    "tests": frozenset({"bench"}),
    "bench": frozenset({"tests"}),
    "support": frozenset({"tests", "bench"}),
}


def tree_sources(root: Path = ROOT) -> dict[str, str]:
    """``{path relative to the repository: source}`` of every module of tests, bench and
    support."""
    return {
        str(path.relative_to(root)): path.read_text()
        for tree in NOT_FROM
        for path in sorted((root / tree).rglob("*.py"))
    }


def cross_tree_imports(sources: Mapping[str, str]) -> list[str]:
    """Absolute imports from one tree into a tree it must not import (anywhere in a module:
    inside functions too)."""
    problems: list[str] = []
    for path, text in sorted(sources.items()):
        banned = NOT_FROM[path.split("/", 1)[0]]
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                if name.split(".")[0] in banned:
                    problems.append(f"{path}:{node.lineno} imports {name}")
    return problems


def test_tests_and_bench_import_each_other_not() -> None:
    assert cross_tree_imports(tree_sources()) == []


def test_the_tree_check_catches_planted_imports() -> None:
    sources = tree_sources()
    sources["tests/sources/test_fastyaml.py"] += "\nfrom bench import kubeapi\n"
    sources["bench/dp.py"] += "\ndef f():\n    import tests.k8s_fake\n"
    sources["support/cluster.py"] += "\nfrom bench.dp import cluster\n"
    sources["bench/tests/test_fuzz.py"] += "\nfrom tests.openflow import ofctl\n"
    problems = cross_tree_imports(sources)
    assert [p.split(":")[0] for p in problems] == [
        "bench/dp.py",
        "bench/tests/test_fuzz.py",
        "support/cluster.py",
        "tests/sources/test_fastyaml.py",
    ]
    assert problems[0].endswith("imports tests.k8s_fake")
