"""From trajectories off the bus to the tensors of one micro-batch (pure: no I/O, no collectives).

1. `GroupAssembler` collects trajectories into GRPO groups by `group_id`; a group is
   complete when `group_size` distinct samples arrived. It is idempotent on
   `trajectory_id` (JetStream may redeliver; a duplicate is ignored and counted), and a
   second trajectory for an already filled `(group_id, sample_index)` is ignored too.
2. `samples_from_groups` computes each trajectory's advantage within its group and decodes
   its packed token arrays (zero copy) into a `Sample`.
3. `plan_micro_batches` spreads samples over ranks (balanced by tokens, longest first) and
   packs each rank's samples into micro-batches of at most `token_budget` tokens
   (first-fit decreasing; a longer sequence gets a micro-batch of its own). Every rank gets
   the same number of micro-batches (padded with empty ones), because each FSDP forward is
   a collective all ranks must join. The plan is a deterministic function of the lengths,
   so every rank computes the same plan from the same batch.
4. `collate` concatenates a micro-batch padding-free: one row `[1, N]` with position ids
   restarting at 0 per sequence (transformers then builds a block-diagonal causal mask for
   sdpa/eager, and flash-attention uses the same position ids), plus `cu_seqlens`. Chosen
   over padding because agent trajectories vary from hundreds to 100K+ tokens: padding a
   micro-batch to its longest member would waste most of the compute, and a token budget
   bounds memory exactly.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import torch

from broker.codec import TokenArrays, token_arrays
from broker.wire import Trajectory
from learner.advantages import compute_advantages


@dataclass
class Group:
    """All `group_size` samples of one prompt, ordered by sample index. Their packed token
    arrays are decoded once, here (zero-copy views of the message bytes), for everyone
    downstream: staleness decisions, advantages and batching, reports."""

    group_id: str
    step: int
    env_class: str
    trajectories: list[Trajectory]
    tokens: list[TokenArrays] = field(init=False, repr=False)
    """`token_arrays` of each trajectory, in the same order."""

    def __post_init__(self) -> None:
        self.tokens = [token_arrays(t) for t in self.trajectories]

    @property
    def rewards(self) -> list[float]:
        return [t.reward for t in self.trajectories]

    @property
    def trajectory_ids(self) -> list[str]:
        return [t.trajectory_id for t in self.trajectories]


@dataclass
class GroupAssembler:
    """Collects trajectories into complete groups; ignores and counts duplicates.

    `seen_ids` seeds the set of trajectory ids already handled (from a checkpoint), so a
    restarted learner does not train twice on a redelivered trajectory. It is bounded by
    `forget`: the learner forgets ids once no copy of them can come back (learner/intake.py).
    """

    seen_ids: set[str] = field(default_factory=set)
    num_duplicates: int = 0
    _pending: dict[str, dict[int, Trajectory]] = field(default_factory=dict)

    @property
    def num_pending_groups(self) -> int:
        return len(self._pending)

    def forget(self, ids: Iterable[str]) -> None:
        """Stop remembering `ids` (handled long enough ago that no copy can arrive again)."""
        self.seen_ids.difference_update(ids)

    def add(self, trajectory: Trajectory) -> Group | None:
        """Add one trajectory; return its group if this completed it, else None."""
        if trajectory.trajectory_id in self.seen_ids:
            self.num_duplicates += 1
            return None
        samples = self._pending.setdefault(trajectory.group_id, {})
        if samples:
            first = next(iter(samples.values()))
            if first.group_size != trajectory.group_size:
                raise ValueError(
                    f"trajectory {trajectory.trajectory_id!r} says group {trajectory.group_id!r} "
                    f"has {trajectory.group_size} samples, an earlier one said {first.group_size}"
                )
        if trajectory.sample_index in samples:
            self.num_duplicates += 1
            return None
        self.seen_ids.add(trajectory.trajectory_id)
        samples[trajectory.sample_index] = trajectory
        if len(samples) < trajectory.group_size:
            return None
        del self._pending[trajectory.group_id]
        ordered = [samples[i] for i in sorted(samples)]
        return Group(
            group_id=trajectory.group_id,
            step=min(t.step for t in ordered),
            env_class=trajectory.env_class,
            trajectories=ordered,
        )


@dataclass(frozen=True)
class Sample:
    """One trajectory as the trainer sees it: token arrays `[T]` and its advantage."""

    token_ids: np.ndarray  # [T] int32
    loss_mask: np.ndarray  # [T] uint8
    behaviour_logprobs: np.ndarray  # [T] float32
    versions: np.ndarray  # [T] int32
    advantage: float
    trajectory_id: str
    group_id: str
    env_class: str

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


def samples_from_groups(
    groups: Iterable[Group], *, estimator: str, normalize_std: bool = True, eps: float = 1e-6
) -> list[Sample]:
    """Advantages per group and decoded token arrays; group order, then sample order."""
    samples = []
    for group in groups:
        rewards = torch.tensor([group.rewards], dtype=torch.float32)  # [1, K]
        advantages = compute_advantages(rewards, estimator, normalize_std=normalize_std, eps=eps)
        for trajectory, arrays, advantage in zip(
            group.trajectories, group.tokens, advantages[0].tolist(), strict=True
        ):
            loss_mask = arrays.loss_mask
            if len(loss_mask) and loss_mask[0]:
                # The first token has no preceding logits to predict it from.
                loss_mask = loss_mask.copy()
                loss_mask[0] = 0
            samples.append(
                Sample(
                    token_ids=arrays.token_ids,
                    loss_mask=loss_mask,
                    behaviour_logprobs=arrays.logprobs,
                    versions=arrays.versions,
                    advantage=advantage,
                    trajectory_id=trajectory.trajectory_id,
                    group_id=group.group_id,
                    env_class=group.env_class,
                )
            )
    return samples


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
