"""The trainer's config: model, precision, packing, optimizer, algorithm, fine-tuning.

`TrainerConfig` holds every field the torch side of the learner reads (learner/trainer/),
so the trainer needs nothing from the bus side; `LearnerConfig` (learner/config.py) extends
it with the bus side's fields, and users still write one flat `[learner]` section.
Pydantic only (no torch import), so `learner --help` and a bad config answer at once. Field
names follow SkyRL / verl where an equivalent exists (`eps_clip_low`/`high` -> `eps_low`/
`eps_high`, `clip_ratio_c`, `loss_reduction`, `advantage_estimator`). Cross-field rules
raise a ValueError that says what to change.
"""

from __future__ import annotations

from typing import Annotated, Literal

import pydantic

from common.config import StrictModel
from common.plugins import is_import_path
from weights.shared.dtypes import canonical_dtype


class OptimConfig(StrictModel):
    """AdamW and its learning-rate schedule."""

    lr: float = pydantic.Field(default=1e-6, gt=0)
    """Peak learning rate."""
    warmup_steps: int = pydantic.Field(default=0, ge=0)
    """Linear warmup over this many optimizer steps (from lr/warmup_steps up to lr)."""
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    """Shape after warmup: constant, cosine or linear decay to `min_lr_ratio * lr` at the
    run's last step (`learner.total_steps`)."""
    min_lr_ratio: float = pydantic.Field(default=0.0, ge=0, le=1)
    """Floor of the decaying schedules, as a fraction of `lr`."""
    grad_clip: float | None = pydantic.Field(default=1.0, gt=0)
    """Clip the global gradient norm to this; None disables clipping (norm still logged)."""
    weight_decay: float = pydantic.Field(default=0.0, ge=0)
    """Decoupled weight decay, applied to matrices only (not norms or biases)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    eps: float = pydantic.Field(default=1e-8, gt=0)
    """AdamW epsilon."""

    @pydantic.model_validator(mode="after")
    def _check(self) -> OptimConfig:
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"betas must both be in [0, 1), got {self.betas}")
        return self


ADVANTAGE_ESTIMATORS = {
    "grpo": "learner.advantages:grpo",
    "dr_grpo": "learner.advantages:dr_grpo",
    "rloo": "learner.advantages:rloo",
}
"""Built-in advantage estimators by name: import paths, loaded as a user's are."""
POLICY_LOSSES = {
    "ppo": "learner.trainer.losses:ppo_term",
    "gspo": "learner.trainer.losses:gspo_term",
}
"""Built-in policy-gradient terms by name: import paths, loaded as a user's are."""


def _builtin_or_import_path(value: str, builtins: dict[str, str]) -> str:
    if value not in builtins and not is_import_path(value):
        raise ValueError(
            f"{value!r}: one of {sorted(builtins)}, or your own as an import path "
            "(my_pkg.module:function)"
        )
    return value


