"""Policy losses per token, with the off-policy corrections an asynchronous learner needs.

Every function works on flat token tensors (`[N]`, padding-free packing): current logprobs
(with grad), the behaviour logprobs vLLM reported when sampling, the sequence's advantage
broadcast on its tokens, the loss mask and `seq_ids` (sequence index of each token). They
return per-token losses; `reductions.py` turns those into a scalar.

Which probability the ratio is taken against (`anchor`), and what multiplies the loss:

- `ppo`: PPO-clip of `pi_theta / pi_behaviour`, with asymmetric clip-higher bounds
  `[1 - eps_low, 1 + eps_high]` and optional dual clip (`clip_ratio_c`: for A < 0 the loss
  is capped at `-A * c`). With `tis_cap = C` it becomes truncated importance sampling: the
  ratio is taken against the trainer's own recomputation `pi_prox` (logprobs of the
  current weights before the update, no grad) and the loss is weighted by
  `min(pi_prox / pi_behaviour, C)`, which corrects the trainer/engine mismatch (and, when
  `max_staleness > 0`, the staleness too: the trainer cannot recompute an older version).
- `decoupled_ppo` (AReaL): ratio against `pi_prox`, clipped; loss weighted by the
  behaviour importance weight `pi_prox / pi_behaviour`; tokens whose weight exceeds
  `behaviour_weight_cap` get weight 0 (AReaL masks them rather than truncating).
- `gspo`: one ratio per sequence, the geometric mean of its token ratios
  `exp(mean_t(log pi_theta - log pi_behaviour))`, clipped; written on every token of the
  sequence with the gradient of each token's logprob (GSPO's token form), so
  `seq_mean_token_mean` gives exactly GSPO's sequence objective.

Optional terms: `kl_coef * KL(pi_theta || pi_ref)` per token (estimators k1, k2, k3 of
Schulman's note) and `- entropy_coef * H` per token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

POLICY_LOSSES = ("ppo", "decoupled_ppo", "gspo")
KL_ESTIMATORS = ("k1", "k2", "k3")
MAX_LOG_RATIO = 20.0  # exp(20) ~ 5e8: keeps a wild ratio finite without changing any sane one


@dataclass(frozen=True)
class PolicyLossSpec:
    """The loss settings (a torch-free mirror of the config's `algorithm` section)."""

    policy_loss: str = "ppo"
    eps_low: float = 0.2
    eps_high: float = 0.2
    clip_ratio_c: float | None = None
    tis_cap: float | None = None
    behaviour_weight_cap: float | None = None
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0

    def __post_init__(self) -> None:
        if self.policy_loss not in POLICY_LOSSES:
            raise ValueError(f"unknown policy loss {self.policy_loss!r}; one of {POLICY_LOSSES}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"unknown KL estimator {self.kl_estimator!r}; one of {KL_ESTIMATORS}")
        if self.clip_ratio_c is not None and self.clip_ratio_c <= 1.0:
            raise ValueError(f"clip_ratio_c must be > 1 (dual clip), got {self.clip_ratio_c}")

    @property
    def needs_proximal(self) -> bool:
        """Whether the trainer must recompute logprobs with the current weights first."""
        return self.policy_loss == "decoupled_ppo" or (
            self.policy_loss == "ppo" and self.tis_cap is not None
        )


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


def policy_loss(inputs: LossInputs, spec: PolicyLossSpec) -> LossTerms:
    """Per-token loss of one micro-batch under `spec` (zero off the loss mask)."""
    mask = inputs.loss_mask.to(torch.bool)
    ones = torch.ones_like(inputs.logprobs).detach()
    if spec.policy_loss == "gspo":
        pg_loss, ratio, clipped = gspo_clip(
            inputs.logprobs,
            inputs.behaviour_logprobs,
            inputs.advantages,
            inputs.loss_mask,
            inputs.seq_ids,
            inputs.num_seqs,
            eps_low=spec.eps_low,
            eps_high=spec.eps_high,
        )
        weight = ones
    else:
        if spec.needs_proximal:
            if inputs.proximal_logprobs is None:
                raise ValueError(f"{spec.policy_loss} with these settings needs proximal_logprobs")
            anchor = inputs.proximal_logprobs.detach()
            if spec.tis_cap is not None:
                weight = truncated_is_weight(anchor, inputs.behaviour_logprobs, spec.tis_cap)
            else:
                weight = decoupled_behaviour_weight(
                    anchor, inputs.behaviour_logprobs, spec.behaviour_weight_cap
                )
        else:
            anchor, weight = inputs.behaviour_logprobs, ones
        pg_loss, ratio, clipped = ppo_clip(
            inputs.logprobs - anchor,
            inputs.advantages,
            eps_low=spec.eps_low,
            eps_high=spec.eps_high,
            clip_ratio_c=spec.clip_ratio_c,
        )
        pg_loss = pg_loss * weight
    loss = pg_loss
    kl = None
    if spec.kl_coef > 0:
        if inputs.ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs")
        kl = kl_estimate(inputs.logprobs, inputs.ref_logprobs, spec.kl_estimator)
        loss = loss + spec.kl_coef * kl
        kl = kl.detach()
    if spec.entropy_coef > 0:
        if inputs.entropy is None:
            raise ValueError("entropy_coef > 0 needs the per-token entropy")
        loss = loss - spec.entropy_coef * inputs.entropy
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
