"""Outcome advantages for group-relative RL: one scalar per trajectory, from its group's rewards.

Input is a `[num_groups, group_size]` tensor of episode rewards (one row per prompt); output
is the advantage of each sample, same shape. The learner broadcasts a sample's advantage onto
every token it generated.

- GRPO: `(r - mean(group)) / (std(group) + eps)`, or only `r - mean(group)` with
  `normalize_std=False`. The std is the unbiased one (Bessel), as in SkyRL and verl.
- Dr.GRPO: `r - mean(group)` (no std division). Its other half, no per-sequence length
  normalisation, is a loss-reduction choice (`seq_mean_token_sum` or `token_mean`), checked
  by the config.
- RLOO: `r_i - mean_{j != i} r_j`, the leave-one-out baseline, which equals
  `K / (K - 1) * (r_i - mean(group))`.

All estimators give zero advantage to a group whose rewards are all equal: such a group has
no learning signal (SkyRL's `variance_per_prompt` = 0).

`learner.algorithm.advantage_estimator` names one of them or the user's own by import path
(`my_pkg.rl:estimator`), with one protocol for both: `estimator(rewards [G, K],
algorithm) -> advantages [G, K]`, the whole `[learner.algorithm]` section being its
settings. The built-ins are import paths (`ADVANTAGE_ESTIMATORS`), loaded the same way.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from common import plugins
from learner.trainer.config import ADVANTAGE_ESTIMATORS, AlgorithmConfig

Estimator = Callable[[torch.Tensor, AlgorithmConfig], torch.Tensor]


def _check(rewards: torch.Tensor) -> None:
    if rewards.ndim != 2:
        raise ValueError(
            f"rewards must be [num_groups, group_size], got shape {tuple(rewards.shape)}"
        )
    if rewards.shape[1] < 2:
        raise ValueError(
            f"group-relative advantages need a group size of at least 2, got {rewards.shape[1]}"
        )


def grpo_advantages(
    rewards: torch.Tensor, *, normalize_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO advantage per sample: reward minus group mean, divided by (group std + eps)."""
    _check(rewards)
    rewards = rewards.to(torch.float32)
    centred = rewards - rewards.mean(dim=1, keepdim=True)  # [G, K]
    if not normalize_std:
        return centred
    return centred / (rewards.std(dim=1, keepdim=True) + eps)


def dr_grpo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """Dr.GRPO advantage: reward minus group mean, no std normalisation."""
    return grpo_advantages(rewards, normalize_std=False)


def rloo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """RLOO advantage: reward minus the mean of the other K-1 rewards of its group."""
    _check(rewards)
    rewards = rewards.to(torch.float32)
    group_size = rewards.shape[1]
    others_mean = (rewards.sum(dim=1, keepdim=True) - rewards) / (group_size - 1)  # [G, K]
    return rewards - others_mean


def grpo(rewards: torch.Tensor, algorithm: AlgorithmConfig) -> torch.Tensor:
    return grpo_advantages(rewards, normalize_std=algorithm.normalize_std, eps=algorithm.std_eps)


def dr_grpo(rewards: torch.Tensor, algorithm: AlgorithmConfig) -> torch.Tensor:
    return dr_grpo_advantages(rewards)


def rloo(rewards: torch.Tensor, algorithm: AlgorithmConfig) -> torch.Tensor:
    return rloo_advantages(rewards)


@functools.cache
def estimator_named(name: str) -> Estimator:
    """A built-in estimator by name, or the user's by import path."""
    return plugins.import_object(ADVANTAGE_ESTIMATORS.get(name, name))


def compute_advantages(rewards: torch.Tensor, algorithm: AlgorithmConfig) -> torch.Tensor:
    """The configured estimator's advantages of `rewards` [G, K]. ValueError when a user's
    estimator returns something else than a finite tensor of the same shape."""
    _check(rewards)
    name = algorithm.advantage_estimator
    advantages = estimator_named(name)(rewards, algorithm)
    if not isinstance(advantages, torch.Tensor) or advantages.shape != rewards.shape:
        got = getattr(advantages, "shape", type(advantages).__name__)
        raise ValueError(f"advantage estimator {name}: returned {got}, not [{rewards.shape}]")
    if not torch.isfinite(advantages).all():
        raise ValueError(f"advantage estimator {name}: returned a value that is not finite")
    return advantages.to(torch.float32)
