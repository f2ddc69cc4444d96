"""The package's layout holds: imports go one way (no cycle among dfairpca's modules), and
the layers docs/design.md draws keep their direction where a cycle would be easy to make."""

import ast
import functools
from pathlib import Path

import pytest

import dfairpca

PACKAGE = Path(dfairpca.__file__).parent


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package is its __init__)."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules) -> set[str]:
    """The dfairpca modules ``name`` imports anywhere in its source (functions included):
    ``import a.b``, ``from a import b`` (b a module or a name of a) and relative forms."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            # "from x import y" imports the module x.y, or the name y of the module x
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                       for alias in node.names]
        else:
            continue
        for target in targets:
            # "import a.b.c" also imports a and a.b; only the named module is an edge
            if target in modules and target != name:
                found.add(target)
    return found


@functools.cache  # the files do not change during a run: parsed once, not once per test
def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _shortest_cycle(graph, component) -> list[str]:
    """A shortest cycle through the component's modules (breadth first from each), which
    names the imports that close it."""
    members, best = set(component), None
    for start in sorted(component):
        parent, queue, last = {start: None}, [start], None
        while queue and last is None:
            v = queue.pop(0)
            for w in sorted(graph[v] & members):
                if w == start:
                    last = v
                    break
                if w not in parent:
                    parent[w] = v
                    queue.append(w)
        if last is None:
            continue
        path = [last]
        while parent[path[-1]] is not None:
            path.append(parent[path[-1]])
        cycle = path[::-1] + [start]
        if best is None or len(cycle) < len(best):
            best = cycle
    return best


def _reachable(graph, start: str) -> set[str]:
    """The modules ``start`` imports, directly or through others, not through the package
    root (which imports every layer; an import of it is the cycle test's to catch)."""
    seen, todo = set(), [start]
    while todo:
        for w in graph[todo.pop()] - seen - {"dfairpca"}:
            seen.add(w)
            todo.append(w)
    return seen


def test_the_graph_walker_sees_every_kind_of_import():
    """The walker finds module-level, function-level, relative and absolute imports, so
    the cycle test below can fail."""
    graph = _graph()
    assert "dfairpca.decomposition" in graph["dfairpca.kernel"]  # from .decomposition import
    assert "dfairpca.checkpoint" in graph["dfairpca._linear"]  # inside a method
    assert "dfairpca.io" in graph["dfairpca._saved"]  # inside a function
    toy = {"a": {"b", "d"}, "b": {"c"}, "c": {"a"}, "d": {"c"}, "e": {"a"}}
    assert _cycles(toy) == [["a", "b", "c", "d"]]
    assert _shortest_cycle(toy, ["a", "b", "c", "d"]) == ["a", "b", "c", "a"]


def test_no_import_cycle_among_dfairpca_modules():
    graph = _graph()
    cycles = [" -> ".join(_shortest_cycle(graph, c)) for c in _cycles(graph)]
    assert not cycles, "import cycles, e.g. " + "; ".join(cycles)


@pytest.mark.parametrize("module, forbidden", [
    # io loads every model through the registry, never by importing an estimator
    ("dfairpca.io", {"dfairpca.decomposition", "dfairpca.kernel", "dfairpca._base"}),
    ("dfairpca._registry", {"dfairpca.decomposition", "dfairpca.kernel", "dfairpca._base"}),
    ("dfairpca._saved", {"dfairpca.decomposition", "dfairpca.kernel", "dfairpca._base"}),
    # the linear estimators never need the kernel module (the kernel may use FairPCA)
    ("dfairpca.decomposition", {"dfairpca.kernel", "dfairpca._kernels"}),
    # the core never imports the estimators
    ("dfairpca.moments", {"dfairpca.decomposition", "dfairpca.kernel", "dfairpca._base"}),
    # nor the pass: the accumulator imports Moments, never the other way
    ("dfairpca.moments", {"dfairpca._accumulator", "dfairpca._engine", "dfairpca.checkpoint"}),
    ("dfairpca._solvers", {"dfairpca.decomposition", "dfairpca.kernel", "dfairpca._base"}),
    # the exact solve, like the randomized one, is below the estimators that call it
    ("dfairpca._exact", {"dfairpca.decomposition", "dfairpca.kernel", "dfairpca._base",
                         "dfairpca._linear"}),
    ("dfairpca._randomized", {"dfairpca.decomposition", "dfairpca.kernel", "dfairpca._base",
                              "dfairpca._linear"}),
    ("dfairpca._thin_pass", {"dfairpca.decomposition", "dfairpca.kernel", "dfairpca._base",
                             "dfairpca._linear", "dfairpca._randomized"}),
    # the edges' storage: URLs below the write protocol, the marker's rules below both
    ("dfairpca._remote", {"dfairpca._writes", "dfairpca.io", "dfairpca.checkpoint",
                          "dfairpca.decomposition", "dfairpca.kernel", "dfairpca._base", "dfairpca.cli"}),
    ("dfairpca._marker", {"dfairpca._remote", "dfairpca._writes", "dfairpca.io",
                          "dfairpca.decomposition", "dfairpca.kernel", "dfairpca._base"}),
])
def test_imports_go_down_the_layers(module, forbidden):
    graph = _graph()
    assert module in graph
    assert not (_reachable(graph, module) & forbidden)
