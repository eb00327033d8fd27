"""The Tether Grafana dashboard, as code: `python -m deploy.grafana.dashboard` writes
deploy/grafana/tether.json (a test fails when the committed JSON drifts from this file).

Every query here is evaluated by tests/deploy/test_live_prometheus.py against a real
Prometheus scraping real Tether processes. Grafana's own variables in queries are limited to
`$__rate_interval` and `$__range`; the datasource is the dashboard variable `datasource`.

Windows: `$__rate_interval` for things that happen many times a second (tokens, episodes,
env steps); a fixed [2m] or [5m] for things that happen once per training step or weight
update, which can be seconds to minutes apart (a shorter window would show gaps).
"""

from __future__ import annotations

import json
from pathlib import Path

DASHBOARD_PATH = Path(__file__).resolve().parent / "tether.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
SCHEMA_VERSION = 39  # Grafana 10.4 / 11.x; newer Grafana migrates it on load
RI = "$__rate_interval"


def target(expr: str, legend: str = "", **extra) -> dict:
    return {"expr": expr, "legendFormat": legend, "datasource": DATASOURCE, **extra}


def mean_of(histogram: str, window: str, by: str = "") -> str:
    """Mean observation of a histogram over `window`: rate(sum) / rate(count)."""
    total = f"sum by ({by}) " if by else "sum"
    return f"{total}(rate({histogram}_sum[{window}])) / {total}(rate({histogram}_count[{window}]))"


def quantile(q: float, histogram: str, window: str, by: str = "") -> str:
    labels = f"{by}, le" if by else "le"
    return f"histogram_quantile({q}, sum by ({labels}) (rate({histogram}_bucket[{window}])))"


def timeseries(
    title: str,
    description: str,
    targets: list[dict],
    *,
    unit: str = "short",
    width: int = 12,
    stack: bool = False,
    min_value: float | None = None,
    max_value: float | None = None,
) -> dict:
    defaults: dict = {
        "unit": unit,
        "custom": {
            "stacking": {"mode": "normal" if stack else "none"},
            "fillOpacity": 30 if stack else 10,
        },
    }
    if min_value is not None:
        defaults["min"] = min_value
    if max_value is not None:
        defaults["max"] = max_value
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": targets,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "_width": width,
    }


def distribution(title: str, description: str, histogram: str) -> dict:
    """Bars of a histogram's buckets over the dashboard's whole time range."""
    return {
        "type": "bargauge",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": [
            target(
                f"sum by (le) (increase({histogram}_bucket[$__range]))",
                "{{le}}",
                format="heatmap",
                instant=True,
                range=False,
            ),
        ],
        "options": {
            "orientation": "vertical",
            "displayMode": "basic",
            "reduceOptions": {"calcs": ["lastNotNull"], "values": False},
        },
        "fieldConfig": {"defaults": {"unit": "short", "decimals": 0}, "overrides": []},
        "_width": 8,
    }


