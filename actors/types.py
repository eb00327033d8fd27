"""The rollout's contract: what an engine and an env connector must provide, and what one
episode produces. The episode logic (actors/episode.py) is written against these
protocols only, so it runs on vLLM (actors/vllm_engine.py), on transformers
(actors/hf_engine.py) or on scripted fakes (tests/fakes.py), against env servers over gRPC
(protos/client.py `GrpcEnvConnector`) or in-process environments.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from actors.config import SamplingConfig
from protos.types import Observation, StepResult, WorkflowOutcome
from weights.actor_side.follower import WeightReceiver

NO_POLICY_VERSION = -1
"""Version tag of tokens no policy generated (prompt, observations, a closing EOS)."""


@dataclass(frozen=True)
class Generation:
    token_ids: list[int]
    logprobs: list[float]
    """Logprob of each sampled token under the behaviour policy."""
    finish_reason: str
    """`stop` (ended on a stop token, included in token_ids) or `length` (hit max_tokens)."""
    versions: list[int]
    """Policy version of the weights that produced each token."""


@dataclass(frozen=True)
class Turn:
    """What one assistant turn may generate: the role's sampling settings (as configured),
    and what the episode decides per turn."""

    sampling: SamplingConfig
    max_tokens: int
    """At most this many tokens (what is left of the episode's budget)."""
    stop_token_ids: tuple[int, ...] = ()
    """The turn ends after the first of these (included)."""
    seed: int | None = None
    """This request's seed (sample i of a seeded group uses sampling.seed + i); None:
    unseeded."""


class Engine(Protocol):
    version: int
    """Policy version of the weights generating now."""

    async def generate(self, prompt_token_ids: list[int], turn: Turn) -> Generation:
        """One assistant turn: at most `turn.max_tokens` tokens, ending after the first stop
        token (included) or at the limit."""
        ...


class ActorEngine(Engine, WeightReceiver, Protocol):
    """What the actor loop needs of its engine: generation, in-flight weight updates
    (weights/actor_side/follower.py), and loading a snapshot before the first broadcast."""

    async def load_snapshot(self, path: str, version: int) -> float:
        """Load the weights snapshot at `path`, label later tokens `version`; returns the
        stall in seconds. WeightUpdateError if it cannot be read (old weights stay)."""
        ...


class EnvSession(Protocol):
    observation: Observation
    """After reset: the prompt messages, the tools offered, metadata."""

    async def step(self, action_text: str) -> StepResult:
        """One assistant message in; observations, reward, done, metadata out."""
        ...

    async def run_workflow(self, base_url: str, api_key: str) -> WorkflowOutcome:
        """A workflow session (`observation.kind == "workflow"`): run the agent once
        against that chat-completions endpoint; its score or its error."""
        ...

    async def close(self) -> None: ...


class EnvConnector(Protocol):
    async def open(self, env_class: str, task: dict) -> EnvSession:
        """Open and reset a session; each call may pick another server address.
        Raises EnvUnavailable (retryable) or TaskRejected (never retry this task)."""
        ...


@dataclass
class EpisodeResult:
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    prompt_len: int = 0
    reward: float = 0.0
    stop_reason: str = ""
    num_turns: int = 0
    num_tool_calls: int = 0
    num_env_retries: int = 0
    env_metrics: dict[str, float] = field(default_factory=dict)
    timing: dict[str, float] = field(default_factory=dict)
    """generate_s, env_s (open + steps), start, end (unix seconds)."""
    turn_finish_reasons: list[str] = field(default_factory=list)
    env_step_latencies_s: list[float] = field(default_factory=list)
    error: str = ""
    resumed_turns: int = 0
    """Turns taken over from the episode's checkpoint (actors/resume.py), not generated here."""
    resumed_tokens: int = 0
    """Policy tokens of those turns."""
    segment_starts: list[int] = field(default_factory=list)
    """An agent episode of several conversations: where each after the first begins
    (actors/workflow_episode.py; Trajectory.segment_starts)."""
    resume_refused: str = ""
    """Why a checkpoint the episode had could not be continued (it was played from its
    start): actors/resume.py `REFUSALS`."""

    @property
    def num_generated_tokens(self) -> int:
        return sum(1 for v in self.versions if v != NO_POLICY_VERSION)

    def append(self, ids: list[int], *, logprobs=None, versions=None) -> None:
        """Append policy tokens (with logprobs and versions) or, without them, fixed tokens."""
        self.token_ids.extend(ids)
        if versions is None:
            self.logprobs.extend([0.0] * len(ids))
            self.loss_mask.extend([0] * len(ids))
            self.versions.extend([NO_POLICY_VERSION] * len(ids))
        else:
            self.logprobs.extend(logprobs)
            self.loss_mask.extend([1] * len(ids))
            self.versions.extend(versions)

    def truncate(self, length: int) -> None:
        for name in ("token_ids", "logprobs", "loss_mask", "versions"):
            del getattr(self, name)[length:]

    def zero_loss_mask(self) -> None:
        self.loss_mask = [0] * len(self.loss_mask)
