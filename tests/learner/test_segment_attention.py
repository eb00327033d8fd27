"""Segment attention against a naive reference: an explicit dense mask and a softmax, on small
random tensors, outputs and gradients; and that transformers builds no dense mask for it."""

import math

import pytest
import torch

from learner.trainer.segment_attention import (
    attend_segments,
    segment_attention,
    use_segment_attention,
)
from learner.trainer.segments import Segments
from tests.learner.builders import tiny_qwen2

# Every kind of segment, several of length 1: a plain token, a 4-token prefix with suffixes
# of 1 and 3, a plain 5, a 1-token prefix with a 2-token suffix, a plain 1.
SEGMENTS = Segments(
    starts=(0, 1, 5, 6, 9, 14, 15, 17),
    lengths=(1, 4, 1, 3, 5, 1, 2, 1),
    parents=(-1, -1, 1, 1, -1, -1, 5, -1),
)


def _allowed(segments: Segments) -> torch.Tensor:
    """`[N, N]` bool: query i may attend key j."""
    n = segments.num_tokens
    allowed = torch.zeros(n, n, dtype=torch.bool)
    for start, length, parent in zip(
        segments.starts, segments.lengths, segments.parents, strict=True
    ):
        rows = slice(start, start + length)
        allowed[rows, rows] = torch.ones(length, length, dtype=torch.bool).tril()
        if parent >= 0:
            p_start, p_len = segments.starts[parent], segments.lengths[parent]
            allowed[rows, p_start : p_start + p_len] = True
    return allowed


def _naive(query, key, value, segments, scale):
    scores = query @ key.transpose(-1, -2) * scale  # [B, H, N, N]
    scores = scores.masked_fill(~_allowed(segments), float("-inf"))
    return scores.softmax(dim=-1) @ value


def _qkv(*, heads: int, kv_heads: int, n: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    shapes = [(1, heads, n, 8), (1, kv_heads, n, 8), (1, kv_heads, n, 8)]
    return [torch.randn(shape, generator=gen, requires_grad=True) for shape in shapes]


def _max_relative(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got - expected).abs().max() / expected.abs().max()).item()


def test_allowed_mask_by_hand():
    """Row 7 (the middle of the 3-token suffix at 6..8) sees the prefix 1..4 and 6, 7."""
    allowed = _allowed(SEGMENTS)
    assert allowed[7].nonzero().flatten().tolist() == [1, 2, 3, 4, 6, 7]
    assert allowed[0].nonzero().flatten().tolist() == [0]
    assert allowed[15].nonzero().flatten().tolist() == [14, 15]  # suffix of the 1-token prefix
    assert allowed[12].nonzero().flatten().tolist() == [9, 10, 11, 12]  # plain


def test_outputs_and_gradients_equal_the_dense_reference():
    query, key, value = _qkv(heads=2, kv_heads=2, n=SEGMENTS.num_tokens, seed=0)
    scale = 1 / math.sqrt(8)
    got = attend_segments(query, key, value, SEGMENTS, scale=scale)
    expected = _naive(query, key, value, SEGMENTS, scale)
    assert _max_relative(got, expected) < 1e-5
    upstream = torch.randn_like(got)
    got_grads = torch.autograd.grad(got, (query, key, value), upstream)
    expected_grads = torch.autograd.grad(expected, (query, key, value), upstream)
    for g, e in zip(got_grads, expected_grads, strict=True):
        assert _max_relative(g, e) < 1e-5


class _GroupedQueryAttention(torch.nn.Module):
    """The attributes segment_attention reads from a transformers attention module."""

    num_key_value_groups = 2


