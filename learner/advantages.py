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
"""

from __future__ import annotations

import torch

ESTIMATORS = ("grpo", "dr_grpo", "rloo")


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


def compute_advantages(
    rewards: torch.Tensor, estimator: str, *, normalize_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """Dispatch on the configured estimator name (`grpo`, `dr_grpo`, `rloo`)."""
    if estimator == "grpo":
        return grpo_advantages(rewards, normalize_std=normalize_std, eps=eps)
    if estimator == "dr_grpo":
        return dr_grpo_advantages(rewards)
    if estimator == "rloo":
        return rloo_advantages(rewards)
    raise ValueError(f"unknown advantage estimator {estimator!r}; choose one of {ESTIMATORS}")
