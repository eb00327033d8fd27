"""Which completed groups a training step may use (pure).

A group is dropped, and counted, when it cannot teach anything honestly:
- `stale`: its oldest policy token is older than `version - max_staleness` (the bound);
- `errors`: fewer than two of its samples finished without an error (an `error:*` episode
  has no real reward, so it takes no part in the group's statistics).
Otherwise the error samples are removed and the rest is trained on.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from broker.codec import token_arrays
from learner.batching import Group
from learner.staleness import is_too_stale, oldest_version


@dataclass(frozen=True)
class GroupDecision:
    group: Group | None
    """The trainable part of the group (None when dropped)."""
    drop_reason: str | None


def is_error_episode(stop_reason: str) -> bool:
    return stop_reason.startswith("error")


def decide_group(group: Group, *, version: int, max_staleness: int) -> GroupDecision:
    valid = [t for t in group.trajectories if not is_error_episode(t.stop_reason)]
    if len(valid) < 2:
        return GroupDecision(None, "errors")
    oldest = oldest_version(token_arrays(t).versions for t in valid)
    if is_too_stale(oldest, version, max_staleness):
        return GroupDecision(None, "stale")
    return GroupDecision(replace(group, trajectories=valid), None)


def staleness_of(group: Group, version: int) -> int:
    """Versions between the group's oldest policy token and `version` (0 if it has none)."""
    oldest = oldest_version(token_arrays(t).versions for t in group.trajectories)
    return 0 if oldest is None else version - oldest
