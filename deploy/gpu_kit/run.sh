#!/usr/bin/env bash
# The GPU kit's device side (docs/gpu.md, "The GPU kit"), run on a lent GPU machine from the
# repository's root, with the parts of .gpukit/ that came with this call:
#
#   bash deploy/gpu_kit/run.sh stage    # keep the parts that came (a warm machine keeps /tmp)
#   bash deploy/gpu_kit/run.sh check [STAGE...]   # assemble and install (once), then test
#
# STAGEs, in the order given (default: all six): broadcast (the bf16 broadcast test of
# tests/gpu), delta (delta rounds into the same engine), lora (vLLM's LoRA in a bf16 CUDA engine, tests/gpu), demo (the 1-GPU demo
# through deploy.local), engines (make test's engine and LoRA tests on CUDA in fp32), stalled
# (the streamed round failing part-way, alone, with a stack dump if it hangs). A warm machine keeps the install, so a later call can run the rest.
#
# `check` writes what it saw to $OUT (the device tool brings it back): kit.log (everything),
# results.json (the figures tests/gpu records), failures.txt (each failure's reason, as it
# happened), junit-*.xml (each test's verdict).
set -uo pipefail

STAGE=/tmp/gpukit
SITE=/tmp/site
OUT=${OUT:-/tmp/gpukit-out}
BUDGET_S=${GPU_KIT_BUDGET_S:-480}
mkdir -p "$STAGE" "$OUT"
cp .gpukit/site.tar.xz.part-* .gpukit/SHA256SUMS "$STAGE"/ 2>/dev/null

say() { echo "== $(date -u +%T) $*"; }

if [[ ${1:-} == stage ]]; then
  ls -l "$STAGE"
  python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' | xargs test -w && echo "purelib writable"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda)'
  python3 -m pip list 2>/dev/null | grep -iE '^(transformers|tokenizers|pytest|pytest-timeout|numba|triton|grpcio|protobuf|peft) '
  exit 0
fi

