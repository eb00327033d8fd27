"""What deploy/fleet_sim.py's simulated run is made of: its inputs (the workload, the
learner, the fleet), the state of its groups, episodes and replicas while it runs, and what
it reports (a time series and a summary). Plain data and the arithmetic on it; the event
loop that moves the state is deploy/fleet_sim.py."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from common.fleet import ElasticConfig
from envservers.latency import LoadStep


@dataclass(frozen=True)
class Workload:
    """The episodes and what they cost: generation on a replica's engine, tools elsewhere."""

    turns_per_episode: float
    """Mean generations per episode; each episode gets the floor or the ceiling, drawn so
    that the mean holds. A tool call follows every turn but the last (the answer)."""
    tokens_per_turn: float
    """Tokens one turn generates."""
    replica_tokens_per_s: float
    """One replica's generation throughput with `engine_slots` sequences decoding."""
    engine_slots: int
    """The sequences a replica's engine decodes at once (`max_num_seqs`); each decodes at
    `replica_tokens_per_s / engine_slots`, and episodes past the slots queue."""
    tool_median_s: float
    tool_p99_s: float
    """A tool call's latency is log-normal with this median and p99 (envservers/latency.py)."""
    load_step: LoadStep | None = None
    """Tool latencies x `factor` from `after_s` to `after_s + for_s` (counted from t = 0)."""
    tool_timeout_s: float | None = None
    """A call past this ends at it (with an error observation): the env server's
    `step_timeout_s`. None: tools never time out."""

    def __post_init__(self) -> None:
        for name in ("turns_per_episode", "tokens_per_turn", "replica_tokens_per_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"workload.{name} must be > 0, got {getattr(self, name)}")
        if self.turns_per_episode < 1:
            raise ValueError(f"an episode has at least one turn, got {self.turns_per_episode}")
        if self.engine_slots < 1:
            raise ValueError(f"workload.engine_slots must be >= 1, got {self.engine_slots}")

    @property
    def turn_s(self) -> float:
        """How long one turn's generation takes in an engine slot."""
        return self.tokens_per_turn * self.engine_slots / self.replica_tokens_per_s


@dataclass(frozen=True)
class Learner:
    """The learner as the fleet sees it: it trains a step on `prompts_per_step` finished
    groups, taking `train_s_per_step` (with the weight broadcast), then releases more."""

    train_s_per_step: float
    prompts_per_step: int
    group_size: int
    max_staleness: int
    total_steps: int

    def __post_init__(self) -> None:
        if self.train_s_per_step < 0 or self.max_staleness < 0:
            raise ValueError("learner.train_s_per_step and max_staleness must be >= 0")
        for name in ("prompts_per_step", "group_size", "total_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"learner.{name} must be >= 1, got {getattr(self, name)}")

    @property
    def window(self) -> int:
        """The most groups released and not trained: (max_staleness + 1) x prompts_per_step
        (plus one replacement per group dropped as stale)."""
        return (self.max_staleness + 1) * self.prompts_per_step


@dataclass(frozen=True)
class Fleet:
    """The actor replicas: sized by common/fleet.py's rule when `elastic.enabled`, else
    `replicas` for the whole run. All start at t = 0."""

    elastic: ElasticConfig
    replicas: int = 1
    """The fixed size while `elastic.enabled` is off."""
    engine_start_s: float = 120.0
    """How long a started replica really takes to its first task (`elastic.engine_start_s`
    is what the config says it takes)."""
    max_groups_in_flight: int | None = None
    """`actor.max_groups_in_flight`: a cap on the groups one replica holds."""

    @property
    def label(self) -> str:
        if not self.elastic.enabled:
            return f"fixed {self.replicas}"
        return f"elastic {self.elastic.min_replicas}-{self.elastic.max_replicas or 'window'}"


class Group:
    """One released prompt: a GRPO group of episodes, held by at most one replica."""

    __slots__ = ("index", "episodes", "num_finished", "num_parked", "replica")

    def __init__(self, index: int, turns: list[int]) -> None:
        self.index = index
        self.episodes = [Episode(self, n) for n in turns]
        self.num_finished = 0
        self.num_parked = 0
        """Of its unfinished episodes, those stopped at a turn boundary on a leaving replica."""
        self.replica: Replica | None = None

    def oldest_version(self) -> int:
        """The policy version of its oldest token: its episodes' first turns'."""
        return min(e.first_version for e in self.episodes if e.first_version is not None)


class Episode:
    __slots__ = ("group", "turns", "turns_done", "first_version")

    def __init__(self, group: Group, turns: int) -> None:
        self.group = group
        self.turns = turns
        self.turns_done = 0
        self.first_version: int | None = None

    @property
    def finished(self) -> bool:
        return self.turns_done == self.turns


class Replica:
    """One actor replica: its engine's slots and queue, and the counts actors/in_flight.py
    takes work by (episodes held, and those of them at a tool)."""

    __slots__ = (
        "index",
        "started_s",
        "ended_s",
        "ready",
        "leaving",
        "groups",
        "episodes",
        "at_tool",
        "generating",
        "queue",
        "largest_group",
    )

    def __init__(self, index: int, started_s: float) -> None:
        self.index = index
        self.started_s = started_s
        self.ended_s: float | None = None
        self.ready = False
        self.leaving = False
        self.groups: set[Group] = set()
        self.episodes = 0
        self.at_tool = 0
        self.generating = 0
        self.queue: deque[Episode] = deque()
        self.largest_group: int | None = None

    @property
    def wanting_engine(self) -> int:
        return self.episodes - self.at_tool


@dataclass(frozen=True)
class Sample:
    """The fleet and the learner at one poll."""

    t: float
    replicas: int
    """Replicas the fleet counts: started or ready, not leaving."""
    replicas_ready: int
    replicas_leaving: int
    work: int
    """Groups released and not finished (pending + ack_pending): what the rule reads."""
    learner_idle_frac: float
    """The learner's idle share of the interval since the previous poll."""


@dataclass(frozen=True)
class Summary:
    label: str
    run_s: float
    """From t = 0 to the end of the last step."""
    steps: int
    learner_idle_frac: float
    learner_idle_frac_during_step: float | None
    """Over the load step (None without one; clipped to the run)."""
    replica_s: float
    """Replica-seconds paid for: each replica from its start (engine loading included) to
    the moment it left, or to the run's end."""
    peak_replicas: int
    fewest_replicas: int
    """After the first poll."""
    handbacks: int
    """Groups handed back by a leaving replica at a turn boundary (no token generated twice)."""
    episodes_handed_back: int
    groups_dropped_stale: int
    tokens_generated: float
    window_peak: int
    """The most groups ever released and neither trained nor dropped."""
    window_limit: int

    @property
    def replica_hours(self) -> float:
        return self.replica_s / 3600


@dataclass
class Result:
    summary: Summary
    samples: list[Sample] = field(default_factory=list)
