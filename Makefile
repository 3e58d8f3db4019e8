# The project's commands. `make test` and `make conformance` set everything up themselves.
PYTHON ?= python3
VENV ?= .venv
TORCH_VERSION ?= 2.9.0
WITH_XLA ?= 1
# Another Lightning than requirements/dev.txt pins (`lightning` and `pytorch-lightning` of that version), for the lane of
# the oldest supported Lightning: give it a VENV of its own, as the newest-torch lane does.
LIGHTNING_VERSION ?=
IMPL ?= lightning_optimizer.reference
REPORTS ?= reports
BENCH_SUITE ?= cpu,xla

# The XLA cells run on torch_xla's CPU device, where compiling the suite's many small graphs is most of their time:
# with LLVM's optimisation off that compile time is about halved (every check passes either way). XLA:CPU's LLVM-IR
# fusion emitters (--xla_cpu_use_fusion_emitters=false) would halve it again, but crash torch_xla 2.9 in the whole
# lane (a segfault in a GradScaler step, an abort in a device-to-host copy). A value in the environment wins.
XLA_FLAGS ?= --xla_backend_optimization_level=0
export XLA_FLAGS

# make test and make audit run several pytest processes at once, DDP ranks beside them, on two cores: with torch's
# default of one OpenMP thread per core in each, their threads wait on each other (make test took 8.4 minutes so, 7.1
# with one thread per process, on the same machine in the same hour). The benchmarks keep torch's default. A value
# in the environment wins.
test audit unit conformance static mutation independent lightning-own-tests lightning: export OMP_NUM_THREADS ?= 1

BIN := $(VENV)/bin
AUDIT_TESTS := tests/test_mutants.py tests/test_independent.py
SOURCES := pyproject.toml $(shell git ls-files -co --exclude-standard spec reference conformance peers 2>/dev/null)
PACKAGES := -p lightning_optimizer.spec -p lightning_optimizer.reference -p lightning_optimizer.conformance -p lightning_optimizer.peers
XLA_PIN := $(if $(filter 1,$(WITH_XLA)),torch_xla==$(TORCH_VERSION))
LIGHTNING_PINS := $(if $(LIGHTNING_VERSION),lightning==$(LIGHTNING_VERSION) pytorch-lightning==$(LIGHTNING_VERSION))