def learner_panels() -> list[dict]:
    staleness = "tether_learner_staleness"
    return [
        timeseries(
            "Policy version",
            "Optimizer steps taken (the learner), the engine version of the slowest actor "
            "replica, and the newest version the actors heard announced. A flat learner line "
            "while actors run is a stalled learner.",
            [
                target("max(tether_learner_policy_version)", "learner"),
                target("min(tether_actor_policy_version)", "slowest actor engine"),
                target("max(tether_actor_newest_version)", "newest announced (actors)"),
            ],
            width=8,
        ),
        timeseries(
            "Reward mean",
            "Mean reward of the trajectories of the last training step.",
            [target("max(tether_learner_reward_mean)", "reward mean")],
            width=8,
        ),
        timeseries(
            "Eval pass@1 per env",
            "pass@1 of the last eval (sampled, over the fixed eval set); env=all is overall.",
            [target("max by (env) (tether_learner_eval_pass_at_1)", "{{env}}")],
            unit="percentunit",
            width=8,
            min_value=0,
            max_value=1,
        ),
        {
            "type": "heatmap",
            "title": "Staleness of trained groups",
            "description": "Per trained group: policy version minus the group's oldest token "
            "version. Counts per time slice; nothing above max_staleness is ever trained.",
            "datasource": DATASOURCE,
            "targets": [
                target(
                    f"sum by (le) (increase({staleness}_bucket[{RI}]))", "{{le}}", format="heatmap"
                ),
            ],
            "options": {
                "calculate": False,
                "yAxis": {"unit": "short", "decimals": 0},
                "color": {"mode": "scheme", "scheme": "Oranges"},
                "cellGap": 1,
                "tooltip": {"show": True, "yHistogram": True},
            },
            "fieldConfig": {"defaults": {}, "overrides": []},
            "_width": 8,
        },
        timeseries(
            "Staleness: mean, bound, share at the bound",
            "Mean staleness of the groups trained in the last 5 min; the run's max_staleness "
            "and the share of groups (last 15 min) at exactly it — both recorded by "
            'run_rules.yml from deploy/observability.py (for an "auto" bound, the bound in '
            'force); the bound in force step by step (an "auto" bound moves it), and the '
            'share of the last step\'s episode time spent in tools (an "auto" bound rises '
            "only while it is at least min_tool_fraction); with learner.staleness_rule = "
            "token, the share of the last step's loss tokens cleared as older than the bound.",
            [
                target(mean_of(staleness, "5m"), "mean staleness"),
                target("tether:learner_max_staleness", "bound (max_staleness)"),
                target("max(tether_learner_staleness_bound)", "bound in force"),
                target("tether:learner_staleness_at_bound:ratio_rate15m", "share at bound"),
                target("max(tether_learner_tool_time_fraction)", "episode time in tools"),
                target(
                    "max(tether_learner_stale_token_fraction)", "loss tokens cleared (token rule)"
                ),
            ],
            width=8,
            min_value=0,
        ),
        distribution(
            "Staleness distribution (dashboard range)",
            "Trained groups by staleness over the whole time range shown.",
            staleness,
        ),
        distribution(
            "Version span of trained episodes (dashboard range)",
            "Trained episodes by the policy versions their tokens span (newest token's "
            "version minus the oldest's): 0 for an episode generated under one version; long "
            "agentic episodes whose tool calls outlast weight updates span more "
            "(learner.staleness_rule = token trains their fresh turns).",
            "tether_learner_version_span",
        ),
        timeseries(
            "Tokens per second",
            "Learner: tokens trained per second in its last step. Actors: policy tokens "
            "generated per second (rate of a counter), all replicas and per replica.",
            [
                target("sum(tether_learner_tokens_per_second)", "learner (trained)"),
                target(
                    f"sum(rate(tether_actor_generated_tokens_total[{RI}]))", "actors (generated)"
                ),
                target(
                    f"sum by (instance) (rate(tether_actor_generated_tokens_total[{RI}]))",
                    "actor {{instance}}",
                ),
            ],
        ),
        timeseries(
            "Prefix sharing",
            "Tokens of the learner's last step, counted per sample, over the tokens it "
            "trained: a GRPO group's common prompt (and any longer common prefix) is "
            "forwarded and backwarded once. 1 means nothing was shared.",
            [target("max(tether_learner_prefix_sharing_ratio)", "samples' tokens / trained")],
        ),
        timeseries(
            "Learner time per step",
            "Mean seconds per training step (last 2 min) waiting for complete groups, "
            "training, and broadcasting weights. A tall data wait: actors are the bottleneck.",
            [
                target(mean_of("tether_learner_data_wait_seconds", "2m"), "data wait"),
                target(mean_of("tether_learner_step_seconds", "2m"), "train step"),
                target(mean_of("tether_learner_broadcast_seconds", "2m"), "weight broadcast"),
            ],
            unit="s",
            stack=True,
        ),
        timeseries(
            "Weight update size",
            "Bytes the last weight broadcast carried to the engines: the whole model in its "
            "engine dtype, or with LoRA the adapter alone (docs/lora.md); with "
            "weight_sync.delta the change from the version before, against the whole "
            "version (docs/weights.md); with learner.snapshot_deltas the delta file the "
            "weights log wrote for actors that follow the object store.",
            [
                target("max(tether_learner_broadcast_bytes)", "bytes per update"),
                target("max(tether_learner_broadcast_raw_bytes)", "the version whole"),
                target("max(tether_learner_weights_log_bytes)", "weights log delta"),
            ],
            unit="bytes",
        ),
        timeseries(
            "Trained vs dropped trajectories",
            "Trajectories per second the actors published, the learner trained on, and the "
            "learner dropped by reason (stale: older than max_staleness; errors/error: env "
            "failures).",
            [
                target(
                    "sum(rate(tether_actor_trajectories_published_total[2m]))", "published (actors)"
                ),
                target("sum(rate(tether_learner_trained_trajectories_total[2m]))", "trained"),
                target(
                    "sum by (reason) (rate(tether_learner_dropped_trajectories_total[2m]))",
                    "dropped: {{reason}}",
                ),
            ],
            unit="short",
        ),
        timeseries(
            "Groups filtered for no signal",
            "Groups the last training step dropped because all their samples got one reward "
            "(zero advantage: learner.dynamic_sampling), each replaced by a new prompt.",
            [target("max(tether_learner_filtered_groups)", "filtered per step")],
            unit="short",
        ),
        timeseries(
            "Loss and gradient norm",
            "Loss and gradient norm (before clipping) of the last training step.",
            [
                target("max(tether_learner_loss)", "loss"),
                target("max(tether_learner_grad_norm)", "grad norm"),
            ],
        ),
    ]


