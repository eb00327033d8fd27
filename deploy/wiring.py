"""The config overrides that wire one run's processes together: the broker's URL, the model
and data paths, the run directory, and every role's ports and addresses. Pure: the launchers
(`make run`, deploy/local.py; the Ray driver, deploy/ray_cluster.py) pass the result on the
command line of every role, ahead of the user's own overrides.
"""

from __future__ import annotations

from pathlib import Path


def wiring(
    run_dir: Path,
    model_dir: Path,
    ports: dict[str, int],
    *,
    nats_host: str = "127.0.0.1",
    envserver_addresses: list[str] | None = None,
) -> list[str]:
    """Overrides that point every role at this run's processes, files and ports.

    `ports`: nats, learner (metrics), weight_store, actor (metrics of replica 0),
    envserver_grpc and envserver (metrics). The actors reach the env servers at
    `envserver_addresses` (default: the one on loopback at envserver_grpc)."""
    data = run_dir / "data"
    addresses = envserver_addresses or [f"127.0.0.1:{ports['envserver_grpc']}"]
    quoted = ",".join(f'"{address}"' for address in addresses)
    return [
        f"broker.url=nats://{nats_host}:{ports['nats']}",
        f"learner.model_path={model_dir}",
        f"learner.train_data={data / 'train.jsonl'}",
        f"learner.eval_data={data / 'eval.jsonl'}",
        f"learner.run_dir={run_dir}",
        f"learner.checkpoint.dir={run_dir / 'checkpoints'}",
        f"learner.metrics_port={ports['learner']}",
        f"learner.weight_sync.store_port={ports['weight_store']}",
        f"actor.engine.model={model_dir}",
        f"actor.env.addresses=[{quoted}]",
        f"actor.metrics_port={ports['actor']}",
        f"envserver.port={ports['envserver_grpc']}",
        f"envserver.metrics_port={ports['envserver']}",
    ]


DEMO_TOOL_FORMAT = "hermes"
"""The tool-call format the demo's tiny model is taught (demo/chat_template.py)."""


def demo_format_problem(tool_format: str, engine_model: str, demo_model: Path) -> str | None:
    """None unless a run serves the demo's tiny model with a tool-call format its chat
    template does not teach (every call it made would be lost); then the error."""
    if tool_format == DEMO_TOOL_FORMAT or Path(engine_model) != Path(demo_model):
        return None
    return (
        f"tool-call format {tool_format!r} (actor.env.tool_format, else envserver.tool_format): "
        f"the demo's tiny model writes its calls as "
        f"{DEMO_TOOL_FORMAT!r} (its chat template teaches no other); the other formats need "
        "a model of that family (learner.model_path and actor.engine.model; docs/envservers.md)"
    )
