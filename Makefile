# The project's commands. `make test` and `make conformance` set everything up themselves.
PYTHON ?= python3
VENV ?= .venv
TORCH_VERSION ?= 2.9.0
WITH_XLA ?= 1
IMPL ?= lightning_optimizer.reference
REPORTS ?= reports
BENCH_SUITE ?= cpu,xla

BIN := $(VENV)/bin
SOURCES := pyproject.toml $(shell git ls-files -co --exclude-standard spec reference conformance peers 2>/dev/null)
PACKAGES := -p lightning_optimizer.spec -p lightning_optimizer.reference -p lightning_optimizer.conformance -p lightning_optimizer.peers
XLA_PIN := $(if $(filter 1,$(WITH_XLA)),torch_xla==$(TORCH_VERSION))

EXAMPLES := $(sort $(wildcard examples/*.py))
PY_SCRIPTS := scripts/peers scripts/lightning-own-tests

.PHONY: env conformance test unit typecheck lint format clean examples peers mutation bench dimensions dist lightning-own-tests

env: $(VENV)/.project

# Dependencies: reinstalled only when the pins change.
$(VENV)/.deps: requirements/dev.txt Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==$(TORCH_VERSION) $(XLA_PIN) -r requirements/dev.txt
	touch $@

# The project itself, editable in strict mode so that mypy resolves the mapped packages.
$(VENV)/.project: $(VENV)/.deps $(SOURCES)
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e . --config-settings editable_mode=strict
	touch $@

conformance: env
	$(BIN)/pytest conformance --impl=$(IMPL) -rfE \
		--report-json=$(REPORTS)/conformance.json --report-md=$(REPORTS)/conformance.md

unit: env
	$(BIN)/pytest tests || [ $$? -eq 5 ]

typecheck: env
	$(BIN)/mypy $(PACKAGES)
	$(BIN)/mypy tests
	$(BIN)/mypy examples
	$(BIN)/mypy bench
	@set -e; for script in $(PY_SCRIPTS); do echo "$(BIN)/mypy $$script"; $(BIN)/mypy $$script; done  # one run each: both are __main__

lint: env
	$(BIN)/ruff check . $(PY_SCRIPTS)
	$(BIN)/ruff format --check . $(PY_SCRIPTS)

# docs/peers.md: the suite on the reference and the peer adapters, side by side (reports in $(REPORTS)/peers).
peers: env
	$(BIN)/python scripts/peers --reports $(REPORTS)/peers

# Lightning's own tests of manual optimization and LightningOptimizer, at the tag tests/lightning_own/expected.json
# pins, with every single-device Trainer on the reference's strategy (not part of `make test`: it reads a clone of
# Lightning, LIGHTNING_REPO=path, or clones the tag under .cache/, which needs the network).
lightning-own-tests: env
	$(BIN)/python scripts/lightning-own-tests $(if $(LIGHTNING_REPO),--lightning-repo $(LIGHTNING_REPO))

# docs/dimensions.md: per requirement, the dimensions its checks vary (rendered from the checks' markers).
dimensions: env
	$(BIN)/python -m lightning_optimizer.conformance.dimensions --write docs/dimensions.md

# Runs the suite against every broken implementation in tests/mutants: prints the kill rate per requirement
# group, writes reports/mutation.json, and fails if any mutant survives.
mutation: env
	$(BIN)/pytest tests/test_mutants.py -q --mutation-report=$(REPORTS)/mutation.json

# Benchmarks (not part of `make test`): time per optimizer step and peak memory against raw PyTorch and the
# peers, every run a whole process; the DDP accumulation case; the suite's wall time per device; writes
# $(REPORTS)/bench.json and docs/bench.png.
bench: env
	$(BIN)/python -m bench --cases default,ddp,fsdp --suite $(BENCH_SUITE) --json $(REPORTS)/bench.json --chart docs/bench.png

# Each example prints one summary line and exits 0.
examples: env
	@set -e; for example in $(EXAMPLES); do echo "== $$example"; $(BIN)/python $$example; done

# The unit tests and the suite side by side (their subprocesses leave a core idle most of the time), then the rest.
test: env
	$(MAKE) --no-print-directory -j2 --output-sync=target unit conformance
	$(MAKE) --no-print-directory typecheck lint examples

# The sdist and, built from it, the wheel, in dist/ (with the pinned setuptools: no build isolation, no download).
# tests/test_packaging.py builds both the same way and installs the wheel into a fresh venv.
dist: env
	rm -rf dist
	$(BIN)/python -m build --no-isolation --outdir dist .

format: env
	$(BIN)/ruff format . $(PY_SCRIPTS)
	$(BIN)/ruff check --fix . $(PY_SCRIPTS)

clean:
	rm -rf $(VENV) build dist *.egg-info $(REPORTS) .mypy_cache .pytest_cache .ruff_cache
