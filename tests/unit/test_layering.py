"""The package layering is one-way: the import graph of tangentlens has no cycle, between its
packages or between its modules, the measurement core and the notebook API do not reach into the
sweep machinery, and the probes reach neither, nor the report.

Every import counts, wherever it is written: at module level, inside a function, under
``if TYPE_CHECKING:``, a ``LazyModule("tangentlens.…")`` and a renderer a reporting declaration
names by import path (``Table(…, render="module:function")``, :mod:`tangentlens.reporting`:
the report loads it when it draws, so the declaring module depends on it); ``from package import
name`` counts as an import of the module the package lazily re-exports ``name`` from."""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

from tests.pages import page

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "src" / "tangentlens"

#: Module name → (source text, whether it is a package's ``__init__``).
Sources = Mapping[str, tuple[str, bool]]
Graph = Mapping[str, set[str]]


def _module(path: Path) -> str:
    """The dotted name of a source file (``probes/`` is installed as ``tangentlens.probes``)."""
    if path.is_relative_to(ROOT / "probes"):
        parts = ("probes", *path.relative_to(ROOT / "probes").with_suffix("").parts)
    else:
        parts = path.relative_to(SOURCE).with_suffix("").parts
    return ".".join(("tangentlens", *parts)).removesuffix(".__init__")


def _sources() -> dict[str, tuple[str, bool]]:
    files = [*SOURCE.rglob("*.py"), *(ROOT / "probes").rglob("*.py")]
    return {_module(p): (p.read_text(encoding="utf-8"), p.name == "__init__.py") for p in files}


def _unit(module: str) -> str:
    """The package (or top-level module) a module belongs to: ``tangentlens.capture.engine`` →
    ``capture``; the package's own ``__init__`` → ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The module a ``from … import`` reads from, relative imports resolved."""
    if not node.level:
        return node.module or ""
    parts = module.split(".")[: len(module.split(".")) + is_package - node.level]
    return ".".join([*parts, *([node.module] if node.module else [])])


def _lazy_exports(tree: ast.Module, package: str) -> dict[str, str]:
    """Name → module of a package's ``lazy_exports`` (its re-exports and exported submodules)."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "lazy_exports"):
            continue
        if len(node.args) > 1 and isinstance(node.args[1], ast.Dict):
            for key, names in zip(node.args[1].keys, node.args[1].values, strict=True):
                target = ast.literal_eval(key)
                target = package + target if target.startswith(".") else target
                out.update({name: target for name in ast.literal_eval(names)})
        for keyword in node.keywords:
            if keyword.arg == "submodules":
                out.update({n: f"{package}.{n}" for n in ast.literal_eval(keyword.value)})
    return out


def _imports(
    tree: ast.Module, module: str, is_package: bool, lazy: Mapping[str, Mapping[str, str]]
) -> list[str]:
    """Every module ``module`` imports, wherever the import is written (module level, function
    bodies, ``if TYPE_CHECKING:``, ``LazyModule("…")``, a ``render="module:function"``
    keyword); ``from package import name`` names the submodule ``name``, else the module
    ``package`` lazily exports ``name`` from, else ``package``."""
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, module, is_package)
            for alias in node.names:
                out.append(lazy.get(base, {}).get(alias.name) or f"{base}.{alias.name}")
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", "") == "LazyModule"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            out.append(node.args[0].value)
        elif isinstance(node, ast.keyword) and node.arg == "render":
            value = getattr(node.value, "value", None)
            if isinstance(value, str) and ":" in value:
                out.append(value.split(":", 1)[0])
    return out


def _module_graph(sources: Sources) -> dict[str, set[str]]:
    """Module → the tangentlens modules it imports (a name that is no module stands for the
    module that defines it: its longest dotted prefix that is one)."""
    trees = {name: ast.parse(text) for name, (text, _) in sources.items()}
    lazy = {name: _lazy_exports(trees[name], name) for name, (_, pkg) in sources.items() if pkg}
    graph: dict[str, set[str]] = {name: set() for name in sources}
    for name, (_, is_package) in sources.items():
        for target in _imports(trees[name], name, is_package, lazy):
            while target not in sources and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in sources and target != name:
                graph[name].add(target)
    return graph


def _package_graph(modules: Graph) -> dict[str, set[str]]:
    """The module graph between units (:func:`_unit`), an import within a unit left out."""
    graph: dict[str, set[str]] = {}
    for source, targets in modules.items():
        for target in targets:
            if _unit(target) != _unit(source):
                graph.setdefault(_unit(source), set()).add(_unit(target))
    return graph


def _graph() -> dict[str, set[str]]:
    return _package_graph(_module_graph(_sources()))


def _cycle(graph: Graph) -> list[str] | None:
    """A cycle of ``graph`` (first node repeated at the end), or None when it has none."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_package_graph_has_no_cycle():
    graph = _graph()
    assert {"core", "sweep", "probes", "capture", "registry"} <= set(graph)  # the scan sees them
    assert "probes" in graph["registry"]  # a function-level import (the built-in catalogue)
    assert _cycle(graph) is None, " → ".join(_cycle(graph) or [])


def test_the_module_graph_has_no_cycle():
    graph = _module_graph(_sources())
    assert "tangentlens.models.hf_lens" in graph["tangentlens.models.lens"]  # the scan sees it
    assert _cycle(graph) is None, " → ".join(_cycle(graph) or [])


