"""One RL training step of a HF causal LM under FSDP2 (or plain, on a single process).

    samples (whole batch, same on every rank)
        -> plan_pieces (deterministic: every rank computes the same plan; a group's common
           prefix becomes one shared piece, learner/trainer/prefix_plan.py)
        -> collate_segments: a packed row of segments per micro-batch (learner/trainer/segments.py)
        -> [no grad] proximal logprobs (decoupled PPO / TIS), reference logprobs (KL)
        -> per micro-batch: forward with segment attention (no N x N mask; each suffix
           attends to its prefix and to itself) -> loss-token logprobs -> policy_loss
           -> weighted sum -> backward
        -> all-reduce loss and health sums; global grad norm
        -> finite? clip + AdamW step + lr schedule, version += 1 : skip (zero grads)

Every rank is handed the whole batch (the learner loop broadcasts it) and trains its share.
Reductions use weights computed from whole-batch token and sequence counts, and the loss is
multiplied by the world size because FSDP averages gradients over ranks: so N ranks compute
exactly the gradient one process would on the same batch. When torch.distributed is not
initialised the model is not sharded at all (a plain single-process reference).

Precision: parameters and optimizer state stay fp32; `bf16` computes in bf16 (FSDP2
`MixedPrecisionPolicy` with fp32 gradient reduction, or autocast without FSDP). Logprobs
and the loss are computed in fp32.
"""

from __future__ import annotations

import contextlib
import copy
import math
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from learner.trainer.checkpoint import TrainingState, load_checkpoint, save_checkpoint
from learner.trainer.chunked_head import chunk_budget_mb
from learner.trainer.config import AlgorithmConfig, TrainerConfig
from learner.trainer.lora import adapter_files, with_adapter, with_adapter_config
from learner.trainer.losses import policy_loss
from learner.trainer.model_init import compute_dtype, default_device, is_sharded, shard
from learner.trainer.optimizer import build_optimizer
from learner.trainer.optimizer import grad_norm as model_grad_norm
from learner.trainer.ppo_health import health_metrics, health_sums
from learner.trainer.prefix_plan import plan_pieces
from learner.trainer.reductions import token_weights
from learner.trainer.sample import Sample
from learner.trainer.segment_attention import use_segment_attention
from learner.trainer.segment_forward import forward_loss_tokens, loss_inputs
from learner.trainer.segments import SegmentBatch, collate_segments
from learner.trainer.step_metrics import step_metrics
from weights.learner_side.adapter import adapter_parameters
from weights.learner_side.fsdp import full_parameters


class TooManySkippedSteps(RuntimeError):
    """`nan_skip_limit` consecutive steps had a non-finite loss or gradient."""

    def __init__(self, message: str, metrics: dict[str, float]):
        super().__init__(message)
        self.metrics = metrics


