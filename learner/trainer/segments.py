"""The tensors of one shared-prefix micro-batch: a packed row of segments and its loss tokens
(pure: numpy/torch tensors, no model).

    pieces (learner/trainer/prefix_plan.py) --collate_segments--> SegmentBatch

The row `[1, N]` is a sequence of segments laid end to end. A shared piece contributes its
prefix once, then each member's suffix as its own segment; a plain piece contributes its
whole sample as one segment:

    row:        | prefix (P) | suffix a | suffix b | plain c |
    positions:   0 .. P-1     P ..       P ..       0 ..
    attends to:  itself,      prefix +   prefix +   itself,
                 causally     itself     itself     causally

Position ids are each token's index in its own sample, so RoPE sees exactly what it would
see for the sample alone. `Segments` is the host-side description the attention function
reads (`learner/trainer/segment_attention.py`); it replaces the dense N x N mask.

Only the positions the loss uses are carried forward. Loss token t of a sample is predicted
by the hidden state of its token t-1, which lives in the prefix (for t-1 < P: shared by all
members, e.g. the first suffix token of every member is predicted by the prefix's last row)
or in the member's suffix. `hidden_rows [U]` lists those rows once each; `token_row [L]`
maps each loss token to one of them. Per-loss-token tensors (`targets`, `behaviour_logprobs`,
`advantages`, `versions`, `seq_ids`) are aligned `[L]`, in sample order then token order, so
`policy_loss` and `token_weights` run on them unchanged with a loss mask of all ones
(`learner/trainer/segment_forward.py` `loss_inputs`). `seq_ids` number this micro-batch's sequences:
one per sample (in `sample_indices` order), or one per step of a step-wise sample.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from learner.trainer.prefix_plan import Piece
from learner.trainer.sample import Sample


@dataclass(frozen=True)
class Segments:
    """Consecutive segments tiling the row `[0, N)`; host ints, so reading them costs no
    device sync. `parents[k]` is the segment whose keys/values segment k also sees in full
    (a shared prefix), or -1."""

    starts: tuple[int, ...]
    lengths: tuple[int, ...]
    parents: tuple[int, ...]
    # What attention builds for these segments (masks, kernel plans), kept for the next layer.
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        assert len(self.starts) == len(self.lengths) == len(self.parents) > 0
        assert self.starts[0] == 0 and min(self.lengths) >= 1
        for k in range(1, len(self.starts)):
            assert self.starts[k] == self.starts[k - 1] + self.lengths[k - 1]
            assert self.parents[k] < k and (
                self.parents[k] < 0 or self.parents[self.parents[k]] < 0
            )

    @property
    def num_tokens(self) -> int:
        return self.starts[-1] + self.lengths[-1]

    def cached(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """`build()` the first time `key` is asked for; the same object for every later layer
        (whose backward keeps it alive anyway)."""
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]


@dataclass
class SegmentBatch:
    """One micro-batch: N tokens as trained, L loss tokens, S samples."""

    input_ids: torch.Tensor  # [1, N] int64
    position_ids: torch.Tensor  # [1, N] int64, the token's index in its sample
    segments: Segments
    hidden_rows: torch.Tensor  # [U] int64, rows of the row whose hidden state is needed
    token_row: torch.Tensor  # [L] int64, index into hidden_rows
    targets: torch.Tensor  # [L] int64, the loss token's id
    token_index: torch.Tensor  # [L] int64, the loss token's index in its sample
    seq_ids: torch.Tensor  # [L] int64, the loss token's sequence (< num_seqs)
    behaviour_logprobs: torch.Tensor  # [L] float32
    advantages: torch.Tensor  # [L] float32
    versions: torch.Tensor  # [L] int64
    sample_indices: tuple[int, ...]  # batch positions of the S samples
    num_unshared_tokens: int  # what the plain packed layout would train
    num_seqs: int = 0  # sequences `seq_ids` index: S, or more when samples are step-wise

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[1]

    @property
    def num_loss_tokens(self) -> int:
        return self.targets.shape[0]


def _empty_batch() -> SegmentBatch:
    """One dummy token and no loss token: a rank without data still joins the collectives."""
    zeros = torch.zeros(0, dtype=torch.int64)
    return SegmentBatch(
        input_ids=torch.zeros((1, 1), dtype=torch.int64),
        position_ids=torch.zeros((1, 1), dtype=torch.int64),
        segments=Segments(starts=(0,), lengths=(1,), parents=(-1,)),
        hidden_rows=zeros,
        token_row=zeros,
        targets=zeros,
        token_index=zeros,
        seq_ids=zeros,
        behaviour_logprobs=torch.zeros(0, dtype=torch.float32),
        advantages=torch.zeros(0, dtype=torch.float32),
        versions=zeros,
        sample_indices=(),
        num_unshared_tokens=0,
    )


def collate_segments(samples: Sequence[Sample], pieces: Sequence[Piece]) -> SegmentBatch:
    """Lay out `pieces` (indices into `samples`) as one micro-batch; no pieces gives the
    1-token dummy."""
    if not pieces:
        return _empty_batch()
    starts: list[int] = []
    lengths: list[int] = []
    parents: list[int] = []
    row_ids: list[np.ndarray] = []
    row_positions: list[np.ndarray] = []
    sample_indices: list[int] = []
    num_seqs = 0  # sequences so far: one per sample, or one per step of a step-wise one
    # Per sample, aligned on its loss tokens: the row whose state predicts the token, etc.
    per_token: dict[str, list[np.ndarray]] = {
        name: [] for name in ("predictor", "target", "index", "seq", "behaviour", "adv", "version")
    }

    def add_segment(tokens: np.ndarray, first_position: int, parent: int) -> int:
        starts.append(starts[-1] + lengths[-1] if starts else 0)
        lengths.append(len(tokens))
        parents.append(parent)
        row_ids.append(tokens)
        row_positions.append(np.arange(first_position, first_position + len(tokens)))
        return starts[-1]

    for piece in pieces:
        p = piece.prefix_len
        parent, prefix_start = -1, 0
        prefix = samples[piece.members[0]].token_ids[:p]
        if p > 0:
            prefix_start = add_segment(prefix, 0, -1)
            parent = len(starts) - 1
        for i in piece.members:
            sample = samples[i]
            if sample.num_tokens <= p or not np.array_equal(sample.token_ids[:p], prefix):
                raise ValueError(f"sample {i} does not continue the {p}-token shared prefix")
            if sample.loss_mask[0]:
                raise ValueError(f"sample {i}: its first token cannot be a loss token")
            start = add_segment(sample.token_ids[p:], p, parent)
            rows = np.concatenate(
                [prefix_start + np.arange(p), start + np.arange(sample.num_tokens - p)]
            )  # [T_i]: the row of each of the sample's tokens
            positions = np.flatnonzero(sample.loss_mask)  # [L_i], all >= 1
            per_token["predictor"].append(rows[positions - 1])
            per_token["target"].append(sample.token_ids[positions])
            per_token["index"].append(positions)
            per_token["seq"].append(num_seqs + sample.seq_index(positions))
            num_seqs += sample.num_seqs
            per_token["behaviour"].append(sample.behaviour_logprobs[positions])
            per_token["adv"].append(np.full(len(positions), sample.advantage))
            per_token["version"].append(sample.versions[positions])
            sample_indices.append(i)

    def tensor(arrays: list[np.ndarray], dtype) -> torch.Tensor:
        return torch.from_numpy(np.concatenate(arrays).astype(dtype))

    predictors = np.concatenate(per_token["predictor"])  # [L]
    hidden_rows, token_row = np.unique(predictors, return_inverse=True)  # [U], [L]
    return SegmentBatch(
        input_ids=tensor(row_ids, np.int64).unsqueeze(0),
        position_ids=tensor(row_positions, np.int64).unsqueeze(0),
        segments=Segments(starts=tuple(starts), lengths=tuple(lengths), parents=tuple(parents)),
        hidden_rows=tensor([hidden_rows], np.int64),
        token_row=tensor([token_row.reshape(-1)], np.int64),
        targets=tensor(per_token["target"], np.int64),
        token_index=tensor(per_token["index"], np.int64),
        seq_ids=tensor(per_token["seq"], np.int64),
        behaviour_logprobs=tensor(per_token["behaviour"], np.float32),
        advantages=tensor(per_token["adv"], np.float32),
        versions=tensor(per_token["version"], np.int64),
        sample_indices=tuple(sample_indices),
        num_unshared_tokens=sum(samples[i].num_tokens for i in sample_indices),
        num_seqs=num_seqs,
    )
