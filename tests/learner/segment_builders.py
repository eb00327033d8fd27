"""Builders for the shared-prefix tests: grouped samples, the one-sequence-at-a-time reference,
and the shared-prefix path run the way a trainer would run it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from learner.trainer.config import AlgorithmConfig
from learner.trainer.losses import LossInputs, entropy_from_logits, policy_loss
from learner.trainer.prefix_plan import plan_pieces
from learner.trainer.reductions import batch_normalizers, token_weights
from learner.trainer.sample import Sample
from learner.trainer.segment_forward import forward_loss_tokens, loss_inputs
from learner.trainer.segments import collate_segments
from tests.learner.builders import VOCAB

SPEC = AlgorithmConfig(eps_low=0.2, eps_high=0.28, entropy_coef=0.01)


def group(
    *,
    group_id: str,
    prefix_len: int,
    suffix_lens: list[int],
    seed: int,
    prompt_len: int | None = None,
    diverge_at: int | None = None,
) -> list[Sample]:
    """Samples agreeing on their first `prefix_len` tokens, then random suffixes.

    The first `prompt_len` tokens (default: all of the prefix) carry no loss; prefix tokens
    after them are a shared first turn with loss on (multi-turn). Each suffix has loss on
    all tokens but a 3-token observation in its middle. `diverge_at`: every sample but the
    first changes its token there (the samples then share only that many tokens).
    Behaviour logprobs differ per sample, also on shared tokens.
    """
    rng = np.random.default_rng(seed)
    prompt_len = prefix_len if prompt_len is None else prompt_len
    prefix = rng.integers(0, VOCAB, prefix_len)
    samples = []
    for k, suffix_len in enumerate(suffix_lens):
        ids = np.concatenate([prefix, rng.integers(0, VOCAB, suffix_len)]).astype(np.int32)
        if diverge_at is not None and k > 0:
            ids[diverge_at] = (ids[diverge_at] + k) % VOCAB
        mask = np.ones(len(ids), dtype=np.uint8)
        mask[:prompt_len] = 0
        middle = prefix_len + suffix_len // 2
        mask[middle : middle + 3] = 0
        mask[0] = 0
        n = len(ids)
        samples.append(
            Sample(
                token_ids=ids,
                loss_mask=mask,
                behaviour_logprobs=(-np.log(VOCAB) + rng.normal(0, 0.3, n)).astype(np.float32),
                versions=rng.integers(0, 3, n).astype(np.int32),
                advantage=float(rng.normal()),
                trajectory_id=f"{group_id}-{k}",
                group_id=group_id,
                env_class="calculator",
            )
        )
    return samples


@dataclass
class Result:
    """Per-sample logprobs at its loss positions (in order), the loss, every gradient."""

    logprobs: list[torch.Tensor]
    loss: float
    grads: dict[str, torch.Tensor]


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every trainable parameter's gradient (a LoRA model's base is frozen)."""
    return {
        name: p.grad.detach().clone() for name, p in model.named_parameters() if p.requires_grad
    }


