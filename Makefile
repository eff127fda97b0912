# Entry points for people and CI. Everything installs itself on a fresh Debian machine (as root).
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: setup lint test test-unit test-slurm24 cluster-down-slurm24 test-slurm26 cluster-down-slurm26 test-topology \
	cluster-down-topology demo cluster-up \
        cluster-down bench

setup: $(VENV)/.installed

# torch first, pinned: the CPU wheel lies on disk; a bare `torch>=2.4` would fetch a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check torch==2.13.0
	$(BIN)/pip install -q --disable-pip-version-check -e '.[torch,dev,ops,plot,lightning]'
	touch $@

lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy

# The whole suite: lint, unit and property tests, and integration tests against the real local Slurm
# (the session fixture installs the Debian packages if missing and brings the cluster up); then the
# Slurm-facing rows of the fault matrix and node loss on Slurm 26.05 (SLURM26_CI_TESTS: the part that fits CI's
# hour on 2 cores; `make test-slurm26` runs the whole fault matrix there).
test: lint
	$(BIN)/pytest -q -ra $(PYTEST_ARGS)
	$(MAKE) test-slurm26 SLURM26_TESTS="$(SLURM26_CI_TESTS)"
	$(MAKE) test-topology

test-unit: setup
	$(BIN)/pytest -q -m 'not slurm' $(PYTEST_ARGS)

# The Slurm-facing integration tests against Debian 13's Slurm 24.11: on a Debian 13 host its own packages, elsewhere
# a Debian 13 chroot (debootstrapped once into /var/cache/slurm-supervisor/trixie, ~2 min). Its own cluster
# directory (.cluster-24) and ports (SLURM24_PORT..+6), so it runs beside the default cluster. As root.
SLURM24_PORT  ?= $(or $(SUPERVISOR_CLUSTER_BASE_PORT),16917)
SLURM24_TESTS ?= tests/integration/test_slurm_adapter.py tests/integration/test_localcluster.py \
                 tests/integration/test_agent_slurm.py tests/integration/test_fault_matrix_ranks.py
test-slurm24: setup
	$(BIN)/python -m slurm.localcluster up --slurm 24 --base-port $(SLURM24_PORT) --timeout 120
	SUPERVISOR_CLUSTER_SLURM=24 SUPERVISOR_CLUSTER_BASE_PORT=$(SLURM24_PORT) \
		$(BIN)/pytest -q -ra -m slurm $(SLURM24_TESTS) $(PYTEST_ARGS)

cluster-down-slurm24: setup
	$(BIN)/python -m slurm.localcluster down --slurm 24 --base-port $(SLURM24_PORT)

# The fault matrix and node loss against Debian sid's Slurm 26.05, the newest release (a sid chroot in
# /var/cache/slurm-supervisor/sid, made once the same way; its own .cluster-26 and ports). As root.
SLURM26_PORT  ?= 17017
SLURM26_TESTS ?= tests/integration/test_fault_matrix_ranks.py tests/integration/test_fault_matrix_crashes.py \
                 tests/integration/test_fault_matrix_slurm.py tests/integration/test_fault_matrix_checkpoints.py \
                 tests/integration/test_node_loss.py
SLURM26_CI_TESTS ?= tests/integration/test_fault_matrix_slurm.py tests/integration/test_node_loss.py
test-slurm26: setup
	$(BIN)/python -m slurm.localcluster up --slurm 26 --base-port $(SLURM26_PORT) --timeout 120
	SUPERVISOR_CLUSTER_SLURM=26 SUPERVISOR_CLUSTER_BASE_PORT=$(SLURM26_PORT) \
		$(BIN)/pytest -q -ra -m slurm $(SLURM26_TESTS) $(PYTEST_ARGS)

cluster-down-slurm26: setup
	$(BIN)/python -m slurm.localcluster down --slurm 26 --base-port $(SLURM26_PORT)

# The tests that need a Slurm topology (the memory tier's buddy ring across switches) on a cluster of their own
# with two leaf switches (topology/tree; its own .cluster-topo and ports). As root.
TOPOLOGY_PORT  ?= 17117
TOPOLOGY_TESTS ?= tests/integration/test_memory_topology.py
test-topology: setup
	$(BIN)/python -m slurm.localcluster up --topology --root .cluster-topo --base-port $(TOPOLOGY_PORT) --timeout 120
	SUPERVISOR_CLUSTER_TOPOLOGY=1 SUPERVISOR_CLUSTER_DIR=$(CURDIR)/.cluster-topo SUPERVISOR_CLUSTER_BASE_PORT=$(TOPOLOGY_PORT) \
		$(BIN)/pytest -q -ra -m slurm $(TOPOLOGY_TESTS) $(PYTEST_ARGS)

cluster-down-topology: setup
	$(BIN)/python -m slurm.localcluster down --topology --root .cluster-topo --base-port $(TOPOLOGY_PORT)

cluster-up: setup
	$(BIN)/python -m slurm.localcluster up

cluster-down: setup
	$(BIN)/python -m slurm.localcluster down

demo: setup
	$(BIN)/python examples/demo.py
