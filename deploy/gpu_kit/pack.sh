#!/usr/bin/env bash
# Packs what a lent GPU machine lacks (docs/gpu.md, "The GPU kit") into .gpukit/: vLLM 0.26.0's
# CUDA build and the pure dependencies in wheels.txt, installed for CPython 3.12 into one
# folder, trimmed, compressed, and cut into parts small enough to travel one per device call
# (64 MiB a call, the working tree included).
#
#   bash deploy/gpu_kit/pack.sh            # -> .gpukit/site.tar.xz.part-aa, -ab, ..., SHA256SUMS
#
# Trimmed, because the machine can use them nowhere or they are too big to carry: FlashAttention-2
# (FA3 is kept: the Hopper kernels vLLM picks on an H100/H200), the MoE kernels (imported
# only if present), the vllm-rs front end, DeepGEMM and the SM100 attention sources.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KIT="$ROOT/deploy/gpu_kit"
# GPU_KIT_PYTHON / GPU_KIT_OUT: a kit for another CPython, e.g. 3.11 for a rehearsal here.
PYTHON_VERSION="${GPU_KIT_PYTHON:-3.12}"
OUT="${GPU_KIT_OUT:-$ROOT/.gpukit}"
WORK="${GPU_KIT_WORK:-$ROOT/.cache/gpu_kit/$PYTHON_VERSION}"
PART_MB="${GPU_KIT_PART_MB:-50}"
PLATFORMS=(manylinux1_x86_64 manylinux2014_x86_64 manylinux_2_5_x86_64 manylinux_2_17_x86_64
  manylinux_2_24_x86_64 manylinux_2_27_x86_64 manylinux_2_28_x86_64 manylinux_2_31_x86_64
  manylinux_2_34_x86_64 manylinux_2_35_x86_64)
TARGET=(--only-binary=:all: --python-version "$PYTHON_VERSION" --implementation cp)
for platform in "${PLATFORMS[@]}"; do TARGET+=(--platform "$platform"); done

rm -rf "$WORK/wheels" && mkdir -p "$WORK/wheels"  # only what wheels.txt names today
# pip's machine-wide torch cap (a constraints file) is for this machine's own installs.
export PIP_CONSTRAINT=
python3 -m pip download --quiet --no-deps "${TARGET[@]}" -d "$WORK/wheels" -r "$KIT/wheels.txt"

rm -rf "$WORK/site"
python3 -m pip install --quiet --no-deps --no-compile "${TARGET[@]}" --target "$WORK/site" \
  "$WORK"/wheels/*.whl
cd "$WORK/site"
find bin -type f ! -name nats-server -delete
rm -rf vllm/vllm-rs vllm/third_party/deep_gemm vllm/third_party/fmha_sm100 \
  vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so vllm/_moe_C_stable_libtorch.abi3.so
find . -name __pycache__ -prune -exec rm -rf {} +

rm -rf "$OUT"
mkdir -p "$OUT"
tar --sort=name --mtime=@0 --owner=0 --group=0 -cf - . | xz -T2 -6 |
  split -b "${PART_MB}M" - "$OUT/site.tar.xz.part-"
cd "$OUT"
sha256sum site.tar.xz.part-* >SHA256SUMS
du -sh "$WORK/site" "$OUT"/site.tar.xz.part-* | sed "s|$ROOT/||"
