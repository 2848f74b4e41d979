# Each target sets itself up: a virtual environment in .venv with the project and its
# dev tools. Nothing is downloaded at run time beyond the PyPI install.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test check lint typecheck docs docs-serve pytest dev histories faults bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[dev]"
	touch $(STAMP)

## Run the demo: embedded Temporal server + worker + SQLite, one scripted agent turn.
demo: $(STAMP)
	$(BIN)/tooltrail demo

## Run everything CI runs: lint, types, the manual, then the whole test suite.
test: check pytest

check: lint typecheck docs

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

## The manual (docs/, MkDocs Material) into site/; --strict: a broken link, anchor or nav
## entry fails. Material's notice about its successor is not a warning of this build.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

## The manual on http://127.0.0.1:8000, rebuilt on every change, until Ctrl-C.
docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

# Test processes (pytest-xdist): each runs its own Temporal dev server and PostgreSQL database.
# On the 2-core machine the suite waits more than it computes (one process used 56% of a
# core), so workers overlap the waits; 3 and 4 measured alike. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 4

pytest: $(STAMP)
	# Bytecode for the tree: this machine sets PYTHONDONTWRITEBYTECODE, so every CLI and worker
	# subprocess of the tests (and the sandbox's re-imports) would compile the modules again.
	$(BIN)/python -m compileall -q tooltrail workflows activities tests > /dev/null
	$(BIN)/pytest -n $(TEST_WORKERS) --dist worksteal

## Embedded server (port 7233, UI 8233) and a worker with the demo tools, until Ctrl-C.
dev: $(STAMP)
	$(BIN)/tooltrail dev

## Re-record the replay corpus tests/histories/ (only for new pipeline paths).
histories: $(STAMP)
	$(BIN)/python -m tests.support.history_scenarios

## A longer randomized fault run (workers killed and restarted); prints the figures.
faults: $(STAMP)
	$(BIN)/python -m bench.faults

## Benchmarks: tables on stdout, JSON in bench/results/.
bench: $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[bench]"
	# Bytecode, as an installed wheel has it: Temporal's sandbox re-imports a workflow's
	# module for every run, which without .pyc files means compiling it every time (this
	# machine sets PYTHONDONTWRITEBYTECODE).
	$(BIN)/python -m compileall -q tooltrail bench > /dev/null
	$(BIN)/python -m bench.all

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site
