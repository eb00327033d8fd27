"""The learner's side of LoRA rounds: the adapter's trainable tensors, under PEFT's names
(weights/formats/adapter.py), gathered on rank 0 for the broadcast and snapshots."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from weights.formats.adapter import peft_name

if TYPE_CHECKING:
    import torch


def adapter_parameters(
    model: torch.nn.Module, *, dtype: torch.dtype | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """(PEFT name, full tensor) of every trainable parameter on rank 0, nothing on the
    others; like `full_parameters`, every rank must exhaust it (each is an all-gather)."""
    from weights.learner_side.fsdp import full_parameters

    for name, tensor in full_parameters(model, dtype=dtype, trainable_only=True):
        yield peft_name(name), tensor
