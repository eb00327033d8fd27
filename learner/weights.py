"""Full weights out of a (possibly FSDP2-sharded) model, streamed in buckets for the broadcast.

Each parameter is gathered on its own (`DTensor.full_tensor()`, an all-gather every rank must
join in the same order), so no rank ever holds more than one bucket of full tensors: the
whole state dict is never materialised at once (DESIGN: "never all copies at once"). Rank 0
receives the buckets and sends them on; the other ranks must still run the iterator to the
end (it yields nothing there) so their all-gathers meet rank 0's.

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


def full_parameters(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) per parameter, on every rank (a collective per sharded tensor)."""
    for name, param in model.named_parameters():
        tensor = param.detach()
        if isinstance(tensor, DTensor):
            tensor = tensor.full_tensor()
        yield name, tensor


def iter_weight_buckets(
    model: torch.nn.Module, *, bucket_bytes: int, dtype: torch.dtype | None = None
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Buckets of (name, full tensor) of about `bucket_bytes` each, on rank 0 only.

    A tensor larger than a bucket gets a bucket of its own. `dtype` casts before sending
    (e.g. bf16 to halve the bytes when the engine runs bf16). Every rank must exhaust it.
    """
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    is_sender = not dist.is_initialized() or dist.get_rank() == 0
    bucket: list[tuple[str, torch.Tensor]] = []
    bucket_size = 0
    for name, tensor in full_parameters(model):
        if not is_sender:
            continue  # the all-gather happened; this rank has nothing to send
        if dtype is not None:
            tensor = tensor.to(dtype)
        size = tensor.numel() * tensor.element_size()
        if bucket and bucket_size + size > bucket_bytes:
            yield bucket
            bucket, bucket_size = [], 0
        bucket.append((name, tensor))
        bucket_size += size
    if bucket:
        yield bucket
