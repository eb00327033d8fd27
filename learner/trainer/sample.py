"""`Sample`: one trajectory as the trainer sees it, the seam between the two sides of the
learner. The bus side (learner/batching.py) decodes trajectories off the wire into samples
with their advantages; the trainer plans, packs and trains them knowing nothing of the bus.
Pure: numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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
