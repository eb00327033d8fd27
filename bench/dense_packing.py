"""The learner's micro-batch path before segment attention, kept as a benchmark baseline:
whole sequences packed into one row `[1, N]` with position ids restarting per sequence, so
transformers builds a dense block-diagonal N x N mask (quadratic in the token budget), and
every sample of a group forwards its prompt again. bench/prefix_sharing.py and
bench/learner.py compare Tether's path against it on the same work."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from learner.trainer.sample import Sample


def plan_micro_batches(
    lengths: list[int], *, num_ranks: int, token_budget: int
) -> list[list[list[int]]]:
    """`plan[rank][micro_batch]` = indices into `lengths`. Same number of micro-batches on
    every rank (trailing empty lists pad the short ones)."""
    if num_ranks < 1 or token_budget < 1:
        raise ValueError(
            f"need num_ranks >= 1 and token_budget >= 1, got {num_ranks}, {token_budget}"
        )
    longest_first = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    rank_tokens = [0] * num_ranks
    rank_samples: list[list[int]] = [[] for _ in range(num_ranks)]
    for i in longest_first:
        rank = min(range(num_ranks), key=lambda r: (rank_tokens[r], r))
        rank_tokens[rank] += lengths[i]
        rank_samples[rank].append(i)
    plan = []
    for indices in rank_samples:
        bins: list[list[int]] = []
        bin_tokens: list[int] = []
        for i in indices:  # already longest first
            for b, used in enumerate(bin_tokens):
                if used + lengths[i] <= token_budget:
                    bins[b].append(i)
                    bin_tokens[b] += lengths[i]
                    break
            else:
                bins.append([i])
                bin_tokens.append(lengths[i])
        plan.append(bins)
    num_micro_batches = max(len(bins) for bins in plan)
    return [bins + [[] for _ in range(num_micro_batches - len(bins))] for bins in plan]


@dataclass
class MicroBatch:
    """Padding-free concatenation of whole sequences (N tokens, S sequences)."""

    input_ids: torch.Tensor  # [1, N] int64
    position_ids: torch.Tensor  # [1, N] int64, restarting at 0 per sequence
    cu_seqlens: torch.Tensor  # [S + 1] int32
    seq_ids: torch.Tensor  # [N] int64
    loss_mask: torch.Tensor  # [N] bool
    behaviour_logprobs: torch.Tensor  # [N] float32
    advantages: torch.Tensor  # [N] float32
    versions: torch.Tensor  # [N] int64
    num_seqs: int

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[1]


def collate(samples: list[Sample]) -> MicroBatch:
    """Concatenate samples into one micro-batch; an empty list gives a 1-token dummy with no
    loss token (a rank without data still joins the collectives)."""
    if not samples:
        return MicroBatch(
            input_ids=torch.zeros((1, 1), dtype=torch.int64),
            position_ids=torch.zeros((1, 1), dtype=torch.int64),
            cu_seqlens=torch.tensor([0, 1], dtype=torch.int32),
            seq_ids=torch.zeros(1, dtype=torch.int64),
            loss_mask=torch.zeros(1, dtype=torch.bool),
            behaviour_logprobs=torch.zeros(1, dtype=torch.float32),
            advantages=torch.zeros(1, dtype=torch.float32),
            versions=torch.full((1,), -1, dtype=torch.int64),
            num_seqs=1,
        )
    lengths = [s.num_tokens for s in samples]
    if min(lengths) < 1:
        raise ValueError("cannot train on an empty trajectory")
    cu_seqlens = np.concatenate([[0], np.cumsum(lengths)])
    positions = np.concatenate([np.arange(n) for n in lengths])
    seq_ids = np.repeat(np.arange(len(samples)), lengths)
    advantages = np.repeat(np.array([s.advantage for s in samples], dtype=np.float32), lengths)

    def cat(name: str, dtype: np.dtype) -> torch.Tensor:
        return torch.from_numpy(np.concatenate([getattr(s, name) for s in samples]).astype(dtype))

    return MicroBatch(
        input_ids=cat("token_ids", np.int64).unsqueeze(0),
        position_ids=torch.from_numpy(positions.astype(np.int64)).unsqueeze(0),
        cu_seqlens=torch.from_numpy(cu_seqlens.astype(np.int32)),
        seq_ids=torch.from_numpy(seq_ids.astype(np.int64)),
        loss_mask=cat("loss_mask", np.bool_),
        behaviour_logprobs=cat("behaviour_logprobs", np.float32),
        advantages=torch.from_numpy(advantages),
        versions=cat("versions", np.int64),
        num_seqs=len(samples),
    )
