"""Segment attention on GPU as one variable-length flash-attention call per layer.

`attend_segments` (segment_attention.py) runs one `scaled_dot_product_attention` per segment:
right on every device, but on a GPU each call is a handful of small kernels, and a
micro-batch of 64 segments x 12 layers x forward and backward is thousands of them. On an H100
that made 1,024-token micro-batches 5x slower per token than 8,192-token ones (docs/gpu.md).
Here the whole row is one `torch.nn.attention.varlen.varlen_attn` call (FlashAttention's
varlen kernel, CUDA only, fp16/bf16):

    queries   the row as it is, `[N, H, D]`; segment k is rows starts[k] .. +lengths[k]
    keys      per segment, its parent's rows (a shared prefix) then its own: gathered with one
              `index_select` (the prefix copied per suffix, as the per-segment path's `cat`)
    mask      causal, aligned bottom-right where a segment has more keys than queries
              (FlashAttention's convention since 2.1): suffix row i sees the whole prefix
              and suffix rows 0..i, exactly the per-segment path's `[S, P + S]` mask

`tests/gpu/test_one_gpu.py` checks it against the per-segment path, outputs and gradients.
"""

from __future__ import annotations

import inspect

import numpy as np
import torch

from learner.trainer.segments import Segments

HALF = (torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 256  # FlashAttention's limit
MIN_SEGMENTS = 4
"""Fewer segments in a row: per-segment SDPA is as cheap (and the varlen op's Python autograd
wrapper costs ~0.3 ms a call). Measured on an H100, a 207M Qwen2, 40k tokens a step: at
1,024-token micro-batches (~1.5 segments each) varlen 14.4k tokens/s vs SDPA 18.0k; at 8,192
(~13 segments) 102k vs 93k."""


def _varlen_attn():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:  # torch before 2.9
        return None
    return varlen_attn


VARLEN_ATTN = _varlen_attn()
CAUSAL = (
    {}
    if VARLEN_ATTN is None
    else {"window_size": (-1, 0)}
    if "window_size" in inspect.signature(VARLEN_ATTN).parameters
    else {"is_causal": True}
)
"""Causal in the installed torch's spelling: `window_size=(-1, 0)` (2.10+) or `is_causal=True`
(2.9); read once, not per layer."""


def compute_dtype(query: torch.Tensor) -> torch.dtype:
    """The dtype attention runs in: autocast's on CUDA when it is on (SDPA is autocast to it;
    a custom kernel is not, and rotary embeddings can leave the query in fp32)."""
    if query.is_cuda and torch.is_autocast_enabled("cuda"):
        return torch.get_autocast_dtype("cuda")
    return query.dtype


def varlen_applies(query: torch.Tensor, dropout: float) -> bool:
    """Whether the varlen kernel can take this call (else the per-segment path must)."""
    return (
        VARLEN_ATTN is not None
        and query.is_cuda
        and dropout == 0.0
        and compute_dtype(query) in HALF
        and query.shape[0] == 1
        and query.shape[-1] <= MAX_HEAD_DIM
    )


def varlen_plan(segments: Segments) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    """(key rows or None when no segment has a parent, cu_seq_q, cu_seq_k) on the host."""
    starts, lengths, parents = segments.starts, segments.lengths, segments.parents
    cu_q = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    if all(p < 0 for p in parents):
        return None, cu_q, cu_q
    rows = []
    for start, length, parent in zip(starts, lengths, parents, strict=True):
        if parent >= 0:
            rows.append(np.arange(starts[parent], starts[parent] + lengths[parent]))
        rows.append(np.arange(start, start + length))
    key_lengths = [
        length + (lengths[parent] if parent >= 0 else 0)
        for length, parent in zip(lengths, parents, strict=True)
    ]
    cu_k = np.concatenate([[0], np.cumsum(key_lengths)]).astype(np.int32)
    return np.concatenate(rows).astype(np.int64), cu_q, cu_k


def _to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """Copied from pinned memory without blocking: a copy from pageable memory waits for
    the GPU to drain, which at small micro-batches stalled the CPU once per micro-batch."""
    return torch.from_numpy(array).pin_memory().to(device, non_blocking=True)


def _device_plan(segments: Segments, device: torch.device):
    """The plan as device tensors, cached on `segments` for the other layers."""
    return segments.cached(("varlen", device), lambda: _plan_on(segments, device))


def _plan_on(segments: Segments, device: torch.device):
    rows, cu_q, cu_k = varlen_plan(segments)
    return (
        None if rows is None else _to_device(rows, device),
        _to_device(cu_q, device),
        _to_device(cu_k, device),
        int(np.diff(cu_q).max()),
        int(np.diff(cu_k).max()),
    )


def attend_segments_varlen(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    segments: Segments,
    *,
    scale: float | None = None,
) -> torch.Tensor:
    """`query/key/value [1, H, N, D]` (same head count) -> `[1, H, N, D]`, in the compute
    dtype."""
    dtype = compute_dtype(query)
    # [1, H, N, D] from transformers is a transposed view of [N, H, D] memory: no copy here.
    q, k, v = (t[0].transpose(0, 1).to(dtype) for t in (query, key, value))
    rows, cu_q, cu_k, max_q, max_k = _device_plan(segments, query.device)
    if rows is not None:
        k, v = k.index_select(0, rows), v.index_select(0, rows)
    out = VARLEN_ATTN(q, k, v, cu_q, cu_k, max_q, max_k, scale=scale, **CAUSAL)
    return out.transpose(0, 1)[None]  # [1, H, N, D]
