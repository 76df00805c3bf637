# Two commands on a fresh machine: `make run` (the main job) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
TRACE ?= traces/mooncake_conversation_10min.parquet
SPEEDUP ?= 10

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

.PHONY: install run test bench
install: $(VENV)/.installed

# Replay the committed 10-minute Mooncake slice at 10x against the embedded simulator.
run: $(VENV)/.installed
	$(VENV)/bin/replayer run $(TRACE) --speedup $(SPEEDUP) $(ARGS)

test: $(VENV)/.installed
	$(PY) -m pytest -q $(PYTEST_ARGS)

bench: $(VENV)/.installed
	$(PY) bench/bench_hotpaths.py
