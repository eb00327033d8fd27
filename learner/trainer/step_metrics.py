"""The metrics of one training step: what it trained (sequences, tokens, the saving of
shared prefixes), how long it took, and the PPO health of its ratios
(learner/trainer/ppo_health.py), from counts and the sums the step all-reduced.
`version` and `step` are the trainer's counters after the update."""

from __future__ import annotations

from learner.trainer.ppo_health import is_degenerate
from learner.trainer.sample import Sample


def step_metrics(
    samples: list[Sample],
    *,
    version: int,
    step: int,
    consecutive_skips: int,
    loss: float,
    grad_norm: float,
    lr: float,
    finite: bool,
    health: dict[str, float],
    num_micro_batches: int,
    num_trained_tokens: int,
    seconds: float,
    recompute_seconds: float,
) -> dict[str, float]:
    num_tokens = sum(s.num_tokens for s in samples)
    oldest = min(
        (int(s.versions[s.loss_mask.astype(bool)].min()) for s in samples if s.loss_mask.any()),
        default=-1,
    )
    degenerate = is_degenerate(
        ratio_std=health.get("ratio_std", 1.0),
        num_tokens=health["num_loss_tokens"],
        oldest_version=oldest,
        current_version=version - int(finite),
    )
    return {
        "loss": loss,
        "grad_norm": grad_norm,
        "lr": lr,
        "version": float(version),
        "step": float(step),
        "skipped": float(not finite),
        "consecutive_skips": float(consecutive_skips),
        "num_sequences": float(len(samples)),
        "num_tokens": float(num_tokens),
        # Shared-prefix training: the tokens forwarded and backwarded (a group's common
        # prefix once) against the samples' own; their ratio is the saving.
        "num_trained_tokens": float(num_trained_tokens),
        "prefix_sharing_ratio": num_tokens / max(num_trained_tokens, 1),
        "num_micro_batches": float(num_micro_batches),
        "step_seconds": seconds,
        "recompute_seconds": recompute_seconds,
        "tokens_per_second": num_tokens / seconds if seconds > 0 else 0.0,
        "degenerate_ratio": float(degenerate),
        **health,
    }
