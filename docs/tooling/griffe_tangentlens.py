"""A griffe extension that reads tangentlens as Python imports it, for the reference site and
for the docstring test (``tests/unit/test_docstrings.py``).

* **Package-dir mappings** — ``[tool.setuptools] package-dir`` in pyproject.toml installs the
  top-level ``probes/`` folder as ``tangentlens.probes``; the mapped folders are loaded under
  their package (replacing any copy found under ``src/``), so a fresh checkout documents them.
* **Lazy exports** — a package whose ``__all__`` comes from
  ``tangentlens._lazy.lazy_exports(__name__, {module: names}, submodules=...)`` gets those
  exports, each an alias to the object in its module.
* **``#:`` comments** — the comment lines just above a module or class attribute are its
  docstring (the house's way of documenting constants).
* **Sphinx roles** — ``:func:`name```, ``:class:`~a.b.C``` … become cross-references to the
  object's documented (canonical) path, resolved as Python would from the docstring's scope;
  a target that is private or external is shown as code, one that names nothing is kept as a
  reference so that a strict build fails on it (and it is listed in :data:`BROKEN`).
* **Doctests** — ``>>>`` blocks become fenced ``pycon`` code.
"""

from __future__ import annotations

import ast
import importlib.util
import logging
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import griffe

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "tangentlens"

#: ``(object path, role target)`` of every role that resolved to nothing, over all loads.
BROKEN: list[tuple[str, str]] = []

_log = logging.getLogger("mkdocs.plugins.tangentlens.griffe")
_ROLE = re.compile(r":(?:py:)?(func|class|meth|mod|data|attr|obj|exc|const):`([^`]+)`")


def package_dirs(root: Path = ROOT) -> dict[str, Path]:
    """Subpackages pyproject.toml maps to their own folder (``{"tangentlens.probes": probes/}``)."""
    with (root / "pyproject.toml").open("rb") as file:
        mapping = tomllib.load(file)["tool"]["setuptools"].get("package-dir", {})
    return {name: root / folder for name, folder in mapping.items() if name}


def load_package(root: Path = ROOT) -> griffe.Module:
    """``tangentlens`` as the docs see it: this extension applied, aliases resolved."""
    loader = griffe.GriffeLoader(
        extensions=griffe.load_extensions(TangentlensExtension),
        search_paths=[str(root / "src")],
    )
    package = loader.load(PACKAGE)
    loader.resolve_aliases(implicit=False, external=False)
    return package


class TangentlensExtension(griffe.Extension):
    """See the module docstring."""

    def on_module_members(self, *, node: ast.AST | griffe.ObjectNode, mod: griffe.Module, **_: Any):
        if isinstance(node, ast.Module):
            _lazy_exports(node, mod)
            _comment_docstrings(mod)

    def on_class_members(self, *, cls: griffe.Class, **_: Any) -> None:
        _comment_docstrings(cls)
        if "__post_init__" in cls.members:  # a dataclass's validation, not API
            cls.del_member("__post_init__")

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **_: Any) -> None:
        if pkg.name != PACKAGE:
            return
        for name, folder in package_dirs().items():
            _graft(pkg, name.split(".")[1:], folder, loader)
        for obj in _walk(pkg):
            if obj.docstring is not None:
                text = _doctests(obj.docstring.value)
                obj.docstring.value = _ROLE.sub(lambda m, obj=obj: _crossref(obj, m[2]), text)


def _graft(pkg: griffe.Module, parts: list[str], folder: Path, loader: griffe.GriffeLoader):
    """Load ``folder`` (a package: its modules and its subpackages' folders) as the member
    ``parts`` of ``pkg``."""
    parent = pkg
    for part in parts[:-1]:
        parent = parent.members[part]
    kwargs = {
        "extensions": loader.extensions,
        "lines_collection": loader.lines_collection,
        "modules_collection": loader.modules_collection,
    }

    def visit(name: str, path: Path, parent: griffe.Module) -> griffe.Module:
        code = path.read_text(encoding="utf-8")
        loader.lines_collection[path] = code.splitlines()
        return griffe.visit(name, filepath=path, code=code, parent=parent, **kwargs)

    def load(name: str, folder: Path, parent: griffe.Module) -> griffe.Module:
        package = visit(name, folder / "__init__.py", parent)
        parent.set_member(name, package)
        for path in sorted(folder.glob("*.py")):
            if path.stem != "__init__":
                package.set_member(path.stem, visit(path.stem, path, package))
        for sub in sorted(folder.glob("*/__init__.py")):
            load(sub.parent.name, sub.parent, package)
        return package

    def modules(module: griffe.Module) -> list[griffe.Module]:
        subs = [sub for sub in module.modules.values() if not sub.is_alias]
        return [module, *(m for sub in subs for m in modules(sub))]

    for module in modules(load(parts[-1], folder, parent)):
        loader.expand_exports(module)


