import pytest
import torch

from learner.trainer.reductions import batch_normalizers, reduce_loss, token_weights

# Three sequences: seq 0 has loss tokens 1, 2, 3; seq 1 has one loss token (6) and a masked
# 4; seq 2 has no loss token at all and must not count.
LOSS = torch.tensor([1.0, 2.0, 3.0, 4.0, 6.0, 100.0])
MASK = torch.tensor([1, 1, 1, 0, 1, 0])
SEQ_IDS = torch.tensor([0, 0, 0, 1, 1, 2])


@pytest.mark.parametrize(
    ("reduction", "expected"),
    [
        ("token_mean", (1 + 2 + 3 + 6) / 4),  # 3.0
        ("seq_mean_token_sum", ((1 + 2 + 3) + 6) / 2),  # 6.0
        ("seq_mean_token_mean", ((1 + 2 + 3) / 3 + 6 / 1) / 2),  # 4.0
    ],
)
def test_reductions_by_hand(reduction, expected):
    assert reduce_loss(LOSS, MASK, SEQ_IDS, 3, reduction).item() == pytest.approx(expected)


def test_normalizers_skip_sequences_without_loss_tokens():
    assert batch_normalizers(MASK, SEQ_IDS, 3) == (4, 2)


@pytest.mark.parametrize("reduction", ["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"])
def test_parts_with_global_normalizers_add_up_to_the_whole(reduction):
    whole = reduce_loss(LOSS, MASK, SEQ_IDS, 3, reduction)
    total_tokens, total_seqs = batch_normalizers(MASK, SEQ_IDS, 3)
    parts = 0.0
    for lo, hi, seq_offset, num_seqs in ((0, 3, 0, 1), (3, 6, 1, 2)):  # split between seqs
        weights = token_weights(
            MASK[lo:hi],
            SEQ_IDS[lo:hi] - seq_offset,
            num_seqs,
            reduction,
            total_tokens=total_tokens,
            total_seqs=total_seqs,
        )
        parts += (LOSS[lo:hi] * weights).sum()
    assert parts.item() == pytest.approx(whole.item())


def test_all_masked_batch_reduces_to_zero_not_nan():
    mask = torch.zeros(3, dtype=torch.int64)
    for reduction in ("token_mean", "seq_mean_token_sum", "seq_mean_token_mean"):
        assert reduce_loss(torch.ones(3), mask, torch.tensor([0, 0, 1]), 2, reduction).item() == 0.0


def test_unknown_reduction_is_a_value_error():
    with pytest.raises(ValueError, match="unknown loss reduction"):
        reduce_loss(LOSS, MASK, SEQ_IDS, 3, "sum")
