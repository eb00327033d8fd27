"""Loss reductions: how per-token losses of a batch become one scalar.

Tokens are flat (`[N]`, padding-free packing) and `seq_ids[i]` says which sequence token `i`
belongs to. Only tokens with `loss_mask = 1` count.

- `token_mean`: sum of token losses / number of loss tokens in the batch (DAPO). Long
  answers weigh more, but every token weighs the same.
- `seq_mean_token_sum`: per sequence the sum of its token losses, then the mean over
  sequences (Dr.GRPO: no per-sequence length normalisation; the constant divisor only scales
  the learning rate).
- `seq_mean_token_mean`: per sequence the mean of its token losses, then the mean over
  sequences (the original GRPO).

A reduction is expressed as a weight per token (`token_weights`), so a batch split into
micro-batches and ranks reduces to exactly the same number as the whole batch: each part
computes `sum(weight * loss)` with the *global* token and sequence counts and the parts add
up. Sequences without any loss token (e.g. overlong-filtered ones) are not counted in the
sequence mean: they carry no signal and must not dilute the others.
"""

from __future__ import annotations

import torch

REDUCTIONS = ("token_mean", "seq_mean_token_sum", "seq_mean_token_mean")


def tokens_per_sequence(
    loss_mask: torch.Tensor, seq_ids: torch.Tensor, num_seqs: int
) -> torch.Tensor:
    """Number of loss tokens in each sequence, `[num_seqs]` float."""
    counts = torch.zeros(num_seqs, dtype=torch.float32, device=loss_mask.device)
    return counts.index_add_(0, seq_ids, loss_mask.to(torch.float32))


def batch_normalizers(
    loss_mask: torch.Tensor, seq_ids: torch.Tensor, num_seqs: int
) -> tuple[int, int]:
    """(number of loss tokens, number of sequences with at least one loss token)."""
    per_seq = tokens_per_sequence(loss_mask, seq_ids, num_seqs)
    return int(per_seq.sum().item()), int((per_seq > 0).sum().item())


def token_weights(
    loss_mask: torch.Tensor,
    seq_ids: torch.Tensor,
    num_seqs: int,
    reduction: str,
    *,
    total_tokens: int,
    total_seqs: int,
) -> torch.Tensor:
    """Weight of each token's loss in the batch loss, `[N]`; zero off the loss mask.

    `total_tokens` / `total_seqs` are the counts over the whole batch (all micro-batches and
    ranks), from `batch_normalizers` on the whole batch. Every sequence must lie wholly in
    this part (sequences are never split across micro-batches).
    """
    mask = loss_mask.to(torch.float32)
    if reduction == "token_mean":
        return mask / max(total_tokens, 1)
    if reduction == "seq_mean_token_sum":
        return mask / max(total_seqs, 1)
    if reduction == "seq_mean_token_mean":
        per_seq = tokens_per_sequence(loss_mask, seq_ids, num_seqs).clamp(min=1.0)
        return mask / (per_seq[seq_ids] * max(total_seqs, 1))
    raise ValueError(f"unknown loss reduction {reduction!r}; choose one of {REDUCTIONS}")


def reduce_loss(
    per_token_loss: torch.Tensor,
    loss_mask: torch.Tensor,
    seq_ids: torch.Tensor,
    num_seqs: int,
    reduction: str,
) -> torch.Tensor:
    """Reduce the per-token losses of one whole batch to a scalar."""
    total_tokens, total_seqs = batch_normalizers(loss_mask, seq_ids, num_seqs)
    weights = token_weights(
        loss_mask, seq_ids, num_seqs, reduction, total_tokens=total_tokens, total_seqs=total_seqs
    )
    return (per_token_loss * weights).sum()
