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
    ("proxy", "routes", "capture"),  # capture: the node's nftables table, as routes its routes
    # healthcheck imports only the model: it sits below the proxy, which is to feed it
    ("datapath", "sources", "servicecidr", "healthcheck", "ovs", "lab"),
    ("openflow",),
    # the bottom: shared values, and leaf helpers that import nothing of ovsproxy
    # ("" is the package itself: ovsproxy.__version__)
    ("model", "gcpause", "heap", "metrics", "netns", ""),
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
