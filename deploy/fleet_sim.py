"""A discrete-event simulator of an elastic actor fleet: plan a run's fleet past the machine
at hand, sized by the same rule the launchers use (common/fleet.py's `FleetSizer`).

What it models, each as the real system does it (the event loop: deploy/fleet_sim_loop.py):
the dispatcher's release rule (learner/dispatcher.py `num_releasable`: released - trained
<= (max_staleness + 1) x prompts_per_step) and the learner's stale-group drop, with a
replacement released for each drop (learner/staleness.py); a step trained once
`prompts_per_step` finished groups wait, in `train_s_per_step`; a replica pulling groups
while its engine has room (actors/in_flight.py `tasks_to_take`: an episode at a tool holds
no slot); an episode of up to `turns_per_episode` turns, each a generation in an engine slot
and a tool call; a replica ready `engine_start_s` after it starts; a leaving replica (the
newest first, as deploy/ray_fleet.py picks) stopping each episode at its next turn boundary
and handing the group back, continued by another replica from that turn, so no token is
generated twice (the hand-backs are counted); the work signal (pending + ack_pending:
released and not finished) read every `poll_s`; log-normal tool latencies capped at the env
server's step timeout, with an optional load step (envservers/latency.py).

What it does not model: generation speed that changes with the engine's load (each slot
decodes at the full engine's per-sequence rate, a little slow for a half-empty engine),
prefill of prompts and observations, turns of different lengths, the weight broadcast apart
from the step, in-flight weight updates pausing generation, the bus's latency, replica
crashes, and a cluster slower to find a node than `engine_start_s`. Deterministic given the
seed.

    python -m deploy.fleet_sim --replicas-max 64 [--load-factor 10 --load-from-s 600 ...]

prints the elastic fleet against fixed fleets at its bounds (bench/elastic_sim.py runs it
calibrated with the numbers measured here).
"""

from __future__ import annotations

import argparse

from common.fleet import ElasticConfig, fleet_bounds
from deploy.fleet_sim_loop import simulate
from deploy.fleet_sim_model import Fleet, Learner, Result, Summary, Workload
from envservers.latency import LoadStep

__all__ = ["compare", "simulate", "summary_table"]


def compare(
    workload: Workload,
    learner: Learner,
    elastic: ElasticConfig,
    *,
    engine_start_s: float,
    seed: int = 0,
) -> dict[str, Result]:
    """The elastic fleet, and fixed fleets at its largest and at its smallest size, on the
    same work and the same seed: {label: result}."""
    bounds = fleet_bounds(
        elastic,
        max_staleness=learner.max_staleness,
        prompts_per_step=learner.prompts_per_step,
        group_size=learner.group_size,
        max_num_seqs=workload.engine_slots,
        max_groups_in_flight=None,
    )
    fixed = elastic.model_copy(update={"enabled": False})
    sized = elastic.model_copy(update={"enabled": True, "max_replicas": bounds.max_replicas})
    fleets = [
        Fleet(sized, engine_start_s=engine_start_s),
        Fleet(fixed, replicas=bounds.max_replicas, engine_start_s=engine_start_s),
        Fleet(fixed, replicas=bounds.min_replicas, engine_start_s=engine_start_s),
    ]
    results = {}
    for fleet in fleets:
        results.setdefault(fleet.label, simulate(workload, learner, fleet, seed=seed))
    return results


def summary_table(summaries: list[Summary]) -> str:
    """One row per run: what a fleet costs and what it buys."""
    header = (
        f"{'fleet':<14} {'run':>9} {'idle':>6} {'idle in step':>12} {'replica-h':>10}"
        f" {'replicas':>9} {'hand-backs':>10} {'stale drops':>11}"
    )
    lines = [header, "-" * len(header)]
    for s in summaries:
        during = (
            "-"
            if s.learner_idle_frac_during_step is None
            else (f"{s.learner_idle_frac_during_step:.1%}")
        )
        lines.append(
            f"{s.label:<14} {s.run_s / 60:>7.1f} m {s.learner_idle_frac:>6.1%} {during:>12}"
            f" {s.replica_hours:>10.1f} {f'{s.fewest_replicas}-{s.peak_replicas}':>9}"
            f" {s.handbacks:>10} {s.groups_dropped_stale:>11}"
        )
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--replicas-min", type=int, default=1)
    add("--replicas-max", type=int, help="default: what the staleness window keeps busy")
    add("--scale-up-after-s", type=float, default=30.0)
    add("--scale-down-after-s", type=float, default=300.0)
    add("--poll-s", type=float, default=5.0)
    add("--engine-start-s", type=float, default=120.0, help="a new replica's start")
    add("--turns", type=float, default=3.0, help="mean turns per episode")
    add("--tokens-per-turn", type=float, default=256.0)
    add("--tokens-per-s", type=float, default=2500.0, help="one replica, engine full")
    add("--engine-slots", type=int, default=64, help="max_num_seqs")
    add("--tool-median-s", type=float, default=0.5)
    add("--tool-p99-s", type=float, default=8.0)
    add("--tool-timeout-s", type=float, default=300.0)
    add("--load-factor", type=float, default=1.0, help="tool latency x this during the step")
    add("--load-from-s", type=float, default=600.0)
    add("--load-for-s", type=float, default=600.0)
    add("--train-s", type=float, default=10.0, help="one learner step with its broadcast")
    add("--prompts-per-step", type=int, default=128)
    add("--group-size", type=int, default=8)
    add("--max-staleness", type=int, default=4)
    add("--steps", type=int, default=200)
    add("--seed", type=int, default=0)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    step = None
    if args.load_factor != 1.0:
        step = LoadStep(args.load_factor, args.load_from_s, args.load_for_s)
    workload = Workload(
        turns_per_episode=args.turns,
        tokens_per_turn=args.tokens_per_turn,
        replica_tokens_per_s=args.tokens_per_s,
        engine_slots=args.engine_slots,
        tool_median_s=args.tool_median_s,
        tool_p99_s=args.tool_p99_s,
        load_step=step,
        tool_timeout_s=args.tool_timeout_s,
    )
    learner = Learner(
        train_s_per_step=args.train_s,
        prompts_per_step=args.prompts_per_step,
        group_size=args.group_size,
        max_staleness=args.max_staleness,
        total_steps=args.steps,
    )
    elastic = ElasticConfig(
        enabled=True,
        min_replicas=args.replicas_min,
        max_replicas=args.replicas_max,
        scale_up_after_s=args.scale_up_after_s,
        scale_down_after_s=args.scale_down_after_s,
        engine_start_s=args.engine_start_s,
        poll_s=args.poll_s,
    )
    results = compare(
        workload, learner, elastic, engine_start_s=args.engine_start_s, seed=args.seed
    )
    print(summary_table([result.summary for result in results.values()]))


if __name__ == "__main__":
    main()