def queue_panel(queue: str, title: str, description: str, legends: list[str]) -> dict:
    """One work queue's consumer counts (tether_bus_*{queue}): pending, ack pending and
    redelivered, with `legends` in that order."""
    counts = ("pending_messages", "ack_pending_messages", "redelivered_messages")
    exprs = [f'max(tether_bus_{count}{{queue="{queue}"}})' for count in counts]
    targets = [target(expr, legend) for expr, legend in zip(exprs, legends, strict=True)]
    return timeseries(title, description, targets, width=6, min_value=0)


def bus_panels() -> list[dict]:
    """The work queues as the learner reads them from JetStream (learner/bus_metrics.py)."""
    return [
        queue_panel(
            "prompts",
            "Prompts pending",
            "Prompt tasks released and not taken by any actor (pending), taken and running "
            "(ack pending), and running after a redelivery (a replica died or gave one back). "
            "Pending that stays above zero: the actors are the bottleneck, and more replicas "
            "help (the KEDA signal, docs/observability.md). Zero while actors wait for prompts: "
            "the learner's staleness bound holds them back.",
            ["pending", "running (ack pending)", "redelivered"],
        ),
        queue_panel(
            "trajectories",
            "Trajectories awaiting the learner",
            "Trajectories stored and not yet fetched by the learner (pending), and fetched but "
            "unacked (held until a checkpoint covers them: queued for training, or trained "
            "since the last checkpoint). Pending that grows: the learner is the bottleneck, "
            "and more actors would only fill the stream.",
            ["not fetched (pending)", "held by the learner", "redelivered"],
        ),
        timeseries(
            "Stream fill (share of its limit)",
            "Each stream's bytes and messages over its limits. A full stream refuses new "
            "messages (publishers retry and wait): TetherStreamNearlyFull fires above 80%.",
            [
                target(
                    "max by (queue) (tether_bus_stream_bytes / tether_bus_stream_max_bytes)",
                    "{{queue}} bytes",
                ),
                target(
                    "max by (queue) (tether_bus_stream_messages / tether_bus_stream_max_messages)",
                    "{{queue}} messages",
                ),
            ],
            unit="percentunit",
            width=6,
            min_value=0,
            max_value=1,
        ),
        timeseries(
            "Stream bytes vs limit",
            "Bytes each stream stores, and its byte limit (streams without one: no line).",
            [
                target("max by (queue) (tether_bus_stream_bytes)", "{{queue}} stored"),
                target("max by (queue) (tether_bus_stream_max_bytes)", "{{queue}} limit"),
            ],
            unit="bytes",
            width=6,
            min_value=0,
        ),
    ]


