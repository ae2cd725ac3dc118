# The two quick-start commands live here: `make demo` and `make test`.
# Both create the virtual environment on first use and reinstall when pyproject.toml changes.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)

.PHONY: setup demo test lint typecheck unit bench test-cluster cluster-build-in-background test-packages kcover-image cluster-up

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $@

demo: setup
	$(BIN)/kcover demo

lint: setup
	$(BIN)/ruff check src tests bench
	$(BIN)/lint-imports

typecheck: setup
	$(BIN)/mypy

# The tests that need the cluster run last and wait for its build (see kcover.testing.fixtures).
unit: setup test-packages kcover-image
	$(BIN)/pytest

# `make test` starts the cluster's build first, in the background at the lowest CPU priority, so it
# compiles (cold: ~15 min of both cores) while everything else runs; it stops if make does.
test: cluster-build-in-background lint typecheck unit

cluster-build-in-background:
	hack/test-cluster/build --background $$PPID

# The real Kubernetes control plane the tests run against: built from Go modules on first use
# (about 15 minutes on 2 cores), reused from ~/.cache/kcover-test-cluster afterwards.
test-cluster:
	hack/test-cluster/build

# Debian packages the tests use: containerd, runc & co. for the real nodes, chromium for the reports
# (a failed install fails only the tests that need the package, each saying what is missing).
test-packages:
	-hack/test-packages

# The kcover image as the Dockerfile makes it (debootstrap + this checkout's wheels), for the chart tests
# on real nodes; cached by the hash of the sources. A failure here fails only those tests, saying why.
kcover-image: setup test-packages
	-$(BIN)/python -m kcover.testing.kcover_image

cluster-up: setup test-cluster
	$(BIN)/python -m kcover.testing.cluster up --nodes 4

bench: setup
	$(BIN)/python -m bench.corpus_accuracy
	$(BIN)/python -m bench.corpus_accuracy --corpus field
	$(BIN)/python -m bench.label_agreement
	$(BIN)/python -m bench.unknown_wording
	$(BIN)/python -m bench.scan_throughput
	$(BIN)/python -m bench.scan_memory
	$(BIN)/python -m bench.packed_throughput
	$(BIN)/python -m bench.launcher_latency
	$(BIN)/python -m bench.launcher_overhead
	$(BIN)/python -m bench.launcher_throughput
	$(BIN)/python -m bench.report_size
	$(BIN)/python -m bench.auto_timing
	$(BIN)/python -m bench.peer_restore
