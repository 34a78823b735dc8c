# Build helpers. The README's two commands are `make test` and `make demo`; both install what they
# need from this repository's own files (a venv from pyproject.toml, the control plane from source).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup test lint unit integration demo crds down clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

setup: $(BIN)/.installed

lint: setup
	$(BIN)/ruff check operator tests
	$(BIN)/ruff format --check operator tests
	$(BIN)/mypy

# The tests: lint and types, the control plane tools (built from upstream once, then cached), then pytest.
test: lint
	$(BIN)/agentrun dev tools
	$(BIN)/pytest

unit: setup
	$(BIN)/pytest tests/unit

integration: setup
	$(BIN)/pytest tests/integration

crds: setup
	$(BIN)/agentrun crds --write crds/

# The main job on the local default: the control plane (with our CRDs), then a look at them.
demo: setup
	$(BIN)/agentrun dev up
	eval "$$($(BIN)/agentrun dev env)" && kubectl get crd && kubectl get ar -A

down: setup
	$(BIN)/agentrun dev down
