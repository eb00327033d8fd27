"""A whole config file as one model: every section a run may hold, validated together.

The roles each validate their own section (and refuse unknown section names); the launchers
(`make run`, the manifest smoke run, `make cluster-up`) validate the whole file with
`RunConfig` before they start anything, so a typo in any section is an error naming the key
at once, not a crash of one process minutes later. Pure pydantic: no runtime module is
imported.
"""

from __future__ import annotations

from pathlib import Path

import pydantic

from actors.config import ActorConfig
from broker.config import BrokerConfig
from common.config import SECTIONS, StrictModel, error_lines, read_sections
from common.restarts import RestartPolicy
from deploy.prepare import PrepareConfig
from envservers.config import EnvServerConfig
from learner.config import LearnerConfig


class LocalRunConfig(StrictModel):
    """The `[local]` section: how the single-machine launcher lays out a run."""

    runs_dir: str = "runs"
    """Parent directory of run directories; `<runs_dir>/latest` points at the newest."""
    actor_replicas: int = pydantic.Field(2, ge=1)
    """Actor replicas (one vLLM engine each)."""
    num_train_rows: int = 10_000
    """Calculator training prompts generated for the run (seeded)."""
    num_eval_rows: int = 100
    """Fixed eval prompts (held out from training)."""
    dataset_seed: int = 0
    """Seed of the training prompts."""
    warm_start: bool = True
    """Start RL from the supervised warm start (False: random weights, for quick checks)."""
    timeout_s: float = 3600.0
    """Stop everything if the run has not finished after this long."""
    restarts: RestartPolicy = RestartPolicy()
    """How a role process that dies is restarted (backoff, restart budget); the run fails
    once a process has spent its budget."""


class RunConfig(StrictModel):
    """Every section of a run's config file; the roles' sections are optional (a file may
    configure only some roles)."""

    broker: BrokerConfig = BrokerConfig()
    """Where the bus is and which run it is (every role)."""
    envserver: EnvServerConfig | None = None
    """The env servers (`envserver --config C`)."""
    learner: LearnerConfig | None = None
    """The learner (`learner --config C`)."""
    actor: ActorConfig | None = None
    """The actor replicas (`actor --config C --replicas N`)."""
    local: LocalRunConfig = LocalRunConfig()
    """The single-machine launcher behind `make run`."""
    prepare: PrepareConfig = PrepareConfig()
    """Inputs a demo run on a cluster makes for itself (deploy/prepare.py)."""


assert tuple(RunConfig.model_fields) == SECTIONS, "common.config.SECTIONS must list RunConfig's"


def load_run_config(path: str | Path | None, overrides: list[str] = ()) -> RunConfig:
    """Validate the whole file (plus dotted overrides); ValueError names every bad key."""
    data = read_sections(path, overrides)
    try:
        return RunConfig.model_validate(data)
    except pydantic.ValidationError as e:
        where = f"{path}" if path else "command line"
        raise ValueError(f"invalid config ({where}):\n" + error_lines(e)) from None
