"""The tutorial notebook (notebooks/tangent_account.ipynb) runs top to bottom in a Jupyter kernel
of this environment, on the micro suite, and is stored without outputs."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import pytest

from tangentlens.sweep.store import read_results

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "tangent_account.ipynb"
#: What the measure cell prints: the ratio at the micro suite's last block, its interval, its bound.
_RATIO = re.compile(
    r"^energy_ratio \(pca, blocks\.1\.hook_resid_post, all tokens\) = (\S+), "
    r"95 % interval \[(\S+), (\S+)\]\n.*\(d - 1\)/k = (\S+)$",
    re.M,
)
#: What the proxies cell prints, one line per proxy: ``METHOD: energy_ratio R, p = P``.
_PROXY = re.compile(r"^ *(\S+): energy_ratio +(\S+), p = (\S+)$", re.M)


def _stdout(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def _pngs(nb) -> int:
    return sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))


def test_the_stored_notebook_has_no_outputs() -> None:
    nb = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code and all(c["outputs"] == [] and c["execution_count"] is None for c in code)


@pytest.mark.slow
def test_the_notebook_runs_on_the_micro_suite(units_env, tmp_path, monkeypatch) -> None:
    """Every cell runs without error in a kernel of this interpreter (its cwd a fresh folder);
    the printed energy ratios are finite and within their interval and bound, the sweep ran the
    four log-spaced steps from 0, and the four figures are written and displayed."""
    import nbformat
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    monkeypatch.setenv("TANGENTLENS_TUTORIAL_SUITE", "micro-pythia")  # the kernel inherits these
    monkeypatch.setenv("TANGENTLENS_TUTORIAL_TOKENS", "2048")
    kernels = tmp_path / "kernels"
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "tangentlens tests",
        "language": "python",
    }
    (kernels / "this-python").mkdir(parents=True)
    (kernels / "this-python" / "kernel.json").write_text(json.dumps(spec), encoding="utf-8")
    work = tmp_path / "work"
    work.mkdir()
    nb = nbformat.read(NOTEBOOK, as_version=4)
    km = KernelManager(
        kernel_name="this-python", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernels)])
    )
    client = NotebookClient(nb, km=km, timeout=600, resources={"metadata": {"path": str(work)}})
    try:
        client.start_new_kernel()
        client.start_new_kernel_client()
    except RuntimeError as error:  # it died before replying (no ipykernel), or never replied
        pytest.skip(f"a Jupyter kernel of {sys.executable} did not start: {error}")
    try:
        client.execute()  # raises CellExecutionError on the first cell that fails
    finally:
        client.kc.stop_channels()
        km.shutdown_kernel(now=True)
        nbformat.write(nb, work / "executed.ipynb")  # what ran, to read after a failure

    printed = "\n".join(_stdout(c) for c in nb.cells if c.cell_type == "code")
    ((ratio, low, high, bound),) = [tuple(map(float, m)) for m in _RATIO.findall(printed)]
    assert math.isfinite(ratio) and 0 < low <= ratio <= high and ratio < bound == 31 / 4
    proxies = {m: (float(r), float(p)) for m, r, p in _PROXY.findall(printed)}
    assert set(proxies) == {"pca", "mean_direction", "unembed_frequent", "unembed_rare"}
    assert proxies["pca"][0] == ratio  # the capture measured again gives the same row
    assert all(math.isfinite(r) and r > 0 and 1 / 101 <= p <= 1 for r, p in proxies.values())
    out = work / "runs" / "tutorial"
    written = [
        out / "energy_by_bin.png",
        out / "energy_by_bin_own.png",
        out / "sweep-micro-pythia" / "figures" / "tangent_energy.png",
        out / "sweep-micro-pythia" / "figures" / "anisotropy_depth.png",
    ]
    assert all(path.stat().st_size > 10_000 for path in written)
    assert _pngs(nb) == len(written)  # each one displayed
    steps = read_results(out / "sweep-micro-pythia").column("step").to_pylist()
    assert sorted(set(steps)) == [0, 2, 10, 40]