STAGES=("${@:2}")
[[ ${#STAGES[@]} -gt 0 ]] || STAGES=(broadcast delta lora demo engines stalled)
for stage in "${STAGES[@]}"; do
  [[ $stage =~ ^(broadcast|delta|lora|demo|engines|stalled)$ ]] || { echo "unknown stage $stage (broadcast, delta, lora, demo, engines, stalled)"; exit 2; }
done
exec > >(tee -a "$OUT/kit.log") 2>&1
DEADLINE=$((SECONDS + BUDGET_S))
left() { local l=$((DEADLINE - SECONDS)); echo $((l > 1 ? l : 1)); }  # timeout 0 would mean none

# The environment every stage runs in (a later call on a warm machine sets it again).
export PATH="$SITE/bin:$PATH" PYTHONUNBUFFERED=1 TETHER_GPU_REQUIRED=1
# FlashInfer is not carried (hundreds of MB); vLLM 0.26's GPU sampler imports it unless told not to.
export VLLM_USE_FLASHINFER_SAMPLER=0
PURELIB=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
[[ -f $SITE/sitecustomize.py ]] && export PYTHONPATH="$SITE"
# The image's grpcio (1.84.0 on 2026-11-26) is older than the floor our generated code
# asserts at import (the grpcio-tools that made it, pyproject.toml). The code runs on it: with
# the floor lowered in this machine's copy of the tree, the 1-GPU demo passed on the H200.
python3 - <<'PY'
import pathlib, re, grpc
from grpc._utilities import first_version_is_lower
for path in pathlib.Path("protos").glob("*_grpc.py"):
    text = path.read_text()
    generated = re.search(r"^GRPC_GENERATED_VERSION = '(.*)'", text, re.M)[1]
    if first_version_is_lower(grpc.__version__, generated):
        path.write_text(text.replace(f"= '{generated}'", f"= '{grpc.__version__}'", 1))
        print(f"{path}: grpcio floor {generated} lowered to the image's {grpc.__version__}")
PY

install() {
  say "assemble"
  (cd "$STAGE" && sha256sum -c --quiet SHA256SUMS) || { echo "kit parts missing or damaged"; ls -l "$STAGE"; exit 3; }
  rm -rf "$SITE" && mkdir -p "$SITE"
  cat "$STAGE"/site.tar.xz.part-* | xz -d -T0 | tar -xf - -C "$SITE" || exit 3
  cp deploy/gpu_kit/vllm026_shim.py "$SITE"/tether_vllm026_shim.py
  # A .pth file puts the kit after the image's own packages on every interpreter's path (the
  # image's torch wins) and loads the shim in every process, subprocesses included.
  if ! printf '%s\nimport tether_vllm026_shim\n' "$SITE" >"$PURELIB/zz_tether_gpu_kit.pth"; then
    echo "WARNING: $PURELIB is read-only; the kit goes on PYTHONPATH (a test's subprocess that sets its own PYTHONPATH will not see it)"
    echo "import tether_vllm026_shim" >"$SITE/sitecustomize.py"
    export PYTHONPATH="$SITE"
  fi
  touch "$SITE/.installed"
}

if [[ -f $SITE/.installed ]]; then
  say "the kit is installed already (a warm machine)"
else
  install
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
python3 - <<'PY' || exit 4
import torch, vllm
from vllm.platforms import current_platform
from vllm.vllm_flash_attn import flash_attn_interface as fa
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
print("vllm", vllm.__version__, "torch", torch.__version__, "platform",
      type(current_platform).__name__, "FA3", fa.FA3_AVAILABLE, gpu)
PY

# Figures go straight to $OUT and each failure's reason is printed as it happens: a call cut
# short by its time limit still brings back what it measured and why tests failed.
export TETHER_GPU_RESULTS="$OUT/results.json"
# GPU_KIT_PYTEST_ARGS: more pytest arguments (a rehearsal on CPU passes --collect-only).
PYTEST=(python3 -m pytest -p no:cacheprovider -p deploy.gpu_kit.report_plugin -v -rs --tb=short
  --timeout 120 ${GPU_KIT_PYTEST_ARGS:-})
# vLLM 0.26 has no per-token version spans (the shim returns none) and cannot reload full
# weights into an engine with LoRA layers; both pass on 0.32 (make test).
KNOWN_026=(
  --deselect "tests/actors/test_vllm_engine.py::test_update_mid_request_relabels_later_tokens_and_the_request_continues"
  --deselect "tests/actors/test_vllm_lora.py::test_a_running_request_continues_on_the_new_adapter"
  --deselect "tests/actors/test_vllm_lora.py::test_a_full_weights_snapshot_drops_the_adapter[vllm_lora]"
)
STALLED="tests/actors/test_vllm_engine.py::test_a_streamed_round_failing_part_way_pauses_generation_until_a_snapshot_loads"
# Each stage's share of the budget, at most (the last one takes what is left).
upto() { local l; l=$(left); echo $(($1 < l ? $1 : l)); }
# make test's engine tests run on CUDA in fp32: their exact comparisons with transformers are
# CPU-fp32 tolerances, so on a GPU a failure of those is a lead, not a verdict; the checksums,
# failed rounds, snapshots and LoRA checks hold on any device.
fp32() { TETHER_TINY_ENGINE_DTYPE=float32 TETHER_TINY_ENGINE_GPU_MEMORY=0.15 "$@"; }

broadcast() {
  say "the GPU tests' engine: a broadcast into a bf16 CUDA engine against transformers"
  timeout "$(upto 120)" "${PYTEST[@]}" --junitxml="$OUT/junit-broadcast.xml" \
    "tests/gpu/test_engine_broadcast.py::test_broadcast_into_cuda_engine_matches_transformers[gloo]"
}

delta() {
  say "delta rounds (weight_sync.delta) into the bf16 CUDA engine against transformers"
  timeout "$(upto 150)" "${PYTEST[@]}" --junitxml="$OUT/junit-delta.xml" \
    "tests/gpu/test_engine_broadcast.py::test_delta_rounds_into_a_bf16_cuda_engine"
}

lora() {
  say "the GPU tests' LoRA engine: adapter rounds into a bf16 CUDA engine against PEFT"
  timeout "$(upto 120)" "${PYTEST[@]}" --junitxml="$OUT/junit-lora.xml" tests/gpu/test_lora_engine.py
}

demo() {
  say "the demo on one GPU through deploy.local (make run); its output goes to $OUT/deploy-local.log"
  local demo_s
  demo_s=$(upto "${GPU_KIT_DEMO_S:-360}")
  TETHER_GPU_LOG_DIR="$OUT" timeout "$demo_s" "${PYTEST[@]}" --timeout "$demo_s" \
    --junitxml="$OUT/junit-demo.xml" tests/gpu/test_runs.py::test_demo_on_one_gpu_learns_to_call_the_tool
}

engines() {
  say "make test's engine tests on CUDA (fp32)"
  fp32 timeout "$(left)" "${PYTEST[@]}" --junitxml="$OUT/junit-engines.xml" "${KNOWN_026[@]}" \
    --deselect "$STALLED" tests/actors/test_vllm_lora.py tests/actors/test_vllm_engine.py
}

stalled() {
  # The thread method dumps every thread's stack before it ends pytest: where it waits.
  say "the test that ran out of time on 2026-11-26, alone (fp32)"
  fp32 timeout "$(left)" "${PYTEST[@]}" --timeout "$(upto 150)" --timeout-method=thread \
    --junitxml="$OUT/junit-stalled.xml" "$STALLED"
}

for stage in "${STAGES[@]}"; do
  "$stage"
  say "$stage: exit $?"
done
say "done, $(left) s of the budget left"
