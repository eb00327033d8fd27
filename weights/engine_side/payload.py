"""A round's tensors into the engine, by what the round carries: full weights (reloaded
into the live model) or a LoRA adapter (vLLM's LoRA, or merged into the base weights)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from weights.engine_side.adapter import apply_adapter
from weights.engine_side.loading import reload
from weights.shared.protocol import LoadResult, RoundTicket


def load_round(
    worker: Any, ticket: RoundTicket, weights: Iterable[tuple[str, torch.Tensor]], track: bool
) -> LoadResult:
    """Load the round's tensors; the result's version, bytes and adapter directory."""
    if ticket.payload == "lora":
        num_bytes, path = apply_adapter(
            worker, weights, ticket.adapter_config, version=ticket.version, track=track
        )
        return LoadResult(version=ticket.version, num_bytes=num_bytes, adapter_path=path)
    return LoadResult(version=ticket.version, num_bytes=reload(worker, weights, track))