def _lazy_exports(node: ast.Module, mod: griffe.Module) -> None:
    for statement in node.body:
        call = getattr(statement, "value", None)
        if not (isinstance(call, ast.Call) and getattr(call.func, "id", "") == "lazy_exports"):
            continue
        names = ast.literal_eval(call.args[1]) if len(call.args) > 1 else {}
        keywords = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
        exports = sorted({*keywords.get("submodules", ()), *(n for v in names.values() for n in v)})
        mod.exports = exports
        for module, listed in names.items():
            source = f"{mod.path}{module}" if module.startswith(".") else module
            for name in listed:
                mod.set_member(name, griffe.Alias(name, f"{source}.{name}", parent=mod))


def _comment_docstrings(owner: griffe.Module | griffe.Class) -> None:
    """``#:`` lines right above an attribute become its docstring."""
    path = owner.filepath
    if not isinstance(path, Path) or path not in owner.lines_collection:
        return
    lines = owner.lines_collection[path]
    for member in owner.members.values():
        if member.is_alias or not member.is_attribute or member.docstring or not member.lineno:
            continue
        comment: list[str] = []
        index = member.lineno - 2
        while index >= 0 and lines[index].strip().startswith("#:"):
            comment.insert(0, lines[index].strip()[2:].strip())
            index -= 1
        if comment:
            member.docstring = griffe.Docstring(" ".join(comment), parent=member)


def _walk(obj: griffe.Object) -> Iterator[griffe.Object]:
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _walk(member)


def _doctests(text: str) -> str:
    """Fence each block of ``>>>`` lines and their output as ``pycon``."""
    out: list[str] = []
    inside = False
    for line in text.splitlines():
        starts = line.lstrip().startswith(">>>")
        if starts and not inside:
            out += ["", "```pycon"]
            inside = True
        elif inside and not line.strip():
            out.append("```")
            inside = False
        out.append(line.strip() if inside else line)
    if inside:
        out.append("```")
    return "\n".join(out)


def _crossref(obj: griffe.Object, spec: str) -> str:
    """The Markdown for a role's target seen from ``obj``'s docstring."""
    target = spec.strip()
    short = target.startswith("~")
    target = target.lstrip("~").removesuffix("()")
    shown = target.rsplit(".", 1)[-1] if short else target
    found = _resolve(obj, target)
    if found is None:
        if _external(obj, target):
            return f"`{shown}`"
        BROKEN.append((obj.path, spec))
        _log.warning("%s: %r names no object of %s", obj.path, spec, PACKAGE)
        return f"[`{shown}`][{target}]"
    if not _documented(found):
        return f"`{shown}`"
    return f"[`{shown}`][{found.path}]"


def _resolve(obj: griffe.Object, target: str) -> griffe.Object | None:
    collection = obj.modules_collection
    scopes: list[str] = []
    scope: griffe.Object | None = obj
    while scope is not None:
        scopes.append(scope.path)
        scope = scope.parent
    if target.startswith("."):
        module = obj if obj.is_module else obj.module
        package = module if module.is_package else module.parent
        candidates = [f"{package.path}{target}"]
    else:
        candidates = [target, *(f"{path}.{target}" for path in scopes)]
    for path in candidates:
        try:
            found = collection.get_member(path)
            return found.final_target if found.is_alias else found
        except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
            continue
    return None


def _documented(obj: griffe.Object) -> bool:
    """Whether the site renders ``obj``: public, in public modules and classes."""
    node: griffe.Object | None = obj
    while node is not None and node.parent is not None:
        if not node.is_public:
            return False
        node = node.parent
    return obj.path.split(".")[0] == PACKAGE


def _external(obj: griffe.Object, target: str) -> bool:
    """A target outside tangentlens: an installed top-level module, or a name ``obj``'s module
    imports from one."""
    head = target.split(".", 1)[0]
    if head == PACKAGE:
        return False
    imported = obj.module.imports.get(head) if not obj.is_module else obj.imports.get(head)
    if imported is not None:
        return not imported.startswith(PACKAGE)
    try:
        return importlib.util.find_spec(head) is not None
    except (ImportError, ValueError):
        return False
