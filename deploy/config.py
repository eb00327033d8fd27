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
from common.fleet import ElasticConfig, FleetBounds, fleet_bounds
from common.storage_config import StorageConfig
from common.supervision import RestartPolicy
from deploy.prepare import PrepareConfig
from envservers.config import EnvServerConfig
from learner.config import LearnerConfig
from weights.formats.adapter import adapter_mismatch
from weights.shared.dtypes import dtype_mismatch


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
    train_data: str = ""
    """Your own training rows (a SkyRL JSONL or Parquet file, e.g. `learner prepare`'s
    train.jsonl; relative to the working directory) instead of the calculator's; needs
    `eval_data` too. The run keeps a validated copy in its directory."""
    eval_data: str = ""
    """Your own eval rows, with `train_data`."""
    warm_start: bool = True
    """Start RL from the supervised warm start (False: random weights, for quick checks)."""
    model_dir: str = ""
    """Your own model directory (a Hugging Face checkpoint: config, tokenizer with a chat
    template, safetensors) for the learner and the engines, instead of the demo's tiny model
    (then `warm_start` does not apply). Relative to the working directory."""
    timeout_s: float = 3600.0
    """Stop everything if the run has not finished after this long."""

    @pydantic.model_validator(mode="after")
    def _own_data_whole(self) -> LocalRunConfig:
        if bool(self.train_data) != bool(self.eval_data):
            raise ValueError("local.train_data and local.eval_data: set both, or neither")
        return self

    colocate: Literal["auto", "never"] = "auto"
    """On a GPU machine with fewer GPUs than learner ranks plus engines: `auto` puts engines
    on the learner's GPUs (a 1-GPU machine runs everything on GPU 0; weights then go over
    gloo), `never` refuses to start (common/placement.py)."""
    learner_gpu_memory_fraction: float = pydantic.Field(0.4, gt=0, lt=1)
    """On a GPU shared with engines: the share of its memory kept for the learner; the
    engines on it split the rest (their gpu_memory_utilization)."""


class RayRunConfig(StrictModel):
    """The `[ray]` section: how the Ray driver (`make cluster-up TARGET=ray`,
    deploy/ray_cluster.py) lays a run out on a Ray cluster. Ports not named here come from the
    roles' own sections (envserver.port, envserver.metrics_port, actor.metrics_port,
    learner.metrics_port, learner.weight_sync.store_port): the k-th process of a role on one
    host gets that port + k."""

    runs_dir: str = "runs"
    """Parent of run directories (relative: to the repository). Every node must see it at
    the same path (a shared filesystem): logs, checkpoints, weight snapshots and the learner's
    metrics.jsonl are written there by processes on several nodes."""
    resume: str = ""
    """Id of an earlier run (a directory under runs_dir) to continue in place: the learner
    resumes from that run's newest checkpoint. Empty: a new run."""
    namespace: str = "tether"
    """Ray namespace of the run's named actors and placement groups."""
    actor_replicas: int = pydantic.Field(2, ge=1)
    """Actor replicas, each its own `actor --replicas 1` process with one vLLM engine."""
    envservers: int = pydantic.Field(1, ge=1)
    """Env server processes (placed on CPU nodes when there is room there)."""
    learner_nodes: int = pydantic.Field(1, ge=1)
    """Nodes the learner's `learner.nproc` ranks are split over (evenly); each node's ranks
    are one STRICT_PACK placement group."""
    gpu_resource: str = "GPU"
    """The Ray resource that counts GPUs (a custom resource on a test cluster without any)."""
    gpus_per_learner_rank: float = pydantic.Field(1.0, ge=0)
    """GPUs reserved for each learner rank."""
    gpus_per_actor: float | None = pydantic.Field(None, ge=0)
    """GPUs reserved for each actor replica; None: `actor.engine.tensor_parallel_size`."""
    cpus_per_learner_rank: float = pydantic.Field(4.0, ge=0)
    """CPUs reserved for each learner rank."""
    cpus_per_actor: float = pydantic.Field(4.0, ge=0)
    """CPUs reserved for each actor replica."""
    cpus_per_envserver: float = pydantic.Field(2.0, ge=0)
    """CPUs reserved for each env server."""
    cpus_nats: float = pydantic.Field(1.0, ge=0)
    """CPUs reserved for nats-server on the head node."""
    nats_port: int = pydantic.Field(4222, ge=1, le=65535)
    """nats-server's client port on the head node."""
    master_port: int = pydantic.Field(29500, ge=1, le=65535)
    """torch.distributed rendezvous port (MASTER_PORT) on learner rank 0's node."""
    free_ports: bool = False
    """Ask each node for free ports instead of the fixed ones (tests; several runs on one
    host). Fixed ports are what firewalls and Prometheus configs expect."""
    bind_host: str = ""
    """Address servers listen on; empty: each node's own IP as Ray knows it (what other nodes
    and Prometheus reach). "0.0.0.0": every interface."""
    placement_timeout_s: float = pydantic.Field(300.0, gt=0)
    """How long to wait for the placement groups to be placed before giving up."""


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
    restarts: RestartPolicy = RestartPolicy()
    """How every supervisor restarts a process that dies (backoff, a restart budget per
    role): `make run`'s roles, `actor --replicas N`'s replicas, a run's roles on Ray (the
    learner's ranks together). The run fails once a role has spent its budget."""
    elastic: ElasticConfig = ElasticConfig()
    """An actor fleet sized by the prompts backlog (Ray's launcher, the Kubernetes
    `elastic` overlay); common/fleet.py is the rule."""
    local: LocalRunConfig = LocalRunConfig()
    """The single-machine launcher behind `make run`."""
    prepare: PrepareConfig = PrepareConfig()
    """Inputs a demo run on a cluster makes for itself (deploy/prepare.py)."""
    ray: RayRunConfig = RayRunConfig()
    """The Ray driver behind `make cluster-up TARGET=ray`."""

    def fleet_bounds(self) -> FleetBounds:
        """The actor fleet's bounds (common/fleet.py), from the learner's staleness window
        and one replica's room; both sections must be present."""
        if self.learner is None or self.actor is None:
            raise ValueError("an elastic fleet needs the config's [learner] and [actor] sections")
        return fleet_bounds(
            self.elastic,
            max_staleness=self.learner.staleness_ceiling,  # "auto": sized for its limit
            prompts_per_step=self.learner.prompts_per_step,
            group_size=self.learner.group_size,
            max_num_seqs=self.actor.engine.max_num_seqs,
            max_groups_in_flight=self.actor.max_groups_in_flight,
        )

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
        # both in torch's names (weights/shared/dtypes.py)
        problem = dtype_mismatch(learner, engine)
        if problem:
            raise ValueError(problem)
        return self

    @pydantic.model_validator(mode="after")
    def _sections_agree(self) -> RunConfig:
        """Settings of two sections that only work together (each role alone cannot see
        the other's section); every message names both keys."""
        problems = []
        if self.actor is not None:
            problems += _actor_and_broker(self.actor, self.broker)
        if self.actor is not None and self.envserver is not None:
            problems += _actor_and_envserver(self.actor, self.envserver)
        if self.actor is not None and self.learner is not None:
            problems += _learner_and_actor(self.learner, self.actor)
        if problems:
            raise ValueError("; ".join(problems))
        return self


