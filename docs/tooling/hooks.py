"""MkDocs hooks for the reference site: nothing in it is written twice.

* the README is the home page (``<!-- readme -->``), read at build time, its links to the
  pages (``docs/<page>.md``) made relative to the site;
* ``<!-- recipe-keys -->`` becomes one table per recipe section, built from the dataclasses the
  recipe is validated against (:mod:`tangentlens.core.recipe`): each key, its type, its
  default and the part of the section's docstring that names it;
* one page per probe (``probes/<name>.md``: the module's docstring holds its definitions) and one
  per package of pyproject.toml (``api/<package>.md``), generated with their nav entries.

A recipe key that its section's docstring never names is a warning, so a strict build fails.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import re
import sys
import tomllib
import typing
from functools import cache
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

log = logging.getLogger("mkdocs.plugins.tangentlens")


def _extension():
    name = "griffe_tangentlens"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


# ---- pages generated from the package ------------------------------------------------------


def _probes() -> list[str]:
    from tangentlens.registry import builtin_probes

    return list(builtin_probes())


def _packages() -> list[str]:
    with (ROOT / "pyproject.toml").open("rb") as file:
        return list(tomllib.load(file)["tool"]["setuptools"]["packages"])


def _directive(path: str, **options: Any) -> str:
    lines = [f"::: {path}"]
    if options:
        lines.append("    options:")
        lines += [f"      {key}: {json.dumps(value)}" for key, value in options.items()]
    return "\n".join(lines) + "\n"


def _modules(module: Any) -> list[Any]:
    """``module`` and its public submodules, depth first."""
    subs = [m for n, m in module.modules.items() if not m.is_alias and not n.startswith("_")]
    return [module, *(found for sub in subs for found in _modules(sub))]


def _final(member: Any) -> Any:
    return member.final_target if member.is_alias else member


@cache
def _reexported() -> frozenset[str]:
    """Paths of the objects some module exports under another module's name."""
    return frozenset(
        _final(module.members[str(name)]).path
        for module in _modules(_api())
        for name in module.exports or ()
        if module.members[str(name)].is_alias
    )


def _module_directive(module: Any) -> str:
    """``module`` with what it defines and exports (or another module re-exports): each object
    is documented once, where it is defined; a package lists its exports as links."""
    if module.exports is None:
        return _directive(module.path, show_submodules=False)
    defined = [
        name
        for name, member in module.members.items()
        if not member.is_alias
        and not member.is_module
        and (name in module.exports or member.path in _reexported())
    ]
    out = _directive(module.path, show_submodules=False, members=defined or False)
    aliases = [str(n) for n in module.exports if module.members[str(n)].is_alias]
    if aliases:
        links = ", ".join(f"[`{n}`][{_final(module.members[n]).path}]" for n in aliases)
        out += f"\nRe-exported by `{module.path}`, documented where defined: {links}.\n"
    return out


def _api_page(package: str) -> str:
    """A package and its modules, less those that have a page of their own."""
    pages = {*_packages(), *(f"tangentlens.probes.{name}" for name in _probes())}

    def page_of(path: str) -> str:
        return max((p for p in pages if path == p or path.startswith(f"{p}.")), key=len)

    root = _api()[package.removeprefix("tangentlens.")] if package != "tangentlens" else _api()
    body = [_module_directive(m) for m in _modules(root) if page_of(m.path) == package]
    if package == "tangentlens.probes":
        body.insert(1, "Each probe has its own page (**Probes** in the navigation).\n")
    return "\n".join(body)


def _generated() -> dict[str, str]:
    pages = {f"probes/{name}.md": _directive(f"tangentlens.probes.{name}") for name in _probes()}
    pages |= {f"api/{package}.md": _api_page(package) for package in _packages()}
    return pages


def on_config(config: Any) -> Any:
    config.nav = [
        *config.nav,
        {"Probes": [{name: f"probes/{name}.md"} for name in _probes()]},
        {"API reference": [{p: f"api/{p}.md"} for p in _packages()]},
    ]
    return config


def on_files(files: Files, config: Any) -> Files:
    for path, content in _generated().items():
        files.append(File.generated(config, path, content=content))
    return files


# ---- the README --------------------------------------------------------------------------


