# Entry points for people and CI. Everything installs itself on a fresh Debian machine (as root).
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: setup lint test test-unit demo cluster-up cluster-down bench

setup: $(VENV)/.installed

# torch first, pinned: the CPU wheel lies on disk; a bare `torch>=2.4` would fetch a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check torch==2.13.0
	$(BIN)/pip install -q --disable-pip-version-check -e '.[torch,dev,ops,plot]'
	touch $@

lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy

# The whole suite: lint, unit and property tests, and integration tests against the real local Slurm
# (the session fixture installs the Debian packages if missing and brings the cluster up).
test: lint
	$(BIN)/pytest -q -ra $(PYTEST_ARGS)

test-unit: setup
	$(BIN)/pytest -q -m 'not slurm' $(PYTEST_ARGS)

cluster-up: setup
	$(BIN)/python -m slurm.localcluster up

cluster-down: setup
	$(BIN)/python -m slurm.localcluster down

demo: setup
	$(BIN)/python examples/demo.py
