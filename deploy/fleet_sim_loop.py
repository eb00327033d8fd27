"""The event loop of deploy/fleet_sim.py's simulator (what it models: that module's
docstring). Events sit in a heap by time; each handler moves the state of
deploy/fleet_sim_model.py and schedules what follows.

    learner ── releases groups while released - trained <= (k+1) P ──► pending queue
       ▲        (learner/dispatcher.py num_releasable)                      │ each replica
       │ P finished groups: a step of train_s, version + 1                  ▼ takes by its room
       └──────────────────────────────── finished ◄── episodes: turn = generation in an
                                                      engine slot, then a tool call (no slot)
    every poll_s: work = released - finished ─► FleetSizer ─► start replicas / ask to leave
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import deque
from collections.abc import Callable

from actors.in_flight import tasks_to_take
from common.fleet import FleetSizer, fleet_bounds
from deploy.fleet_sim_model import (
    Episode,
    Fleet,
    Group,
    Learner,
    Replica,
    Result,
    Sample,
    Summary,
    Workload,
)
from envservers.latency import lognormal_params
from learner.dispatcher import num_releasable
from learner.staleness import is_too_stale


def simulate(workload: Workload, learner: Learner, fleet: Fleet, *, seed: int = 0) -> Result:
    """One run from t = 0 until the learner's last step ends."""
    return _Run(workload, learner, fleet, seed).run()


