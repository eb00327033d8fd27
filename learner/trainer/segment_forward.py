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

With `head_chunk_mb` the head never builds the `[U, V]` logits at all: for the duration of the
call its forward is replaced by learner/trainer/chunked_head.py (the logsumexp and entropy
of each row in chunks, recomputed in backward; each loss token's logit as one dot product),
still inside the model's forward, so FSDP's hooks still gather and free its weight. Only for
the architectures whose causal-LM forward hands the head's output on untouched (no scaling,
no soft-capping: `CHUNKABLE`); others take the plain path.
"""

from __future__ import annotations

import contextlib

import torch

from learner.trainer.chunked_head import chunk_rows, head_terms
from learner.trainer.losses import LossInputs, entropy_from_logits
from learner.trainer.segments import SegmentBatch

ENTROPY_MODES = ("none", "detached", "grad")
CHUNKABLE = ("qwen2", "qwen3", "llama", "mistral")
"""model_type of the architectures whose forward returns `lm_head(hidden)` as the logits."""


def forward_loss_tokens(
    model: torch.nn.Module,
    batch: SegmentBatch,
    *,
    entropy: str = "none",
    device: torch.device | None = None,
    head_chunk_mb: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`(logprobs [L], entropy [L] or None)` of the batch's loss tokens under `model` (which
    must use segment attention). `entropy`: "none", "detached" or "grad". `head_chunk_mb`:
    the chunked head's working memory (None: the plain head, `[U, V]` logits)."""
    if entropy not in ENTROPY_MODES:
        raise ValueError(f"unknown entropy mode {entropy!r}; one of {ENTROPY_MODES}")
    device = device or batch.input_ids.device
    token_row, targets = batch.token_row.to(device), batch.targets.to(device)
    head = model.get_output_embeddings()
    chunked = head_chunk_mb is not None and _chunkable(model, head)
    plain = contextlib.nullcontext()
    with _chunked_head(head, token_row, targets, entropy, head_chunk_mb) if chunked else plain:
        output = model(
            input_ids=batch.input_ids.to(device),
            position_ids=batch.position_ids.to(device),
            segments=batch.segments,
            logits_to_keep=batch.hidden_rows.to(device),
            use_cache=False,
        ).logits[0]
    if chunked:  # [L, 2]: the head returned logprobs and entropy
        if entropy == "none":
            return output[:, 0], None
        return output[:, 0], output[:, 1].detach() if entropy == "detached" else output[:, 1]
    logits = output.to(torch.float32)  # [U, V]
    log_normalizer = torch.logsumexp(logits, dim=-1)  # [U]
    picked = logits[token_row, targets]  # [L]
    logprobs = picked - log_normalizer[token_row]  # [L]
    if entropy == "none":
        return logprobs, None
    source = logits if entropy == "grad" else logits.detach()
    return logprobs, entropy_from_logits(source)[token_row]  # [L]


def _chunkable(model: torch.nn.Module, head: torch.nn.Module | None) -> bool:
    """A known architecture whose head is a plain linear layer (FSDP's subclass of it
    included; not a PEFT layer, whose forward adds its adapter)."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    return model_type in CHUNKABLE and isinstance(head, torch.nn.Linear)


@contextlib.contextmanager
def _chunked_head(head, token_row, targets, entropy: str, chunk_mb: float):
    """For the block, `head(hidden [1, U, H])` returns `[1, L, 2]`: each loss token's logprob
    and entropy (zeros when not asked; the caller detaches it when "detached")."""

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        rows = hidden[0]  # [U, H]
        weight, bias = head.weight, head.bias
        lse, row_entropy, picked = head_terms(
            rows, weight, bias, token_row, targets, rows=chunk_rows(weight.shape[0], chunk_mb),
            with_entropy=entropy != "none",
        )  # fmt: skip
        logprobs = picked - lse[token_row]
        return torch.stack([logprobs, row_entropy[token_row]], dim=-1)[None]

    head.forward = forward
    try:
        yield
    finally:
        del head.forward  # the class's forward again


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
