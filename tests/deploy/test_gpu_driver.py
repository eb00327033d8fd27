"""`make install`'s driver check (deploy/gpu_driver.py) on hand-picked driver versions."""

from __future__ import annotations

from deploy.gpu_driver import CUDA_OF_PINNED_TORCH, driver_problem


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
