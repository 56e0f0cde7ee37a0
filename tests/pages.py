"""The README and the reference site's pages (``docs/<name>.md``) as the tests read them: a
page's text, one of its sections, its fenced code blocks. The README is the front door: its
examples are copies of the pages' (``tests/e2e/test_readme.py`` checks it), and the tests run
them where they live, in the pages."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def page(name: str) -> str:
    """The text of the page ``docs/<name>.md``."""
    return (DOCS / f"{name}.md").read_text(encoding="utf-8")


def section(text: str, heading: str) -> str:
    """The part of ``text`` under the level-2 ``heading``, up to the next level-2 heading."""
    return text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]


def blocks(text: str, language: str = "python") -> list[str]:
    """The fenced code blocks of ``text`` in ``language``, in order."""
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)
