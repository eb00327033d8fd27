"""The `[learner]` config section: the trainer's fields (`TrainerConfig`: model, precision,
optimizer, algorithm, fine-tuning) and the bus side's (data, staleness, groups per step,
evals, checkpoints, the weight broadcast), in one flat section.

Pydantic only (no torch import), so `learner --help` and a bad config answer at once.
`max_staleness` is prime-rl's `async_level`. Cross-field rules raise a ValueError that says
what to change.
"""

from __future__ import annotations

from typing import Annotated, Literal

import pydantic

from common.config import StrictModel
from common.progress import ProgressSetting
from learner.difficulty import DifficultyConfig
from learner.trainer.config import TrainerConfig
from weights.config import WeightSyncConfig


class CheckpointConfig(StrictModel):
    """Where and how often DCP checkpoints are written."""

    dir: str = "runs/checkpoints"
    """Directory holding one step_XXXXXXXX/ subdirectory per checkpoint."""
    interval: int = pydantic.Field(default=50, ge=1)
    """Save every this many optimizer steps."""
    keep: int = pydantic.Field(default=2, ge=1)
    """Number of newest checkpoints kept on disk."""
    resume: bool = True
    """Continue from the newest complete checkpoint in `dir` if there is one."""


class BoundLimits(StrictModel):
    """An "auto" staleness bound's limits (learner/staleness.py, `AdaptiveBound`): when the
    learner counts as starved of data, and the off-policy health the bound stays inside."""

    starved_wait_fraction: float = pydantic.Field(default=0.3, gt=0, le=1)
    """The learner is starved when its data waits are at least this share of its wait +
    train time over the last `starved_steps` steps."""
    starved_steps: int = pydantic.Field(default=2, ge=1)
    """The steps that window spans; after a rise it fills anew before the next (one slow
    step is noise, and data arrives in bursts: a step that waited is often followed by one
    whose groups were all there)."""
    min_tool_fraction: float = pydantic.Field(default=0.35, ge=0, le=1)
    """A starved learner raises the bound only while its episodes spend at least this share
    of their time in env steps (tools) rather than generating (`rollout/all/
    tool_time_fraction`, averaged over the steps of the starved window). Below it the
    engines are the bottleneck: more episodes in flight would queue in them, and the older
    data would cost the correction's extra forward."""
    max_clip_fraction: float = pydantic.Field(default=0.2, gt=0)
    """The share of loss tokens whose ratio the PPO clip cut, above which the bound falls."""
    max_approx_kl: float = pydantic.Field(default=0.05, gt=0)
    """KL(behaviour || current) per token (PPO health's `approx_kl`) above which it falls."""


