"""Policy losses per token, with the off-policy corrections an asynchronous learner needs.

Every function works on flat token tensors (`[N]`, padding-free packing): current logprobs
(with grad), the behaviour logprobs vLLM reported when sampling, the sequence's advantage
broadcast on its tokens, the loss mask and `seq_ids` (sequence index of each token). They
return per-token losses; `reductions.py` turns those into a scalar.

Two explicit choices shape `ppo` (the config's `algorithm` section names them):

- `ratio_anchor`: the clipped ratio is `pi_theta / pi_anchor`, the anchor being the
  behaviour logprobs vLLM reported (`behaviour`) or the trainer's own recomputation with
  the current weights before the update, no grad (`proximal`, AReaL's proximal policy).
  Clipping uses asymmetric clip-higher bounds `[1 - eps_low, 1 + eps_high]` and an optional
  dual clip (`clip_ratio_c`: for A < 0 the loss is capped at `-A * c`).
- `importance_weight`: what multiplies each token's clipped loss: nothing (`none`);
  truncated importance sampling `min(pi_prox / pi_behaviour, tis_cap)` (`tis`), which
  corrects the trainer/engine mismatch and, when `max_staleness > 0`, the staleness too
  (the trainer cannot recompute an older version); or AReaL's behaviour weight
  `pi_prox / pi_behaviour` with tokens above `behaviour_weight_cap` masked to 0
  (`decoupled`; AReaL masks rather than truncates). AReaL's decoupled PPO is
  `proximal` + `decoupled`.

`gspo` takes one ratio per sequence, the geometric mean of its token ratios
`exp(mean_t(log pi_theta - log pi_behaviour))`, clipped; written on every token of the
sequence with the gradient of each token's logprob (GSPO's token form), so
`seq_mean_token_mean` gives exactly GSPO's sequence objective.

Optional terms: `kl_coef * KL(pi_theta || pi_ref)` per token (estimators k1, k2, k3 of
Schulman's note) and `- entropy_coef * H` per token.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from common import plugins
from learner.trainer.config import POLICY_LOSSES, AlgorithmConfig

KL_ESTIMATORS = ("k1", "k2", "k3")
MAX_LOG_RATIO = 20.0  # exp(20) ~ 5e8: keeps a wild ratio finite without changing any sane one


@dataclass
class LossInputs:
    """Flat token tensors of one micro-batch (all `[N]`)."""

    logprobs: torch.Tensor
    behaviour_logprobs: torch.Tensor
    advantages: torch.Tensor
    loss_mask: torch.Tensor
    seq_ids: torch.Tensor
    num_seqs: int
    proximal_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None


@dataclass
class LossTerms:
    """Per-token results (all `[N]`, zero or False off the loss mask except `ratio`)."""

    loss: torch.Tensor
    ratio: torch.Tensor  # the ratio that was clipped (detached); per sequence for GSPO
    clipped: torch.Tensor  # bool: a clip bound (or the dual clip) is the active branch
    importance_weight: torch.Tensor  # detached weight multiplying the policy loss (1 if none)
    kl: torch.Tensor | None = None  # detached KL estimate to the reference, if any


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[target] per row, in float32 without materialising log_softmax."""
    logits = logits.to(torch.float32)  # [N, V]
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) per row, `[N]`."""
    logits = logits.to(torch.float32)
    log_probs = torch.log_softmax(logits, dim=-1)
    return -(log_probs.exp() * log_probs).sum(dim=-1)


def ppo_clip(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
    clip_ratio_c: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO-clip per token: `max(-A r, -A clip(r, 1-eps_low, 1+eps_high))`, then for A < 0
    `min(that, -A c)` (dual clip). Returns (loss, ratio, clipped)."""
    ratio = torch.exp(log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss = torch.maximum(loss_unclipped, loss_clipped)
    clipped = loss_clipped > loss_unclipped
    if clip_ratio_c is not None:
        loss_dual = -advantages * clip_ratio_c
        dual_active = (advantages < 0) & (loss_dual < loss)
        loss = torch.where(dual_active, loss_dual, loss)
        clipped = clipped | dual_active
    return loss, ratio, clipped


def gspo_clip(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    seq_ids: torch.Tensor,
    num_seqs: int,
    *,
    eps_low: float,
    eps_high: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GSPO per token: the sequence ratio `s = exp(mean over loss tokens of log r)` clipped
    like PPO; value `s` on every token, gradient `s * grad log pi(token)`."""
    mask = loss_mask.to(torch.float32)
    token_log_ratio = torch.where(
        loss_mask.to(torch.bool), (logprobs - old_logprobs).detach(), torch.zeros_like(mask)
    )  # [N]
    zeros = torch.zeros(num_seqs, dtype=torch.float32, device=logprobs.device)
    seq_tokens = zeros.index_add(0, seq_ids, mask).clamp(min=1.0)  # [S]
    seq_log_ratio = zeros.index_add(0, seq_ids, token_log_ratio) / seq_tokens  # [S]
    log_ratio = logprobs - logprobs.detach() + seq_log_ratio[seq_ids]  # [N]
    ratio = torch.exp(log_ratio.clamp(max=MAX_LOG_RATIO))
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss = torch.maximum(loss_unclipped, loss_clipped)
    return loss, ratio.detach(), loss_clipped > loss_unclipped


def truncated_is_weight(
    trainer_logprobs: torch.Tensor, engine_logprobs: torch.Tensor, cap: float
) -> torch.Tensor:
    """TIS weight `min(pi_trainer / pi_engine, cap)`, detached."""
    log_weight = (trainer_logprobs - engine_logprobs).detach().clamp(max=MAX_LOG_RATIO)
    return torch.exp(log_weight).clamp(max=cap)


def decoupled_behaviour_weight(
    proximal_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, cap: float | None
) -> torch.Tensor:
    """AReaL's behaviour weight `pi_prox / pi_behaviour`, detached; 0 where it exceeds `cap`."""
    log_weight = (proximal_logprobs - behaviour_logprobs).detach().clamp(max=MAX_LOG_RATIO)
    weight = torch.exp(log_weight)
    if cap is None:
        return weight
    return torch.where(weight <= cap, weight, torch.zeros_like(weight))


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi.

    k1 = log pi - log pi_ref; k2 = (log pi - log pi_ref)^2 / 2;
    k3 = pi_ref/pi - 1 - log(pi_ref/pi) (non-negative, unbiased, low variance).
    """
    log_ratio = (logprobs - ref_logprobs).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio**2
    if estimator == "k3":
        return torch.exp(-log_ratio) - 1.0 + log_ratio
    raise ValueError(f"unknown KL estimator {estimator!r}; one of {KL_ESTIMATORS}")


@dataclass
class PolicyTerm:
    """What a policy-gradient term gives per token (all `[N]`): the protocol of the built-in
    terms and of a user's (`learner.algorithm.policy_loss = "my_pkg.rl:term"`)."""

    pg_loss: torch.Tensor  # with grad; what the token contributes before KL and entropy
    ratio: torch.Tensor  # the ratio reported as a metric (detached ones if it has none)
    clipped: torch.Tensor  # bool: where a clip bound is the active branch (all False if none)
    weight: torch.Tensor  # detached importance weight already in pg_loss (ones if none)


def ppo_term(inputs: LossInputs, algorithm: AlgorithmConfig) -> PolicyTerm:
    """Token-level clipped ratio against the chosen anchor, times the importance weight."""
    if algorithm.needs_proximal and inputs.proximal_logprobs is None:
        raise ValueError("ratio_anchor/importance_weight need proximal_logprobs")
    proximal = None if inputs.proximal_logprobs is None else inputs.proximal_logprobs.detach()
    anchor = proximal if algorithm.ratio_anchor == "proximal" else inputs.behaviour_logprobs
    weight = torch.ones_like(inputs.logprobs).detach()
    if algorithm.importance_weight == "tis":
        weight = truncated_is_weight(proximal, inputs.behaviour_logprobs, algorithm.tis_cap)
    elif algorithm.importance_weight == "decoupled":
        weight = decoupled_behaviour_weight(
            proximal, inputs.behaviour_logprobs, algorithm.behaviour_weight_cap
        )
    pg_loss, ratio, clipped = ppo_clip(
        inputs.logprobs - anchor,
        inputs.advantages,
        eps_low=algorithm.eps_low,
        eps_high=algorithm.eps_high,
        clip_ratio_c=algorithm.clip_ratio_c,
    )
    return PolicyTerm(pg_loss * weight, ratio, clipped, weight)


def gspo_term(inputs: LossInputs, algorithm: AlgorithmConfig) -> PolicyTerm:
    """One clipped ratio per sequence, against the behaviour logprobs."""
    pg_loss, ratio, clipped = gspo_clip(
        inputs.logprobs,
        inputs.behaviour_logprobs,
        inputs.advantages,
        inputs.loss_mask,
        inputs.seq_ids,
        inputs.num_seqs,
        eps_low=algorithm.eps_low,
        eps_high=algorithm.eps_high,
    )
    return PolicyTerm(pg_loss, ratio, clipped, torch.ones_like(inputs.logprobs).detach())


@functools.cache
def term_named(name: str) -> Callable[[LossInputs, AlgorithmConfig], PolicyTerm]:
    """A built-in policy-gradient term by name, or the user's by import path."""
    return plugins.import_object(POLICY_LOSSES.get(name, name))


def policy_loss(inputs: LossInputs, algorithm: AlgorithmConfig) -> LossTerms:
    """Per-token loss of one micro-batch (zero off the loss mask): the configured policy
    term, then the KL and entropy terms, then the mask."""
    mask = inputs.loss_mask.to(torch.bool)
    term = term_named(algorithm.policy_loss)(inputs, algorithm)
    if not isinstance(term, PolicyTerm) or term.pg_loss.shape != inputs.logprobs.shape:
        raise ValueError(
            f"policy_loss {algorithm.policy_loss}: must return a PolicyTerm of [N] tensors"
        )
    pg_loss, ratio, clipped, weight = term.pg_loss, term.ratio, term.clipped, term.weight
    loss = pg_loss
    kl = None
    if algorithm.kl_coef > 0:
        if inputs.ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs")
        kl = kl_estimate(inputs.logprobs, inputs.ref_logprobs, algorithm.kl_estimator)
        loss = loss + algorithm.kl_coef * kl
        kl = kl.detach()
    if algorithm.entropy_coef > 0:
        if inputs.entropy is None:
            raise ValueError("entropy_coef > 0 needs the per-token entropy")
        loss = loss - algorithm.entropy_coef * inputs.entropy
    # where(), not multiply: a NaN outside the mask (e.g. garbage at a sequence boundary)
    # must not leak into the sum.
    loss = torch.where(mask, loss, torch.zeros_like(loss))
    return LossTerms(
        loss=loss,
        ratio=ratio.detach(),
        clipped=clipped & mask,
        importance_weight=torch.where(mask, weight, torch.zeros_like(weight)),
        kl=kl,
    )
