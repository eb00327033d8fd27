"""Acceptance of shared-prefix training on one process: per-token logprobs, the loss
(`policy_loss` + `token_weights`, with an entropy bonus so its gradient is checked too) and
every parameter's gradient equal one plain forward per sample (fp32, max relative error 1e-5;
see `relative_error`). The 2-rank FSDP2 case is in test_segment_distributed.py."""

import pytest
import torch

from learner.trainer.prefix_plan import plan_pieces
from learner.trainer.segment_attention import use_segment_attention
from learner.trainer.segment_forward import forward_loss_tokens, loss_inputs
from learner.trainer.segments import collate_segments
from tests.learner.builders import tiny_qwen2
from tests.learner.segment_builders import group, max_relative_errors, reference, shared

TOLERANCE = 1e-5
REDUCTIONS = ("token_mean", "seq_mean_token_mean")


def _models(*, tied: bool = False) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(plain sdpa model, the same weights with segment attention)."""
    plain = tiny_qwen2(seed=0, tie_word_embeddings=tied)
    segmented = tiny_qwen2(seed=0, tie_word_embeddings=tied)
    segmented.load_state_dict(plain.state_dict())
    return plain, use_segment_attention(segmented)


def _assert_exact(samples, *, token_budget, reduction, tied=False, **plan):
    plain, segmented = _models(tied=tied)
    expected = reference(plain, samples, reduction=reduction)
    got, micro_batches = shared(
        segmented, samples, token_budget=token_budget, reduction=reduction, **plan
    )
    errors = max_relative_errors(got, expected)
    worst = max(errors, key=errors.get)
    assert errors[worst] < TOLERANCE, (worst, errors[worst])
    return micro_batches


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_single_turn_groups(reduction):
    samples = [
        *group(group_id="a", prefix_len=24, suffix_lens=[9, 1, 17, 4], seed=1),
        *group(group_id="b", prefix_len=30, suffix_lens=[12, 6, 20], seed=2),
    ]
    (pieces,) = _assert_exact(samples, token_budget=512, reduction=reduction, tied=True)
    assert sorted(p.prefix_len for p in pieces) == [24, 30]  # both shared, one micro-batch


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_multi_turn_groups_share_more_than_the_prompt(reduction):
    """Group a shares a 20-token prompt and a 12-token first turn with loss on it (the same
    rows predict those tokens for every member); group b diverges at token 5 of its prompt,
    under `min_shared_tokens`: it is trained as plain sequences."""
    samples = [
        *group(group_id="a", prefix_len=32, prompt_len=20, suffix_lens=[10, 15, 3], seed=3),
        *group(group_id="b", prefix_len=24, suffix_lens=[8, 11], seed=4, diverge_at=5),
    ]
    (pieces,) = _assert_exact(samples, token_budget=512, reduction=reduction)
    assert sorted((p.prefix_len, p.members) for p in pieces) == [
        (0, (3,)),
        (0, (4,)),
        (32, (0, 1, 2)),
    ]


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_group_split_across_micro_batches(reduction):
    """24 + 20 + 18 + 16 + 14 = 92 tokens as trained do not fit 60: the suffixes are packed
    first-fit decreasing into room for 36 next to the prefix: {20, 16}, {18, 14}."""
    samples = group(group_id="a", prefix_len=24, suffix_lens=[20, 18, 16, 14], seed=5)
    micro_batches = _assert_exact(samples, token_budget=60, reduction=reduction)
    assert [[(p.prefix_len, p.members) for p in mb] for mb in micro_batches] == [
        [(24, (0, 2))],
        [(24, (1, 3))],
    ]


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_micro_batch_mixes_shared_groups_and_plain_sequences(reduction):
    samples = [
        *group(group_id="a", prefix_len=20, suffix_lens=[5, 9], seed=6),
        *group(group_id="solo", prefix_len=10, suffix_lens=[14], seed=7),
        *group(group_id="b", prefix_len=18, suffix_lens=[7, 2, 11], seed=8),
        *group(group_id="short", prefix_len=6, suffix_lens=[9, 3], seed=9),  # 6 < 16: plain
    ]
    (pieces,) = _assert_exact(samples, token_budget=1024, reduction=reduction)
    assert sorted(p.prefix_len for p in pieces) == [0, 0, 0, 18, 20]


def test_recomputed_logprobs_without_grad_equal_the_training_forward():
    """Proximal/reference logprobs come from the same call under no_grad."""
    _, segmented = _models()
    samples = group(group_id="a", prefix_len=24, suffix_lens=[9, 5, 12], seed=10)
    ((pieces,),) = plan_pieces(samples, num_ranks=1, token_budget=512)
    batch = collate_segments(samples, pieces)
    with_grad, _ = forward_loss_tokens(segmented, batch)
    with torch.no_grad():
        recomputed, entropy = forward_loss_tokens(segmented, batch, entropy="detached")
    assert not recomputed.requires_grad and entropy.shape == recomputed.shape
    torch.testing.assert_close(recomputed, with_grad.detach(), rtol=0, atol=0)
    inputs = loss_inputs(batch, with_grad, proximal_logprobs=recomputed)
    assert inputs.loss_mask.all() and inputs.num_seqs == 3
    assert inputs.logprobs.shape == inputs.advantages.shape == inputs.seq_ids.shape


def test_empty_micro_batch_has_no_loss_token_but_a_graph():
    """A rank without data runs the 1-token dummy: no loss tokens, and backward still
    reaches every parameter (FSDP's reduce-scatter needs every rank to run it)."""
    _, segmented = _models()
    batch = collate_segments([], [])
    logprobs, entropy = forward_loss_tokens(segmented, batch, entropy="grad")
    assert logprobs.shape == entropy.shape == (0,)
    (logprobs.sum() + entropy.sum()).backward()
    grads = [p.grad for p in segmented.parameters()]
    assert all(g is not None and not g.any() for g in grads)


def test_forward_without_segments_is_refused():
    _, segmented = _models()
    with pytest.raises(ValueError, match="needs the `segments=` keyword"):
        segmented(input_ids=torch.zeros((1, 4), dtype=torch.int64))
