"""Rollout metrics per environment, from finished GRPO groups. Pure: lists in, a flat dict out.

A group is every sample of one prompt. Error episodes (`stop_reason` `error:*`: the env
server was unreachable, a replay diverged) carry reward 0 and an all-zero loss mask; their
reward is not a reward, so they are left out of every prompt and sample statistic and only
show in `error_fraction` and the stop-reason fractions. A group whose samples all errored
counts in `num_samples` but not in `num_prompts`.

Keys, for each environment `<e>` under `env/<e>/` and over all environments under `all/`
(means are omitted when a scope has no valid sample, rather than reported as NaN):

    num_prompts             groups with at least one valid (non-error) sample
    num_samples             all samples, errors included
    pass_at_n               fraction of prompts with at least one success (reward >= threshold)
    pass_at_1               mean over prompts of the fraction of successful samples: the
                            unbiased pass@1 estimate from n samples per prompt
    mean_reward             mean reward over valid samples
    variance_per_prompt     mean over prompts of the within-group reward variance (population
                            variance, so 0.25 is the maximum for 0/1 rewards)
    frac_groups_with_signal fraction of prompts whose rewards are not all equal (GRPO learns
                            only from those)
    mean_turns              assistant turns per valid sample
    mean_tool_calls         `num_tool_calls` per valid sample
    mean_response_tokens    policy-generated tokens (loss-mask sum) per valid sample
    tool_time_fraction      the share of the valid samples' time spent in env steps (tools)
                            rather than in the engine: `time_in_tools`
    error_fraction          error episodes / all samples
    samples_per_prompt      mean group size (the n of pass_at_n)
    stop_reason/<r>         fraction of samples (errors included) that stopped with `<r>`

Per environment only: `env/<e>/env_metrics/<k>`, the mean of the env's own metadata counter
`<k>` (e.g. `tool_errors`) over the valid samples that report it. Over all environments the
stop-reason fractions are top-level: `stop_reason/<r>`, not `all/stop_reason/<r>`.
`prefix` (e.g. "eval/") is put in front of every key.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

import numpy as np

from broker.codec import MASK_DTYPE
from broker.wire import Trajectory

DEFAULT_SUCCESS_THRESHOLD = 1.0
"""A sample succeeds when its reward is at least this (the calculator scores 1.0 or 0.0)."""


def _is_error(trajectory: Trajectory) -> bool:
    """An error episode (`learner.steps.is_error_episode`, repeated here to stay free of
    torch), or one whose reward is NaN or infinite: neither reward is a reward."""
    return trajectory.stop_reason.startswith("error") or not math.isfinite(trajectory.reward)


def response_tokens(trajectory: Trajectory) -> int:
    """Tokens the policy generated and is trained on: the loss-mask sum."""
    return int(np.frombuffer(trajectory.loss_mask, dtype=MASK_DTYPE).sum())


def rollout_metrics(
    groups: Iterable[Sequence[Trajectory]],
    *,
    success_threshold: float = DEFAULT_SUCCESS_THRESHOLD,
    prefix: str = "",
) -> dict[str, float]:
    """Flat metrics dict (see the module docstring) over `groups`.

    Each group is a sequence of the trajectories of one prompt, or anything with a
    `.trajectories` attribute holding them (`learner.batching.Group`).
    """
    by_env: dict[str, list[list[Trajectory]]] = defaultdict(list)
    all_groups = []
    for group in groups:
        trajectories = list(getattr(group, "trajectories", group))
        if not trajectories:
            raise ValueError("a group has no trajectories")
        env_classes = {t.env_class for t in trajectories}
        if len(env_classes) != 1:
            raise ValueError(
                f"group {trajectories[0].group_id!r} mixes environments {sorted(env_classes)}"
            )
        by_env[trajectories[0].env_class].append(trajectories)
        all_groups.append(trajectories)

    metrics: dict[str, float] = {}
    for env_class in sorted(by_env):
        env_groups = by_env[env_class]
        scope = f"{prefix}env/{env_class}/"
        metrics.update(_prefixed(scope, _scope_metrics(env_groups, success_threshold)))
        metrics.update(_prefixed(f"{scope}stop_reason/", _stop_reason_fractions(env_groups)))
        metrics.update(_prefixed(f"{scope}env_metrics/", _env_metric_means(env_groups)))
    if all_groups:
        metrics.update(_prefixed(f"{prefix}all/", _scope_metrics(all_groups, success_threshold)))
        metrics.update(_prefixed(f"{prefix}stop_reason/", _stop_reason_fractions(all_groups)))
    return metrics


def _scope_metrics(groups: list[list[Trajectory]], threshold: float) -> dict[str, float]:
    num_samples = sum(len(g) for g in groups)
    num_errors = sum(_is_error(t) for g in groups for t in g)
    metrics = {
        "num_samples": float(num_samples),
        "error_fraction": num_errors / num_samples,
        "samples_per_prompt": num_samples / len(groups),
    }
    valid_groups = [[t for t in g if not _is_error(t)] for g in groups]
    valid_groups = [g for g in valid_groups if g]
    metrics["num_prompts"] = float(len(valid_groups))
    if not valid_groups:
        return metrics

    successes, variances, with_signal = [], [], []
    for group in valid_groups:
        rewards = np.array([t.reward for t in group], dtype=np.float64)
        successes.append(float(np.mean(rewards >= threshold)))
        variances.append(float(np.var(rewards)))
        with_signal.append(float(rewards.max() != rewards.min()))
    valid = [t for g in valid_groups for t in g]
    metrics.update(
        pass_at_n=float(np.mean([s > 0 for s in successes])),
        pass_at_1=float(np.mean(successes)),
        mean_reward=float(np.mean([t.reward for t in valid])),
        variance_per_prompt=float(np.mean(variances)),
        frac_groups_with_signal=float(np.mean(with_signal)),
        mean_turns=float(np.mean([t.num_turns for t in valid])),
        mean_tool_calls=float(np.mean([t.num_tool_calls for t in valid])),
        mean_response_tokens=float(np.mean([response_tokens(t) for t in valid])),
    )
    if (in_tools := time_in_tools(valid)) is not None:
        metrics["tool_time_fraction"] = in_tools
    return metrics


def time_in_tools(trajectories: list[Trajectory]) -> float | None:
    """The share of these episodes' time spent in env steps (tools, the env server) rather
    than generating: sum of `env_s` / sum of `env_s + generate_s`, from each trajectory's
    timing, error episodes left out (as from every rollout metric). None when none of them
    was timed. An agent workflow's time in tools is its run less its model calls."""
    valid = [t for t in trajectories if not _is_error(t)]
    env_s = sum(t.timing.get("env_s", 0.0) for t in valid)
    generate_s = sum(t.timing.get("generate_s", 0.0) for t in valid)
    return env_s / (env_s + generate_s) if env_s + generate_s > 0 else None


def _stop_reason_fractions(groups: list[list[Trajectory]]) -> dict[str, float]:
    counts = Counter(t.stop_reason for g in groups for t in g)
    total = sum(counts.values())
    return {reason: n / total for reason, n in sorted(counts.items())}


def _env_metric_means(groups: list[list[Trajectory]]) -> dict[str, float]:
    values: dict[str, list[float]] = defaultdict(list)
    for group in groups:
        for t in group:
            if not _is_error(t):
                for key, value in t.env_metrics.items():
                    values[key].append(float(value))
    return {key: float(np.mean(v)) for key, v in sorted(values.items())}


def _prefixed(prefix: str, metrics: dict[str, float]) -> dict[str, float]:
    return {prefix + key: value for key, value in metrics.items()}
