"""Prometheus metrics of the learner (served on /metrics by common.metrics.serve_metrics).

    tether_learner_policy_version                      optimizer steps taken (gauge)
    tether_learner_loss                                last step's loss (gauge)
    tether_learner_grad_norm                           last step's gradient norm (gauge)
    tether_learner_reward_mean                         last step's mean reward (gauge)
    tether_learner_tokens_per_second                   last step's training throughput (gauge)
    tether_learner_staleness                           per trained group: version - oldest
                                                       token version (histogram, buckets 0..8)
    tether_learner_version_span                        per trained episode: newest - oldest
                                                       token version (histogram, buckets 0..8)
    tether_learner_data_wait_seconds                   waiting for complete groups per step
    tether_learner_step_seconds                        one training step (all ranks)
    tether_learner_broadcast_seconds                   one weight broadcast to the actors
    tether_learner_broadcast_bytes                     bytes of the last broadcast (gauge; with
                                                       LoRA the adapter's)
    tether_learner_broadcast_raw_bytes                 the same version whole, in the wire dtype
                                                       (gauge; below the above only with
                                                       weight_sync.delta)
    tether_learner_weights_log_bytes                   the last version's delta file in the
                                                       weights log (learner.snapshot_deltas)
    tether_learner_trained_trajectories_total          trajectories trained on
    tether_learner_dropped_trajectories_total{reason}  trajectories dropped (stale, errors, ...)
    tether_learner_filtered_groups                     last step's groups without reward signal,
                                                       filtered (learner.dynamic_sampling; gauge)
    tether_learner_stale_token_fraction                last step's loss tokens cleared as older
                                                       than the bound (staleness_rule token)
    tether_learner_staleness_bound                     the bound in force for the last step
                                                       (moves under max_staleness = "auto")
    tether_learner_tool_time_fraction                  share of the last step's episode time
                                                       spent in env steps (tools), not generating
    tether_learner_eval_pass_at_1{env}                 last eval's pass@1 (env="all": overall)

The bus's work queues, as the learner reads them from JetStream (learner/bus_metrics.py;
gauges labelled `queue` = prompts or trajectories; only the learner exports them):

    tether_bus_pending_messages{queue}        stored, not yet delivered to the consumer:
                                              prompts no actor took, trajectories not fetched
    tether_bus_ack_pending_messages{queue}    delivered, not yet acked: prompts being run;
                                              trajectories held until a checkpoint covers them
    tether_bus_redelivered_messages{queue}    unacked messages delivered more than once
    tether_bus_stream_messages{queue}         messages the stream stores
    tether_bus_stream_bytes{queue}            bytes the stream stores
    tether_bus_stream_max_messages{queue}     the stream's limits (no series where unlimited)
    tether_bus_stream_max_bytes{queue}

`record_step(metrics)` updates them from the flat record the loop writes to metrics.jsonl.
Keys read (each optional; a missing key leaves its metric alone):

    version             -> policy_version
    train/loss          -> loss
    train/grad_norm     -> grad_norm
    reward_mean         -> reward_mean
    tokens_per_s        -> tokens_per_second
    staleness           -> staleness: a list of per-group staleness values (or one int)
    version_span        -> version_span: a list of per-episode version spans
    max_staleness       -> staleness_bound
    rollout/all/tool_time_fraction -> tool_time_fraction
    wait_data_s         -> data_wait_seconds
    train_s             -> step_seconds
    broadcast_s         -> broadcast_seconds
    broadcast_bytes     -> broadcast_bytes
    broadcast_raw_bytes -> broadcast_raw_bytes
    weights_log_bytes   -> weights_log_bytes
    trained             -> trained_trajectories_total: the run's CUMULATIVE count
    dropped_by_reason   -> dropped_trajectories_total: CUMULATIVE counts {reason: n}
    eval/all/pass_at_1, eval/env/<e>/pass_at_1 -> eval_pass_at_1{env}

Counters are fed cumulative totals (what the loop keeps and checkpoints) and advance by the
difference from the last value seen in this process. After a resume the first step therefore
adds the restored total at once (one spike in `increase()`), and the counter equals the run's
total, as metrics.jsonl does. A total that goes down (a new run in the same process) starts
a new baseline without advancing.

`record_bus(depths)` sets the tether_bus_* gauges from one `QueueDepth` per queue.
"""

from __future__ import annotations

from collections.abc import Mapping

import prometheus_client

from broker.queue_depth import QueueDepth

