"""The package's layout holds: every module belongs to one layer of :data:`LAYERS` (the
table README "Layout" draws), imports only go down the layers or stay within one, and there
is no import cycle among dfairpca's modules."""

import ast
import functools
from pathlib import Path

import pytest

import dfairpca

PACKAGE = Path(dfairpca.__file__).parent


@functools.cache
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
        elif isinstance(node, ast.Call) and _is_import_module(node):
            targets = _import_module_targets(name, package, node, path)
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


def _is_import_module(node: ast.Call) -> bool:
    f = node.func
    return (isinstance(f, ast.Attribute) and f.attr == "import_module") or (
        isinstance(f, ast.Name) and f.id == "import_module")


#: modules that import by a computed name, and what they may reach that way: a package's
#: own submodules (its lazy public names), never a module of another layer by a string
COMPUTED_IMPORTS = {
    "dfairpca": "_PUBLIC",  # the values of its _PUBLIC table, read below
    "dfairpca.celeba": "dfairpca.celeba",
    # the experiments, by the names of the configuration
    "dfairpca.paper._run": ("dfairpca.paper.faces", "dfairpca.paper.synthetic", "dfairpca.paper.tables",
                            "dfairpca.paper.tradeoff"),
}


def _import_module_targets(name: str, package: str, node: ast.Call, path: Path) -> list[str]:
    """The modules an ``importlib.import_module`` call imports: its constant argument
    (relative to ``__name__`` / ``__package__``), or for a computed one what
    :data:`COMPUTED_IMPORTS` allows that module (an unlisted one fails here)."""
    arg = node.args[0] if node.args else None
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        target = arg.value
        if target.startswith("."):
            base = package.split(".")
            level = len(target) - len(target.lstrip("."))
            base = base[: len(base) - (level - 1)]
            target = ".".join(base + [target.lstrip(".")])
        return [target]
    allowed = COMPUTED_IMPORTS.get(name)
    assert allowed is not None, (
        f"{name} imports a module by a computed name ({ast.unparse(node)}), which the layer "
        "test cannot follow: import it by name, or list it in COMPUTED_IMPORTS")
    if isinstance(allowed, tuple):
        return list(allowed)
    if allowed == "_PUBLIC":
        table = next(n.value for n in ast.walk(ast.parse(path.read_text()))
                     if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "_PUBLIC"
                                                          for t in n.targets))
        return sorted({f"{name}.{v.value}" for v in table.values})
    return [m for m in _modules() if m.startswith(allowed + ".")]


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


#: the layers, top first: each module belongs to the first entry naming it or a package
#: above it.  Imports go down this table or stay within a layer (README "Layout").
LAYERS = [
    ("applications", ["dfairpca.__main__", "dfairpca.cli", "dfairpca.celeba", "dfairpca.paper",
                      "dfairpca.datasets"]),
    ("public API", ["dfairpca"]),  # the package root: its names, imported on first use
    ("estimators", ["dfairpca.decomposition", "dfairpca.metrics"]),
    ("solvers", ["dfairpca.solve"]),
    ("the pass", ["dfairpca.engine"]),
    ("statistics", ["dfairpca.stats"]),
    ("input", ["dfairpca.inputs"]),
    ("edges", ["dfairpca.io", "dfairpca.cluster"]),  # storage, Zarr, reaching the cluster
    ("foundations", ["dfairpca.base", "dfairpca.errors"]),
]


def _layer(module: str, layers=LAYERS) -> int | None:
    """The index in ``layers`` of the layer holding ``module`` (the longest matching name)."""
    best, where = -1, None
    for i, (_, names) in enumerate(layers):
        for n in names:
            if (module == n or module.startswith(n + ".")) and len(n) > best:
                best, where = len(n), i
    return where


def _upward(graph, layers=LAYERS) -> list[str]:
    """Every import from a module to one in a higher layer, as "a (layer) -> b (layer)"."""
    out = []
    for a, targets in sorted(graph.items()):
        for b in sorted(targets):
            la, lb = _layer(a, layers), _layer(b, layers)
            if la is not None and lb is not None and lb < la:
                out.append(f"{a} ({layers[la][0]}) -> {b} ({layers[lb][0]})")
    return out


def test_the_graph_walker_sees_every_kind_of_import():
    """The walker finds module-level, function-level, relative, absolute and
    import_module imports, so the tests below can fail."""
    graph = _graph()
    assert "dfairpca.decomposition._pca" in graph["dfairpca.decomposition.kernel"]  # from ._pca import
    assert "dfairpca.engine.checkpoint" in graph["dfairpca.decomposition._linear"]  # inside a method
    assert "dfairpca.io" in graph["dfairpca.decomposition._saved"]  # inside a function
    assert "dfairpca.stats.moments" in graph["dfairpca"]  # a computed import_module name
    toy = {"a": {"b", "d"}, "b": {"c"}, "c": {"a"}, "d": {"c"}, "e": {"a"}}
    assert _cycles(toy) == [["a", "b", "c", "d"]]
    assert _shortest_cycle(toy, ["a", "b", "c", "d"]) == ["a", "b", "c", "a"]


def test_every_module_is_in_one_layer():
    unmapped = sorted(m for m in _modules() if _layer(m) is None)
    assert not unmapped, f"modules in no layer of LAYERS: {unmapped}"


def test_imports_only_go_down_the_layers():
    upward = _upward(_graph())
    assert not upward, "imports to a higher layer: " + "; ".join(upward)


@pytest.mark.parametrize("source, injected", [
    ("dfairpca.stats._sums", "from ..celeba import render\n"),
    ("dfairpca.base._solvers", "from ..engine import _engine\n"),
    ("dfairpca.inputs._validation", "def f():\n    from ..celeba import schema\n"),
    ("dfairpca.stats.moments", "import dfairpca.cli\n"),
    ("dfairpca.io._registry", "import importlib\nimportlib.import_module('dfairpca.decomposition')\n"),
    ("dfairpca.engine._accumulator", "from ..solve import _exact\n"),
    ("dfairpca.io._writes", "from dfairpca.decomposition import PCA\n"),
])
def test_an_injected_upward_import_is_caught(source, injected, tmp_path):
    """Each kind of upward edge, added to a copy of a module, fails the layer test."""
    modules = _modules()
    text = modules[source].read_text() + "\n" + injected
    path = tmp_path / modules[source].name
    path.write_text(text)
    graph = {**_graph(), source: _imports(source, path, modules)}
    assert any(line.startswith(source + " ") for line in _upward(graph))


def test_no_import_cycle_among_dfairpca_modules():
    graph = _graph()
    cycles = [" -> ".join(_shortest_cycle(graph, c)) for c in _cycles(graph)]
    assert not cycles, "import cycles, e.g. " + "; ".join(cycles)


def test_at_most_eight_modules_sit_flat_in_the_package():
    """The layers are folders: what is left flat is the package root, its command line and
    the few public modules a user imports by name."""
    flat = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(flat) <= 8, flat
