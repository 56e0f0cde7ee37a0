"""Run a probe recipe over a suite's checkpoints, resumably, and print the report.

``python scripts/sweep_checkpoints.py [--recipe quickstart] [--set KEY=VALUE] [--out RUN_DIR]
[--resume]`` — the same code as ``tangentlens sweep``.
"""

import sys

from tangentlens.cli import main

if __name__ == "__main__":
    sys.exit(main(["sweep", *sys.argv[1:]]))