def actor_panels() -> list[dict]:
    return [
        timeseries(
            "Episodes per second by env and stop reason",
            "Finished episodes per second, by environment and stop reason.",
            [
                target(
                    f"sum by (env_class, stop_reason) (rate(tether_actor_episodes_total[{RI}]))",
                    "{{env_class}} {{stop_reason}}",
                )
            ],
        ),
        timeseries(
            "Actor in-flight episodes and groups",
            "Episodes running now, prompt tasks (GRPO groups) held, and episodes in an env "
            "server call (a tool: no engine slot held), per replica.",
            [
                target(
                    "sum by (instance) (tether_actor_episodes_in_flight)", "episodes {{instance}}"
                ),
                target("sum by (instance) (tether_actor_groups_in_flight)", "groups {{instance}}"),
                target("sum by (instance) (tether_actor_episodes_at_env)", "at env {{instance}}"),
            ],
        ),
        timeseries(
            "Actor engine busy",
            "Share of wall time each replica's engine had at least one generation in it "
            "(1 - this is the engine's idle time: the number asynchrony exists to shrink).",
            [
                target(
                    f"sum by (instance) (rate(tether_actor_engine_busy_seconds_total[{RI}]))",
                    "{{instance}}",
                )
            ],
        ),
        timeseries(
            "Where actor time goes",
            "Seconds per second, all replicas: waiting for prompt tasks (one pull loop per "
            "replica), for weights new enough for a task (per held group), on env servers "
            "and in generation (per episode, so several episodes in flight add up past 1).",
            [
                target(
                    f"sum by (what) (rate(tether_actor_wait_seconds_total[{RI}]))",
                    "waiting: {{what}}",
                ),
                target(f"sum(rate(tether_actor_generate_seconds_total[{RI}]))", "generating"),
            ],
        ),
        timeseries(
            "Generation stall per weight update",
            "Seconds generation was paused per weight update (broadcast round or snapshot "
            "load), mean and p99 over 5 min.",
            [
                target(
                    mean_of("tether_actor_weight_update_stall_seconds", "5m", by="kind"),
                    "mean {{kind}}",
                ),
                target(
                    quantile(0.99, "tether_actor_weight_update_stall_seconds", "5m", by="kind"),
                    "p99 {{kind}}",
                ),
            ],
            unit="s",
        ),
        timeseries(
            "Weight broadcast on the wire",
            "Bytes per second of weight rounds while their messages were arriving, per "
            "replica: the broadcast's own speed (the engine's loads between messages are in "
            "the stall above). Compare with the host's network, or loopback on one machine.",
            [
                target(  # no series while no round lands (not 0 / 0 = NaN)
                    f"sum by (instance) (rate(tether_actor_weight_update_bytes_total[{RI}])) / "
                    f"(sum by (instance) (rate(tether_actor_weight_wire_seconds_total[{RI}])) > 0)",
                    "{{instance}}",
                )
            ],
            unit="Bps",
        ),
        timeseries(
            "Version lag",
            "Per replica: newest version the learner announced minus the engine's version.",
            [target("max by (instance) (tether_actor_version_lag)", "{{instance}}")],
            min_value=0,
        ),
        timeseries(
            "Prompt tasks by outcome",
            "Tasks per second: acked (done), rejected (never retried), nacked (given back).",
            [target(f"sum by (outcome) (rate(tether_actor_tasks_total[{RI}]))", "{{outcome}}")],
        ),
        timeseries(
            "Episodes resumed from checkpoints",
            "Episode checkpoints written at turn boundaries (per second), and what they did for"
            " redelivered tasks: samples resumed from their last turn, skipped (stored"
            " already), or played from the start (stale, ahead, prompt, replay, env: why).",
            [
                target(
                    f"sum by (outcome) (rate(tether_actor_episode_checkpoints_total[{RI}]))",
                    "checkpoints {{outcome}}",
                ),
                target(
                    f"sum by (outcome) (increase(tether_actor_episode_resumes_total[{RI}]))",
                    "samples {{outcome}}",
                ),
            ],
        ),
        timeseries(
            "Tokens saved by resumed episodes",
            "Policy tokens per second taken over from a dead replica's episode checkpoints,"
            " against those generated.",
            [
                target(f"sum(rate(tether_actor_resumed_tokens_total[{RI}]))", "taken over"),
                target(f"sum(rate(tether_actor_generated_tokens_total[{RI}]))", "generated"),
            ],
        ),
        timeseries(
            "Env step latency seen by actors",
            "One env step including the gRPC round trip, from the actors (p50, p99).",
            [
                target(quantile(0.5, "tether_actor_env_step_seconds", RI), "p50"),
                target(quantile(0.99, "tether_actor_env_step_seconds", RI), "p99"),
            ],
            unit="s",
        ),
        timeseries(
            "Turns and tool calls per episode",
            "Mean assistant turns and tool calls per finished episode (last 5 min).",
            [
                target(mean_of("tether_actor_turns", "5m"), "turns"),
                target(
                    "sum(rate(tether_actor_tool_calls_total[5m]))"
                    " / sum(rate(tether_actor_episodes_total[5m]))",
                    "tool calls",
                ),
            ],
        ),
        timeseries(
            "Undecodable tokens",
            "Generated token ids per second that the tokenizer has no token for: they decode "
            "to nothing, the env sees no text. Empty in a healthy run; otherwise the weights "
            "are random or untrained, or the tokenizer is not the model's (docs/actors.md).",
            [target("sum(rate(tether_actor_undecodable_tokens_total[5m]))", "ids/s")],
        ),
    ]


