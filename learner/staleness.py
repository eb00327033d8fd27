"""The tether: pure rules that bound how far behind the policy a trained token may be.

The policy version `v` is the number of optimizer steps taken. Prompts for training step `s`
are generated at some version and trained on when the learner is at version `s` (step `s`
is the update that takes the policy from `s` to `s + 1`).

- Admission (dispatcher): release the prompts for step `s` only once `v >= s - max_staleness`.
  So a token trained at step `s` was generated at a version of at least `s - max_staleness`.
- Consumption (learner): a group whose oldest policy token has version `o` is too stale at
  version `v` when `o < v - max_staleness`; it is dropped and counted, never trained on.
  Admission alone cannot promise this (a slow actor may still be generating a released
  prompt after many updates), so both rules are needed.
- `max_staleness = 0` is the synchronous baseline: prompts for step `s` wait for version `s`,
  and only tokens of the current version are trained on.

Consumption has two granularities (`learner.staleness_rule`):
- `group` (the default): the rule above; one stale token drops the whole group.
- `token`: a policy token older than the bound gets no loss (its loss mask is cleared, and it
  is counted); the rest of its episode is trained with its own behaviour logprobs. A long
  episode that spans weight updates keeps its fresh turns instead of being thrown away. The
  group is dropped as `stale` only when fewer than `min_fresh_fraction` of its loss tokens
  are within the bound (too little of it left to learn from). Advantages stay per episode.

Versions of -1 mark tokens no policy produced (prompt, observations); they never count.

`AdaptiveBound` (below) is the controller of a bound that sets itself from the learner's
data wait and PPO health (`learner.max_staleness = "auto"`; learner/bound.py runs it). Its
groups are consumed by the bound in force when each was released, which they carry.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable

import numpy as np

from learner.config import BoundLimits


def check_max_staleness(max_staleness: int) -> None:
    """The one check of the bound (the config's field says `ge=0` as well, for its error)."""
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")


def release_horizon(version: int, max_staleness: int) -> int:
    """The first training step whose prompts may not be released yet at `version`: steps
    `s < version + max_staleness + 1` satisfy `version >= s - max_staleness`."""
    check_max_staleness(max_staleness)
    return version + max_staleness + 1


def may_release(step: int, version: int, max_staleness: int) -> bool:
    """May the dispatcher release the prompts meant for training step `step` now?"""
    return step < release_horizon(version, max_staleness)


def oldest_allowed_version(step: int, max_staleness: int) -> int:
    """The oldest policy version that may generate a prompt meant for step `step` (its
    task's `min_version`): tokens older than that would be dropped as stale at step `step`."""
    check_max_staleness(max_staleness)
    return max(0, step - max_staleness)


def oldest_version(versions: Iterable[np.ndarray]) -> int | None:
    """Oldest policy version over the given per-token version arrays (one per trajectory of
    a group), ignoring -1; None when no token came from a policy."""
    oldest = None
    for array in versions:
        produced = array[array >= 0]
        if produced.size:
            low = int(produced.min())
            oldest = low if oldest is None else min(oldest, low)
    return oldest


def is_too_stale(oldest: int | None, version: int, max_staleness: int) -> bool:
    """Must a group whose oldest policy token has version `oldest` be dropped at `version`?
    A group without policy tokens (`oldest is None`) is never stale."""
    check_max_staleness(max_staleness)
    return oldest is not None and oldest < version - max_staleness


STALENESS_RULES = ("group", "token")


def stale_tokens(versions: np.ndarray, version: int, max_staleness: int) -> np.ndarray:
    """Which tokens are policy tokens older than the bound at `version` (bool, per token)."""
    check_max_staleness(max_staleness)
    return (versions >= 0) & (versions < version - max_staleness)


def fresh_fraction(
    versions: Iterable[np.ndarray],
    loss_masks: Iterable[np.ndarray],
    version: int,
    max_staleness: int,
) -> float | None:
    """The fraction of loss tokens (over a group's trajectories) within the bound at
    `version`; None when there is no loss token at all."""
    num_loss = num_fresh = 0
    for array, mask in zip(versions, loss_masks, strict=True):
        loss = mask != 0
        num_loss += int(loss.sum())
        num_fresh += int((loss & ~stale_tokens(array, version, max_staleness)).sum())
    return None if num_loss == 0 else num_fresh / num_loss


def version_span(versions: np.ndarray) -> int:
    """Policy versions one episode's tokens span: its newest token's version minus its
    oldest's (0 for an episode generated under one version, or with no policy token). An
    agentic episode whose tool calls outlast weight updates spans several."""
    produced = versions[versions >= 0]
    return int(produced.max() - produced.min()) if produced.size else 0


def staleness_histogram(
    versions: Iterable[np.ndarray], current_version: int, num_buckets: int
) -> list[int]:
    """Policy tokens counted by staleness `current_version - token_version`.

    Bucket k (k < num_buckets - 1) counts tokens exactly k versions old; the last bucket
    counts those `num_buckets - 1` or more versions old. A token from a *newer* version than
    `current_version` (impossible unless versions are mislabelled) raises ValueError.
    """
    if num_buckets < 1:
        raise ValueError(f"num_buckets must be >= 1, got {num_buckets}")
    counts = np.zeros(num_buckets, dtype=np.int64)
    for array in versions:
        produced = array[array >= 0].astype(np.int64)
        staleness = current_version - produced
        if staleness.size and staleness.min() < 0:
            raise ValueError(
                f"token version {int(produced.max())} is newer than the learner's {current_version}"
            )
        counts += np.bincount(np.minimum(staleness, num_buckets - 1), minlength=num_buckets)
    return counts.tolist()


# ---- an adaptive bound ------------------------------------------------------------------------
#
# The bound that suits a run depends on its tools: with slow ones the learner waits on data at
# bound 1 and a larger bound buys throughput; with fast ones it buys little and costs
# off-policy drift. `AdaptiveBound` moves the bound by at most one a step, between 1 and a
# ceiling, from what the learner measures anyway: its wait for data against its train time over
# the last few steps (starved: raise) and the PPO health of its last step (clip fraction, approx
# KL of the behaviour policy to the current one: past their limits, lower at once).


class AdaptiveBound:
    """The bound in force, moved once per step by `observe` (pure: the numbers in, the bound
    out); `state` / `from_state` carry it through a checkpoint."""

    def __init__(self, ceiling: int, limits: BoundLimits | None = None, bound: int = 1) -> None:
        if ceiling < 1:
            raise ValueError(f"an adaptive bound needs a ceiling of at least 1, got {ceiling}")
        check_max_staleness(bound)
        self.ceiling = ceiling
        self.limits = limits if limits is not None else BoundLimits()
        self.bound = min(max(bound, 1), ceiling)
        self.window: list[tuple[float, float, float | None]] = []
        """(wait s, train s, tool fraction or None) of the last healthy steps since the
        bound last moved."""

    def observe(
        self,
        *,
        wait_s: float,
        train_s: float,
        health: dict[str, float],
        tool_fraction: float | None = None,
    ) -> int:
        """The bound for the next step, after a step that waited `wait_s` for data, trained
        for `train_s` and left `health` (PPO health's metrics; missing ones count healthy),
        on episodes that spent `tool_fraction` of their time in tools (None: not known, the
        data wait alone decides)."""
        limits = self.limits
        if (
            health.get("clip_fraction", 0.0) > limits.max_clip_fraction
            or health.get("approx_kl", 0.0) > limits.max_approx_kl
        ):
            self.bound, self.window = max(self.bound - 1, 1), []
            return self.bound
        self.window = [*self.window, (wait_s, train_s, tool_fraction)][-limits.starved_steps :]
        waited = sum(wait for wait, _, _ in self.window)
        busy = waited + sum(train for _, train, _ in self.window)
        full = len(self.window) == limits.starved_steps
        starved = full and busy > 0 and waited / busy >= limits.starved_wait_fraction
        # Judged over the same window as the wait: one step's episodes can read high (a tail
        # of slow tool calls, a pause in the agent's own process) while the window's do not.
        known = [fraction for _, _, fraction in self.window if fraction is not None]
        tool_bound = not known or statistics.fmean(known) >= limits.min_tool_fraction
        if starved and tool_bound:
            self.bound, self.window = min(self.bound + 1, self.ceiling), []
        return self.bound

    def needs_correction(self) -> bool:
        """Past bound 1 the behaviour policy may be several updates old: the configured
        off-policy correction (TIS, decoupled PPO) must be on."""
        return self.bound > 1

    def state(self) -> dict:
        return {"bound": self.bound, "window": [list(step) for step in self.window]}

    @classmethod
    def from_state(
        cls, state: dict, ceiling: int, limits: BoundLimits | None = None
    ) -> AdaptiveBound:
        """The controller a checkpoint saved, under the config's `ceiling` now (a bound
        above a lowered ceiling comes down to it)."""
        restored = cls(ceiling, limits, state["bound"])
        # A checkpoint from before tool fractions were kept holds (wait, train): not known.
        restored.window = [tuple([*step, None][:3]) for step in state["window"]]
        return restored
