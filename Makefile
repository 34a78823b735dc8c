# Build helpers. The README's two commands are `make test` and `make demo`; both install what they
# need from this repository's own files (a venv from pyproject.toml, the control plane from source).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: busybox setup bubblewrap test lint unit integration demo crds down clean kind image

$(BIN)/.installed: pyproject.toml operator/devcluster/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]' -e operator/devcluster
	touch $@

setup: $(BIN)/.installed bubblewrap busybox

# The local pod runner mounts each pod's volumes with bubblewrap (`bwrap`): installed from the
# distribution's packages when missing and we are root; otherwise say how.
bubblewrap:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap; \
	  else \
	    echo "bubblewrap (bwrap) is missing; the local pod runner needs it: sudo apt-get install -y bubblewrap" >&2; \
	  fi; }

# A warm pod's `main` is a POSIX shell loop (jobs/warm.py): its unit tests run it with dash and with
# busybox's sh, the shell of the examples' images; busybox from the distribution's packages when
# missing and we are root; otherwise those tests run with dash only, and say so.
busybox:
	@command -v busybox >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq busybox-static || \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq busybox-static; }; \
	  else \
	    echo "busybox is missing; the warm loop's tests run with dash only: sudo apt-get install -y busybox-static" >&2; \
	  fi; }

lint: setup
	$(BIN)/ruff check operator tests
	$(BIN)/ruff format --check operator tests
	$(BIN)/mypy

# The tests: lint and types, then pytest (the unit tier, the planner's coverage bar, the rest; every
# tier runs once, and a failure of one does not stop the next). The control plane tools, KWOK (the
# scale test, docs/local-dev.md#kwok) and Prometheus (the monitoring tests), built from upstream once
# and then cached, and the operator image with busybox (on a Docker engine; skipped with AGENTRUN_DOCKER=0)
# build in the background meanwhile; pytest runs its self-contained tiers first, and the first test
# that needs either waits for it through its file lock (docs/development.md#make-test). The image's
# own failure is the Docker tests' to report (they skip with the reason where no engine can run).
# What the run starts it stops: on its way out (also on a failure, Ctrl-C, TERM or HUP) it stops the
# background steps and ends its engine session, which stops a dockerd this run (its image step or its
# tests) started and leaves one that was running before alone (docs/development.md#docker).
# Coverage (docs/development.md#coverage): line and branch coverage of both packages, in-process,
# per package at the end. The unit tier runs first in a pytest of its own, so the planner's bar is
# checked on what the unit tests alone reach; the other tiers then append to the same data.
COV := --cov --cov-report=
PLANNER_BAR = $(BIN)/coverage report --include='operator/agentrun_operator/planner/*' --skip-covered \
	--fail-under=95 || { echo "the planner's coverage by tests/unit is below 95 % (docs/development.md\#coverage)" >&2; false; }
TOOLS_LOG := $(VENV)/tools-build.log
IMAGE_LOG := $(VENV)/image-build.log
test: setup
	@export AGENTRUN_ENGINE_SESSION=$$$$; \
	setsid sh -c '$(BIN)/agentrun dev tools && $(BIN)/python -m agentrun_devcluster.kwok build && $(BIN)/agentrun dev tools --prometheus' > $(TOOLS_LOG) 2>&1 & tools=$$!; image=; \
	if [ "$${AGENTRUN_DOCKER:-}" != 0 ]; then \
	  setsid $(BIN)/agentrun dev image --with-busybox > $(IMAGE_LOG) 2>&1 & image=$$!; fi; \
	stop() { for group in $$tools $$image; do kill -- -$$group 2>/dev/null; done; }; \
	finish() { trap '' HUP INT TERM; stop; [ -z "$$image" ] || wait $$image; \
	  $(BIN)/python -m agentrun_devcluster.dockerengine end-session; }; \
	trap finish EXIT; trap 'exit 129' HUP; trap 'exit 130' INT; trap 'exit 143' TERM; \
	echo "control plane tools and operator image: checked, or built in the background (logs: $(TOOLS_LOG), $(IMAGE_LOG))"; \
	$(MAKE) --no-print-directory lint || exit 1; \
	$(BIN)/pytest tests/unit $(COV); unit=$$?; \
	$(PLANNER_BAR); planner=$$?; \
	$(BIN)/pytest --ignore=tests/unit $(COV) --cov-append; rest=$$?; \
	$(BIN)/python -m tests.support.coverage_report; \
	wait $$tools; built=$$?; tools=; cat $(TOOLS_LOG); \
	if [ -n "$$image" ]; then wait $$image; echo "operator image: exit $$?, last line: $$(tail -n 1 $(IMAGE_LOG))"; image=; fi; \
	for s in $$unit $$planner $$rest $$built; do [ $$s = 0 ] || exit $$s; done

unit: setup
	$(BIN)/pytest tests/unit $(COV); unit=$$?; \
	$(PLANNER_BAR); planner=$$?; \
	$(BIN)/python -m tests.support.coverage_report; \
	exit $$(( unit != 0 ? unit : planner ))

integration: setup
	$(BIN)/pytest tests/integration

# The CRDs, generated from the models, into crds/ and into the chart (kept byte-identical).
crds: setup
	$(BIN)/agentrun crds --write crds/
	$(BIN)/agentrun crds --write charts/agentrun-operator/crds/

# The main job on the local default: the control plane, the local pod runner and the operator (loops
# on), then the conditional-loop example run for real and followed to its end (at most 5 minutes);
# prints the run's status, its iterations and the files they left on its PVC.
demo: setup
	$(BIN)/agentrun dev up
	$(BIN)/agentrun dev run examples/conditional-loop.yaml --timeout 300

down: setup
	$(BIN)/agentrun dev down

# The operator image, built with a Docker engine (a running one; as root on Debian one is installed
# and started). BASE=auto uses the Dockerfile's digest-pinned base when it is present or can be
# pulled, else a base made from Debian packages (BASE=local forces it, BASE=registry forbids it).
# Cached: nothing is rebuilt while the build inputs are unchanged. docs/operations.md#make-image
BASE ?= auto
image: setup
	$(BIN)/agentrun dev image --base $(BASE) --with-busybox

# Docker hosts only: the image, a kind cluster, `helm install` with loops on, examples in real
# containers (tests/kind/; skipped with the reason where no Docker engine answers).
kind: setup
	AGENTRUN_KIND=1 $(BIN)/pytest tests/kind -rs
