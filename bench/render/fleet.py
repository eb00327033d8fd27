"""Renderer of bench/elastic_sim.py: a 64-replica elastic fleet planned by the simulator
(deploy/fleet_sim.py) from figures measured here, against fixed fleets at its bounds."""

from __future__ import annotations

from bench.render.markdown import MISSING, Figures, count, fixed, join, percent, table

FLEETS = (("elastic", "elastic"), ("fixed_max", "fixed at the most"),
          ("fixed_min", "fixed at the fewest"))  # fmt: skip
HEADER = [
    "fleet",
    "replicas (fewest-most)",
    "run",
    "learner idle",
    "learner idle in the load step",
    "replica-hours",
    "groups handed back",
    "groups dropped as stale",
]
PLOT = (
    "![replicas, backlog and learner idle against time, each fleet](images/elastic_sim.png)"
    "\n\nThe plot ends a little after the elastic run; the single replica's goes on."
)


def elastic_sim(f: Figures) -> str:
    return join(_setup(f), table(HEADER, [_row(f, key, label) for key, label in FLEETS]),
                _reading(f), PLOT, _provenance(f))  # fmt: skip


def _setup(f: Figures) -> str:
    def c(name: str, places: int = 1) -> str:
        return fixed(f.get(f"calib_{name}"), places)

    return (
        "**Simulated, not measured** (`deploy/fleet_sim.py`), from inputs measured here:"
        f" one replica generates {c('replica_tokens_per_s', 0)} tokens/s with"
        f" {c('engine_slots', 0)} sequences decoding, a turn is {c('tokens_per_turn')} tokens"
        f" and an episode {c('turns_per_episode', 2)} turns, a replica starts in"
        f" {c('engine_start_s')} s (`actor.json`); tool calls are log-normal, median"
        f" {c('tool_median_s')} s and p99 {c('tool_p99_s')} s (`agentic.json`'s agentic"
        f" workload), capped at the env server's {c('tool_timeout_s', 0)} s step timeout; a"
        f" learner step with its broadcast took {c('measured_train_s_per_step', 2)} s at"
        f" {c('measured_prompts_per_step', 0)} prompts (`agentic.json`, bound"
        f" {c('max_staleness', 0)}), so {c('train_s_per_step')} s at the plan's"
        f" {count(f.get('prompts_per_step'))} prompts of {c('group_size', 0)} episodes."
        f" The plan: {count(f.get('steps'))} steps at bound {c('max_staleness', 0)}, up to"
        f" {count(f.get('max_replicas'))} replicas (`[elastic]`'s default windows), every tool"
        f" call {fixed(f.get('load_factor'), 0)} times slower from minute"
        f" {_minutes(f.get('load_from_s'))} to minute"
        f" {_minutes(_sum(f.get('load_from_s'), f.get('load_for_s')))}."
    )


def _row(f: Figures, key: str, label: str) -> list[str]:
    def g(name: str) -> object:
        return f.get(f"{key}_{name}")

    return [
        label,
        f"{count(g('replicas_min'))}-{count(g('replicas_max'))}",
        f"{_minutes(g('run_s'), 1)} min",
        percent(g("learner_idle_frac"), 1),
        percent(g("learner_idle_frac_during_step"), 1),
        fixed(g("replica_hours"), 1),
        count(g("handbacks")),
        count(g("groups_dropped_stale")),
    ]


def _reading(f: Figures) -> str:
    """What the table says, computed from it: the saving, the step, and the size the rule
    settles at against the replicas whose generation keeps pace with the learner."""
    names = ("elastic_replica_hours", "fixed_max_replica_hours", "elastic_run_s",
             "fixed_max_run_s", "elastic_learner_idle_frac_during_step",
             "fixed_max_learner_idle_frac_during_step", "elastic_replicas_end")  # fmt: skip
    values = [f.get(name) for name in names]
    if not all(isinstance(v, int | float) for v in values):
        return ""
    elastic, most, run, most_run, idle, most_idle, settled = values
    said = [
        f"The elastic fleet pays {percent(1 - elastic / most)} fewer replica-hours than the"
        f" fixed fleet at its most, for a run {percent(abs(run / most_run - 1), 1)}"
        f" {'longer' if run > most_run else 'shorter'}."
    ]
    if abs(idle - most_idle) < 0.05:
        said.append(
            "In the load step the learner idles about as much with either: the staleness"
            " window, not the fleet, bounds the groups in flight."
        )
    pace = _pace_replicas(f)
    if pace is not None:
        said.append(
            f"Outside the step the generation of {fixed(pace, 1)} replicas keeps pace with the"
            f" learner; the fleet settles at {count(settled)}, sized by the backlog just after"
            " each release and held for the scale-down window."
        )
    said.append("Handed-back groups continue from their last turn: no token is generated twice.")
    return " ".join(said)


def _pace_replicas(f: Figures) -> float | None:
    """Replicas whose engines, full, generate a step's tokens in one learner step."""
    names = ("turns_per_episode", "tokens_per_turn", "group_size", "train_s_per_step",
             "replica_tokens_per_s")  # fmt: skip
    values = [f.get(f"calib_{name}") for name in names] + [f.get("prompts_per_step")]
    if not all(isinstance(v, int | float) for v in values):
        return None
    turns, tokens, group, train_s, rate, prompts = values
    return prompts * group * turns * tokens / (train_s * rate)


def _provenance(f: Figures) -> str:
    return (
        f"_Simulated {f.get('measured_at', 'at an unrecorded time')} (seed"
        f" {f.get('seed', MISSING)}), from `actor.json` measured"
        f" {f.get('calib_actor_measured_at', MISSING)} and `agentic.json` measured"
        f" {f.get('calib_agentic_measured_at', MISSING)}._"
    )


def _minutes(value_s: object, places: int = 0) -> str:
    return fixed(value_s / 60, places) if isinstance(value_s, int | float) else MISSING


def _sum(a: object, b: object) -> float | None:
    return a + b if isinstance(a, int | float) and isinstance(b, int | float) else None