class LearnerConfig(TrainerConfig):
    """The `[learner]` section: the trainer's fields (learner/trainer/config.py) and the
    bus side's: data, staleness, batching by groups, evals, checkpoints, weights out."""

    train_data: str | None = None
    """SkyRL-format training prompts (JSONL or Parquet)."""
    eval_data: str | None = None
    """SkyRL-format eval prompts; None disables eval."""
    nproc: int = pydantic.Field(default=1, ge=1)
    """Number of learner ranks (torchrun processes)."""
    collective_timeout_s: float = pydantic.Field(default=600.0, gt=0)
    """Timeout of the ranks' own collectives (FSDP all-gathers and reduce-scatters; NCCL on
    GPU, where a collective stuck this long takes the rank down and torchrun the job). Ranks
    > 0 gather weights in step with rank 0 while it sends them, so it must exceed
    weight_sync.join_timeout_s + 2 x weight_sync.transfer_timeout_s."""
    command_timeout_s: float = pydantic.Field(default=86400.0, gt=0)
    """How long ranks > 0 wait for rank 0's next command. It travels over a CPU gloo group of
    its own, not NCCL: rank 0 may wait on the bus (first trajectories, evals, the drain) far
    longer than any collective should take. A rank 0 that dies closes its connections and the
    others stop at once; this bounds only a rank 0 that hangs."""
    seed: int = 0
    """Seed of the dataset order and of torch."""
    torch_threads: int | None = pydantic.Field(default=None, ge=1)
    """torch intra-op threads per rank; None keeps torch's default (one per core). On a
    machine shared with other busy processes 1 is often faster: an OpenMP team spins
    waiting for a member that the OS has descheduled."""
    max_staleness: Annotated[int, pydantic.Field(ge=0)] | Literal["auto"] = 1
    """Bound on policy lag in optimizer steps; 0 is the synchronous baseline. "auto": a
    bound that sets itself (learner/staleness.py, `AdaptiveBound`), starting at 1, raised
    while the learner waits on data and its PPO health holds, lowered when that health
    degrades, never above `max_staleness_limit`; the off-policy correction is on for the
    steps it is above 1 (learner/bound.py)."""
    max_staleness_limit: int = pydantic.Field(default=4, ge=1)
    """The ceiling of an "auto" bound (what an elastic fleet and the alert rules are sized for)."""
    max_staleness_auto: BoundLimits = BoundLimits()
    """When an "auto" bound rises and falls."""
    staleness_rule: Literal["group", "token"] = "group"
    """How a completed group older than the bound is treated (learner/staleness.py):
    `group` drops it whole; `token` clears the loss of each policy token older than the bound
    (counted) and trains the rest, dropping the group only when less than
    `min_fresh_fraction` of its loss tokens are within the bound."""
    min_fresh_fraction: float = pydantic.Field(default=0.5, gt=0, le=1)
    """`token` rule: the smallest fraction of a group's loss tokens that must be within the
    bound for the group to be trained."""
    prompts_per_step: int = pydantic.Field(default=8, ge=1)
    """Groups (prompts) per optimizer step."""
    group_size: int = pydantic.Field(default=8, ge=2)
    """Samples per prompt (GRPO group size)."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling: a complete group whose trainable samples all got one reward
    (all solved, all failed) has zero advantage everywhere and teaches nothing, so it is
    dropped as `filtered` and a replacement prompt is released; each step then trains
    `prompts_per_step` groups with signal (learner/steps.py)."""
    max_filtered_per_step: int = pydantic.Field(default=16, ge=0)
    """At most this many groups filtered per step: past it the step takes groups as they
    come, signal or not, and says so (a task set the policy has mastered, or cannot solve,
    would otherwise release prompts without end)."""
    difficulty: DifficultyConfig = DifficultyConfig()
    """Online difficulty filtering: saturated prompts visited less often (`enabled`)."""
    step_wise: bool = False
    """Step-wise trajectories (SkyRL's `step_wise_trajectories`): each assistant turn of an
    episode is its own sequence in the loss, with the episode's advantage. Changes what
    `seq_mean_*` reductions and GSPO call a sequence; `token_mean` is unchanged. Trained in
    one forward per episode (docs/learner.md)."""
    eval_interval: int | None = pydantic.Field(default=None, ge=1)
    """Run eval every this many steps; None never."""
    run_dir: str = "runs/learner"
    """Where the learner writes metrics.jsonl, eval dumps and weight snapshots."""
    progress: ProgressSetting = "auto"
    """The progress line on stdout, one per step and per eval, as `make run` shows it
    (common/progress.py): "auto" when stdout is a terminal (a learner started by hand),
    "always", or "never"."""
    metrics_port: int = pydantic.Field(default=9300, ge=0)
    """Port of the Prometheus /metrics endpoint (0: a free one)."""
    metrics_host: str = "127.0.0.1"
    """Address of the /metrics, /healthz and /readyz server; "0.0.0.0" in a cluster, where
    scrapers and probes come from outside the pod."""
    eval_samples_per_prompt: int = pydantic.Field(default=4, ge=1)
    """Samples per eval prompt: pass@1 is their mean success, pass@n any success."""
    drain_timeout_s: float = pydantic.Field(default=60.0, ge=0)
    """After the last step: how long to wait for released groups still being generated. They
    are counted as dropped (`unused`), so that every released prompt is accounted for."""
    eval_timeout_s: float = pydantic.Field(default=600.0, ge=0)
    """After the last step: how long to wait for evals still running."""
    broadcast_weights: bool = True
    """Broadcast new weights to the actors after every optimizer step."""
    snapshot_interval: int = pydantic.Field(default=10, ge=1)
    """Write a full weights snapshot every this many versions, for actors that join late."""
    snapshot_deltas: bool = False
    """The weights log: between snapshots, write every version as its change from the one
    before (bit patterns XORed, zstd; a few percent of the bytes at RL learning rates in
    bf16) beside them, and announce it. An actor that does not join the broadcast
    (`actor.weight_source = "store"`: outside the learner's network) then follows every
    version from the newest snapshot plus these deltas, bit for bit (docs/weights.md,
    "The weights log"). Costs a host copy of the model on rank 0 and an encode per
    version. Full weights only."""
    stall_snapshot_s: float = pydantic.Field(default=15.0, gt=0)
    """Waiting this long for data with a snapshot older than the current version, write and
    announce a snapshot of the current version. Engines that missed the broadcast (a
    restarted actor) catch up from it; without it they wait for a version that only their
    own data would let the learner reach."""
    weight_sync: WeightSyncConfig = WeightSyncConfig()
    """The weight broadcast group (the learner serves its TCPStore)."""
    checkpoint: CheckpointConfig = CheckpointConfig()
    """Checkpointing."""

    @property
    def adaptive_staleness(self) -> bool:
        return self.max_staleness == "auto"

    @property
    def staleness_ceiling(self) -> int:
        """The largest bound this run may use: a fixed bound, or an "auto" bound's limit.
        What is sized for the worst case (buffers, fleets, alert rules) is sized for it."""
        return self.max_staleness_limit if self.max_staleness == "auto" else self.max_staleness

    @pydantic.model_validator(mode="after")
    def _check_learner(self) -> LearnerConfig:
        if self.eval_interval is not None and self.eval_data is None:
            raise ValueError("eval_interval is set but eval_data is not")
        if self.snapshot_deltas and self.finetune.mode == "lora":
            raise ValueError(
                "snapshot_deltas with finetune.mode = 'lora': the weights log holds full "
                "weights; an adapter's snapshots are small already (set snapshot_deltas = false)"
            )
        sync = self.weight_sync
        if self.collective_timeout_s <= sync.join_timeout_s + 2 * sync.transfer_timeout_s:
            raise ValueError(
                f"collective_timeout_s ({self.collective_timeout_s}) must exceed "
                f"weight_sync.join_timeout_s + 2 x transfer_timeout_s "
                f"({sync.join_timeout_s + 2 * sync.transfer_timeout_s}): the other ranks wait "
                "in the weight gather while rank 0 sends"
            )
        return self
