# Two commands on a fresh machine: `make run` (the main job) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
TRACE ?= traces/mooncake_conversation_10min.parquet
SPEEDUP ?= 10

# A pip configuration may list local package indexes that hold only some projects; pip then
# prints "WARNING: Location '...' is ignored: it is neither a file nor a directory." once per
# project it looks up. Those lines (and only those) are dropped; pipefail keeps pip's exit code.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
PIP_NOISE := 2>&1 | { grep -v "^WARNING: Location '.*' is ignored: it is neither a file nor a directory\.$$" || true; }

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip $(PIP_NOISE)
	$(PY) -m pip install --quiet -e '.[test,docs]' $(PIP_NOISE)
	touch $@

.PHONY: install run test lint docs bench
install: $(VENV)/.installed

# Replay the committed 10-minute Mooncake slice at 10x against the embedded simulator.
run: $(VENV)/.installed
	$(VENV)/bin/replayer run $(TRACE) --speedup $(SPEEDUP) $(ARGS)

# Two test processes (pytest-xdist): most of the suite's time is spent waiting on replays and
# servers, not on the CPU. TEST_WORKERS=0 runs the tests in this process, one at a time.
TEST_WORKERS ?= 2
test: $(VENV)/.installed
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

# The rules a machine keeps (settings in pyproject.toml): the formatter, ruff's checks (import
# order, complexity and length limits, no reaching into private names), mypy (strict on core,
# plan, http and send; no module ignored) and the pipeline's layer contract (import-linter).
lint: $(VENV)/.installed
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# The documentation site (mkdocs.yml): --strict fails on a broken link, a page missing from the
# navigation or a stale reference. `$(VENV)/bin/mkdocs serve` shows it while you write.
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

bench: $(VENV)/.installed
	$(PY) bench/bench_hotpaths.py
