"""The package layering is one-way: the import graph between tangentlens' packages (module-level
imports, type-checking-only imports left out) has no cycle, the measurement core and the notebook
API do not reach into the sweep machinery, and the probes reach neither."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "src" / "tangentlens"


def _unit(path: Path) -> str:
    """The package (or top-level module) a source file belongs to."""
    if path.parent == ROOT / "probes":
        return "probes"
    return path.relative_to(SOURCE).with_suffix("").parts[0]


def _module_level_imports(tree: ast.Module) -> list[str]:
    """Modules imported at module level, outside ``if TYPE_CHECKING:`` blocks."""
    out: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for child in ast.walk(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                break
            if isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                out.append(child.module)
                if child.module == "tangentlens":
                    out += [f"tangentlens.{alias.name}" for alias in child.names]
            elif isinstance(child, ast.Import):
                out += [alias.name for alias in child.names]
    return out


def _graph() -> dict[str, set[str]]:
    files = [*SOURCE.rglob("*.py"), *(ROOT / "probes").glob("*.py")]
    graph: dict[str, set[str]] = {}
    for path in files:
        source = _unit(path)
        for module in _module_level_imports(ast.parse(path.read_text(encoding="utf-8"))):
            parts = module.split(".")
            if parts[0] == "tangentlens" and len(parts) > 1 and parts[1] != source:
                graph.setdefault(source, set()).add(parts[1])
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
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
    assert _cycle(graph) is None, " → ".join(_cycle(graph) or [])


#: The layers of the README's "How the code is laid out": a package imports only from its own
#: layer and those before it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("__init__", "_lazy", "paths", "checks", "typing", "runtime", "seeding", "results", "testing"),
    ("metrics",),
    ("dictionaries",),
    ("data", "models"),
    ("capture",),
    ("contract",),
    ("proxies", "user_proxies"),
    ("probes",),
    ("registry",),
    ("core",),
    ("notebook",),
    ("sweep",),
    ("comparison", "report", "cli"),
)


def test_each_package_imports_only_from_its_layer_and_those_before():
    layer = {name: i for i, names in enumerate(LAYERS) for name in names}
    graph = _graph()
    assert set(graph) <= set(layer), sorted(set(graph) - set(layer))
    upward = [(a, b) for a, targets in graph.items() for b in targets if layer[b] > layer[a]]
    assert not upward, upward


def test_the_readme_lists_the_layers():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("How the code is laid out", 1)[1].split("```text\n", 1)[1].split("```")[0]
    listed = [line.split("   ")[0].replace("/", "").split(", ") for line in block.splitlines()]
    public = [[n for n in names if n not in ("__init__", "_lazy", "paths")] for names in LAYERS]
    assert listed == public


def test_a_cycle_is_found():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}}) is None


def test_the_core_and_the_notebook_do_not_import_the_sweep():
    graph = _graph()
    assert "sweep" not in graph["core"]
    assert "sweep" not in graph["notebook"]
    assert graph["probes"].isdisjoint({"core", "sweep", "notebook", "report"})


def test_type_checking_and_function_imports_are_not_layering():
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from tangentlens.sweep import plan\n"
        "def f():\n    from tangentlens.sweep import units\n"
        "from tangentlens.capture import Needs\n"
    )
    assert _module_level_imports(tree) == ["typing", "tangentlens.capture"]