def readme() -> str:
    """The README as the home page: its links into ``docs/`` point at the site's pages."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.sub(r"\]\(docs/", "](", text)


# ---- recipe keys ---------------------------------------------------------------------------


def _toml(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, tuple | list):
        return "`[" + ", ".join(_toml(v).strip("`") for v in value) + "]`"
    if isinstance(value, dict):
        return "`{}`" if not value else f"`{value}`"
    return f"`{value}`"


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def _section_class(hint: Any) -> type | None:
    """The dataclass a field's annotation names (``X`` or ``X | None``), if any."""
    args = typing.get_args(hint) or (hint,)
    found = [a for a in args if dataclasses.is_dataclass(a)]
    return found[0] if found else None


_ABBREVIATIONS = ("e.g", "i.e", "etc", "cf", "vs")


def clauses(text: str) -> list[str]:
    """``text`` cut at ``;`` and sentence ends outside brackets and code."""
    text = re.sub(r"\s+", " ", text).strip()
    out, start, depth, code = [], 0, 0, False
    for i, char in enumerate(text):
        if char == "`":
            code = not code
        elif code:
            continue
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth = max(depth - 1, 0)
        elif depth == 0 and char in ";." and text[i + 1 : i + 2] in (" ", ""):
            if char == "." and text[start:i].endswith(_ABBREVIATIONS):
                continue
            out.append(text[start : i + 1].strip())
            start = i + 1
    if text[start:].strip():
        out.append(text[start:].strip())
    return out


def _docstring(cls: type) -> str:
    """The class docstring as the site renders it (roles become cross-references)."""
    api = _api()
    try:
        obj = api[f"{cls.__module__.removeprefix('tangentlens.')}.{cls.__qualname__}"]
    except KeyError:
        return cls.__doc__ or ""
    return obj.docstring.value if obj.docstring else ""


@cache
def _api():
    return _extension().load_package(ROOT)


def _keys(cls: type) -> list[tuple[dataclasses.Field, object, list[str]]]:
    """Each key of ``cls``'s table: its field, type and the clauses of the docstring that name
    it."""
    docs = clauses(_docstring(cls))
    hints = typing.get_type_hints(cls)
    return [
        (f, hints[f.name], [c for c in docs if f"``{f.name}``" in c])
        for f in dataclasses.fields(cls)
    ]


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _section(path: str, cls: type, out: list[str]) -> None:
    docs = clauses(_docstring(cls))
    keys = _keys(cls)
    general = [c for c in docs if not any(c in named for _, _, named in keys)]
    qualified = _qualified(cls)
    out += [f"## `[{path}]`", "", f"Validated by [`{cls.__name__}`][{qualified}]."]
    if general:
        out += ["", " ".join(general)]
    out.append("")
    if not keys:
        out += ["No keys.", ""]
        return
    out += ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    nested = []
    for field, hint, named in keys:
        sub = _section_class(hint)
        default = _toml(_default(field))
        if sub is not None:
            nested.append((f"{path}.{field.name}", sub))
            default = f"unset: a [`[{path}.{field.name}]`](#{_anchor(path, field.name)}) table"
        elif isinstance(_default(field), dict):
            default = f"`{{}}`: a `[{path}.{field.name}]` table"
        meaning = " ".join(named)
        if not meaning:
            log.warning(
                "recipe key %s.%s: %s's docstring never names it", path, field.name, qualified
            )
        cells = [f"`{field.name}`", f"`{field.type}`", default, meaning]
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    out.append("")
    for sub_path, sub in nested:
        _section(sub_path, sub, out)


def _anchor(*parts: str) -> str:
    """The id the toc extension gives the heading of section ``parts`` (word characters kept)."""
    return re.sub(r"[^\w-]", "", ".".join(parts).lower())


def recipe_keys() -> str:
    """The generated body of the recipe-keys page."""
    from tangentlens.core.recipe import Recipe
    from tangentlens.registry import builtin_probes

    out: list[str] = []
    for field in dataclasses.fields(Recipe):
        if field.name == "probes":
            for name, probe in builtin_probes().items():
                _section(f"probes.{name}", probe.config, out)
        elif (cls := _section_class(typing.get_type_hints(Recipe)[field.name])) is not None:
            _section(field.name, cls, out)
    return "\n".join(out)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    markdown = markdown.replace("<!-- readme -->", readme())
    if "<!-- recipe-keys -->" in markdown:
        markdown = markdown.replace("<!-- recipe-keys -->", recipe_keys())
    return markdown
