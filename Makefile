# The README's commands. Everything installs into .venv from requirements.txt.
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
PYTHON ?= python3

.PHONY: venv demo down test lint bench

venv: $(VENV)/.installed

$(VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements.txt
	touch $@

demo: venv
	$(PY) lab/lab.py demo

down: venv
	$(PY) lab/lab.py down

test: venv
	$(PY) -m pytest tests

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/yamllint --strict .
	find multimaster -name '*.sls' -print0 | xargs -0 $(BIN)/salt-lint

bench: venv
	$(PY) bench/bench_sync_keys.py
	$(PY) bench/bench_sync_roots.py
	$(PY) bench/bench_reactor.py
