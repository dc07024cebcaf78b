# The project's commands. `make demo` and `make test` install whatever is missing first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SYSTEM_STAMP := $(VENV)/.system-deps
# tflite-runtime (the gateway's fallback runtime) needs numpy<2, so it is tested in its own venv.
LEGACY_VENV := .venv-legacy
LEGACY_STAMP := $(LEGACY_VENV)/.installed

.PHONY: setup demo cluster-demo test lint typecheck pytest bench reliability mutation models wheel clean

setup: $(STAMP) $(SYSTEM_STAMP) $(LEGACY_STAMP)

# The wheel holds the gateway only (what runs on the Pi); training/ and devkit/ run from this
# checkout, which the dev venv gets on its path (a .pth file), with `tesla-train` running
# `python -m training`.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[train,dev,metrics,cluster]'
	$(PY) -c 'import pathlib, sysconfig; pathlib.Path(sysconfig.get_path("purelib"), "tesla-checkout.pth").write_text("$(CURDIR)\n")'
	printf '#!/bin/sh\nexec "%s" -m training "$$@"\n' "$(abspath $(PY))" > $(VENV)/bin/tesla-train
	chmod +x $(VENV)/bin/tesla-train
	touch $@

$(LEGACY_STAMP): pyproject.toml
	test -x $(LEGACY_VENV)/bin/python || $(PYTHON) -m venv $(LEGACY_VENV)
	$(LEGACY_VENV)/bin/python -m pip install --quiet "tflite-runtime==2.14.*" "numpy<2" \
		"pydantic>=2.8,<3" "structlog>=24.1" "paho-mqtt>=2.2,<2.3" "pyserial==3.5" "pynacl>=1.5"
	touch $@

$(SYSTEM_STAMP): scripts/install-system-deps.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	bash scripts/install-system-deps.sh
	touch $@

demo: setup
	$(PY) -m devkit.demo

# Three nats-servers and three gateways in cluster mode; one gateway is killed mid-run.
cluster-demo: setup
	$(PY) -m devkit.cluster_demo

test: setup lint typecheck pytest

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check tesla_gateway devkit training tests

typecheck: setup
	$(PY) -m mypy

pytest: setup
	$(PY) -m pytest

bench: setup
	$(PY) -m devkit.bench

reliability: setup
	$(PY) -m pytest -m reliability --reliability-long

# Mutation testing (mutmut) of the modules that hold the gateway's promises, each mutant against
# its module's own tests, in a scratch copy of HEAD; writes docs/mutation.md. Not part of `test`:
# about 15 minutes on one core (devkit/mutation/targets.py; --only TARGET reruns one).
mutation: setup
	nice -n 10 $(PY) -m devkit.mutation

# The gateway's wheel (tesla_gateway/ with the default models and the example config; no training,
# devkit or demo) into dist/, for `pip install dist/tesla_gateway-*.whl` on the Pi
# (docs/operations.md, "Installing"). Needs only python3 with pip; pip fetches setuptools to build.
wheel:
	$(PYTHON) -m devkit.wheel --out dist

# Retrain the committed default models from ../shared/data (about 20 minutes on 2 cores).
models: setup
	$(PY) -m training default-models --out models --runs runs

clean:
	rm -rf $(VENV) $(LEGACY_VENV) .pytest_cache .mypy_cache .ruff_cache dist