class _Run:
    def __init__(self, workload: Workload, learner: Learner, fleet: Fleet, seed: int) -> None:
        self.w, self.l, self.f = workload, learner, fleet
        self.rng = random.Random(seed)
        self.mu, self.sigma = lognormal_params(workload.tool_median_s, workload.tool_p99_s)
        self.events: list[tuple[float, int, Callable, object]] = []
        self.seq = itertools.count()
        self.now = 0.0
        self.version = 0
        self.num_released = self.num_finished = self.num_dropped = 0
        self.pending: deque[Group] = deque()
        self.finished: list[Group] = []
        self.busy_since: float | None = None
        self.busy_spans: list[tuple[float, float]] = []
        self.replicas: list[Replica] = []
        self.gone: list[Replica] = []
        self.samples: list[Sample] = []
        self.done_s: float | None = None
        self.handbacks = self.episodes_handed_back = self.window_peak = 0
        self.tokens_generated = 0.0
        self.sizer: FleetSizer | None = None
        if fleet.elastic.enabled:
            bounds = fleet_bounds(
                fleet.elastic,
                max_staleness=learner.max_staleness,
                prompts_per_step=learner.prompts_per_step,
                group_size=learner.group_size,
                max_num_seqs=workload.engine_slots,
                max_groups_in_flight=fleet.max_groups_in_flight,
            )
            self.sizer = FleetSizer(bounds, bounds.min_replicas, 0.0)

    def at(self, t: float, handler: Callable, arg: object = None) -> None:
        heapq.heappush(self.events, (t, next(self.seq), handler, arg))

    def run(self) -> Result:
        initial = self.sizer.replicas if self.sizer else self.f.replicas
        for _ in range(initial):
            self._start_replica()
        self._release()
        self.at(0.0, self._poll)
        while self.done_s is None:
            self.now, _, handler, arg = heapq.heappop(self.events)
            handler(arg)
        return Result(self._summary(), self.samples)

    # --- the learner ----------------------------------------------------------------------

    def _release(self) -> None:
        n = num_releasable(
            version=self.version,
            num_released=self.num_released,
            num_dropped_groups=self.num_dropped,
            prompts_per_step=self.l.prompts_per_step,
            max_staleness=self.l.max_staleness,
            total_steps=self.l.total_steps,
        )
        base = math.floor(self.w.turns_per_episode)
        extra = self.w.turns_per_episode - base
        for index in range(self.num_released, self.num_released + n):
            turns = [base + (self.rng.random() < extra) for _ in range(self.l.group_size)]
            self.pending.append(Group(index, turns))
        self.num_released += n
        in_window = self.num_released - self.num_dropped - self.version * self.l.prompts_per_step
        self.window_peak = max(self.window_peak, in_window)
        if n:
            self._dispatch()

    def _try_train(self) -> None:
        if self.busy_since is not None or self.done_s is not None:
            return
        k = self.l.max_staleness
        fresh = [g for g in self.finished if not is_too_stale(g.oldest_version(), self.version, k)]
        if len(fresh) < len(self.finished):
            self.num_dropped += len(self.finished) - len(fresh)
            self.finished = fresh
            self._release()
        if len(self.finished) >= self.l.prompts_per_step:
            del self.finished[: self.l.prompts_per_step]
            self.busy_since = self.now
            self.at(self.now + self.l.train_s_per_step, self._trained)

    def _trained(self, _) -> None:
        self.busy_spans.append((self.busy_since, self.now))
        self.busy_since = None
        self.version += 1
        if self.version == self.l.total_steps:
            self.done_s = self.now
            return
        self._release()
        self._try_train()

    def _busy_s(self, start: float, end: float) -> float:
        """The learner's training seconds inside [start, end]."""
        spans = list(self.busy_spans)
        if self.busy_since is not None:
            spans.append((self.busy_since, self.now))
        return sum(max(0.0, min(b, end) - max(a, start)) for a, b in spans)

    # --- the replicas ---------------------------------------------------------------------

    def _start_replica(self) -> None:
        replica = Replica(len(self.replicas) + len(self.gone), self.now)
        self.replicas.append(replica)
        self.at(self.now + self.f.engine_start_s, self._ready, replica)

    def _ready(self, replica: Replica) -> None:
        if replica.ended_s is None and not replica.leaving:
            replica.ready = True
            self._fill(replica)

    def _dispatch(self) -> None:
        """Hand pending groups out one at a time to every replica with room, in turn."""
        while self.pending:
            took = False
            for replica in self.replicas:
                if self.pending and self._room(replica) > 0:
                    self._take(replica, self.pending.popleft())
                    took = True
            if not took:
                return

    def _fill(self, replica: Replica) -> None:
        while self.pending and self._room(replica) > 0:
            self._take(replica, self.pending.popleft())

    def _room(self, replica: Replica) -> int:
        if not replica.ready or replica.leaving:
            return 0
        return tasks_to_take(
            engine_slots=self.w.engine_slots,
            wanting_engine=replica.wanting_engine,
            groups=len(replica.groups),
            group_size=replica.largest_group,
            max_groups=self.f.max_groups_in_flight,
        )

    def _take(self, replica: Replica, group: Group) -> None:
        group.replica = replica
        group.num_parked = 0
        replica.groups.add(group)
        replica.largest_group = max(len(group.episodes), replica.largest_group or 0)
        for episode in group.episodes:
            if not episode.finished:
                replica.episodes += 1
                self._want_engine(replica, episode)

    def _want_engine(self, replica: Replica, episode: Episode) -> None:
        if replica.generating >= self.w.engine_slots:
            replica.queue.append(episode)
            return
        replica.generating += 1
        if episode.first_version is None:
            episode.first_version = self.version
        self.at(self.now + self.w.turn_s, self._generated, episode)

    def _generated(self, episode: Episode) -> None:
        replica = episode.group.replica
        replica.generating -= 1
        self.tokens_generated += self.w.tokens_per_turn
        episode.turns_done += 1
        if replica.queue:
            self._want_engine(replica, replica.queue.popleft())
        if episode.finished:
            self._episode_done(replica, episode)
            return
        replica.at_tool += 1
        latency = self.rng.lognormvariate(self.mu, self.sigma)
        if self.w.load_step is not None:
            latency *= self.w.load_step.factor_at(self.now)
        if self.w.tool_timeout_s is not None:
            latency = min(latency, self.w.tool_timeout_s)
        self.at(self.now + latency, self._tool_returned, episode)
        self._fill(replica)

    def _tool_returned(self, episode: Episode) -> None:
        replica = episode.group.replica
        replica.at_tool -= 1
        if replica.leaving:
            self._park(replica, episode)
        else:
            self._want_engine(replica, episode)

    def _episode_done(self, replica: Replica, episode: Episode) -> None:
        group = episode.group
        replica.episodes -= 1
        group.num_finished += 1
        if group.num_finished == len(group.episodes):
            replica.groups.remove(group)
            group.replica = None
            self.num_finished += 1
            self.finished.append(group)
            self._try_train()
        self._after_change(replica, group)

    def _park(self, replica: Replica, episode: Episode) -> None:
        """A leaving replica stops `episode` at a turn boundary."""
        replica.episodes -= 1
        episode.group.num_parked += 1
        self._after_change(replica, episode.group)

    def _after_change(self, replica: Replica, group: Group) -> None:
        if not replica.leaving:
            self._fill(replica)
            return
        unfinished = len(group.episodes) - group.num_finished
        if group.replica is replica and unfinished and group.num_parked == unfinished:
            replica.groups.remove(group)
            group.replica = None
            self.pending.appendleft(group)
            self.handbacks += 1
            self.episodes_handed_back += unfinished
        if not replica.groups:
            self._leave_now(replica)
        self._dispatch()

    def _leave_now(self, replica: Replica) -> None:
        replica.ended_s = self.now
        self.replicas.remove(replica)
        self.gone.append(replica)

    # --- the fleet ------------------------------------------------------------------------

    def _poll(self, _) -> None:
        work = self.num_released - self.num_finished
        if self.sizer is not None:
            self._resize(self.sizer.observe(self.now, work))
        poll_s = self.f.elastic.poll_s
        busy = self._busy_s(self.now - poll_s, self.now) if self.samples else 0.0
        counted = [r for r in self.replicas if not r.leaving]
        self.samples.append(
            Sample(
                t=self.now,
                replicas=len(counted),
                replicas_ready=sum(r.ready for r in counted),
                replicas_leaving=len(self.replicas) - len(counted),
                work=work,
                learner_idle_frac=1.0 - busy / poll_s if self.samples else 1.0,
            )
        )
        self.at(self.now + poll_s, self._poll)

    def _resize(self, target: int) -> None:
        counted = [r for r in self.replicas if not r.leaving]
        for _ in range(target - len(counted)):
            self._start_replica()
        for replica in sorted(counted, key=lambda r: -r.index)[: max(len(counted) - target, 0)]:
            replica.leaving = True
            waiting, replica.queue = replica.queue, deque()
            for episode in waiting:  # not generating: already at a turn boundary
                self._park(replica, episode)
            if replica in self.replicas and not replica.groups:
                self._leave_now(replica)

    def _summary(self) -> Summary:
        end = self.done_s
        step = self.w.load_step
        during = None
        if step is not None and step.after_s < end:
            until = min(step.after_s + step.for_s, end)
            during = 1.0 - self._busy_s(step.after_s, until) / (until - step.after_s)
        counts = [s.replicas for s in self.samples[1:]] or [self.samples[0].replicas]
        return Summary(
            label=self.f.label,
            run_s=end,
            steps=self.version,
            learner_idle_frac=1.0 - self._busy_s(0.0, end) / end,
            learner_idle_frac_during_step=during,
            replica_s=sum((r.ended_s or end) - r.started_s for r in self.replicas + self.gone),
            peak_replicas=max(counts),
            fewest_replicas=min(counts),
            handbacks=self.handbacks,
            episodes_handed_back=self.episodes_handed_back,
            groups_dropped_stale=self.num_dropped,
            tokens_generated=self.tokens_generated,
            window_peak=self.window_peak,
            window_limit=self.l.window,
        )