_GAUGES = {  # record key -> the gauge that shows its last value
    "version": prometheus_client.Gauge(
        "tether_learner_policy_version", "Policy version: optimizer steps taken"
    ),
    "train/loss": prometheus_client.Gauge("tether_learner_loss", "Loss of the last training step"),
    "train/grad_norm": prometheus_client.Gauge(
        "tether_learner_grad_norm", "Gradient norm (before clipping) of the last training step"
    ),
    "reward_mean": prometheus_client.Gauge(
        "tether_learner_reward_mean", "Mean reward of the trajectories of the last training step"
    ),
    "tokens_per_s": prometheus_client.Gauge(
        "tether_learner_tokens_per_second", "Tokens trained per second in the last training step"
    ),
    "train/prefix_sharing_ratio": prometheus_client.Gauge(
        "tether_learner_prefix_sharing_ratio",
        "Tokens of the last step's samples over the tokens trained (shared prefixes once)",
    ),
    "filtered_groups": prometheus_client.Gauge(
        "tether_learner_filtered_groups",
        "Groups the last step filtered for no reward signal (learner.dynamic_sampling)",
    ),
    "max_staleness": prometheus_client.Gauge(
        "tether_learner_staleness_bound",
        'The staleness bound in force for the last step (moves under max_staleness = "auto")',
    ),
    "rollout/all/tool_time_fraction": prometheus_client.Gauge(
        "tether_learner_tool_time_fraction",
        "Share of the last step's episode time spent in env steps (tools), not generating",
    ),
    "stale_token_fraction": prometheus_client.Gauge(
        "tether_learner_stale_token_fraction",
        "Loss tokens of the last step cleared as older than the bound (staleness_rule token)",
    ),
    "broadcast_bytes": prometheus_client.Gauge(
        "tether_learner_broadcast_bytes",
        "Bytes of the last weight broadcast to the actors (with LoRA: the adapter's)",
    ),
    "broadcast_raw_bytes": prometheus_client.Gauge(
        "tether_learner_broadcast_raw_bytes",
        "The last broadcast's version whole, in the wire dtype (weight_sync.delta sends less)",
    ),
    "weights_log_bytes": prometheus_client.Gauge(
        "tether_learner_weights_log_bytes",
        "The last version's delta file in the weights log (learner.snapshot_deltas)",
    ),
}
_SECONDS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_TIMINGS = {  # record key -> the histogram of its seconds, one observation per step
    "wait_data_s": prometheus_client.Histogram(
        "tether_learner_data_wait_seconds",
        "Time a training step waited for complete groups",
        buckets=_SECONDS_BUCKETS,
    ),
    "train_s": prometheus_client.Histogram(
        "tether_learner_step_seconds", "Time of one training step", buckets=_SECONDS_BUCKETS
    ),
    "broadcast_s": prometheus_client.Histogram(
        "tether_learner_broadcast_seconds",
        "Time of one weight broadcast to the actors",
        buckets=_SECONDS_BUCKETS,
    ),
}
STALENESS = prometheus_client.Histogram(
    "tether_learner_staleness",
    "Per trained group: policy version minus the group's oldest token version",
    buckets=tuple(range(9)),
)
VERSION_SPAN = prometheus_client.Histogram(
    "tether_learner_version_span",
    "Per trained episode: its newest token's policy version minus its oldest's",
    buckets=tuple(range(9)),
)
TRAINED = prometheus_client.Counter(
    "tether_learner_trained_trajectories", "Trajectories trained on"
)
DROPPED = prometheus_client.Counter(
    "tether_learner_dropped_trajectories", "Trajectories dropped, by reason", ["reason"]
)
EVAL_PASS_AT_1 = prometheus_client.Gauge(
    "tether_learner_eval_pass_at_1", "pass@1 of the last eval (env=all: over all envs)", ["env"]
)
_BUS = {  # QueueDepth field -> the gauge that shows it, per queue
    field: prometheus_client.Gauge(f"tether_bus_{name}", text, ["queue"])
    for field, name, text in [
        ("pending", "pending_messages", "Messages stored, not yet delivered to the consumer"),
        ("ack_pending", "ack_pending_messages", "Messages delivered, not yet acknowledged"),
        ("redelivered", "redelivered_messages", "Unacked messages delivered more than once"),
        ("messages", "stream_messages", "Messages the stream stores"),
        ("bytes", "stream_bytes", "Bytes the stream stores"),
        ("max_messages", "stream_max_messages", "The stream's message limit (if any)"),
        ("max_bytes", "stream_max_bytes", "The stream's byte limit (if any)"),
    ]
}
_last_totals: dict[str, float] = {}


def record_step(metrics: dict) -> None:
    """Update the learner's Prometheus metrics from one flat record (keys in the docstring)."""
    for key, gauge in _GAUGES.items():
        if key in metrics:
            gauge.set(float(metrics[key]))
    for key, histogram in _TIMINGS.items():
        if key in metrics:
            histogram.observe(float(metrics[key]))
    staleness = metrics.get("staleness")
    if staleness is not None:
        for value in staleness if isinstance(staleness, list | tuple) else [staleness]:
            STALENESS.observe(float(value))
    for value in metrics.get("version_span", ()):
        VERSION_SPAN.observe(float(value))
    if "trained" in metrics:
        TRAINED.inc(_advance("trained", float(metrics["trained"])))
    for reason, total in metrics.get("dropped_by_reason", {}).items():
        DROPPED.labels(reason=reason).inc(_advance(f"dropped:{reason}", float(total)))
    for key, value in metrics.items():
        if key == "eval/all/pass_at_1":
            EVAL_PASS_AT_1.labels(env="all").set(float(value))
        elif key.startswith("eval/env/") and key.endswith("/pass_at_1"):
            env = key[len("eval/env/") : -len("/pass_at_1")]
            EVAL_PASS_AT_1.labels(env=env).set(float(value))


def _advance(name: str, total: float) -> float:
    """How far the counter `name` moves for a new cumulative `total`."""
    last = _last_totals.get(name, 0.0)
    _last_totals[name] = total
    return total - last if total >= last else 0.0


def record_bus(depths: Mapping[str, QueueDepth]) -> None:
    """Set the tether_bus_* gauges of each queue (`queue` label) from its depth; a limit
    that is None (unlimited) has no series."""
    for queue, depth in depths.items():
        for field, gauge in _BUS.items():
            value = getattr(depth, field)
            if value is None:
                gauge.remove(queue)
            else:
                gauge.labels(queue=queue).set(float(value))