def test_grouped_query_attention_through_the_interface_function():
    """4 query heads share 2 key/value heads; output comes back as `[1, N, H, D]`."""
    query, key, value = _qkv(heads=4, kv_heads=2, n=SEGMENTS.num_tokens, seed=1)
    out, weights = segment_attention(
        _GroupedQueryAttention(), query, key, value, None, scaling=0.5, segments=SEGMENTS
    )
    assert weights is None and out.shape == (1, SEGMENTS.num_tokens, 4, 8)
    expanded = [t.repeat_interleave(2, dim=1) for t in (key, value)]
    expected = _naive(query, *expanded, SEGMENTS, 0.5).transpose(1, 2)
    assert _max_relative(out, expected) < 1e-5


def test_a_dense_mask_and_unsupported_features_are_refused():
    query, key, value = _qkv(heads=2, kv_heads=2, n=SEGMENTS.num_tokens, seed=2)
    module = torch.nn.Module()
    mask = torch.ones(1, 1, SEGMENTS.num_tokens, SEGMENTS.num_tokens, dtype=torch.bool)
    with pytest.raises(ValueError, match="dense attention mask"):
        segment_attention(module, query, key, value, mask, segments=SEGMENTS)
    with pytest.raises(ValueError, match="does not support sliding_window"):
        segment_attention(module, query, key, value, None, sliding_window=4, segments=SEGMENTS)
    with pytest.raises(ValueError, match="does not support softcap"):
        segment_attention(module, query, key, value, None, softcap=30.0, segments=SEGMENTS)


def test_transformers_builds_no_dense_mask_for_segment_attention():
    """Its mask factory returns None for an implementation it has no mask function for,
    even for packed position ids (which make it build a block-diagonal N x N mask for sdpa)."""
    from transformers.masking_utils import create_causal_mask

    model = use_segment_attention(tiny_qwen2())
    embeds = torch.zeros(1, 6, 64)
    position_ids = torch.tensor([[0, 1, 2, 3, 3, 4]])  # a prefix and two suffixes
    kwargs = dict(inputs_embeds=embeds, attention_mask=None, past_key_values=None)
    assert create_causal_mask(config=model.config, position_ids=position_ids, **kwargs) is None
    sdpa_config = tiny_qwen2().config
    dense = create_causal_mask(config=sdpa_config, position_ids=position_ids, **kwargs)
    assert dense is not None and dense.shape[-2:] == (6, 6)  # what the current path builds


def test_the_varlen_plan_by_hand():
    """Each segment's keys for the one-call GPU kernel: a suffix gets its prefix's rows, then
    its own; plain segments their own (learner/trainer/segment_varlen.py)."""
    from learner.trainer.segment_varlen import varlen_plan

    rows, cu_q, cu_k = varlen_plan(SEGMENTS)
    assert cu_q.tolist() == [0, 1, 5, 6, 9, 14, 15, 17, 18]
    # keys: [0] [1..4] [1..4, 5] [1..4, 6..8] [9..13] [14] [14, 15, 16] [17]
    assert cu_k.tolist() == [0, 1, 5, 10, 17, 22, 23, 26, 27]
    assert rows.tolist()[:17] == [0, 1, 2, 3, 4, 1, 2, 3, 4, 5, 1, 2, 3, 4, 6, 7, 8]
    assert rows.tolist()[17:] == [9, 10, 11, 12, 13, 14, 14, 15, 16, 17]
    plain = Segments(starts=(0, 3), lengths=(3, 2), parents=(-1, -1))
    rows, cu_q, cu_k = varlen_plan(plain)
    assert rows is None and cu_q.tolist() == cu_k.tolist() == [0, 3, 5]


def test_the_varlen_kernel_is_refused_where_it_cannot_run():
    query, key, value = _qkv(heads=2, kv_heads=2, n=SEGMENTS.num_tokens, seed=0)
    with pytest.raises(ValueError, match="varlen kernel needs CUDA"):
        attend_segments(query, key, value, SEGMENTS, kernel="varlen")
    with pytest.raises(ValueError, match="kernel must be"):
        attend_segments(query, key, value, SEGMENTS, kernel="flash")
