"""From trajectories off the bus to the samples the trainer plans (pure: no I/O, no collectives).

1. `GroupAssembler` collects trajectories into GRPO groups by `group_id`; a group is
   complete when `group_size` distinct samples arrived. It is idempotent on
   `trajectory_id` (JetStream may redeliver; a duplicate is ignored and counted), and a
   second trajectory for an already filled `(group_id, sample_index)` is ignored too.
2. `samples_from_groups` computes each trajectory's advantage within its group and decodes
   its packed token arrays (zero copy) into a `Sample`.

Micro-batches are planned and laid out by learner/prefix_plan.py and learner/segments.py:
a group's common prefix is trained once, and sequences meet in a packed row without a dense
mask. Packing (not padding), because agent trajectories vary from hundreds to 100K+ tokens:
padding a micro-batch to its longest member would waste most of the compute, and a token
budget bounds memory exactly.
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
    step_starts: np.ndarray | None = None
    """Step-wise trajectories: the position where each step (an assistant turn: a run of
    loss tokens) begins, ascending; each step is its own sequence in the loss reduction.
    None: the whole sample is one sequence."""

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_seqs(self) -> int:
        """Sequences this sample lays out (one per step; a whole sample always one)."""
        return 1 if self.step_starts is None else len(self.step_starts)

    @property
    def num_loss_seqs(self) -> int:
        """Sequences with at least one loss token (what a sequence mean divides by)."""
        return self.num_seqs if self.step_starts is not None else int(self.loss_mask.any())

    def seq_index(self, positions: np.ndarray) -> np.ndarray:
        """The sequence (step) within this sample of each of its loss-token `positions`."""
        if self.step_starts is None:
            return np.zeros(len(positions), dtype=np.int64)
        return np.searchsorted(self.step_starts, positions, side="right") - 1


def step_starts(loss_mask: np.ndarray) -> np.ndarray:
    """Where each run of loss tokens begins: the turns of a token-in/token-out episode
    (the actor masks exactly the policy's tokens; observations between turns are 0)."""
    mask = np.asarray(loss_mask, dtype=bool)
    return np.flatnonzero(mask & ~np.concatenate([[False], mask[:-1]]))


def samples_from_groups(
    groups: Iterable[Group],
    *,
    estimator: str,
    normalize_std: bool = True,
    eps: float = 1e-6,
    step_wise: bool = False,
) -> list[Sample]:
    """Advantages per group and decoded token arrays; group order, then sample order.
    `step_wise`: each turn of an episode is its own sequence in the loss, sharing the
    episode's advantage (docs/learner.md, step-wise trajectories)."""
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
                    step_starts=step_starts(loss_mask) if step_wise else None,
                )
            )
    return samples
