"""Where a step's time goes, for both sides of bench/peer_trl.py (pure: records in,
figures out). Steady state only: step 1 is left out (it waits for the engines or the
first generation), so a mean step here is what the run costs per step once it runs.

Tether (the learner's metrics.jsonl, learner clock; the actors' counters, watcher clock):
    per_step_s        mean interval between consecutive `train` records
    wait_data_s       the learner waiting for groups to arrive
    train_s           the training step (forward, backward, optimizer)
    broadcast_s       gathering and sending the weights to the engines
    other_s           the rest of the interval (announce, release, checkpoint, history)
    engine_busy_frac  of the engines' wall time, the share with a generation in flight
                      (sum over replicas / replicas, between the first and last step)
    eval_s            an in-run eval: from its version's step to its record (it shares
                      the engines with training meanwhile)
TRL (its progress.jsonl):
    per_step_s, generate_s (generation, tool rounds and rewards), train_s (the rest)
Both: startup_s, launch to the end of step 1 minus a step (TRL: step 1's own duration;
Tether: step 2's interval, as step 1's start is not recorded).
"""

from __future__ import annotations

from statistics import mean


def _steady(values: list[float]) -> float:
    return mean(values[1:]) if len(values) > 1 else float("nan")


def trl_breakdown(trl: dict) -> dict[str, float]:
    steps = [r for r in trl["records"] if r["kind"] == "step"]
    if not steps:
        return {}
    step_s = [r["step_s"] for r in steps]
    generate_s = [r["generate_s"] for r in steps]
    return {
        "trl_per_step_s": _steady(step_s),
        "trl_generate_per_step_s": _steady(generate_s),
        "trl_train_per_step_s": _steady([s - g for s, g in zip(step_s, generate_s, strict=True)]),
        "trl_startup_s": steps[0]["t"] - steps[0]["step_s"],
        "trl_wall_s": trl["wall_s"],
    }


def tether_breakdown(run) -> dict[str, float]:
    from bench.tether_run import actor_counter_at

    train = run.train
    if len(train) < 2:
        return {}
    intervals = [b["wall_s"] - a["wall_s"] for a, b in zip(train, train[1:], strict=False)]
    later = train[1:]
    waits = [r["wait_data_s"] for r in later]
    trains = [r["train_s"] for r in later]
    broadcasts = [r["broadcast_s"] for r in later]
    figures = {
        "tether_per_step_s": mean(intervals),
        "tether_wait_data_per_step_s": mean(waits),
        "tether_train_per_step_s": mean(trains),
        "tether_broadcast_per_step_s": mean(broadcasts),
        "tether_other_per_step_s": mean(intervals) - mean(waits) - mean(trains) - mean(broadcasts),
        "tether_startup_s": train[0]["t"] - (train[1]["wall_s"] - train[0]["wall_s"]),
        "tether_wall_s": run.wall_s,
        "tether_learner_wait_frac": sum(waits) / sum(intervals),
    }
    replicas = len(run.actor_samples[-1][1]) if run.actor_samples else 0
    if replicas:
        first, last = train[0]["t"], train[-1]["t"]
        busy = "tether_actor_engine_busy_seconds_total"
        spent = actor_counter_at(run, busy, last) - actor_counter_at(run, busy, first)
        figures["tether_engine_busy_frac"] = spent / replicas / (last - first)
        figures["tether_engine_busy_per_step_s"] = spent / replicas / (len(train) - 1)
        figures["tether_actor_replicas"] = replicas
    figures.update(_eval_times(run))
    return figures


def _eval_times(run) -> dict[str, float]:
    """Mean seconds from an eval's version to its record (learner clock)."""
    at_version = {r["version"]: r["wall_s"] for r in run.train}
    durations = [
        r["wall_s"] - at_version[r["version"]] for r in run.evals if r["version"] in at_version
    ]
    if not durations:
        return {}
    return {"tether_eval_s": mean(durations), "tether_num_evals": len(run.evals)}
