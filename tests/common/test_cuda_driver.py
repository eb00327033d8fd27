"""`make install`'s driver check (common/cuda_driver.py) on hand-picked driver versions."""

from __future__ import annotations

from common.cuda_driver import CUDA_OF_PINNED_TORCH, driver_problem, no_cuda_message


def test_pinned_cuda_needs_a_580_driver():
    assert CUDA_OF_PINNED_TORCH == "13.0"
    assert driver_problem("580.65.06", "13.0") is None
    assert driver_problem("590.12", "13.0") is None
    problem = driver_problem("570.133.20", "13.0")
    assert problem is not None and "570.133.20 is too old for CUDA 13.0" in problem
    assert ">= 580.65.06" in problem


def test_versions_compare_numerically_not_as_text():
    assert driver_problem("575.9", "12.9") is not None  # 575.9 < 575.51.03
    assert driver_problem("575.100", "12.9") is None


def test_unknown_cuda_is_said_plainly():
    assert "no minimum driver known for CUDA 11.8" in driver_problem("999.0", "11.8")


def _no_cuda(**facts) -> str:
    base = {"torch_version": "2.13.0+cu130", "torch_cuda": "13.0", "driver": None,
            "visible": None}  # fmt: skip
    return no_cuda_message("learner.device", **{**base, **facts})


def test_a_gpu_role_without_a_gpu_says_why_and_what_is_needed():
    cpu_build = _no_cuda(torch_version="2.13.0+cpu", torch_cuda=None)
    assert cpu_build.startswith('learner.device = "cuda" but torch sees no GPU')
    assert "torch 2.13.0+cpu is a CPU build" in cpu_build
    assert "no NVIDIA driver found" in _no_cuda()
    assert "needs NVIDIA driver >= 580.65.06" in _no_cuda()
    old = _no_cuda(driver="570.133.20")
    assert "NVIDIA driver 570.133.20 found" in old and ">= 580.65.06" in old
    hidden = _no_cuda(driver="580.95.05", visible="")
    assert "new enough" in hidden and "CUDA_VISIBLE_DEVICES=" in hidden
    for message in (cpu_build, old, hidden):
        assert "\n" not in message  # one line
