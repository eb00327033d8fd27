"""Which completed groups a training step may use (pure).

A sample is never trained on when (`sample_problem`, the reason it is counted under):
- `errors`: it is an error episode (`error:*` stop reason): it has no real reward;
- `nonfinite_reward`: its reward is NaN or infinite (an env or a wire bug);
- `nonfinite_logprobs`: a behaviour logprob of one of its loss tokens is NaN or infinite;
- `bad_tokens`: a token id outside the model's vocabulary (it would crash the embedding);
- `bad_loss_mask`: a loss mask value other than 0 or 1.
Such samples are removed from their group and counted as dropped under that reason; they
take no part in the group's statistics. The wire codec already refused anything whose byte
arrays disagree in length (broker/codec.py); these are the checks of their contents.

A group is dropped whole, and counted, when it cannot teach anything honestly:
- fewer than two of its samples are trainable (reason: the most common problem, `errors`
  when none has one);
- `future`: a token carries a version newer than the learner's. After a resume from a
  checkpoint older than the last announced version, actors still hold weights of the lost
  branch; what they generated comes from a policy this learner never had;
- `stale`: its oldest policy token is older than `version - max_staleness` (the bound);
- `filtered` (with `filter_no_signal`, learner.dynamic_sampling): its trainable samples all
  got the same reward, so every advantage is zero and it would teach nothing.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, replace

import numpy as np

from broker.codec import TokenArrays
from broker.wire import Trajectory
from learner.batching import Group
from learner.ledger import FILTERED
from learner.staleness import is_too_stale, oldest_version


@dataclass(frozen=True)
class GroupDecision:
    group: Group | None
    """The trainable part of the group (None when dropped)."""
    drop_reason: str | None
    """Why the whole group was dropped (None when it is trained)."""
    removed: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Ids of samples removed from a trained group, by the reason they are dropped."""


def is_error_episode(stop_reason: str) -> bool:
    return stop_reason.startswith("error")


def sample_problem(
    trajectory: Trajectory, arrays: TokenArrays, *, vocab_size: int | None = None
) -> str | None:
    """Why this sample must not be trained on (see the module docstring), or None."""
    if is_error_episode(trajectory.stop_reason):
        return "errors"
    if not math.isfinite(trajectory.reward):
        return "nonfinite_reward"
    if not np.isfinite(arrays.logprobs[arrays.loss_mask != 0]).all():
        return "nonfinite_logprobs"
    ids = arrays.token_ids
    if ids.size and (int(ids.min()) < 0 or (vocab_size is not None and ids.max() >= vocab_size)):
        return "bad_tokens"
    if arrays.loss_mask.size and int(arrays.loss_mask.max()) > 1:
        return "bad_loss_mask"
    return None


def newest_version(versions) -> int | None:
    """Newest policy version over per-token version arrays, ignoring -1; None if none."""
    newest = None
    for array in versions:
        if array.size and int(array.max()) >= 0:
            high = int(np.max(array))
            newest = high if newest is None else max(newest, high)
    return newest


def decide_group(
    group: Group,
    *,
    version: int,
    max_staleness: int,
    vocab_size: int | None = None,
    filter_no_signal: bool = False,
) -> GroupDecision:
    problems = [
        sample_problem(t, arrays, vocab_size=vocab_size)
        for t, arrays in zip(group.trajectories, group.tokens, strict=True)
    ]
    valid = [i for i, problem in enumerate(problems) if problem is None]
    if len(valid) < 2:
        found = Counter(p for p in problems if p is not None)
        return GroupDecision(None, found.most_common(1)[0][0] if found else "errors")
    versions = [group.tokens[i].versions for i in valid]
    newest = newest_version(versions)
    if newest is not None and newest > version:
        return GroupDecision(None, "future")
    if is_too_stale(oldest_version(versions), version, max_staleness):
        return GroupDecision(None, "stale")
    if filter_no_signal and len({group.trajectories[i].reward for i in valid}) == 1:
        return GroupDecision(None, FILTERED)
    removed: dict[str, tuple[str, ...]] = {}
    for t, problem in zip(group.trajectories, problems, strict=True):
        if problem is not None:
            removed[problem] = (*removed.get(problem, ()), t.trajectory_id)
    trainable = replace(group, trajectories=[group.trajectories[i] for i in valid])
    return GroupDecision(trainable, None, removed)


def staleness_of(group: Group, version: int) -> int:
    """Versions between the group's oldest policy token and `version` (0 if it has none)."""
    oldest = oldest_version(arrays.versions for arrays in group.tokens)
    return 0 if oldest is None else version - oldest


def empty_step_warning(step: int, groups: list[Group]) -> str:
    """What to say of a step that trained on no loss token: nothing was learned. The usual
    cause is every response cut at its token limit (stop reason `length`), whose loss the
    actor's overlong filtering masks; a model that never emits EOS (random or untrained
    weights, or a tokenizer other than the model's) does exactly that."""
    reasons = Counter(t.stop_reason for g in groups for t in g.trajectories)
    shown = ", ".join(f"{reason} {n}" for reason, n in reasons.most_common())
    return (
        f"step {step} had no loss token in any of its {sum(reasons.values())} samples "
        f"(stop reasons: {shown}): nothing was learned. Responses cut at their limit have no "
        "loss with actor.rollout.overlong_filtering (on by default); a model that never ends "
        "its turn (random weights, or another tokenizer's EOS) gives only those"
    )
