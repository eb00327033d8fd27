"""Logprobs (and entropy) of a `SegmentBatch`'s loss tokens, and the loss inputs built on them.

    use_segment_attention(model)                                   # once per model
    logprobs, entropy = forward_loss_tokens(model, batch, entropy="grad")     # [L], [L]
    inputs = loss_inputs(batch, logprobs, entropy=entropy, proximal_logprobs=..., device=...)
    terms = policy_loss(inputs, spec)                              # unchanged
    weights = token_weights(inputs.loss_mask, inputs.seq_ids, inputs.num_seqs, ...)

The model runs once over the packed row with segment attention; the language-model head runs
only on the `U` hidden rows that predict a loss token (transformers' `logits_to_keep` with an
index tensor), never on all N rows: with a 150K vocabulary the logits are the largest
activation. Going through the model's own forward (not `model.model` + `model.lm_head`)
keeps FSDP2's root hooks in charge of the embedding, final norm and head parameters. Under
`torch.no_grad()` the same call recomputes proximal or reference logprobs with the same
saving. Logprobs and entropy are computed in float32.
"""

from __future__ import annotations

import torch

from learner.trainer.losses import LossInputs, entropy_from_logits
from learner.trainer.segments import SegmentBatch

ENTROPY_MODES = ("none", "detached", "grad")


def forward_loss_tokens(
    model: torch.nn.Module,
    batch: SegmentBatch,
    *,
    entropy: str = "none",
    device: torch.device | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`(logprobs [L], entropy [L] or None)` of the batch's loss tokens under `model` (which
    must use segment attention). `entropy`: "none", "detached" or "grad"."""
    if entropy not in ENTROPY_MODES:
        raise ValueError(f"unknown entropy mode {entropy!r}; one of {ENTROPY_MODES}")
    device = device or batch.input_ids.device
    logits = model(
        input_ids=batch.input_ids.to(device),
        position_ids=batch.position_ids.to(device),
        segments=batch.segments,
        logits_to_keep=batch.hidden_rows.to(device),
        use_cache=False,
    ).logits[0]  # [U, V]
    logits = logits.to(torch.float32)
    token_row = batch.token_row.to(device)
    log_normalizer = torch.logsumexp(logits, dim=-1)  # [U]
    picked = logits[token_row, batch.targets.to(device)]  # [L]
    logprobs = picked - log_normalizer[token_row]  # [L]
    if entropy == "none":
        return logprobs, None
    source = logits if entropy == "grad" else logits.detach()
    return logprobs, entropy_from_logits(source)[token_row]  # [L]


def loss_inputs(
    batch: SegmentBatch,
    logprobs: torch.Tensor,
    *,
    entropy: torch.Tensor | None = None,
    proximal_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    device: torch.device | None = None,
) -> LossInputs:
    """`LossInputs` over the loss tokens only (`[L]`, loss mask all ones, `seq_ids` indexing
    `batch.sample_indices`), for `policy_loss` and `token_weights` as they are."""
    device = device or logprobs.device
    return LossInputs(
        logprobs=logprobs,
        behaviour_logprobs=batch.behaviour_logprobs.to(device),
        advantages=batch.advantages.to(device),
        loss_mask=torch.ones(batch.num_loss_tokens, dtype=torch.bool, device=device),
        seq_ids=batch.seq_ids.to(device),
        num_seqs=batch.num_seqs,
        proximal_logprobs=proximal_logprobs,
        ref_logprobs=ref_logprobs,
        entropy=entropy,
    )
