"""The `weight_sync` config section (under `[learner]`): where the learner serves the weight
store, bucket size, backend and timeouts. Pydantic only: imports no torch."""

from __future__ import annotations

import pydantic

from common.config import StrictModel


class WeightSyncConfig(StrictModel):
    """Where the learner serves the weight store and how long it waits for actors."""

    store_host: str = "127.0.0.1"
    """Host of the learner's TCPStore (learner binds it; actors connect to it)."""
    store_port: int = 29650
    """Port of the learner's TCPStore."""
    bucket_mb: float = 64.0
    """Target bucket size: tensors are packed into flat buffers of about this many MB."""
    join_timeout_s: float = 10.0
    """Longest the sender waits for registered actors to join a round."""
    transfer_timeout_s: float = 60.0
    """Timeout of the round's process group: forming it and every broadcast in it."""
    backend: str = "auto"
    """`auto` (nccl when the learner has CUDA, else gloo), `gloo` or `nccl`."""
    delta: bool = False
    """Send each version as its change from the one before (the XOR of its bit patterns,
    zstd-compressed; a keyframe every `keyframe_interval` versions and whenever the members
    change): at RL learning rates in bf16 a few percent of the bytes. Costs a host copy of
    the model (in the wire dtype) on the learner's rank 0 and in every engine worker, and
    CPU time to encode and decode (docs/weights.md, "Delta rounds"). Full weights only (an
    adapter's rounds are small already)."""
    keyframe_interval: int = pydantic.Field(default=20, ge=1)
    """With `delta`: at most this many versions from one keyframe to the next."""

    @pydantic.field_validator("bucket_mb", "join_timeout_s", "transfer_timeout_s")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError(f"must be > 0, got {value}")
        return value

    @pydantic.field_validator("backend")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        if value not in ("auto", "gloo", "nccl"):
            raise ValueError(f"backend must be auto, gloo or nccl, got {value!r}")
        return value
