"""From trajectories off the bus to the samples the trainer plans (pure: no I/O, no collectives).

1. `GroupAssembler` collects trajectories into GRPO groups by `group_id`; a group is
   complete when `group_size` distinct samples arrived. It is idempotent on
   `trajectory_id` (JetStream may redeliver; a duplicate is ignored and counted), and a
   second trajectory for an already filled `(group_id, sample_index)` is ignored too.
2. `samples_from_groups` computes each trajectory's advantage within its group and decodes
   its packed token arrays (zero copy) into a `Sample`, one per conversation of an agent
   episode of several (each its own sequence, all with the episode's advantage).

Micro-batches are planned and laid out by learner/trainer/prefix_plan.py and
learner/trainer/segments.py: a group's common prefix is trained once, and sequences meet in
a packed row without a dense mask. Packing (not padding), because agent trajectories vary
from hundreds to 100K+ tokens: padding a micro-batch to its longest member would waste most
of the compute, and a token budget bounds memory exactly.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from broker.codec import TokenArrays, token_arrays
from broker.wire import Trajectory
from learner.advantages import compute_advantages
from learner.trainer.config import AlgorithmConfig
from learner.trainer.sample import Sample, step_starts

DEFAULT_ALGORITHM = AlgorithmConfig()


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

    @property
    def max_staleness(self) -> int | None:
        """The bound in force when its prompt was released; None when its actor did not say
        (the learner's own bound applies)."""
        said = self.trajectories[0].max_staleness if self.trajectories else -1
        return said if said >= 0 else None


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


def conversations(num_tokens: int, segment_starts: list[int]) -> list[tuple[int, int]]:
    """(start, end) of each conversation of a trajectory (`Trajectory.segment_starts`: an
    agent episode of several; one span for any other). ValueError for starts that are not
    ascending positions inside the arrays (a malformed trajectory, never trained)."""
    bounds = [0, *segment_starts, num_tokens]
    if any(a >= b for a, b in zip(bounds, bounds[1:])):  # noqa: B905 (offset pairs)
        raise ValueError(
            f"segment_starts {segment_starts} are not ascending positions inside "
            f"{num_tokens} tokens"
        )
    return list(zip(bounds, bounds[1:]))  # noqa: B905


def samples_from_groups(
    groups: Iterable[Group],
    *,
    algorithm: AlgorithmConfig = DEFAULT_ALGORITHM,
    step_wise: bool = False,
) -> list[Sample]:
    """Advantages per group and decoded token arrays; group order, then sample order.
    `step_wise`: each turn of an episode is its own sequence in the loss, sharing the
    episode's advantage (docs/learner.md, step-wise trajectories)."""
    samples = []
    for group in groups:
        rewards = torch.tensor([group.rewards], dtype=torch.float32)  # [1, K]
        advantages = compute_advantages(rewards, algorithm)
        for trajectory, arrays, advantage in zip(
            group.trajectories, group.tokens, advantages[0].tolist(), strict=True
        ):
            spans = conversations(len(arrays.token_ids), trajectory.segment_starts)
            for k, (start, end) in enumerate(spans):
                loss_mask = arrays.loss_mask[start:end]
                if len(loss_mask) and loss_mask[0]:
                    # The first token has no preceding logits to predict it from.
                    loss_mask = loss_mask.copy()
                    loss_mask[0] = 0
                samples.append(
                    Sample(
                        token_ids=arrays.token_ids[start:end],
                        loss_mask=loss_mask,
                        behaviour_logprobs=arrays.logprobs[start:end],
                        versions=arrays.versions[start:end],
                        advantage=advantage,
                        trajectory_id=trajectory.trajectory_id + (f"#{k}" if k else ""),
                        group_id=group.group_id,
                        env_class=group.env_class,
                        step_starts=step_starts(loss_mask) if step_wise else None,
                    )
                )
    return samples
