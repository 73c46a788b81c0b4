# `make demo` and `make test` set everything up on a fresh machine: a virtual environment in .venv with torch
# (CPU build), slurmrt in editable mode and the test tools.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test lint clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,dev,gpu]'
	touch $@

demo: $(VENV)/.installed
	$(PY) -m torch.distributed.run --nproc-per-node 2 examples/quickstart/train.py --steps 20

test: $(VENV)/.installed
	$(PY) -m pytest

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check src tests examples benchmarks
	$(VENV)/bin/mypy src

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
