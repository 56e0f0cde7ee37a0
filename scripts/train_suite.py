"""Train a built-in mini suite into the user cache.

``python scripts/train_suite.py mini-pythia`` (the same as ``tangentlens train-suite``).
"""

import sys

from tangentlens.cli import main

if __name__ == "__main__":
    sys.exit(main(["train-suite", *sys.argv[1:]]))
