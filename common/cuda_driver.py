"""Is this machine's NVIDIA driver new enough for the CUDA build we install? Run by
`make install` on GPU machines before anything is downloaded, and by `make gpu-check`:

    python3 -m common.cuda_driver [--cuda 13.0]

and by a role whose config asks for a GPU (`learner.device` or `actor.engine.device` set to
"cuda", as the GPU overlay and a Ray plan that assigned GPUs do): without a usable GPU it
refuses to start, in one line that names the driver found and the one needed
(`require_cuda`), instead of a 7B learner loading on CPU and failing much later elsewhere.

The pinned `vllm==0.32.0` requires `torch==2.13.0`, whose PyPI wheels are built with CUDA
13.0 (vLLM 0.32's VLLM_MAIN_CUDA_VERSION): the driver must be at least the one that CUDA
release names (NVIDIA's CUDA toolkit release notes, table 3). A driver that is too old fails
later with "CUDA driver version is insufficient" deep inside the first engine or rank; this
says so up front. Standard library only: it runs before the virtual environment exists.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

CUDA_OF_PINNED_TORCH = "13.0"
"""The CUDA version of the torch wheel vllm==0.32.0 pins (torch 2.13.0 on PyPI)."""

MIN_DRIVER = {
    "13.0": "580.65.06",
    "12.9": "575.51.03",
    "12.8": "570.26",
    "12.6": "560.28.03",
    "12.4": "550.54.14",
}
"""Minimum Linux driver of each CUDA release (toolkit release notes)."""


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.strip().split("."))


def driver_problem(driver: str, cuda: str) -> str | None:
    """None when `driver` can run CUDA `cuda`; else the message that says what to do."""
    if cuda not in MIN_DRIVER:
        return f"no minimum driver known for CUDA {cuda}; known: {', '.join(MIN_DRIVER)}"
    need = MIN_DRIVER[cuda]
    if _version(driver) >= _version(need):
        return None
    return (
        f"NVIDIA driver {driver} is too old for CUDA {cuda} (torch 2.13.0 / vllm 0.32.0 "
        f"need driver >= {need}). Upgrade the driver (e.g. the {need.split('.')[0]} branch), "
        "or on a datacenter GPU install NVIDIA's CUDA forward-compatibility package and set "
        "VLLM_ENABLE_CUDA_COMPATIBILITY=1."
    )


def installed_driver() -> str | None:
    """The driver version nvidia-smi reports (the first GPU's), None without nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return None
    result = subprocess.run(
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=False,
    )
    lines = result.stdout.split()
    return lines[0] if result.returncode == 0 and lines else None


class CudaUnavailable(RuntimeError):
    """A role was configured for a GPU, and this machine gives torch none."""


def no_cuda_message(
    setting: str,
    *,
    torch_version: str,
    torch_cuda: str | None,
    driver: str | None,
    visible: str | None,
) -> str:
    """Why `setting = "cuda"` cannot be had here, and what to do (pure). `torch_cuda`:
    the CUDA version torch was built with (None: a CPU build); `driver`: nvidia-smi's
    (None: no driver); `visible`: CUDA_VISIBLE_DEVICES (None: unset)."""
    asked = f'{setting} = "cuda" but torch sees no GPU: '
    if torch_cuda is None:
        return asked + (
            f"torch {torch_version} is a CPU build. Install the CUDA build on a machine with "
            "an NVIDIA driver (make install), or leave the device at auto"
        )
    need = MIN_DRIVER.get(torch_cuda)
    wanted = f"torch {torch_version} (CUDA {torch_cuda}) needs NVIDIA driver >= {need}"
    if driver is None:
        return asked + f"no NVIDIA driver found (nvidia-smi is not on PATH); {wanted}"
    if need is not None and _version(driver) < _version(need):
        return asked + f"NVIDIA driver {driver} found; {wanted}"
    return asked + (
        f"NVIDIA driver {driver} found and new enough, CUDA_VISIBLE_DEVICES="
        f"{visible if visible is not None else '(unset)'}: is a GPU assigned to this process?"
    )


def require_cuda(setting: str) -> None:
    """Raise `CudaUnavailable` (one line) unless torch can use a CUDA GPU here."""
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return
    raise CudaUnavailable(
        no_cuda_message(
            setting,
            torch_version=torch.__version__,
            torch_cuda=torch.version.cuda,
            driver=installed_driver(),
            visible=os.environ.get("CUDA_VISIBLE_DEVICES"),
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m common.cuda_driver", description=__doc__)
    parser.add_argument("--cuda", default=CUDA_OF_PINNED_TORCH)
    args = parser.parse_args(argv)
    driver = installed_driver()
    if driver is None:
        print("gpu_driver: no nvidia-smi (no NVIDIA driver): nothing to check")
        return 0
    problem = driver_problem(driver, args.cuda)
    if problem:
        print(f"make install: {problem}", file=sys.stderr)
        return 1
    print(f"NVIDIA driver {driver}: fine for CUDA {args.cuda}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