EXAMPLES := $(sort $(wildcard examples/*.py))
LIGHTNING_TESTS := $(sort $(wildcard tests/test_lightning*.py))
# The Lightning namespace the Lightning tests and the examples run in: `lightning` (lightning.pytorch, as users import
# it) or `pytorch_lightning` (the same files on pytorch_lightning and the reference's twin package, through the test
# switch in tests/lightning_scenarios/namespace.py).
LIGHTNING_NAMESPACE ?= lightning
export LIGHTNING_NAMESPACE
EXAMPLE_PYTHON := $(if $(filter pytorch_lightning,$(LIGHTNING_NAMESPACE)),PYTHONPATH=tests $(BIN)/python -m lightning_scenarios.example,$(BIN)/python)
PY_SCRIPTS := scripts/peers scripts/lightning-own-tests

.PHONY: env browser conformance test unit static audit independent typecheck lint format clean examples peers mutation bench dimensions dist lightning-own-tests lightning

env: $(VENV)/.project browser

# Chromium, for the test that renders the HTML report in a real browser: installed from Debian's packages where this
# runs as root with apt-get and it is missing (about 110 MB to download, under a minute); elsewhere that test says why
# it does not run.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		{ apt-get install -y -q chromium >/dev/null 2>&1 || \
		  { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; }; } && \
		echo "installed Debian's chromium"; } || echo "no chromium: the HTML report's browser test will not run"

# Dependencies: reinstalled only when the pins change.
$(VENV)/.deps: requirements/dev.txt Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(if $(LIGHTNING_VERSION),grep -v -E '^(lightning|pytorch-lightning)==',cat) requirements/dev.txt > $(VENV)/requirements.txt
	$(BIN)/python -m pip install -q torch==$(TORCH_VERSION) $(XLA_PIN) -r $(VENV)/requirements.txt $(LIGHTNING_PINS)
	touch $@

# The project itself, editable in strict mode so that mypy resolves the mapped packages.
$(VENV)/.project: $(VENV)/.deps $(SOURCES)
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e . --config-settings editable_mode=strict
	touch $@

conformance: env
	$(BIN)/pytest conformance --impl=$(IMPL) -rfE \
		--report-json=$(REPORTS)/conformance.json --report-md=$(REPORTS)/conformance.md

# The unit tests: everything under tests/ but the suite's audit (below).
unit: env
	$(BIN)/pytest tests $(AUDIT_TESTS:%=--ignore=%) || [ $$? -eq 5 ]

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

# Lightning's own tests of optimization on one CPU device, at the tag tests/lightning_own/expected.json pins, plain
# and with every single-device Trainer on the reference's strategy, compared per test, in LIGHTNING_NAMESPACE's
# Lightning (`lightning`: the test files as written; `pytorch_lightning`: their imports rewritten, the twin package's
# strategy) (not part of `make test`: it
# takes 5 to 8 minutes, and reads a clone of Lightning, LIGHTNING_REPO=path, or clones the tag under .cache/,
# which needs the network). What those test files need beyond the dev tools goes to a folder of its own first.
lightning-own-tests: env .cache/lightning-own-tests-deps/.installed
	$(BIN)/python scripts/lightning-own-tests --namespace $(LIGHTNING_NAMESPACE) $(if $(LIGHTNING_REPO),--lightning-repo $(LIGHTNING_REPO))

.cache/lightning-own-tests-deps/.installed: requirements/lightning-own-tests.txt
	rm -rf $(@D)
	$(BIN)/python -m pip install -q --no-deps --target $(@D) -r $<
	touch $@

# docs/dimensions.md: per requirement, the dimensions its checks vary (rendered from the checks' markers).
dimensions: env
	$(BIN)/python -m lightning_optimizer.conformance.dimensions --write docs/dimensions.md

# The suite's audit (CI runs it after `make test`): every broken implementation caught, and a second implementation
# passing every check it claims.
audit: env
	$(MAKE) --no-print-directory -j2 --output-sync=target mutation independent

# Runs the suite against every broken implementation in tests/mutants/<family>/, on the checks each one declares:
# prints the kill rate per requirement group, writes reports/mutation.json, and fails if any mutant survives.
mutation: env
	$(BIN)/pytest tests/test_mutants.py -q --mutation-report=$(REPORTS)/mutation.json

# The suite against tests/independent, written from the spec text alone: it passes every check on the cells it claims.
independent: env
	$(BIN)/pytest tests/test_independent.py -q

# Benchmarks (not part of `make test`): time per optimizer step and peak memory against raw PyTorch and the
# peers, every run a whole process; the DDP accumulation case; the suite's wall time per device; writes
# $(REPORTS)/bench.json and docs/bench.png.
bench: env
	$(BIN)/python -m bench --cases default,ddp,fsdp --suite $(BENCH_SUITE) --json $(REPORTS)/bench.json --chart docs/bench.png

# Each example prints one summary line and exits 0 (in LIGHTNING_NAMESPACE's Lightning).
examples: env
	@set -e; for example in $(EXAMPLES); do echo "== $$example ($(LIGHTNING_NAMESPACE))"; $(EXAMPLE_PYTHON) $$example; done

# The Lightning tests and the examples in one namespace (`make test` runs them in `lightning`; CI also runs
# `make lightning LIGHTNING_NAMESPACE=pytorch_lightning`, and both on the oldest Lightning supported).
lightning: env
	$(BIN)/pytest $(LIGHTNING_TESTS) -p no:cacheprovider
	$(MAKE) --no-print-directory examples

# The unit tests, the suite on the reference and the static checks side by side (each leaves a core idle at times).
test: env
	$(MAKE) --no-print-directory -j3 --output-sync=target unit conformance static

static: env
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
