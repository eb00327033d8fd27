"""Which completed groups a training step may use (pure).

A sample is never trained on when (`sample_problem`, the reason it is counted under):
- `errors`: it is an error episode (`error:*` stop reason): it has no real reward;
- `nonfinite_reward`: its reward is NaN or infinite (an env or a wire bug);
- `nonfinite_logprobs`: a behaviour logprob of one of its loss tokens is NaN or infinite;
- `bad_tokens`: a token id outside the model's vocabulary (it would crash the embedding);
- `bad_loss_mask`: a loss mask value other than 0 or 1;
- `bad_segments`: an agent episode's conversation starts (`segment_starts`) that are not
  ascending positions inside its tokens.
Such samples are removed from their group and counted as dropped under that reason; they
take no part in the group's statistics. The wire codec already refused anything whose byte
arrays disagree in length (broker/codec.py); these are the checks of their contents.

A group is dropped whole, and counted, when it cannot teach anything honestly:
- fewer than two of its samples are trainable (reason: the most common problem, `errors`
  when none has one);
- `future`: a token carries a version newer than the learner's. After a resume from a
  checkpoint older than the last announced version, actors still hold weights of the lost
  branch; what they generated comes from a policy this learner never had;
- `stale`: its oldest policy token is older than `version - max_staleness`, the bound in
  force when its prompt was released (the group says it; an actor that does not, the
  learner's own);
  under the `token` rule (learner/staleness.py), only when fewer than `min_fresh_fraction`
  of its loss tokens are within the bound: otherwise the stale tokens' loss mask is cleared
  (`GroupDecision.masked_stale_tokens`) and the rest is trained;
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
from learner.batching import Group, conversations
from learner.ledger import FILTERED
from learner.staleness import fresh_fraction, is_too_stale, oldest_version, stale_tokens


@dataclass(frozen=True)
class GroupDecision:
    group: Group | None
    """The trainable part of the group (None when dropped)."""
    drop_reason: str | None
    """Why the whole group was dropped (None when it is trained)."""
    removed: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Ids of samples removed from a trained group, by the reason they are dropped."""
    masked_stale_tokens: int = 0
    """Loss tokens of the trained group whose loss the `token` rule cleared."""


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
    try:
        conversations(len(ids), trajectory.segment_starts)
    except ValueError:
        return "bad_segments"
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
    staleness_rule: str = "group",
    min_fresh_fraction: float = 0.5,
) -> GroupDecision:
    problems = [
        sample_problem(t, arrays, vocab_size=vocab_size)
        for t, arrays in zip(group.trajectories, group.tokens, strict=True)
    ]
    valid = [i for i, problem in enumerate(problems) if problem is None]
    if len(valid) < 2:
        found = Counter(p for p in problems if p is not None)
        return GroupDecision(None, found.most_common(1)[0][0] if found else "errors")
    if group.max_staleness is not None:  # the bound it was released under
        max_staleness = group.max_staleness
    versions = [group.tokens[i].versions for i in valid]
    newest = newest_version(versions)
    if newest is not None and newest > version:
        return GroupDecision(None, "future")
    if staleness_rule == "token":
        masks = [group.tokens[i].loss_mask for i in valid]
        fresh = fresh_fraction(versions, masks, version, max_staleness)
        if fresh is not None and fresh < min_fresh_fraction:
            return GroupDecision(None, "stale")
    elif is_too_stale(oldest_version(versions), version, max_staleness):
        return GroupDecision(None, "stale")
    if filter_no_signal and len({group.trajectories[i].reward for i in valid}) == 1:
        return GroupDecision(None, FILTERED)
    removed: dict[str, tuple[str, ...]] = {}
    for t, problem in zip(group.trajectories, problems, strict=True):
        if problem is not None:
            removed[problem] = (*removed.get(problem, ()), t.trajectory_id)
    trainable = replace(group, trajectories=[group.trajectories[i] for i in valid])
    masked = 0
    if staleness_rule == "token":
        trainable.tokens, masked = without_stale_loss(trainable.tokens, version, max_staleness)
    return GroupDecision(trainable, None, removed, masked)


def without_stale_loss(
    tokens: list[TokenArrays], version: int, max_staleness: int
) -> tuple[list[TokenArrays], int]:
    """The token arrays with the loss mask cleared on policy tokens older than the bound,
    and how many loss tokens that cleared."""
    out, masked = [], 0
    for arrays in tokens:
        stale = stale_tokens(arrays.versions, version, max_staleness) & (arrays.loss_mask != 0)
        if stale.any():
            masked += int(stale.sum())
            arrays = arrays._replace(
                loss_mask=np.where(stale, 0, arrays.loss_mask).astype(np.uint8)
            )
        out.append(arrays)
    return out, masked


def staleness_of(group: Group, version: int) -> int:
    """Versions between the group's oldest trained policy token and `version` (0 if it has
    none): its loss tokens, or all its policy tokens when none carries loss (a group whose
    loss was masked whole, e.g. by overlong filtering)."""
    trained = [arrays.versions[arrays.loss_mask != 0] for arrays in group.tokens]
    oldest = oldest_version(trained)
    if oldest is None:
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
