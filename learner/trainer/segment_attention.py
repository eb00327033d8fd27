"""Attention over a packed row of segments, as a transformers attention function.

    use_segment_attention(model)            # once: register, switch the model to it
    model(input_ids, position_ids, segments=batch.segments, ...)   # see segment_forward.py

`segment_attention` is registered in transformers' `AttentionInterface` under
`ATTENTION_NAME`; models that route attention through that interface (Qwen2, Qwen3, Llama
and the other generated HF causal LMs) call it in every layer with the projected, rotated
`query [1, H, N, D]`, `key`/`value [1, H_kv, N, D]`, and hand it the `segments=` keyword the
caller passed to the model's forward (`learner/trainer/segments.py` `Segments`). A segment without a
parent (a shared prefix, or a plain sequence) attends causally to itself; a segment with a
parent (a suffix) attends to all of its parent's keys/values and causally to itself. The
parent's K/V are views of the layer's one K/V tensor, so autograd accumulates every
suffix's gradient into the one prefix.

No dense N x N mask: transformers builds masks only for implementations registered in its
`AttentionMaskInterface`; for any other name `masking_utils._preprocess_mask_arguments` exits
early and the layers get `attention_mask=None` (its "custom attention without equivalent mask
creation" path). So this name is deliberately *not* registered there, and the function
refuses a mask if a future transformers ever passes one. The biggest mask is a suffix's
`[S, P + S]`.

Mechanism: one `scaled_dot_product_attention` per segment: `is_causal` for a prefix or a
plain segment; for a suffix, its K/V concatenated after the prefix's and a lower-right causal
additive mask `[S, P + S]`. Chosen by measurement (this machine's CPU, 1 thread, the demo's
tiny Qwen2, forward + backward of a whole step, best of 3; scratch variants not kept):

    step seconds                                  demo (8 x 8, P 148)   synthetic (2 x 16, P 2048)
    one call per segment (this)                          0.90                  2.60
    one call per group, suffixes padded to the longest   1.19                  3.45
    one call per group, block-diagonal mask over all     1.51                  5.96
      of its suffixes (quadratic in the group's suffix tokens)

Split attention (prefix part and causal self part merged by their log-sum-exps) would avoid
copying the prefix's K/V per suffix, but SDPA's log-sum-exp output has no gradient, so the
merge would need an eager score matrix. Splitting the row with `split()` matters: slicing
each segment out instead made the backward write one zero-filled whole-row gradient per
slice (demo step 1.55 s instead of 1.12 s in the same session). Everything here exists on
CPU and CUDA; on CUDA in fp16/bf16 the whole row goes instead to one FlashAttention varlen
call (learner/trainer/segment_varlen.py): per-segment calls are launch-bound there.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from learner.trainer.segment_varlen import MIN_SEGMENTS, attend_segments_varlen, varlen_applies
from learner.trainer.segments import Segments

ATTENTION_NAME = "tether_segments"
UNSUPPORTED = ("softcap", "s_aux")


def _repeat_kv(states: torch.Tensor, num_groups: int) -> torch.Tensor:
    """`[B, H_kv, N, D]` -> `[B, H_kv * num_groups, N, D]` (grouped-query attention)."""
    if num_groups == 1:
        return states
    batch, num_kv_heads, length, head_dim = states.shape
    expanded = states[:, :, None].expand(batch, num_kv_heads, num_groups, length, head_dim)
    return expanded.reshape(batch, num_kv_heads * num_groups, length, head_dim)


def _suffix_mask(
    segments: Segments, length: int, prefix_len: int, query: torch.Tensor
) -> torch.Tensor:
    """Additive `[S, P + S]` mask of a suffix: row i sees the whole prefix and suffix tokens
    0..i (columns j <= P + i get 0, the others -inf). Additive in the query's dtype, since
    SDPA would convert a boolean mask on every call, and cached on `segments`: every layer
    (whose backward keeps its mask) shares one tensor per shape."""
    return segments.cached(
        (length, prefix_len, query.dtype, query.device),
        lambda: torch.full(
            (length, prefix_len + length), float("-inf"), dtype=query.dtype, device=query.device
        ).triu(diagonal=prefix_len + 1),
    )


def attend_segments(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    segments: Segments,
    *,
    scale: float | None = None,
    dropout: float = 0.0,
    kernel: str = "auto",
) -> torch.Tensor:
    """Attention of `query/key/value [B, H, N, D]` (same head count) within `segments`;
    returns `[B, H, N, D]`. `kernel`: `sdpa` (one call per segment, any device), `varlen`
    (one FlashAttention varlen call, CUDA in fp16/bf16: segment_varlen.py) or `auto` (varlen
    where it applies and the row has `MIN_SEGMENTS` or more)."""
    assert query.shape[2] == key.shape[2] == segments.num_tokens, (query.shape, segments)
    if kernel not in ("auto", "sdpa", "varlen"):
        raise ValueError(f"kernel must be auto, sdpa or varlen, got {kernel!r}")
    if kernel == "varlen" and not varlen_applies(query, dropout):
        raise ValueError("the varlen kernel needs CUDA, fp16/bf16, no dropout and batch 1")
    many = len(segments.lengths) >= MIN_SEGMENTS
    if kernel == "varlen" or (kernel == "auto" and many and varlen_applies(query, dropout)):
        return attend_segments_varlen(query, key, value, segments, scale=scale)
    # split(), not one slice per segment: a slice's backward writes a zero-filled gradient of
    # the whole row, which made the backward quadratic in the number of segments.
    queries = query.split(segments.lengths, dim=2)  # each [B, H, S, D]
    keys = key.split(segments.lengths, dim=2)
    values = value.split(segments.lengths, dim=2)
    outputs = []
    for k, (length, parent) in enumerate(zip(segments.lengths, segments.parents, strict=True)):
        if parent < 0:
            out = F.scaled_dot_product_attention(
                queries[k], keys[k], values[k], dropout_p=dropout, is_causal=True, scale=scale
            )
        else:
            out = F.scaled_dot_product_attention(
                queries[k],
                torch.cat([keys[parent], keys[k]], dim=2),
                torch.cat([values[parent], values[k]], dim=2),
                attn_mask=_suffix_mask(segments, length, segments.lengths[parent], query),
                dropout_p=dropout,
                scale=scale,
            )  # [B, H, S, D]
        outputs.append(out)
    return torch.cat(outputs, dim=2)


def segment_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    segments: Segments | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """The `AttentionInterface` function: returns `(output [1, N, H, D], None)`."""
    if segments is None:
        raise ValueError(
            f"attention {ATTENTION_NAME!r} needs the `segments=` keyword on the model's forward"
            " (use learner.trainer.segment_forward.forward_loss_tokens)"
        )
    if attention_mask is not None:
        raise ValueError(
            f"attention {ATTENTION_NAME!r} got a dense attention mask; transformers should not"
            " build one for it (is the name registered in AttentionMaskInterface?)"
        )
    # Features some models pass and this function does not implement: refuse rather than
    # silently compute something else (Gemma 2's logit softcap, gpt-oss's attention sinks).
    passed = {"sliding_window": sliding_window, **{name: kwargs.get(name) for name in UNSUPPORTED}}
    for name, setting in passed.items():
        if setting is not None:
            raise ValueError(f"attention {ATTENTION_NAME!r} does not support {name}")
    num_groups = getattr(module, "num_key_value_groups", 1)
    out = attend_segments(
        query,
        _repeat_kv(key, num_groups),
        _repeat_kv(value, num_groups),
        segments,
        scale=scaling,
        dropout=dropout,
    )  # [1, H, N, D]
    return out.transpose(1, 2).contiguous(), None


def register_segment_attention() -> str:
    """Register `segment_attention` with transformers (idempotent); returns its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, segment_attention)
    return ATTENTION_NAME


def use_segment_attention(model: torch.nn.Module) -> torch.nn.Module:
    """Switch a HF causal LM (before or after `fully_shard`) to segment attention; every
    forward must then pass `segments=`. Returns the model."""
    model.set_attn_implementation(register_segment_attention())
    return model
