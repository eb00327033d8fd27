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
            f" learner; the fleet settles at {count(settled)}, sized by the groups in flight on"
            " average, those waiting on a tool included: they hold no engine slot, so the"
            " rule's room per replica (engine sequences over a group's) over-counts what the"
            " engines need when tools are slow."
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


RUNS = (("fixed", "one fixed replica"), ("elastic", "elastic, 1-2 replicas"))
RAY_HEADER = [
    "fleet",
    "replicas over time",
    "run",
    "steps trained in the load step",
    "learner idle before / in / after the load step",
    "groups handed back / cut",
    "broadcast median / max",
    "books",
]
RAY_PLOT = "![replicas and learner idle per step against time, both runs](images/elastic.png)"


def elastic(f: Figures) -> str:
    """Renderer of bench/elastic.py: the elastic fleet on a real Ray cluster against one
    fixed replica, the same run under a tool-latency step."""
    rows = [_ray_row(f, key, label) for key, label in RUNS]
    return join(_ray_setup(f), table(RAY_HEADER, rows), _ray_reading(f), RAY_PLOT,
                _ray_provenance(f))  # fmt: skip


def _ray_setup(f: Figures) -> str:
    return (
        f"Tool calls: median {fixed(f.get('tool_median_s'), 1)} s, times"
        f" {fixed(f.get('load_step_factor'), 0)} for {fixed(f.get('load_step_for_s'), 0)} s;"
        f" the elastic fleet read the backlog every {fixed(f.get('elastic_poll_s'), 0)} s, up"
        f" window {fixed(f.get('elastic_scale_up_after_s'), 0)} s, down window"
        f" {fixed(f.get('elastic_scale_down_after_s'), 0)} s, first reading"
        f" {fixed(f.get('elastic_engine_start_s'), 0)} s after the run started."
    )


def _ray_row(f: Figures, key: str, label: str) -> list[str]:
    def g(name: str) -> object:
        return f.get(f"{key}_{name}")

    idle = " / ".join(percent(g(f"idle_{when}")) for when in ("before_step", "during_step",
                                                               "after_step"))  # fmt: skip
    books = "balanced" if g("ledger_problems") == 0 else f"{count(g('ledger_problems'))} problems"
    return [
        label,
        str(g("fleet") or MISSING).replace(" ", ", "),
        f"{fixed(g('run_s'), 0)} s, {count(g('steps'))} steps",
        count(g("steps_in_step")),
        idle,
        f"{count(g('groups_handed_back'))} / {count(g('groups_cut'))}",
        f"{fixed(g('broadcast_s_median'), 2)} / {fixed(g('broadcast_s_max'), 2)} s",
        books,
    ]


def _ray_reading(f: Figures) -> str:
    ratio, step = f.get("idle_during_step_elastic_over_fixed"), f.get("elastic_load_step")
    if not isinstance(ratio, int | float):
        return ""
    return (
        f"The load step (tool latency x{fixed(f.get('load_step_factor'), 0)}, at {step} of"
        f" the elastic run) leaves the learner idle {percent(ratio)} as long with the elastic"
        " fleet as with one fixed replica, on the same steps, and the elastic fleet trains"
        f" {count(f.get('elastic_steps_in_step'))} steps in it against"
        f" {count(f.get('fixed_steps_in_step'))}: its second replica is ready only after an"
        " engine start of its own. Replicas leaving hand their groups"
        " back at the next turn; a cut group would be played again, a handed-back one"
        " continues from its last turn."
    )


def _ray_provenance(f: Figures) -> str:
    return (
        f"_Measured {f.get('measured_at', 'at an unrecorded time')} on"
        f" {f.get('machine', MISSING)}, 1-minute load {fixed(f.get('load_avg_1m_before'), 1)}"
        " before._"
    )