def _learner_and_actor(learner: LearnerConfig, actor: ActorConfig) -> list[str]:
    """A LoRA run's adapter rank against the engines' max_lora_rank, before anything
    starts (the engines would be refused when they subscribe)."""
    if learner.finetune.mode != "lora":
        return []
    engine = actor.engine
    problem = adapter_mismatch(
        {"r": learner.finetune.rank}, engine.max_lora_rank if engine.enable_lora else None
    )
    return [problem] if problem else []


def _actor_and_broker(actor: ActorConfig, broker: BrokerConfig) -> list[str]:
    if actor.heartbeat_s * 2 > broker.prompt_ack_wait_s:
        return [
            f"actor.heartbeat_s ({actor.heartbeat_s}) must be at most half of "
            f"broker.prompt_ack_wait_s ({broker.prompt_ack_wait_s}), else a task still "
            "running is redelivered to another replica"
        ]
    return []


def _actor_and_envserver(actor: ActorConfig, server: EnvServerConfig) -> list[str]:
    problems = []
    if actor.env.max_message_bytes != server.max_message_bytes:
        problems.append(
            f"actor.env.max_message_bytes ({actor.env.max_message_bytes}) must equal "
            f"envserver.max_message_bytes ({server.max_message_bytes}): the two ends of "
            "the gRPC channel refuse messages over their own limit"
        )
    if server.tls.cert_file and not actor.env.tls.ca_file:
        problems.append(
            "actor.env.tls.ca_file is empty but envserver.tls.cert_file is set: the actors "
            "cannot verify (or even reach) a TLS env server"
        )
    if not server.tls.cert_file and actor.env.tls.ca_file:
        problems.append(
            "actor.env.tls.ca_file is set but envserver.tls.cert_file is empty: the env "
            "server speaks plain gRPC"
        )
    if server.tls.client_ca_file and not actor.env.tls.cert_file:
        problems.append(
            "actor.env.tls.cert_file is empty but envserver.tls.client_ca_file is set: the "
            "env server refuses clients without a certificate"
        )
    return problems


assert tuple(RunConfig.model_fields) == SECTIONS, "common.config.SECTIONS must list RunConfig's"


def load_run_config(path: str | Path | None, overrides: list[str] = ()) -> RunConfig:
    """Validate the whole file (plus dotted overrides); ValueError names every bad key."""
    data = read_sections(path, overrides)
    try:
        return RunConfig.model_validate(data)
    except pydantic.ValidationError as e:
        where = f"{path}" if path else "command line"
        raise ValueError(f"invalid config ({where}):\n" + error_lines(e)) from None
