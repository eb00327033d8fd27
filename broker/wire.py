"""Wire types: what travels on the bus between the learner, the actors and the dispatcher.

Every type is a msgspec Struct encoded as MessagePack. Token arrays travel as packed
little-endian bytes (int32 ids, float32 logprobs, uint8 loss mask, int32 policy versions),
never as lists of ints: decoding a list of 100K Python ints costs ~30x more than viewing the
same bytes as a numpy array, and would make the learner, not NATS, the bottleneck.

Changing a field here changes the wire contract: `tests/test_public_surface.py` pins it.
"""

from __future__ import annotations

import msgspec


class PromptTask(msgspec.Struct, frozen=True, kw_only=True):
    """One prompt released by the dispatcher; an actor turns it into a GRPO group.

    Shaped like a SkyRL dataset row plus the scheduling fields the learner needs.
    """

    task_id: str
    """Unique per release (dataset key + step + epoch); the group id of its trajectories."""
    step: int
    """Training step this prompt is meant for; the staleness bound is computed from it."""
    min_version: int = 0
    """Oldest policy version allowed to generate it (step - max_staleness): an actor whose
    weights are older waits for newer ones first. This makes max_staleness=0 synchronous."""
    group_size: int
    """Number of samples to generate for this prompt (GRPO group size)."""
    env_class: str
    """Name of the environment (in an env server's registry) that scores the episode."""
    data_source: str = ""
    prompt: list[dict[str, str]]
    """Chat messages: system + first user message only (SkyRL row format)."""
    reward_spec: dict = {}
    extra_info: dict = {}
    is_eval: bool = False
    """Eval prompts are generated with eval sampling settings and never trained on."""


class Trajectory(msgspec.Struct, frozen=True, kw_only=True):
    """One finished multi-turn episode, tokenized, as the learner trains on it.

    The token arrays cover prompt + all turns. `loss_mask` is 1 exactly on tokens the policy
    generated (assistant turns) and 0 on the prompt and on templated observations.
    `versions[i]` is the policy version that generated token i (-1 where no policy did).
    """

    trajectory_id: str
    group_id: str
    """The PromptTask.task_id this sample belongs to."""
    group_size: int
    sample_index: int
    step: int
    """PromptTask.step, copied so the learner can group without a lookup."""
    env_class: str
    data_source: str = ""
    actor_id: str = ""
    is_eval: bool = False
    prompt_len: int
    """Number of leading tokens that are the templated prompt."""
    token_ids: bytes
    """int32 little-endian, one per token."""
    logprobs: bytes
    """float32 little-endian: behaviour logprob of each token (0 where loss_mask is 0)."""
    loss_mask: bytes
    """uint8, one per token."""
    versions: bytes
    """int32 little-endian: policy version that produced each token, -1 for non-policy tokens."""
    reward: float
    stop_reason: str
    """`stop` (the env ended the episode after a turn that ended on EOS), `length` (... after
    a turn cut at max_generate_length), `max_turns`, `max_input_length`, `overlong`, or
    `error:<what>` when the episode could not be finished (reward 0, all-zero loss mask: the
    learner leaves it out of group statistics)."""
    num_turns: int
    num_tool_calls: int = 0
    env_metrics: dict[str, float] = {}
    timing: dict[str, float] = {}
    """Seconds spent generating, in env steps, waiting for weights; plus start/end stamps."""


class PolicyVersion(msgspec.Struct, frozen=True, kw_only=True):
    """The learner's announcement of a new policy version (stored in the NATS KV)."""

    version: int
    """Number of optimizer steps the learner has taken."""
    published_at: float
    snapshot_path: str = ""
    """Newest full weights snapshot on disk, for actors that join late ("" if none yet)."""
    snapshot_version: int = -1
    broadcast_addr: str = ""
    """host:port of the TCPStore of the weight broadcast group ("" when not broadcasting)."""
    lineage: str = ""
    """Which learner process announced it: new with every learner start. A resumed learner
    continues from its checkpoint's version, so versions above that one, announced under
    an earlier lineage, belong to a history that was rolled back: an actor whose weights
    are newer than the announced version of a new lineage reloads the announced snapshot
    ("" from a learner that predates lineages)."""
