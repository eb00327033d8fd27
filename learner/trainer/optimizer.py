"""AdamW, its parameter groups and its learning-rate schedule: linear warmup, then
constant, cosine or linear decay; and the global gradient norm the clipping reads.

`lr_multiplier(k)` is the factor on the peak lr for optimizer step k (0-based), what
`torch.optim.lr_scheduler.LambdaLR` expects when `scheduler.step()` follows each
`optimizer.step()`. Warmup starts at 1/warmup_steps (never 0: a step with lr 0 would bump
the policy version without changing the policy).
"""

from __future__ import annotations

import functools
import math

import torch
from torch.distributed.tensor import DTensor

from learner.trainer.config import OptimConfig


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


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices only (norm scales and biases are 1-D)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(
    model: torch.nn.Module, optim: OptimConfig, *, total_steps: int
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over the trainable parameters and the schedule stepping its lr."""
    optimizer = torch.optim.AdamW(
        param_groups(model, optim.weight_decay), lr=optim.lr, betas=optim.betas, eps=optim.eps
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        functools.partial(
            lr_multiplier,
            warmup_steps=optim.warmup_steps,
            schedule=optim.schedule,
            total_steps=total_steps,
            min_lr_ratio=optim.min_lr_ratio,
        ),
    )
    return optimizer, scheduler


def grad_norm(model: torch.nn.Module) -> float:
    """Global L2 norm of all gradients (every rank gets the same number)."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return 0.0
    norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    return float(norm)
