"""Full weights out of a (possibly FSDP2-sharded) model, one parameter at a time.

Each parameter is gathered on its own (`DTensor.full_tensor()`, an all-gather every rank
must join in the same order), so no rank ever holds more than the tensor in flight plus the
bucket the sender is filling: the whole state dict is never materialised at once (DESIGN:
"never all copies at once"). Only rank 0 yields anything; the other ranks must still run the
iterator to the end so that their all-gathers meet rank 0's.

Names are the HF parameter names (`model.layers.0.self_attn.q_proj.weight`): `fully_shard`
swaps module classes in place and adds no prefix. Tied parameters appear once (vLLM's
Qwen2 loader fills `lm_head` from the embedding when `tie_word_embeddings` is set).
Only parameters travel; Qwen2's buffers are the non-persistent rotary tables.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def full_parameters(
    model: torch.nn.Module, *, dtype: torch.dtype | None = None, trainable_only: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) per parameter on rank 0, nothing on the others (each sharded
    tensor is a collective: every rank must exhaust the iterator). `dtype` casts on the
    way out (bf16 halves the bytes for a bf16 engine). `trainable_only` skips frozen
    parameters (a LoRA adapter's base model, weights/formats/adapter.py)."""
    is_sender = not dist.is_initialized() or dist.get_rank() == 0
    for name, param in model.named_parameters():
        if trainable_only and not param.requires_grad:
            continue  # the same on every rank: the gathers stay in step
        tensor = param.detach()
        if isinstance(tensor, DTensor):
            tensor = tensor.full_tensor()
        if is_sender:
            yield name, tensor if dtype is None else tensor.to(dtype)