def envserver_panels() -> list[dict]:
    latency = "tether_env_step_seconds"
    return [
        timeseries(
            "Env steps per second per env",
            "Steps completed per second by the env servers, per environment.",
            [target(f"sum by (env) (rate(tether_env_steps_total[{RI}]))", "{{env}}")],
        ),
        timeseries(
            "Env step latency per env (server side)",
            "p50 and p99 of one step inside the env server, per environment.",
            [
                target(quantile(0.5, latency, RI, by="env"), "p50 {{env}}"),
                target(quantile(0.99, latency, RI, by="env"), "p99 {{env}}"),
            ],
            unit="s",
        ),
        timeseries(
            "Env errors by code",
            "Env server RPCs per second that ended in a gRPC error, by method and code.",
            [
                target(
                    f"sum by (method, code) (rate(tether_env_errors_total[{RI}]))",
                    "{{method}} {{code}}",
                )
            ],
        ),
        timeseries(
            "Open env sessions per env",
            "Sessions (episodes) open on the env servers now.",
            [target("sum by (env) (tether_env_active_sessions)", "{{env}}")],
        ),
        timeseries(
            "Env output repaired",
            "Observations cut to max_observation_chars, and rewards that were NaN or "
            "infinite (passed on; the actor ends that episode as an error), per env. "
            "Empty in a healthy run.",
            [
                target(
                    "sum by (env) (rate(tether_env_truncated_observations_total[5m]))",
                    "cut {{env}}",
                ),
                target(
                    "sum by (env) (rate(tether_env_nonfinite_rewards_total[5m]))",
                    "non-finite {{env}}",
                ),
            ],
        ),
    ]


def health_panels() -> list[dict]:
    return [
        {
            "type": "stat",
            "title": "Targets up",
            "description": "Every scraped Tether process: UP, or DOWN (see TetherTargetDown).",
            "datasource": DATASOURCE,
            "targets": [target('up{job=~"learner|actor|envserver"}', "{{job}} {{instance}}")],
            "fieldConfig": {
                "defaults": {
                    "mappings": [
                        {
                            "type": "value",
                            "options": {
                                "0": {"text": "DOWN", "color": "red"},
                                "1": {"text": "UP", "color": "green"},
                            },
                        }
                    ],
                    "thresholds": {
                        "mode": "absolute",
                        "steps": [{"color": "red", "value": None}, {"color": "green", "value": 1}],
                    },
                },
                "overrides": [],
            },
            "options": {
                "colorMode": "background",
                "graphMode": "none",
                "reduceOptions": {"calcs": ["lastNotNull"], "values": False},
            },
            "_width": 12,
        },
        timeseries(
            "Bus publish retries and corrupt messages",
            "Publishes retried (stream full or broker unreachable) and messages that could "
            "not be decoded, per process and subject. Empty in a healthy run.",
            [
                target(
                    "sum by (job, subject) (rate(tether_broker_publish_retries_total[5m]))",
                    "retries {{job}} {{subject}}",
                ),
                target(
                    "sum by (job, subject) (rate(tether_broker_corrupt_messages_total[5m]))",
                    "corrupt {{job}} {{subject}}",
                ),
            ],
        ),
    ]


def layout(sections: list[tuple[str, list[dict]]]) -> list[dict]:
    """Rows and panels on Grafana's 24-column grid, left to right, 8 units high."""
    panels, next_id, y = [], 1, 0
    for title, section in sections:
        panels.append(
            {
                "type": "row",
                "title": title,
                "collapsed": False,
                "id": next_id,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        next_id, y, x = next_id + 1, y + 1, 0
        for panel in section:
            panel = dict(panel)
            width = panel.pop("_width")
            if x + width > 24:
                x, y = 0, y + 8
            panel["id"] = next_id
            panel["gridPos"] = {"h": 8, "w": width, "x": x, "y": y}
            for ref, t in enumerate(panel["targets"]):
                t["refId"] = chr(ord("A") + ref)
            panels.append(panel)
            next_id, x = next_id + 1, x + width
        y += 8
    return panels


def dashboard() -> dict:
    return {
        "uid": "tether-overview",
        "title": "Tether",
        "description": "Async RL run: learner, actor replicas, env servers (deploy/grafana).",
        "tags": ["tether"],
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "timezone": "browser",
        "time": {"from": "now-30m", "to": "now"},
        "refresh": "10s",
        "annotations": {"list": []},
        "links": [],
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                    "refresh": 1,
                    "regex": "",
                    "options": [],
                }
            ]
        },
        "panels": layout(
            [
                ("Learner", learner_panels()),
                ("Bus (JetStream)", bus_panels()),
                ("Actors", actor_panels()),
                ("Env servers", envserver_panels()),
                ("Health", health_panels()),
            ]
        ),
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def queries(board: dict) -> list[str]:
    """Every query `expr` of a dashboard (rows' nested panels included)."""
    found = []
    for panel in board["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            found.extend(t["expr"] for t in inner.get("targets", []))
    return found


if __name__ == "__main__":
    DASHBOARD_PATH.write_text(render())
    print(f"wrote {DASHBOARD_PATH}")
