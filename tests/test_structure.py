"""The package's layout holds: every module belongs to one layer of :data:`LAYERS` (the
table README "Layout" draws), imports only go down the layers or stay within one, and there
is no import cycle among dfairpca's modules."""

import ast
import functools
import subprocess
import sys
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
    # the values of its _PUBLIC table, read below; its _SUBPACKAGES are no edges: the root
    # binds a folder as the attribute that ``import dfairpca.<name>`` binds, and needs none
    "dfairpca": "_PUBLIC",
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
    ("the cluster", ["dfairpca.cluster"]),  # connect, local cluster: an edge the CLI and users call
    ("estimators", ["dfairpca.decomposition", "dfairpca.metrics"]),
    ("solvers", ["dfairpca.solve"]),
    ("the pass", ["dfairpca.engine"]),
    ("statistics", ["dfairpca.stats"]),
    ("input", ["dfairpca.inputs"]),
    ("edges", ["dfairpca.io"]),  # storage, Zarr, the paths the workers share
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
    assert "dfairpca.decomposition._fair" in graph["dfairpca.decomposition.kernel"]  # from ._fair import
    assert "dfairpca.engine.checkpoint" in graph["dfairpca.decomposition._base"]  # inside a method
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


def _subpackage(module: str) -> str:
    """The subpackage (or flat module) of ``module``: ``dfairpca.io._zarr`` -> ``dfairpca.io``.
    A ``__main__`` is a node of its own: a script ``python -m`` runs, which nothing imports,
    so it closes no cycle."""
    if module.endswith(".__main__"):
        return module
    return ".".join(module.split(".")[:2])


def _subpackage_graph(graph) -> dict[str, set[str]]:
    """The imports between subpackages (and flat modules): one edge for any import between
    two of their modules."""
    out: dict[str, set[str]] = {}
    for a, targets in graph.items():
        out.setdefault(_subpackage(a), set())
        out[_subpackage(a)] |= {_subpackage(b) for b in targets} - {_subpackage(a)}
    return out


def test_no_import_cycle_among_subpackages():
    """Acyclic modules can still make cyclic folders (io -> cluster -> io through different
    modules): the subpackages, each taken as one node, import one another without a cycle."""
    graph = _subpackage_graph(_graph())
    graph = {a: targets & set(graph) for a, targets in graph.items()}
    cycles = [" -> ".join(_shortest_cycle(graph, c)) for c in _cycles(graph)]
    assert not cycles, "subpackage import cycles, e.g. " + "; ".join(cycles)


def test_the_subpackage_graph_sees_a_cycle_through_different_modules():
    graph = _subpackage_graph({"dfairpca.io._zarr": {"dfairpca.cluster._shared"},
                               "dfairpca.cluster._shared": {"dfairpca.io._remote"},
                               "dfairpca.io._remote": set()})
    assert _cycles(graph) == [["dfairpca.cluster", "dfairpca.io"]]


