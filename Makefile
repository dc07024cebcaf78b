# The project's commands. `make demo` and `make test` install whatever is missing first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SYSTEM_STAMP := $(VENV)/.system-deps

.PHONY: setup demo test lint typecheck pytest bench reliability models clean

setup: $(STAMP) $(SYSTEM_STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[train,dev]'
	touch $@

$(SYSTEM_STAMP): scripts/install-system-deps.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	bash scripts/install-system-deps.sh
	touch $@

demo: setup
	$(PY) -m gateway.demo

test: setup lint typecheck pytest

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check gateway training tests

typecheck: setup
	$(PY) -m mypy

pytest: setup
	$(PY) -m pytest

bench: setup
	$(PY) -m bench

reliability: setup
	$(PY) -m pytest -m reliability --reliability-long

# Retrain the committed default models from ../shared/data (about 15 minutes on 2 cores).
models: setup
	$(PY) -m training default-models --out models --runs runs

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