class AlgorithmConfig(StrictModel):
    """Advantages, policy loss, off-policy corrections, regularisers."""

    advantage_estimator: str = "grpo"
    """Group-relative baseline: `grpo`, `dr_grpo` (no std), `rloo` (leave-one-out), or your
    own by import path: `estimator(rewards [G, K], algorithm) -> advantages [G, K]`
    (learner/advantages.py; docs/learner.md)."""
    normalize_std: bool = True
    """GRPO only: divide by the group's reward std."""
    std_eps: float = pydantic.Field(default=1e-6, gt=0)
    """GRPO only: added to the std before dividing."""
    policy_loss: str = "ppo"
    """ppo: token-level clipped ratio; gspo: one clipped ratio per sequence (the geometric
    mean of its token ratios), always against the behaviour logprobs; or your own by import
    path: `term(inputs, algorithm) -> PolicyTerm` (learner/trainer/losses.py; KL, entropy
    and the loss mask are applied around it as for the built-ins)."""
    loss_reduction: Literal["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"] = (
        "token_mean"
    )
    """How per-token losses become the batch loss."""
    ratio_anchor: Literal["behaviour", "proximal"] = "behaviour"
    """ppo only: what the clipped ratio is taken against. `behaviour`: the logprobs vLLM
    reported when sampling (PPO against the policy that acted). `proximal`: the trainer's
    own recomputation with the current weights before the update (AReaL's proximal policy;
    costs one extra forward)."""
    importance_weight: Literal["none", "tis", "decoupled"] = "none"
    """ppo only: what multiplies each token's clipped loss. `none`: 1. `tis`: truncated
    importance sampling, `min(pi_prox / pi_behaviour, tis_cap)`, correcting the
    trainer/engine mismatch and staleness. `decoupled`: AReaL's behaviour weight
    `pi_prox / pi_behaviour`, tokens above `behaviour_weight_cap` getting weight 0. Both
    need the proximal recomputation. AReaL's decoupled PPO is
    `ratio_anchor = "proximal", importance_weight = "decoupled"`."""
    eps_low: float = pydantic.Field(default=0.2, gt=0, lt=1)
    """Lower clip: the ratio is clipped at 1 - eps_low."""
    eps_high: float = pydantic.Field(default=0.2, gt=0)
    """Upper clip: 1 + eps_high (DAPO's clip-higher uses 0.28)."""
    clip_ratio_c: float | None = pydantic.Field(default=None, gt=1)
    """Dual clip for negative advantages (3.0 in verl); None disables it."""
    tis_cap: float = pydantic.Field(default=2.0, gt=0)
    """Cap of the `tis` importance weight."""
    behaviour_weight_cap: float | None = pydantic.Field(default=None, gt=0)
    """`decoupled` importance weight: tokens whose pi_prox/pi_behaviour exceeds this get no
    loss (None: no cap)."""
    kl_coef: float = pydantic.Field(default=0.0, ge=0)
    """Weight of KL(pi || reference) per token; 0 skips the reference model entirely."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """Per-token KL estimator."""
    entropy_coef: float = pydantic.Field(default=0.0, ge=0)
    """Weight of the entropy bonus per token."""

    @pydantic.field_validator("advantage_estimator")
    @classmethod
    def _estimator(cls, value: str) -> str:
        return _builtin_or_import_path(value, ADVANTAGE_ESTIMATORS)

    @pydantic.field_validator("policy_loss")
    @classmethod
    def _loss(cls, value: str) -> str:
        return _builtin_or_import_path(value, POLICY_LOSSES)

    @property
    def needs_proximal(self) -> bool:
        """Whether the trainer must recompute logprobs with the current weights first."""
        return self.ratio_anchor == "proximal" or self.importance_weight != "none"

    @pydantic.model_validator(mode="after")
    def _check(self) -> AlgorithmConfig:
        if self.policy_loss == "gspo" and (
            self.ratio_anchor != "behaviour" or self.importance_weight != "none"
        ):
            raise ValueError(
                "gspo's ratio is against the behaviour logprobs with no importance weight: "
                "leave ratio_anchor = 'behaviour' and importance_weight = 'none'"
            )
        if self.behaviour_weight_cap is not None and self.importance_weight != "decoupled":
            raise ValueError("behaviour_weight_cap applies to importance_weight 'decoupled' only")
        if self.policy_loss == "gspo" and self.loss_reduction != "seq_mean_token_mean":
            raise ValueError(
                "gspo's objective is a mean over sequences of sequence losses: set "
                "loss_reduction = 'seq_mean_token_mean'"
            )
        if self.policy_loss == "gspo" and self.clip_ratio_c is not None:
            raise ValueError("clip_ratio_c (dual clip) is for token-level ppo losses, not gspo")
        if self.advantage_estimator == "dr_grpo" and self.loss_reduction == "seq_mean_token_mean":
            raise ValueError(
                "dr_grpo drops the per-sequence length normalisation: use loss_reduction "
                "'seq_mean_token_sum' (or 'token_mean'), not 'seq_mean_token_mean'"
            )
        return self


DECODER_LINEAR_MODULES = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
]
"""Every linear layer of a Qwen2 / Llama decoder layer (not the LM head, not embeddings)."""


class FinetuneConfig(StrictModel):
    """What the learner trains: every weight, or a LoRA adapter on frozen base weights
    (PEFT's LoRA; names as in PEFT's `LoraConfig`)."""

    mode: Literal["full", "lora"] = "full"
    """`full`: every parameter is trained, checkpointed and sent to the engines. `lora`: the
    base model is frozen and only a LoRA adapter is trained; checkpoints, snapshots and the
    weight broadcast carry the adapter alone (docs/learner.md, LoRA)."""
    rank: int = pydantic.Field(default=16, ge=1)
    """LoRA rank (PEFT's `r`). An engine loading adapters natively needs
    `actor.engine.max_lora_rank` >= this."""
    alpha: int = pydantic.Field(default=32, ge=1)
    """LoRA alpha (PEFT's `lora_alpha`): the adapter's product is scaled by alpha / rank."""
    dropout: float = pydantic.Field(default=0.0, ge=0, lt=1)
    """Dropout on the adapter's input while training (PEFT's `lora_dropout`). Keep 0 for RL:
    the engines sample without dropout, so any dropout makes the trainer's logprobs differ
    from the behaviour policy's and shows up as ratio noise."""
    target_modules: list[str] = DECODER_LINEAR_MODULES
    """Modules that get an adapter (PEFT's `target_modules`, matched against the end of each
    module's name). The default adapts every linear layer of the decoder; vLLM adapts linear
    layers, so keep to those."""

    @pydantic.field_validator("target_modules")
    @classmethod
    def _some_modules(cls, modules: list[str]) -> list[str]:
        if not modules:
            raise ValueError("name at least one target module (e.g. q_proj, v_proj)")
        return modules


class TrainerConfig(StrictModel):
    """What the trainer reads of the `[learner]` section."""

    model_path: str
    """HF model directory (config + weights + tokenizer) to start from."""
    ref_model_path: str | None = None
    """Reference model for the KL term; None uses `model_path`."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Compute dtype (also `fp32`, `bf16`): bfloat16 keeps float32 master weights and
    reduces gradients in float32. `auto`: bfloat16 on GPU, float32 on CPU. Weights go to the
    engines in this dtype, and an engine of another dtype is refused (weights/shared/dtypes.py)."""
    device: Literal["auto", "cuda"] = "auto"
    """`auto`: this rank's GPU when torch sees one, else CPU. `cuda`: a GPU or nothing: the
    learner refuses to start without one, naming the NVIDIA driver found and the one needed
    (common/cuda_driver.py). GPU configs set it (deploy/k8s/gpu/tether.toml; a Ray plan that
    gives the learner GPUs does too)."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward to save memory."""
    head_chunk_mb: Annotated[float, pydantic.Field(gt=0)] | Literal["auto"] | None = "auto"
    """Working memory of the language-model head, which then never builds the `[tokens,
    vocabulary]` logits: log-normaliser and entropy in chunks of rows, recomputed in
    backward (learner/trainer/chunked_head.py; for Qwen2/3, Llama, Mistral). `auto`: 1,024
    MB on a GPU, where each chunk re-reads the head's weight and small chunks made the head
    2x slower (docs/gpu.md), 128 MB on CPU. `null` (command line): the plain head (at 16K
    tokens and a 152K vocabulary, 10 GB per float32 copy of the logits)."""
    micro_batch_tokens: int = pydantic.Field(default=8192, ge=1)
    """Token budget of one packed micro-batch (forward + backward), counted as trained: a
    shared prefix counts once."""
    share_prefix: bool = True
    """Forward and backward a group's common token prefix once (its prompt; in multi-turn
    episodes any longer common prefix), every sample's suffix attending to it: identical
    logprobs and gradients, the cost of the unique tokens (docs/learner.md)."""
    min_shared_prefix_tokens: int = pydantic.Field(default=16, ge=1)
    """Shorter common prefixes are not shared (the segment bookkeeping would cost more
    than it saves)."""
    nan_skip_limit: int = pydantic.Field(default=3, ge=1)
    """Stop after this many consecutive steps skipped for a non-finite loss or gradient."""
    total_steps: int = pydantic.Field(default=100, ge=1)
    """Optimizer steps (policy versions) in the run; the learner stops after the last one."""
    optim: OptimConfig = OptimConfig()
    """Optimizer and schedule."""
    algorithm: AlgorithmConfig = AlgorithmConfig()
    """Advantages and losses."""
    finetune: FinetuneConfig = FinetuneConfig()
    """Full fine-tuning or a LoRA adapter (`[learner.finetune]`)."""

    @pydantic.field_validator("dtype", mode="before")
    @classmethod
    def _torch_name(cls, value):
        return canonical_dtype(value) if isinstance(value, str) else value

    @pydantic.model_validator(mode="after")
    def _check_trainer(self) -> TrainerConfig:
        if self.optim.warmup_steps > self.total_steps:
            raise ValueError(
                f"optim.warmup_steps ({self.optim.warmup_steps}) exceeds total_steps "
                f"({self.total_steps})"
            )
        return self