def reference(
    model: torch.nn.Module, samples: list[Sample], *, reduction: str, spec: AlgorithmConfig = SPEC
) -> Result:
    """One forward per sample with full logits, losses over all tokens with the loss mask."""
    model.zero_grad(set_to_none=True)
    logprobs, entropies = [], []
    for s in samples:
        ids = torch.from_numpy(s.token_ids.astype(np.int64))
        logits = model(input_ids=ids[None], use_cache=False).logits[0]  # [T, V]
        zero = torch.zeros(1)
        picked = logits[:-1].log_softmax(-1).gather(-1, ids[1:, None])[:, 0]  # [T - 1]
        logprobs.append(torch.cat([zero, picked]))
        entropies.append(torch.cat([zero, entropy_from_logits(logits[:-1])]))

    def cat(name: str, dtype) -> torch.Tensor:
        return torch.from_numpy(np.concatenate([getattr(s, name) for s in samples]).astype(dtype))

    lengths = [s.num_tokens for s in samples]
    inputs = LossInputs(
        logprobs=torch.cat(logprobs),
        behaviour_logprobs=cat("behaviour_logprobs", np.float32),
        advantages=torch.from_numpy(
            np.repeat(np.array([s.advantage for s in samples], np.float32), lengths)
        ),
        loss_mask=cat("loss_mask", np.bool_),
        seq_ids=torch.from_numpy(np.repeat(np.arange(len(samples)), lengths)),
        num_seqs=len(samples),
        entropy=torch.cat(entropies),
    )
    total_tokens, total_seqs = batch_normalizers(inputs.loss_mask, inputs.seq_ids, len(samples))
    weights = token_weights(
        inputs.loss_mask,
        inputs.seq_ids,
        len(samples),
        reduction,
        total_tokens=total_tokens,
        total_seqs=total_seqs,
    )
    loss = (policy_loss(inputs, spec).loss * weights).sum()
    loss.backward()
    at_loss = [
        lp[torch.from_numpy(s.loss_mask.astype(bool))]
        for lp, s in zip(logprobs, samples, strict=True)
    ]
    return Result([lp.detach() for lp in at_loss], loss.item(), _grads(model))


def totals(samples: list[Sample]) -> tuple[int, int]:
    """Whole-batch (loss tokens, sequences with a loss token)."""
    counts = [int(s.loss_mask.sum()) for s in samples]
    return sum(counts), sum(1 for n in counts if n > 0)


def shared_step(
    model: torch.nn.Module,
    samples: list[Sample],
    micro_batches,
    *,
    reduction: str,
    spec: AlgorithmConfig = SPEC,
    scale: float = 1.0,
) -> tuple[dict[int, torch.Tensor], float]:
    """Forward + backward over `micro_batches` (lists of pieces) the way a trainer would;
    returns (logprobs by sample index, this part's loss). Gradients accumulate in `model`."""
    total_tokens, total_seqs = totals(samples)
    by_sample, loss_sum = {}, 0.0
    for pieces in micro_batches:
        batch = collate_segments(samples, pieces)
        logprobs, entropy = forward_loss_tokens(model, batch, entropy="grad")
        inputs = loss_inputs(batch, logprobs, entropy=entropy)
        weights = token_weights(
            inputs.loss_mask,
            inputs.seq_ids,
            inputs.num_seqs,
            reduction,
            total_tokens=total_tokens,
            total_seqs=total_seqs,
        )
        loss = (policy_loss(inputs, spec).loss * weights).sum()
        (loss * scale).backward()
        loss_sum += loss.item()
        for k, i in enumerate(batch.sample_indices):
            by_sample[i] = logprobs[batch.seq_ids == k].detach()
    return by_sample, loss_sum


def shared(
    model: torch.nn.Module, samples: list[Sample], *, token_budget: int, reduction: str, **plan
) -> tuple[Result, list]:
    """The shared-prefix path on one process; returns the result and the plan it used."""
    model.zero_grad(set_to_none=True)
    (micro_batches,) = plan_pieces(samples, num_ranks=1, token_budget=token_budget, **plan)
    by_sample, loss = shared_step(model, samples, micro_batches, reduction=reduction)
    logprobs = [by_sample[i] for i in range(len(samples))]
    return Result(logprobs, loss, _grads(model)), micro_batches


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    """max |got - expected| / max |expected| over the tensor (elementwise relative error is
    meaningless where a gradient entry is ~0)."""
    assert got.shape == expected.shape
    if expected.numel() == 0:
        return 0.0
    scale = expected.abs().max().item()
    return (got - expected).abs().max().item() / max(scale, 1e-30)


def max_relative_errors(got: Result, expected: Result) -> dict[str, float]:
    """Worst relative error of the logprobs, the loss and each parameter's gradient."""
    assert got.grads.keys() == expected.grads.keys()
    errors = {
        "logprobs": max(
            relative_error(g, e) for g, e in zip(got.logprobs, expected.logprobs, strict=True)
        ),
        "loss": abs(got.loss - expected.loss) / abs(expected.loss),
    }
    errors.update({name: relative_error(got.grads[name], g) for name, g in expected.grads.items()})
    return errors
