"""Learning-rate schedule: linear warmup, then constant, cosine or linear decay.

`lr_multiplier(k)` is the factor on the peak lr for optimizer step k (0-based), what
`torch.optim.lr_scheduler.LambdaLR` expects when `scheduler.step()` follows each
`optimizer.step()`. Warmup starts at 1/warmup_steps (never 0: a step with lr 0 would bump
the policy version without changing the policy).
"""

from __future__ import annotations

import math


def lr_multiplier(
    step: int,
    *,
    warmup_steps: int,
    schedule: str,
    total_steps: int | None,
    min_lr_ratio: float = 0.0,
) -> float:
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    if total_steps is None:
        raise ValueError(f"schedule {schedule!r} needs total_steps")
    progress = min(max((step - warmup_steps) / max(total_steps - warmup_steps, 1), 0.0), 1.0)
    if schedule == "cosine":
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    elif schedule == "linear":
        shape = 1.0 - progress
    else:
        raise ValueError(f"unknown schedule {schedule!r}; one of constant, cosine, linear")
    return min_lr_ratio + (1.0 - min_lr_ratio) * shape
