"""Prometheus metrics of an env server (served on /metrics by common.metrics.serve_metrics).

tether_env_steps_total{env}              steps completed (rate() = steps/s)
tether_env_step_seconds{env}             step latency, server side
tether_env_active_sessions{env}          open sessions
tether_env_errors_total{method, code}    RPCs that ended in a gRPC error
tether_env_truncated_observations_total{env}  observations cut to max_observation_chars
tether_env_nonfinite_rewards_total{env}  steps whose reward was NaN or infinite
"""

from __future__ import annotations

import prometheus_client

STEPS = prometheus_client.Counter("tether_env_steps", "Env steps completed", ["env"])
STEP_SECONDS = prometheus_client.Histogram(
    "tether_env_step_seconds",
    "Env step latency (server side)",
    ["env"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
ACTIVE_SESSIONS = prometheus_client.Gauge(
    "tether_env_active_sessions", "Open env sessions", ["env"]
)
ERRORS = prometheus_client.Counter(
    "tether_env_errors", "Env RPCs that failed, by gRPC status code", ["method", "code"]
)
TRUNCATED_OBSERVATIONS = prometheus_client.Counter(
    "tether_env_truncated_observations",
    "Observations longer than max_observation_chars, cut with a marker",
    ["env"],
)
NONFINITE_REWARDS = prometheus_client.Counter(
    "tether_env_nonfinite_rewards", "Steps whose reward was NaN or infinite", ["env"]
)
