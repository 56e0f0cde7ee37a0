"""Text the run directory and recipes hold is UTF-8 whatever the locale: a cluster node's job
often runs with ``LC_ALL=C``, where Python's default text encoding is ASCII."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = """
import locale, pathlib, sys
from tangentlens.core.recipe import load_recipe
from tangentlens.sweep.store import RunStore

if locale.getpreferredencoding(False) == "UTF-8" or sys.flags.utf8_mode:
    sys.exit(3)  # this platform's C locale is UTF-8 already
root, text = pathlib.Path(sys.argv[1]), "ratio \\u2265 1 \\u00b7 \\u03bc"
store = RunStore(root)
store.write_file("report.txt", text)
store.write_manifest({"note": text})
print(store.read_manifest()["note"] == text)
recipe = root / "mine.toml"
recipe.write_bytes(f"# {text}\\n[probes.cosine_drift]\\n".encode("utf-8"))
print(load_recipe(recipe).name)
"""


def test_a_report_a_manifest_and_a_recipe_under_an_ascii_locale(tmp_path):
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": "utf-8"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)], env=env, capture_output=True, text=True
    )
    if done.returncode == 3:
        pytest.skip("LC_ALL=C is a UTF-8 locale on this platform")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "mine"]
    assert (tmp_path / "report.txt").read_bytes() == "ratio ≥ 1 · μ".encode()