#: The layers of "How the code is laid out" (docs/development.md): a package imports only from
#: its own layer and those before it.
LAYERS: tuple[tuple[str, ...], ...] = (
    (
        "__init__",
        "_lazy",
        "paths",
        "checks",
        "typing",
        "runtime",
        "locking",
        "seeding",
        "results",
        "testing",
    ),
    ("metrics",),
    ("dictionaries",),
    ("data", "models"),
    ("capture",),
    ("contract", "reporting", "findings", "drawing"),
    ("proxies", "user_proxies"),
    ("probes",),
    ("registry", "glossary"),
    ("core",),
    ("notebook", "conformance"),
    ("sweep",),
    ("comparison", "report", "cli"),
)


def test_each_package_imports_only_from_its_layer_and_those_before():
    layer = {name: i for i, names in enumerate(LAYERS) for name in names}
    graph = _graph()
    assert set(graph) <= set(layer), sorted(set(graph) - set(layer))
    upward = [(a, b) for a, targets in graph.items() for b in targets if layer[b] > layer[a]]
    assert not upward, upward


def test_the_development_page_lists_the_layers():
    text = page("development").split("How the code is laid out", 1)[1]
    block = text.split("```text\n", 1)[1].split("```")[0]
    listed = [line.split("   ")[0].replace("/", "").split(", ") for line in block.splitlines()]
    public = [[n for n in names if n not in ("__init__", "_lazy", "paths")] for names in LAYERS]
    assert listed == public


def test_a_renderer_named_by_import_path_is_an_import():
    """A probe that names a report function as its renderer depends on the report: the layering
    refuses it, as it would the import."""
    graph = _synthetic(
        {
            "probes": "",
            "probes.mine": 'T = Table("m", "t", render="tangentlens.report.figures:draw")\n',
            "probes.render": "",
            "probes.render.mine": "def draw(rows): ...\n",
            "probes.theirs": 'F = Figure("f.png", render="tangentlens.probes.render.mine:draw")\n',
            "report": "",
            "report.figures": "def draw(rows): ...\n",
        },
        packages=("probes", "probes.render", "report"),
    )
    assert graph["tangentlens.probes.mine"] == {"tangentlens.report.figures"}
    assert graph["tangentlens.probes.theirs"] == {"tangentlens.probes.render.mine"}
    assert _package_graph(graph) == {"probes": {"report"}}


def test_the_core_and_the_notebook_do_not_import_the_sweep():
    graph = _graph()
    assert "sweep" not in graph["core"]
    assert "sweep" not in graph["notebook"]
    assert graph["probes"].isdisjoint({"core", "sweep", "notebook", "report", "registry"})


def test_a_cycle_is_found():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}}) is None


def _synthetic(sources: Mapping[str, str], packages: tuple[str, ...] = ()) -> dict[str, set[str]]:
    """The module graph of modules ``tangentlens.<name>`` with these sources."""
    return _module_graph(
        {f"tangentlens.{name}": (text, name in packages) for name, text in sources.items()}
    )


def test_a_cycle_through_a_function_level_import_is_found():
    graph = _synthetic(
        {
            "a": "from tangentlens.b import f\n",
            "b": "def f():\n    from tangentlens.a import g\n    return g\n",
        }
    )
    assert _cycle(graph) == ["tangentlens.a", "tangentlens.b", "tangentlens.a"]
    assert _cycle(_package_graph(graph)) == ["a", "b", "a"]


def test_a_cycle_through_a_type_checking_or_lazy_import_is_found():
    type_checking = _synthetic(
        {
            "a": "import tangentlens.b\n",
            "b": "if TYPE_CHECKING:\n    from tangentlens import a\n",
        }
    )
    assert _cycle(type_checking) == ["tangentlens.a", "tangentlens.b", "tangentlens.a"]
    lazy = _synthetic({"a": "import tangentlens.b\n", "b": 'm = LazyModule("tangentlens.a")\n'})
    assert _cycle(lazy) == ["tangentlens.a", "tangentlens.b", "tangentlens.a"]


def test_a_name_a_package_re_exports_is_read_as_its_module():
    graph = _synthetic(
        {
            "pkg": '__all__, __getattr__, __dir__ = lazy_exports(__name__, {".b": ("B",)})\n',
            "pkg.b": "from . import C\n",  # not re-exported: the package itself
            "pkg.c": "def f():\n    from tangentlens.pkg import B\n",
        },
        packages=("pkg",),
    )
    assert graph == {"tangentlens.pkg": set(), "tangentlens.pkg.b": {"tangentlens.pkg"},
                     "tangentlens.pkg.c": {"tangentlens.pkg.b"}}  # fmt: skip


def test_an_acyclic_graph_passes_with_every_kind_of_import():
    graph = _synthetic(
        {
            "a": "import tangentlens.b\ndef f():\n    from tangentlens import c\n",
            "b": "if TYPE_CHECKING:\n    from tangentlens.c import x\n",
            "c": 'm = LazyModule("tangentlens.d")\n',
            "d": "import os\n",
        }
    )
    assert graph == {"tangentlens.a": {"tangentlens.b", "tangentlens.c"},
                     "tangentlens.b": {"tangentlens.c"}, "tangentlens.c": {"tangentlens.d"},
                     "tangentlens.d": set()}  # fmt: skip
    assert _cycle(graph) is None
