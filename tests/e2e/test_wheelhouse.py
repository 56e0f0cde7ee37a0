"""A compute node without a package index: tangentlens installs from a wheelhouse
(``scripts/wheelhouse.py``; ``make setup`` builds one for this machine in ``.wheelhouse``) into
a fresh environment that already has its own torch, without the index and without a second
torch, and runs."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WHEELHOUSE = ROOT / ".wheelhouse"


def _wheelhouse_script():
    spec = importlib.util.spec_from_file_location("wheelhouse", ROOT / "scripts" / "wheelhouse.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _node_torch(folder: Path) -> Path:
    """A folder holding only torch (links to this environment's installed files), standing for
    a node's own torch build."""
    folder.mkdir()
    torch = importlib.metadata.distribution("torch")
    tops = {Path(f).parts[0] for f in torch.files or []}  # packages and dist-info; not ../bin
    for top in sorted(t for t in tops if not t.startswith(".") and not t.endswith(".pth")):
        (folder / top).symlink_to(Path(torch.locate_file(top)))
    return folder


def test_the_wheelhouse_installs_offline_beside_the_nodes_torch(tmp_path):
    assert WHEELHOUSE.is_dir() and list(WHEELHOUSE.glob("*.whl")), "run `make setup` first"
    assert not list(WHEELHOUSE.glob("torch-*.whl")), "torch is the node's own"
    project = tmp_path / "project"  # this checkout's wheel, built offline
    _wheelhouse_script().project_wheel(project)
    node = tmp_path / "node"
    venv.create(node, with_pip=True)
    python = node / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    Path(site, "node_torch.pth").write_text(str(_node_torch(tmp_path / "torch")) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull  # no configured index or find-links: the wheelhouse only
    installed = subprocess.run(
        [python, "-m", "pip", "install", "--no-index", "--find-links", str(WHEELHOUSE),
         "--find-links", str(project), "--no-compile", "tangentlens"],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr[-2000:]
    assert "Requirement already satisfied: torch" in installed.stdout
    assert "torch-" not in installed.stdout.split("Successfully installed")[-1]
    ran = subprocess.run(
        [python, "-c", "import torch, tangentlens as tl, tangentlens.probes; "
         "from tangentlens.metrics import cosine_anisotropy; "
         "print(torch.__file__); print(cosine_anisotropy(torch.eye(3)))"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    torch_file, value = ran.stdout.split()
    assert str(tmp_path / "torch") in torch_file and float(value) == 0.0
    assert subprocess.run([node / "bin" / "tangentlens", "--help"], env=env).returncode == 0
