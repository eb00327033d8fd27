"""What bench/async.py and bench/agentic.py share: `make run`'s job (configs/demo.toml)
with every calculator `add` call first waiting a log-normal latency (envservers/latency.py),
at a staleness bound; the steady-state figures of one such run, watched by
bench/tether_run.py; and the GPU model computed from a synchronous run's parts."""

from __future__ import annotations

BUSY = "tether_actor_engine_busy_seconds_total"
GENERATED = "tether_actor_generated_tokens_total"


def workload_overrides(
    *,
    steps: int,
    bound: int,
    median_ms: float,
    p99_s: float,
    replicas: int = 1,
    eval_rows: int = 16,
    eval_samples: int = 1,
) -> list[str]:
    """The run's overrides: evals only at v0 and after the last step (the launcher's summary
    needs one; neither falls in the measured steady state)."""
    return [
        f"learner.total_steps={steps}",
        f"learner.max_staleness={bound}",
        f"learner.eval_interval={10 * steps}",
        f"learner.eval_samples_per_prompt={eval_samples}",
        f"local.num_eval_rows={eval_rows}",
        f"local.actor_replicas={replicas}",
        f"envserver.calculator.latency_median_s={median_ms / 1000}",
        f"envserver.calculator.latency_p99_s={p99_s}",
        "envserver.calculator.latency_seed=0",
    ]


def mode_figures(run) -> dict[str, float]:
    """Steady-state figures of one watched run (bench/tether_run.py RunRecord)."""
    from bench.tether_run import actor_counter_at

    train = run.train
    first, last = train[0], train[-1]
    wall = last["wall_s"] - first["wall_s"]  # learner clock
    later = train[1:]
    figures = {
        "s_per_step": wall / len(later),
        "learner_idle_frac": sum(r["wait_data_s"] for r in later) / wall,
        "learner_train_frac": sum(r["train_s"] for r in later) / wall,
        "learner_broadcast_frac": sum(r["broadcast_s"] for r in later) / wall,
        "wait_data_s_per_step": sum(r["wait_data_s"] for r in later) / len(later),
        "train_s_per_step": sum(r["train_s"] for r in later) / len(later),
        "broadcast_s_per_step": sum(r["broadcast_s"] for r in later) / len(later),
        "trained_tokens_per_s": sum(r["num_tokens"] for r in later) / wall,
        "max_staleness_seen": last["max_staleness_seen"],
    }
    replicas = len(run.actor_samples[-1][1])
    seen = last["t"] - first["t"]  # watcher clock
    busy = actor_counter_at(run, BUSY, last["t"]) - actor_counter_at(run, BUSY, first["t"])
    tokens = actor_counter_at(run, GENERATED, last["t"]) - actor_counter_at(
        run, GENERATED, first["t"]
    )
    figures["actor_idle_frac"] = 1 - busy / replicas / seen
    figures["engine_busy_s_per_step"] = busy / replicas / len(later)
    figures["generated_tokens_per_s"] = tokens / seen
    return figures


def gpu_model(sync: dict[str, float]) -> dict[str, float]:
    """A MODEL, not a measurement: the learner and the engines on separate devices. From
    the synchronous run: G = the learner's wait for a step's data (generation of the whole
    batch, tool tails included, while the learner idles), T = its train + broadcast time,
    E = engine busy seconds per step. Synchronous on GPUs: G + T per step. Asynchronous,
    with enough staleness to hide the tails: max(T, E), the busier device."""
    g, t, e = sync["wait_data_s_per_step"], sync["train_s_per_step"], sync["engine_busy_s_per_step"]
    t += sync["broadcast_s_per_step"]
    async_step = max(t, e)
    return {
        "model_gpu_sync_s_per_step": g + t,
        "model_gpu_async_s_per_step": async_step,
        "model_gpu_speedup": (g + t) / async_step,
        "model_gpu_learner_idle_frac": 1 - t / async_step,
        "model_gpu_actor_idle_frac": 1 - e / async_step,
    }
