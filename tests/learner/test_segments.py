"""The packed segment layout of one micro-batch, by hand."""

import numpy as np
import pytest
import torch

from learner.trainer.prefix_plan import Piece
from learner.trainer.sample import Sample
from learner.trainer.segments import Segments, collate_segments


def _sample(*, token_ids, loss_mask, logprobs=None, advantage=0.0, versions=None) -> Sample:
    n = len(token_ids)
    return Sample(
        token_ids=np.array(token_ids, dtype=np.int32),
        loss_mask=np.array(loss_mask, dtype=np.uint8),
        behaviour_logprobs=np.array(logprobs or [0.0] * n, dtype=np.float32),
        versions=np.array(versions or [0] * n, dtype=np.int32),
        advantage=advantage,
        trajectory_id="t",
        group_id="g",
        env_class="calculator",
    )


def test_collate_by_hand():
    """a = [5 6 7 | 8 9] with loss on 7 (a shared first turn), 8, 9; b = [5 6 7 | 4] with
    loss on 4; c = [3 2] plain with loss on 2.

        row:       5 6 7 | 8 9 | 4 | 3 2
        position:  0 1 2 | 3 4 | 3 | 0 1
        segment:   prefix  a     b   c (plain)

    Token t is predicted by the row of token t-1: a's 7, 8, 9 by rows 1, 2, 3; b's 4 by row
    2 (the prefix's last row, shared with a's 8); c's 2 by row 6.
    """
    a = _sample(
        token_ids=[5, 6, 7, 8, 9],
        loss_mask=[0, 0, 1, 1, 1],
        logprobs=[0.0, 0.0, -0.1, -0.2, -0.3],
        advantage=1.5,
        versions=[-1, -1, 2, 3, 3],
    )
    b = _sample(token_ids=[5, 6, 7, 4], loss_mask=[0, 0, 0, 1], logprobs=[0, 0, 0, -0.4])
    c = _sample(token_ids=[3, 2], loss_mask=[0, 1], logprobs=[0, -0.5], advantage=-1.0)
    batch = collate_segments(
        [a, b, c],
        [Piece(prefix_len=3, members=(0, 1), num_tokens=6), Piece(0, (2,), 2)],
    )
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 9, 4, 3, 2]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4, 3, 0, 1]]
    assert batch.segments == Segments(
        starts=(0, 3, 5, 6), lengths=(3, 2, 1, 2), parents=(-1, 0, 0, -1)
    )
    assert batch.hidden_rows.tolist() == [1, 2, 3, 6]
    assert batch.token_row.tolist() == [0, 1, 2, 1, 3]  # rows 1, 2, 3, 2, 6
    assert batch.targets.tolist() == [7, 8, 9, 4, 2]
    assert batch.token_index.tolist() == [2, 3, 4, 3, 1]
    assert batch.seq_ids.tolist() == [0, 0, 0, 1, 2]
    assert batch.behaviour_logprobs.tolist() == pytest.approx([-0.1, -0.2, -0.3, -0.4, -0.5])
    assert batch.advantages.tolist() == [1.5, 1.5, 1.5, 0.0, -1.0]
    assert batch.versions.tolist() == [2, 3, 3, 0, 0]
    assert batch.sample_indices == (0, 1, 2) and batch.num_seqs == 3
    assert batch.num_tokens == 8 and batch.num_unshared_tokens == 11
    assert batch.num_loss_tokens == 5


def test_empty_micro_batch_is_one_token_and_no_loss_token():
    batch = collate_segments([], [])
    assert batch.num_tokens == 1 and batch.num_loss_tokens == 0 and batch.num_seqs == 0
    assert batch.segments == Segments(starts=(0,), lengths=(1,), parents=(-1,))
    assert batch.hidden_rows.dtype == torch.int64 and batch.hidden_rows.numel() == 0


def test_bad_pieces_are_value_errors():
    a = _sample(token_ids=[5, 6, 7, 8], loss_mask=[0, 1, 1, 1])
    other = _sample(token_ids=[5, 9, 7, 8], loss_mask=[0, 1, 1, 1])
    with pytest.raises(ValueError, match="does not continue the 3-token shared prefix"):
        collate_segments([a, other], [Piece(3, (0, 1), 6)])
    with pytest.raises(ValueError, match="does not continue"):
        collate_segments([a, a], [Piece(4, (0, 1), 4)])  # no suffix left
    first_is_loss = _sample(token_ids=[5, 6], loss_mask=[1, 1])
    with pytest.raises(ValueError, match="first token cannot be a loss token"):
        collate_segments([first_is_loss], [Piece(0, (0,), 2)])
