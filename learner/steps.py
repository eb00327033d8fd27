"""Which completed groups a training step may use (pure).

A group is dropped, and counted, when it cannot teach anything honestly:
- `errors`: fewer than two of its samples finished without an error (an `error:*` episode
  has no real reward, so it takes no part in the group's statistics);
- `future`: a token carries a version newer than the learner's. After a resume from a
  checkpoint older than the last announced version, actors still hold weights of the lost
  branch; what they generated comes from a policy this learner never had;
- `stale`: its oldest policy token is older than `version - max_staleness` (the bound).
Otherwise the error samples are removed (and counted as dropped `errors`) and the rest is
trained on.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from learner.batching import Group
from learner.staleness import is_too_stale, oldest_version


@dataclass(frozen=True)
class GroupDecision:
    group: Group | None
    """The trainable part of the group (None when dropped)."""
    drop_reason: str | None
    """Why the whole group was dropped (None when it is trained)."""
    error_ids: tuple[str, ...] = ()
    """Ids of error samples removed from a trained group (dropped, reason `errors`)."""


def is_error_episode(stop_reason: str) -> bool:
    return stop_reason.startswith("error")


def newest_version(versions) -> int | None:
    """Newest policy version over per-token version arrays, ignoring -1; None if none."""
    newest = None
    for array in versions:
        if array.size and int(array.max()) >= 0:
            high = int(np.max(array))
            newest = high if newest is None else max(newest, high)
    return newest


def decide_group(group: Group, *, version: int, max_staleness: int) -> GroupDecision:
    valid = [t for t in group.trajectories if not is_error_episode(t.stop_reason)]
    if len(valid) < 2:
        return GroupDecision(None, "errors")
    versions = [
        arrays.versions
        for t, arrays in zip(group.trajectories, group.tokens, strict=True)
        if not is_error_episode(t.stop_reason)
    ]
    newest = newest_version(versions)
    if newest is not None and newest > version:
        return GroupDecision(None, "future")
    if is_too_stale(oldest_version(versions), version, max_staleness):
        return GroupDecision(None, "stale")
    errors = tuple(t.trajectory_id for t in group.trajectories if is_error_episode(t.stop_reason))
    return GroupDecision(replace(group, trajectories=valid), None, errors)


def staleness_of(group: Group, version: int) -> int:
    """Versions between the group's oldest policy token and `version` (0 if it has none)."""
    oldest = oldest_version(arrays.versions for arrays in group.tokens)
    return 0 if oldest is None else version - oldest
