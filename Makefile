# `make demo` and `make test` set everything up on a fresh machine: a virtual environment in .venv with torch
# (CPU build), slurmrt in editable mode and the test tools.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test test-unit test-gpu test-repeat bench chaos lint docs dist check-dist clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,dev,gpu,docs]'
	touch $@

# A 2-node x 2-task job under `slurmrt sim`: preempted 1 s after its first checkpoint (USR1 at once, SIGTERM after a
# 10 s grace time), it saves, requeues itself and resumes from its checkpoint; the summary lists both runs, then
# `slurmrt status` reads the job's event log next to its checkpoints.
DEMO_DIR := $(shell mktemp -u /tmp/slurmrt-demo-XXXXXX)
demo: $(VENV)/.installed
	SLURMRT_DEADLINE_MARGIN_S=5 SLURMRT_SAVE_TIME_S=2 $(VENV)/bin/slurmrt sim --nodes 2 --ntasks-per-node 2 \
	    --time 2:00 --signal USR1@10 --preempt-at 1 --after-checkpoint --grace 10 --requeue -- \
	    $(PY) examples/quickstart/train.py --steps 150 --step-time 0.1 --save-every 20 --checkpoint-dir $(DEMO_DIR)
	@echo
	@echo '$$ slurmrt status $(DEMO_DIR)'
	@$(VENV)/bin/slurmrt status $(DEMO_DIR)
	@echo
	@echo 'Draw it as a picture (needs matplotlib: $(PY) -m pip install matplotlib):'
	@echo '  $(VENV)/bin/slurmrt status $(DEMO_DIR) --plot job.png'

# The cluster scenarios (pytest -m slurm) run beside the rest (tests/run.sh says why); `$(PY) -m pytest` runs it all
# in one process.
test: $(VENV)/.installed
	PY=$(PY) tests/run.sh

# The unit tests alone: pure, no process started (tests/unit/conftest.py refuses one).
test-unit: $(VENV)/.installed
	$(PY) -m pytest tests/unit

# What only a GPU shows (tests/gpu, skipped without CUDA): the CUDA connections rule before any context, NCCL, GPU
# tensors saved and loaded bitwise, the framework examples through a preemption on the GPU. With the machine's own
# CUDA build of torch: `python -m pytest tests/gpu` with src/ on PYTHONPATH.
test-gpu: $(VENV)/.installed
	$(PY) -m pytest tests/gpu -rA

# The suite 5 times on an idle machine, then 3 times while two busy loops spin: how often each test passed.
test-repeat: $(VENV)/.installed
	tests/stress/repeat.sh 5 3

# The seeded fault campaign (benchmarks/chaos.py): real multi-rank training under slurmrt sim, one fault per trial
# (or many: MTBF=1s), each trial checked for lost work, a dead job and leftover processes; JOBS trials at once, until
# FAULTS faults. CLUSTER=1: its series on the test cluster instead (benchmarks/chaos_cluster.py; root, or a cluster
# already started by tests/slurm/cluster.sh). Not part of `make test` (it takes long).
chaos: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[bench]'
ifeq ($(CLUSTER),1)
	bash tests/slurm/cluster.sh start
	SLURM_CONF=$${SLURMRT_CLUSTER_DIR:-/tmp/slurmrt-cluster}/slurm.conf $(PY) -m benchmarks.chaos_cluster \
		--faults $(or $(FAULTS),50) --seed $(or $(SEED),1) --mtbf $(or $(MTBF),6)
else
	$(PY) -m benchmarks.chaos --trials $(or $(TRIALS),28) --seed $(or $(SEED),1) $(if $(MTBF),--mtbf $(MTBF)) \
		--jobs $(or $(JOBS),1) $(if $(FAULTS),--faults $(FAULTS))
	$(PY) -m benchmarks.chaos_neighbours --trials $(or $(NEIGHBOURS),10) --seed $(or $(SEED),1)
endif

bench: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) -m benchmarks.run

# The docs site (mkdocs, Material, mkdocstrings) into build/site; --strict: a broken link or reference fails it.
# The runnable code blocks of the docs run in `make test` (tests/integration/test_docs.py).
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# The sdist and the wheel, into dist/ (python -m build: an isolated build environment from PyPI).
dist: $(VENV)/.installed
	rm -rf dist
	$(PY) -m build --outdir dist .

# The wheel as a user gets it: a clean venv installs dist/*.whl and runs the quickstart under `slurmrt sim` from a
# directory outside the clone (.ci/wheel; CI runs it).
check-dist:
	PYTHON=$(PYTHON) .ci/wheel

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check src tests examples benchmarks
	$(VENV)/bin/mypy src

clean:
	rm -rf $(VENV) build dist *.egg-info src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