def _defines_something(tree: ast.Module) -> bool:
    """Whether a module's top level defines a function, class or name besides ``__all__``."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.AnnAssign)):
            return True
        if isinstance(node, ast.Assign) and not any(getattr(t, "id", None) == "__all__"
                                                    for t in node.targets):
            return True
    return False


def test_only_a_package_init_only_re_exports():
    """A module that only imports names for others to import from it is a second front door
    (a package's ``__init__`` is the one); and no ``noqa: F401`` keeps an unused import alive
    for an old path outside an ``__init__``."""
    hollow, kept = [], []
    for name, path in sorted(_modules().items()):
        if path.name in ("__init__.py", "__main__.py"):
            continue
        text = path.read_text()
        if not _defines_something(ast.parse(text)):
            hollow.append(name)
        kept += [f"{name}:{i}" for i, line in enumerate(text.splitlines(), 1) if "noqa: F401" in line]
    assert not hollow, f"modules that only re-export: {hollow}"
    assert not kept, f"re-export lines outside __init__ files: {kept}"


def test_only_io_tells_a_url_from_a_local_path():
    """Outside io, code asks ``storage_for(path)`` what it needs of where data lives; a call
    of ``is_remote`` there would be a second place that decides it."""
    calls = [f"{name}:{node.lineno}" for name, path in sorted(_modules().items())
             if not name.startswith("dfairpca.io")
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None))
             == "is_remote"]
    assert not calls, f"is_remote asked outside io: {calls}"


def _storage_kind_asked(text: str) -> list[int]:
    """The lines where ``text`` reads an attribute ``remote`` (a Storage's kind)."""
    return [node.lineno for node in ast.walk(ast.parse(text))
            if isinstance(node, ast.Attribute) and node.attr == "remote"]


def _io_private_uses(name: str, path: Path, text: str) -> list[str]:
    """What the module ``name`` (outside io) uses of io's privates: an import of one of its
    ``_`` modules (any form the layer graph follows) or of a ``_name`` from it, or an
    attribute ``io._name``."""
    modules = _modules()
    out = [f"{name} imports {target}" for target in sorted(_imports(name, path, modules))
           if target.startswith("dfairpca.io._")]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")
            source = (".".join(base[: len(base) - (node.level - 1)] + ([node.module] if node.module else []))
                      if node.level else node.module or "")
            out += [f"{name}:{node.lineno} from {source} import {a.name}" for a in node.names
                    if source == "dfairpca.io" and _private(a.name)]
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            owner = node.value
            if (isinstance(owner, ast.Name) and owner.id == "io") or (
                    isinstance(owner, ast.Attribute) and owner.attr == "io"):
                out.append(f"{name}:{node.lineno} {ast.unparse(node)}")
    return out


def _outside_io():
    return [(name, path) for name, path in sorted(_modules().items())
            if name != "dfairpca.io" and not name.startswith("dfairpca.io.")]


def test_only_io_knows_the_kind_of_storage():
    """Outside io, code asks a Storage what it needs (``user_path``, ``as_argument``,
    ``sibling``, ``local_copy``, ...), never whether it is remote: the kind of storage is
    io's to know, so that a backend is added in io alone."""
    asked = [f"{name}:{line}" for name, path in _outside_io()
             for line in _storage_kind_asked(path.read_text())]
    assert not asked, f"a storage's kind asked outside io: {asked}"


def test_no_module_outside_io_uses_its_private_modules():
    """io's ``__all__`` is its door: every layer above imports from ``dfairpca.io`` itself,
    so io's modules can be split, merged or renamed without touching them."""
    uses = [use for name, path in _outside_io() for use in _io_private_uses(name, path, path.read_text())]
    assert not uses, "io's privates used outside io: " + "; ".join(uses)


@pytest.mark.parametrize("module, injected", [
    ("dfairpca.engine.checkpoint", "from ..io._fsspec import local_copy\n"),
    ("dfairpca.decomposition._saved", "def f():\n    from ..io import _registry\n"),
    ("dfairpca.stats.moments", "import dfairpca.io._arrays\n"),
    ("dfairpca.cli._fit", "from ..io import _MARKERS\n"),
    ("dfairpca.engine._compute", "from .. import io\nx = io._remote\n"),
    ("dfairpca.solve._randomized", "import importlib\nimportlib.import_module('dfairpca.io._where')\n"),
])
def test_an_injected_io_private_use_is_caught(module, injected, tmp_path):
    path = tmp_path / _modules()[module].name
    path.write_text(_modules()[module].read_text() + "\n" + injected)
    assert _io_private_uses(module, path, path.read_text()), injected
    assert not _io_private_uses(module, _modules()[module], _modules()[module].read_text())


def test_an_injected_storage_kind_question_is_caught():
    assert _storage_kind_asked("def f(out):\n    return storage_for(out).remote\n") == [2]
    assert not _storage_kind_asked("def f(out):\n    return storage_for(out).user_path()\n")


def test_at_most_eight_modules_sit_flat_in_the_package():
    """The layers are folders: what is left flat is the package root, its command line and
    the few public modules a user imports by name."""
    flat = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(flat) <= 8, flat


#: the applications of LAYERS' top layer: each may import its own private modules, never
#: the library's (nor another application's), so that the library's internals can move
APPLICATIONS = LAYERS[0][1]


def _private(part: str) -> bool:
    """A ``_name`` (not a ``__dunder__``)."""
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _outside_private(target: str, own: str) -> bool:
    """Whether the module path ``target`` has a private component and lies outside ``own``."""
    if target == own or target.startswith(own + "."):
        return False
    return any(_private(part) for part in target.split("."))


def _private_uses(name: str, path: Path, text: str) -> list[str]:
    """What the application module ``name`` uses of another package's privates: a module
    path with a ``_`` component (``import``, ``from``, an ``import_module`` string), a
    ``_name`` imported from another package, and an attribute ``x._name`` of anything but
    ``self``, ``cls`` and ``super()``."""
    own = next(a for a in APPLICATIONS if name == a or name.startswith(a + "."))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def absolute(module: str, level: int) -> str:
        if not level:
            return module
        base = package.split(".")
        base = base[: len(base) - (level - 1)]
        return ".".join(base + ([module] if module else []))

    out = []
    for node in ast.walk(ast.parse(text, str(path))):
        where = f"{name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            out += [f"{where} import {a.name}" for a in node.names if _outside_private(a.name, own)]
        elif isinstance(node, ast.ImportFrom):
            source = absolute(node.module or "", node.level)
            if _outside_private(source, own):
                out.append(f"{where} from {source} import ...")
            elif not (source == own or source.startswith(own + ".")):
                out += [f"{where} from {source} import {a.name}" for a in node.names
                        if _private(a.name)]
        elif isinstance(node, ast.Call) and _is_import_module(node):
            arg = node.args[0] if node.args else None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                target = arg.value.lstrip(".")
                target = absolute(target, len(arg.value) - len(target))
                if _outside_private(target, own):
                    out.append(f"{where} import_module({arg.value!r})")
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if (isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name)
                    and owner.func.id == "super"):
                continue
            out.append(f"{where} {ast.unparse(node)}")
    return out


def _application_private_uses() -> list[str]:
    return [use for name, path in sorted(_modules().items()) if _layer(name) == 0
            for use in _private_uses(name, path, path.read_text())]


@pytest.mark.parametrize("module, injected", [
    ("dfairpca.cli._fit", "from ..io._writes import check_target\n"),
    ("dfairpca.cli", "def f():\n    import dfairpca.base._version\n"),
    ("dfairpca.celeba.pool", "from ..io import _remote\n"),
    ("dfairpca.celeba.schema", "from ..io import _ChunkError\n"),
    ("dfairpca.paper.tables", "from ..datasets._paper import DIGITS\n"),
    ("dfairpca.paper._run", "import importlib\nimportlib.import_module('dfairpca.io._files')\n"),
    ("dfairpca.cli._fit", "def f(est):\n    return est._fit_solver(3)\n"),
])
def test_an_injected_private_use_is_caught(module, injected):
    """Each kind of private use, added to an application module, is found; the module's own
    privates (``self._x``, its package's ``_modules``) are not."""
    path = _modules()[module]
    assert _private_uses(module, path, injected), injected
    own = ("from ._errors import CLIError\n" if module.startswith("dfairpca.cli") else
           "from . import _pieces\n" if module.startswith("dfairpca.paper") else "")
    own += "class A:\n    def f(self):\n        return self._x, super()._y()\n"
    assert not _private_uses(module, path, own)


def test_applications_use_only_the_librarys_public_api():
    """The command line, celeba, paper and datasets import the library's documented public
    modules and names only (each may use its own private modules)."""
    uses = _application_private_uses()
    assert not uses, "private uses by applications: " + "; ".join(uses)


def test_the_readme_draws_the_same_layers():
    """README "Layout" is this table: the same layers in the same order, each with the same
    folders and modules, so the picture users read cannot drift from what is enforced."""
    import re

    text = (PACKAGE.parent / "README.md").read_text(encoding="utf-8")
    block = re.search(r"## Layout\n.*?```\n(.*?)```", text, re.S)
    assert block, "README.md has no Layout picture"
    drawn = []
    for line in block.group(1).splitlines():
        layer, _, items = re.split(r"(\s{2,})", line.strip(), maxsplit=1)
        names = []
        for item in items.split(" · "):
            item = item.strip().removesuffix("/").removesuffix(".py")
            names.append("dfairpca" if item == "__init__" else f"dfairpca.{item}")
        drawn.append((layer, sorted(names)))
    assert drawn == [(layer, sorted(names)) for layer, names in LAYERS]


def test_the_root_gives_every_subpackage_by_its_name():
    """``dfairpca.<folder>`` after ``import dfairpca``, for every public folder and flat
    module (the docs write ``dfairpca.datasets.load_adult()``): the lazy table is the tree."""
    public = {name.split(".")[1] for name in _modules()
              if name.count(".") >= 1 and not name.split(".")[1].startswith("_")}
    assert dfairpca._SUBPACKAGES == public
    assert public <= set(dir(dfairpca))


def test_import_dfairpca_is_light_and_its_subpackages_come_on_first_use():
    """A fresh interpreter: ``import dfairpca`` imports none of the heavy dependencies
    (worker processes and ``dfairpca --help`` pay for it), and the README's line runs."""
    heavy = ("numpy", "scipy", "sklearn", "dask", "distributed", "zarr", "pandas", "matplotlib",
             "PIL", "tqdm", "fairlearn")
    code = f"""
import sys
import dfairpca
print(sorted({{m.split(".")[0] for m in sys.modules}} & set({heavy!r})))
print(sorted(m for m in sys.modules if m.startswith(("dfairpca.datasets", "dfairpca.metrics"))))
data = dfairpca.datasets.load_adult()
print(type(dfairpca.metrics.mmd2).__name__, len(data.X_train) > 0)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == ["[]", "[]", "function True"], done.stdout
    done = subprocess.run([sys.executable, "-c", "import dfairpca; dfairpca.no_such_name"],
                          capture_output=True, text=True, timeout=300)
    assert "has no attribute 'no_such_name'" in done.stderr


def test_the_command_line_loads_no_heavy_library_before_a_command_needs_it():
    """``dfairpca --help`` and a refused command line answer at once: the cli package
    loads numpy at most, the rest when a command runs (its deferred imports)."""
    code = ("import sys\nimport dfairpca.cli\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'zarr', 'PIL', 'scipy', 'sklearn', "
            "'dask', 'distributed', 'pandas', 'matplotlib', 'fsspec', 'xarray'}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
