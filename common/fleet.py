"""How many actor replicas a run wants: one rule for every target (Ray's launcher, the
Kubernetes overlay's KEDA and HPA objects, deploy/fleet_sim.py's simulator).

    work       = pending + ack_pending of the prompts queue  (groups released, not finished)
    sustained  = the lowest work of the last scale_up_after_s
    held       = the mean work of the last scale_down_after_s
    want       = ceil(max(sustained, held) / groups_per_replica),
                 within [min_replicas, max_replicas]

The learner releases at most `(max_staleness + 1) * prompts_per_step` groups ahead of
training (learner/dispatcher.py), so more replicas than `ceil` of that over one replica's
groups would only wait: that is `max_replicas` unless the config lowers it. While actors
are the bottleneck the released window stays full of unfinished groups and the fleet grows;
while the learner is, the window holds few and it shrinks.

Work jumps with every release (a step's prompts arrive at once), so neither reading alone
sizes the fleet. `sustained` grows it only for work that lasted a whole window (a burst
shorter than that adds nothing); `held` is the groups in flight on average (Little's law:
what the fleet's room must hold), which keeps it while the mean needs it and shrinks it once
the mean falls, not at the peak of every release. The fleet grows to `want` at once and
shrinks only to the largest `want` of the last `scale_down_after_s` (as Kubernetes' HPA
does with its scale-down stabilization window), never shorter than `engine_start_s`, so a
replica just paid for is not dropped in a lull. `FleetSizer` is that, pure (time is an
argument); deploy/k8s_elastic.py writes the same as one PromQL query and HPA behavior.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import pydantic

from common.config import StrictModel

LEAVE_MARGIN_S = 60
"""A leaving replica's time past actor.drain_timeout_s: its last pulls expire, its engine
stops and frees its memory, the process exits (Kubernetes' default 90 s grace is the
default 30 s drain plus this)."""


def leave_grace_s(drain_timeout_s: float) -> int:
    """How long a replica told to leave gets before it is killed: its drain, then its exit
    (the actor pod's terminationGracePeriodSeconds; Ray's stop of a leaving replica)."""
    return math.ceil(drain_timeout_s) + LEAVE_MARGIN_S


class ElasticConfig(StrictModel):
    """The `[elastic]` section: an actor fleet sized by the prompts backlog."""

    enabled: bool = False
    """Off: the fleet is the fixed size the launcher was given."""
    min_replicas: int = pydantic.Field(default=1, ge=1)
    """The fewest replicas, however little work there is."""
    max_replicas: int | None = pydantic.Field(default=None, ge=1)
    """None: as many as the staleness bound can keep busy (module docstring)."""
    scale_up_after_s: float = pydantic.Field(default=30.0, ge=0)
    """How long more work than the fleet holds must last before replicas are added."""
    scale_down_after_s: float = pydantic.Field(default=300.0, ge=0)
    """The down window: the mean work over it sizes the fleet, and the fleet shrinks only to
    the largest size it wanted in it (a leaving replica hands its episodes back at their
    next turn: actor.drain_timeout_s)."""
    engine_start_s: float = pydantic.Field(default=120.0, ge=0)
    """How long a replica takes from start to its first task (engine load and weights):
    the shortest scale-down window allowed."""
    poll_s: float = pydantic.Field(default=5.0, gt=0)
    """How often the launcher reads the backlog (the learner's bus poll interval)."""

    @pydantic.model_validator(mode="after")
    def _windows_and_bounds(self) -> ElasticConfig:
        if self.max_replicas is not None and self.max_replicas < self.min_replicas:
            raise ValueError(
                f"elastic.max_replicas ({self.max_replicas}) is below elastic.min_replicas "
                f"({self.min_replicas})"
            )
        if self.scale_down_after_s < self.engine_start_s:
            raise ValueError(
                f"elastic.scale_down_after_s ({self.scale_down_after_s}) is shorter than "
                f"elastic.engine_start_s ({self.engine_start_s}): a replica would leave "
                "before the one started for the same work was ready"
            )
        return self


@dataclass(frozen=True)
class FleetBounds:
    """The numbers every target sizes by, derived from the run's config."""

    min_replicas: int
    max_replicas: int
    groups_per_replica: int
    """The groups one replica works on at once (KEDA's and HPA's per-replica target)."""
    scale_up_after_s: float
    scale_down_after_s: float

    def replicas_for(self, work: float) -> int:
        """The replicas `work` unfinished groups keep busy, within the bounds."""
        wanted = math.ceil(max(work, 0) / self.groups_per_replica)
        return min(max(wanted, self.min_replicas), self.max_replicas)


def groups_per_replica(
    *, max_num_seqs: int, group_size: int, max_groups_in_flight: int | None
) -> int:
    """The groups one replica generates at once: its engine's sequences over a group's
    (actors/in_flight.py), or the configured cap when it is lower; at least one."""
    room = max(max_num_seqs // group_size, 1)
    return room if max_groups_in_flight is None else min(room, max_groups_in_flight)


def fleet_bounds(
    elastic: ElasticConfig,
    *,
    max_staleness: int,
    prompts_per_step: int,
    group_size: int,
    max_num_seqs: int,
    max_groups_in_flight: int | None,
) -> FleetBounds:
    """The bounds of a run whose learner and actor sections hold these numbers."""
    per_replica = groups_per_replica(
        max_num_seqs=max_num_seqs, group_size=group_size, max_groups_in_flight=max_groups_in_flight
    )
    window = (max_staleness + 1) * prompts_per_step
    useful = max(math.ceil(window / per_replica), elastic.min_replicas)
    ceiling = useful if elastic.max_replicas is None else min(elastic.max_replicas, useful)
    return FleetBounds(
        min_replicas=elastic.min_replicas,
        max_replicas=ceiling,  # useful and max_replicas are both >= min_replicas
        groups_per_replica=per_replica,
        scale_up_after_s=elastic.scale_up_after_s,
        scale_down_after_s=elastic.scale_down_after_s,
    )


class FleetSizer:
    """The fleet size over time: `observe` each reading of the backlog, get the size now."""

    def __init__(self, bounds: FleetBounds, replicas: int, now: float) -> None:
        self.bounds = bounds
        self.replicas = replicas
        self._start = now
        self._readings: deque[tuple[float, float]] = deque()  # (time, work)
        self._wants: deque[tuple[float, int]] = deque()  # (time, want)

    def observe(self, now: float, work: float) -> int:
        """The fleet size after a reading of `work` (pending + ack_pending) at `now`."""
        b = self.bounds
        _keep(self._readings, (now, max(work, 0.0)), max(b.scale_up_after_s, b.scale_down_after_s))
        if now - self._start < b.scale_up_after_s:
            return self.replicas  # no up window watched whole yet
        want = b.replicas_for(self.signal(now))
        _keep(self._wants, (now, want), b.scale_down_after_s)
        if want > self.replicas:
            self.replicas = want
        else:
            self.replicas = min(self.replicas, max(w for _, w in self._wants))
        return self.replicas

    def signal(self, now: float) -> float:
        """max(sustained, held) of the module docstring, from the readings kept."""
        b = self.bounds
        recent = [w for at, w in self._readings if at >= now - b.scale_up_after_s]
        held = [w for at, w in self._readings if at >= now - b.scale_down_after_s]
        return max(min(recent), sum(held) / len(held))


def _keep(series: deque, item: tuple, window_s: float) -> None:
    """Append `item` (time first) and drop what is older than `window_s` before it."""
    series.append(item)
    while series[0][0] < item[0] - window_s:
        series.popleft()
