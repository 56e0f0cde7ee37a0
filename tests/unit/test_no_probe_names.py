"""The engine names no built-in probe: outside ``probes/`` (and its recipes) no code of
``src/tangentlens`` imports a built-in probe's module or holds its name in a string — what one
probe needs beyond moments, its notes, checks, log scales and findings are what it declares
(``Probe``, ``Reporting``), so a new built-in probe touches its module, its test and the micro
recipe only. Docstrings and comments may name probes as examples.

Allowed, where it is: the legacy-key migration (recipes from before the ``[proxies]`` stage
kept its keys under ``[probes.tangent_energy]``); the renderers live with their probes
(``probes/render/``). The allowance is exact: one that no longer names a probe fails too."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "src" / "tangentlens"

#: Built-in probe names: the modules of probes/ (read from the folder, nothing imported).
BUILTIN = sorted(p.stem for p in (ROOT / "probes").glob("*.py") if p.stem != "__init__")

#: (file under src/tangentlens, enclosing function or "<module>") → why it may name a probe.
ALLOWED: dict[tuple[str, str], str] = {
    ("core/proxy_stage.py", "<module>"): "the legacy-key migration's table",
}

_NAME = re.compile(r"(?<![A-Za-z0-9_])(" + "|".join(BUILTIN) + r")(?![A-Za-z0-9_])")


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string nodes that are docstrings (module, class, function)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _exported_names(tree: ast.AST) -> set[int]:
    """ids of the strings that name a module's attributes: ``__all__`` and ``lazy_exports``
    (a metric function may share a probe's name: ``metrics.qk_drift``)."""
    out = set()
    for node in ast.walk(tree):
        listed = (
            isinstance(node, ast.Assign)
            and any(getattr(t, "id", "") == "__all__" for t in node.targets)
        ) or (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "lazy_exports")
        if listed:
            out.update(id(n) for n in ast.walk(node) if isinstance(n, ast.Constant))
    return out


def _enclosing(tree: ast.AST) -> dict[int, str]:
    """Node id → the name of the top-level function or class it is in ("<module>" else)."""
    out: dict[int, str] = {}
    for top in ast.iter_child_nodes(tree):
        name = getattr(top, "name", "<module>")
        for node in ast.walk(top):
            out[id(node)] = name if isinstance(
                top, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
            ) else "<module>"  # fmt: skip
    return out


def names_of_builtin_probes(text: str) -> Iterator[tuple[str, int, str]]:
    """``(enclosing, line, what)`` for every place ``text`` names a built-in probe in code: an
    import of its module, a ``LazyModule`` of it, a string (not a docstring) holding its name."""
    tree = ast.parse(text)
    docstrings, where = _docstrings(tree) | _exported_names(tree), _enclosing(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            modules = [a.name for a in node.names]
            if isinstance(node, ast.ImportFrom):
                modules = [f"{node.module}.{a.name}" for a in node.names]
            for module in modules:
                parts = module.split(".")
                if "probes" in parts and _NAME.search(parts[-1]):
                    yield where.get(id(node), "<module>"), node.lineno, f"import {module}"
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and (found := _NAME.search(node.value))
        ):
            yield where.get(id(node), "<module>"), node.lineno, repr(found.group(1))


def test_the_engine_names_no_builtin_probe():
    assert "tangent_energy" in BUILTIN and "untrained_block" in BUILTIN  # the scan sees them
    found, used = [], set()
    for path in sorted(SOURCE.rglob("*.py")):
        relative = str(path.relative_to(SOURCE))
        for enclosing, line, what in names_of_builtin_probes(path.read_text(encoding="utf-8")):
            if (relative, enclosing) in ALLOWED:
                used.add((relative, enclosing))
            else:
                found.append(f"{relative}:{line} ({enclosing}) names {what}")
    assert found == [], "\n".join(found)
    assert set(ALLOWED) == used, f"allowances that name no probe: {set(ALLOWED) - used}"


def test_the_scan_finds_each_way_of_naming_a_probe():
    text = '''
"""A docstring naming tangent_energy is documentation."""
from tangentlens.probes import tangent_energy
import tangentlens.probes.qk_drift
X = "probes.cosine_drift.rank"
def f():
    """tangent_energy again."""
    return f"{1} rows of subspace_stability"
Y = "tangent_energy_figure"  # another identifier: not a probe's name
Z = "update_alignment."
__all__ = ["qk_drift"]  # a metric function of that name
'''
    found = [(enclosing, what) for enclosing, _, what in sorted(names_of_builtin_probes(text))]
    assert sorted(found) == sorted(
        [
            ("<module>", "import tangentlens.probes.tangent_energy"),
            ("<module>", "import tangentlens.probes.qk_drift"),
            ("<module>", "'cosine_drift'"),
            ("f", "'subspace_stability'"),
            ("<module>", "'update_alignment'"),
        ]
    )