class Trainer:
    """Holds the (sharded) policy, optional reference model, AdamW and the lr schedule.

    Build it on every rank after `init_process_group` (or without one for a single
    process), from the *initial* weights, then `load` a checkpoint to resume. The reference
    model for the KL term defaults to a frozen copy of `model` as passed in (so: the initial
    weights); pass `ref_model` to use another.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        config: TrainerConfig,
        *,
        ref_model: torch.nn.Module | None = None,
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
    ):
        self.config = config
        self.algorithm = config.algorithm
        self.device = device or default_device()
        self.distributed = dist.is_initialized()
        self.world_size = dist.get_world_size() if self.distributed else 1
        self.rank = dist.get_rank() if self.distributed else 0
        self.dtype = dtype or compute_dtype(config.dtype, self.device)
        """The compute dtype (parameters and optimizer state stay fp32)."""
        self.bf16 = self.dtype == torch.bfloat16
        self.head_chunk_mb = chunk_budget_mb(config.head_chunk_mb, self.device)
        self.dtype_name = str(self.dtype).removeprefix("torch.")
        """The same, as the weight broadcast and the engines name it (`bfloat16`)."""
        self.weights_dtype = torch.bfloat16 if self.bf16 else None
        """The dtype full weights go out in (to the engines and snapshots); None: fp32."""
        self.version = 0
        self.step = 0
        self.consecutive_skips = 0

        if self.algorithm.kl_coef > 0 and ref_model is None:
            if self.distributed:
                raise ValueError(
                    "kl_coef > 0 under FSDP needs ref_model, built sharded with "
                    "learner.trainer.model_init.load_model: a deep copy would put a whole model on "
                    "every rank"
                )
            ref_model = copy.deepcopy(model)  # one process: one copy
        if self.algorithm.kl_coef == 0:
            ref_model = None
        self.lora = config.finetune.mode == "lora"
        """Only a LoRA adapter trains (learner/trainer/lora.py); the reference stays the base."""
        self.adapter_config = with_adapter_config(config) if self.lora else None
        model = self._place(with_adapter(model, config) if self.lora else model)
        if ref_model is not None:
            ref_model = self._place(ref_model).requires_grad_(False)
            ref_model.eval()
        # A shared prefix must be at least this long; beyond any sample: nothing is shared.
        self.min_shared_tokens = (
            config.min_shared_prefix_tokens if config.share_prefix else sys.maxsize
        )
        if config.gradient_checkpointing:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        model.train()
        self.model = model
        self.ref_model = ref_model

        self.optimizer, self.scheduler = build_optimizer(
            model, config.optim, total_steps=config.total_steps
        )

    def _place(self, model: torch.nn.Module) -> torch.nn.Module:
        """fp32 on this rank's device, sharded under FSDP (unless built sharded already),
        attending through segments (learner/trainer/segment_attention.py)."""
        model = use_segment_attention(model)
        if is_sharded(model):
            return model
        model = model.to(self.device, dtype=torch.float32)
        return shard(model, bf16=self.bf16, device=self.device) if self.distributed else model

    # ---- forward -------------------------------------------------------------------------

    def _autocast(self):
        if self.bf16 and not self.distributed:
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _logprobs(
        self, model: torch.nn.Module, mb: SegmentBatch, *, entropy: str = "none"
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logprob (and entropy: "none", "detached" or "grad") of each loss token, `[L]`."""
        with self._autocast():
            return forward_loss_tokens(
                model, mb, entropy=entropy, device=self.device,
                head_chunk_mb=self.head_chunk_mb,
            )  # fmt: skip

    @torch.no_grad()
    def compute_logprobs(
        self, micro_batches: list[SegmentBatch], *, reference: bool = False
    ) -> list[torch.Tensor]:
        """Loss-token logprobs `[L]` per micro-batch under the current (or reference)
        weights, without grad. Collective under FSDP: every rank passes the same number of
        batches."""
        model = self.ref_model if reference else self.model
        if model is None:
            raise ValueError("no reference model (kl_coef is 0)")
        return [self._logprobs(model, mb)[0] for mb in micro_batches]

    def micro_batches(self, samples: list[Sample]) -> tuple[list[SegmentBatch], int]:
        """This rank's micro-batches of `samples`, and the tokens the whole plan trains (a
        shared prefix counted once, all ranks)."""
        plan = plan_pieces(
            samples,
            num_ranks=self.world_size,
            token_budget=self.config.micro_batch_tokens,
            min_shared_tokens=self.min_shared_tokens,
        )
        trained = sum(p.num_tokens for rank in plan for mb in rank for p in mb)
        return [collate_segments(samples, pieces) for pieces in plan[self.rank]], trained

    # ---- the step ------------------------------------------------------------------------

    def train_step(
        self, samples: list[Sample], algorithm: AlgorithmConfig | None = None
    ) -> dict[str, float]:
        """One optimizer step on `samples` (the whole batch; identical on every rank).
        `algorithm`, when given, is the algorithm from this step on: an "auto" staleness
        bound turns the off-policy correction on and off with the bound."""
        if not samples:
            raise ValueError("train_step needs at least one sample")
        if algorithm is not None:
            self.algorithm = algorithm
        start = time.perf_counter()
        micro_batches, num_trained_tokens = self.micro_batches(samples)
        proximal = [None] * len(micro_batches)
        if self.algorithm.needs_proximal:
            proximal = self.compute_logprobs(micro_batches)
        reference = [None] * len(micro_batches)
        if self.ref_model is not None:
            reference = self.compute_logprobs(micro_batches, reference=True)
        recompute_seconds = time.perf_counter() - start

        loss_value, sums, extremes = self._accumulate(micro_batches, proximal, reference, samples)
        grad_norm = model_grad_norm(self.model)
        lr = self.scheduler.get_last_lr()[0]
        finite = self._apply_update(loss_value, grad_norm)
        metrics = step_metrics(
            samples,
            version=self.version,
            step=self.step,
            consecutive_skips=self.consecutive_skips,
            loss=loss_value,
            grad_norm=grad_norm,
            lr=lr,
            finite=finite,
            health=health_metrics(sums.cpu(), extremes.cpu()),
            num_micro_batches=len(micro_batches),
            num_trained_tokens=num_trained_tokens,
            seconds=time.perf_counter() - start,
            recompute_seconds=recompute_seconds,
        )
        if self.consecutive_skips >= self.config.nan_skip_limit:
            raise TooManySkippedSteps(
                f"{self.consecutive_skips} consecutive steps had a non-finite loss ({loss_value})"
                f" or gradient norm ({grad_norm}); stopping",
                metrics,
            )
        return metrics

    def _accumulate(
        self,
        micro_batches: list[SegmentBatch],
        proximal: list[torch.Tensor | None],
        reference: list[torch.Tensor | None],
        samples: list[Sample],
    ) -> tuple[float, torch.Tensor, torch.Tensor]:
        """Forward and backward every micro-batch, gradients summed into `.grad`. Returns
        the batch loss and the health sums and extremes (all-reduced over ranks)."""
        total_tokens = sum(int(s.loss_mask.sum()) for s in samples)
        total_seqs = sum(s.num_loss_seqs for s in samples)  # a step-wise sample: its turns
        entropy_mode = "grad" if self.algorithm.entropy_coef > 0 else "detached"
        dev = self.device
        loss_sum = torch.zeros((), dtype=torch.float64, device=dev)
        sums_total, extremes_total = None, None
        for mb, prox, ref in zip(micro_batches, proximal, reference, strict=True):
            logprobs, entropy = self._logprobs(self.model, mb, entropy=entropy_mode)
            inputs = loss_inputs(
                mb, logprobs, entropy=entropy, proximal_logprobs=prox, ref_logprobs=ref, device=dev
            )
            terms = policy_loss(inputs, self.algorithm)
            weights = token_weights(
                inputs.loss_mask,
                inputs.seq_ids,
                inputs.num_seqs,
                self.algorithm.loss_reduction,
                total_tokens=total_tokens,
                total_seqs=total_seqs,
            )
            mb_loss = (terms.loss * weights).sum()
            # FSDP divides gradients by the world size; the weights already normalise over
            # the whole batch, so scale back up to get the single-process gradient.
            (mb_loss * self.world_size).backward()
            loss_sum += mb_loss.detach().to(torch.float64)
            sums, extremes = health_sums(
                logprobs=logprobs,
                behaviour_logprobs=inputs.behaviour_logprobs,
                loss_mask=inputs.loss_mask,
                clipped=terms.clipped,
                entropy=entropy,
                kl_ref=terms.kl,
                importance_weight=terms.importance_weight,
                proximal_logprobs=prox,
                fresh=mb.versions.to(dev) == self.version,  # sampled by these very weights
            )
            sums_total = sums if sums_total is None else sums_total + sums
            extremes_total = (
                extremes if extremes_total is None else torch.maximum(extremes_total, extremes)
            )
        if self.distributed:
            dist.all_reduce(loss_sum)
            dist.all_reduce(sums_total)
            dist.all_reduce(extremes_total, op=dist.ReduceOp.MAX)
        return float(loss_sum), sums_total, extremes_total

    def _apply_update(self, loss_value: float, grad_norm: float) -> bool:
        """Clip, AdamW step, lr schedule and version += 1 when loss and gradient are finite;
        otherwise skip (count it). Gradients are cleared either way. Returns finiteness."""
        finite = math.isfinite(loss_value) and math.isfinite(grad_norm)
        if finite:
            if self.config.optim.grad_clip is not None:
                params = [p for p in self.model.parameters() if p.grad is not None]
                torch.nn.utils.clip_grads_with_norm_(
                    params, self.config.optim.grad_clip, torch.tensor(grad_norm, device=self.device)
                )
            self.optimizer.step()
            self.scheduler.step()
            self.version += 1
            self.consecutive_skips = 0
        else:
            self.consecutive_skips += 1
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return finite

    # ---- weights and checkpoints ---------------------------------------------------------

    def full_weights(self, *, dtype: torch.dtype | None = None):
        """(name, full tensor) per parameter on rank 0 (every rank must exhaust it); with
        LoRA the adapter's tensors only, named as PEFT saves them."""
        if self.lora:
            return adapter_parameters(self.model, dtype=dtype)
        return full_parameters(self.model, dtype=dtype)

    def _parts(self) -> dict:
        """What a checkpoint holds: with LoRA the adapter (the frozen base is model_path's)."""
        return {"model": self.model, "optimizer": self.optimizer, "scheduler": self.scheduler,
                "trainable_only": self.lora}  # fmt: skip

    def save(self, root: str | Path, state: TrainingState) -> Path:
        """Collective DCP save; `state.step`/`state.version` are overwritten from the trainer."""
        state.step, state.version = self.step, self.version
        extra_files = adapter_files(self.adapter_config)
        return save_checkpoint(root, state=state, extra_files=extra_files, **self._parts())

    def load(self, path: str | Path) -> TrainingState:
        """Collective DCP load; restores the step and version counters too."""
        state = load_checkpoint(path, **self._parts())
        self.step, self.version = state.step, state.version
        self.consecutive_skips = 0
        return state
