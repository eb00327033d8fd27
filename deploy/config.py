"""A whole config file as one model: every section a run may hold, validated together.

The roles each validate their own section (and refuse unknown section names); the launchers
(`make run`, the manifest smoke run, `make cluster-up`) validate the whole file with
`RunConfig` before they start anything, so a typo in any section is an error naming the key
at once, not a crash of one process minutes later. Pure pydantic: no runtime module is
imported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pydantic

from actors.config import ActorConfig
from broker.config import BrokerConfig
from common.config import SECTIONS, StrictModel, error_lines, read_sections
from common.storage_config import StorageConfig
from deploy.prepare import PrepareConfig
from envservers.config import EnvServerConfig
from learner.config import LearnerConfig
from weights.dtypes import dtype_mismatch, resolve_engine_dtype, resolve_learner_dtype
from weights.lora import adapter_mismatch


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
    colocate: Literal["auto", "never"] = "auto"
    """On a GPU machine with fewer GPUs than learner ranks plus engines: `auto` puts engines
    on the learner's GPUs (a 1-GPU machine runs everything on GPU 0; weights then go over
    gloo), `never` refuses to start (common/placement.py)."""
    learner_gpu_memory_fraction: float = pydantic.Field(0.4, gt=0, lt=1)
    """On a GPU shared with engines: the share of its memory kept for the learner; the
    engines on it split the rest (their gpu_memory_utilization)."""


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
    storage: StorageConfig = StorageConfig()
    """The bucket for checkpoints, snapshots and eval dumps (learner and actors)."""
    local: LocalRunConfig = LocalRunConfig()
    """The single-machine launcher behind `make run`."""
    prepare: PrepareConfig = PrepareConfig()
    """Inputs a demo run on a cluster makes for itself (deploy/prepare.py)."""

    @pydantic.model_validator(mode="after")
    def _dtypes_agree(self) -> RunConfig:
        """Learner and engine dtypes, before anything starts: on either device when both
        are explicit (`auto` resolves the same way on both sides of one machine; a mix of
        auto and explicit is checked where it resolves, when the engine subscribes)."""
        if self.learner is None or self.actor is None:
            return self
        learner, engine = self.learner.dtype, self.actor.engine.dtype
        if "auto" in (learner, engine):
            return self
        for on_gpu in (False, True):
            problem = dtype_mismatch(
                resolve_learner_dtype(learner, on_gpu=on_gpu),
                resolve_engine_dtype(engine, on_gpu=on_gpu),
            )
            if problem:
                raise ValueError(problem)
        return self

    @pydantic.model_validator(mode="after")
    def _adapter_fits(self) -> RunConfig:
        """A LoRA run's adapter rank against the engines' max_lora_rank, before anything
        starts (the engines would be refused when they subscribe)."""
        if self.learner is None or self.actor is None or self.learner.finetune.mode != "lora":
            return self
        engine = self.actor.engine
        problem = adapter_mismatch(
            {"r": self.learner.finetune.rank}, engine.max_lora_rank if engine.enable_lora else None
        )
        if problem:
            raise ValueError(problem)
        return self


assert tuple(RunConfig.model_fields) == SECTIONS, "common.config.SECTIONS must list RunConfig's"


def load_run_config(path: str | Path | None, overrides: list[str] = ()) -> RunConfig:
    """Validate the whole file (plus dotted overrides); ValueError names every bad key."""
    data = read_sections(path, overrides)
    try:
        return RunConfig.model_validate(data)
    except pydantic.ValidationError as e:
        where = f"{path}" if path else "command line"
        raise ValueError(f"invalid config ({where}):\n" + error_lines(e)) from None
