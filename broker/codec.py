"""Encode and decode wire messages; pack and view token arrays.

Pure functions, no I/O. A message that cannot be decoded raises `WireDecodeError` with the
message's identity in the text, so the consumer can terminate it and say which one it was.
"""

from __future__ import annotations

from typing import NamedTuple, TypeVar

import msgspec
import numpy as np

from broker.wire import EpisodeCheckpoint, PolicyVersion, PromptTask, Trajectory

M = TypeVar("M", PromptTask, Trajectory, PolicyVersion, EpisodeCheckpoint)

_ENCODER = msgspec.msgpack.Encoder()
_DECODERS = {
    PromptTask: msgspec.msgpack.Decoder(PromptTask),
    Trajectory: msgspec.msgpack.Decoder(Trajectory),
    PolicyVersion: msgspec.msgpack.Decoder(PolicyVersion),
    EpisodeCheckpoint: msgspec.msgpack.Decoder(EpisodeCheckpoint),
}

# Wire dtypes: explicit little-endian, whatever the host byte order.
TOKEN_DTYPE = np.dtype("<i4")
LOGPROB_DTYPE = np.dtype("<f4")
MASK_DTYPE = np.dtype("u1")
VERSION_DTYPE = np.dtype("<i4")


class WireDecodeError(ValueError):
    """A message on the bus is not a valid instance of the type its subject promises."""


class TokenArrays(NamedTuple):
    """Read-only numpy views over a trajectory's packed token bytes (no copy)."""

    token_ids: np.ndarray  # [T] int32
    logprobs: np.ndarray  # [T] float32
    loss_mask: np.ndarray  # [T] uint8
    versions: np.ndarray  # [T] int32


def encode(message: msgspec.Struct) -> bytes:
    return _ENCODER.encode(message)


def decode(data: bytes, type_: type[M], *, what: str = "") -> M:
    """Decode `data` as `type_`; `what` names the message in the error (subject, seq, id)."""
    try:
        message = _DECODERS[type_].decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise WireDecodeError(f"cannot decode {type_.__name__} {what}: {e}".strip()) from e
    if isinstance(message, Trajectory):
        _check_trajectory(message, what)
    elif isinstance(message, PolicyVersion):
        _check_policy_version(message, what)
    elif isinstance(message, EpisodeCheckpoint):
        _check_episode_checkpoint(message, what)
    return message


def pack_tokens(
    *,
    token_ids: np.ndarray | list[int],
    logprobs: np.ndarray | list[float],
    loss_mask: np.ndarray | list[int],
    versions: np.ndarray | list[int],
) -> dict[str, bytes]:
    """Pack four equal-length arrays into the Trajectory byte fields (keyword arguments)."""
    arrays = {
        "token_ids": np.asarray(token_ids, dtype=TOKEN_DTYPE),
        "logprobs": np.asarray(logprobs, dtype=LOGPROB_DTYPE),
        "loss_mask": np.asarray(loss_mask, dtype=MASK_DTYPE),
        "versions": np.asarray(versions, dtype=VERSION_DTYPE),
    }
    lengths = {name: a.shape for name, a in arrays.items()}
    if len(set(lengths.values())) != 1 or arrays["token_ids"].ndim != 1:
        raise ValueError(f"token arrays must be 1-D and of equal length, got {lengths}")
    return {name: a.tobytes() for name, a in arrays.items()}


def token_arrays(message: Trajectory | EpisodeCheckpoint) -> TokenArrays:
    return TokenArrays(
        token_ids=np.frombuffer(message.token_ids, dtype=TOKEN_DTYPE),
        logprobs=np.frombuffer(message.logprobs, dtype=LOGPROB_DTYPE),
        loss_mask=np.frombuffer(message.loss_mask, dtype=MASK_DTYPE),
        versions=np.frombuffer(message.versions, dtype=VERSION_DTYPE),
    )


def num_tokens(trajectory: Trajectory) -> int:
    return len(trajectory.token_ids) // TOKEN_DTYPE.itemsize


def _token_problems(m: Trajectory | EpisodeCheckpoint) -> list[str]:
    """Why a message's packed token fields do not line up (they would misalign training)."""
    n = len(m.token_ids) // TOKEN_DTYPE.itemsize
    problems = []
    if len(m.token_ids) % TOKEN_DTYPE.itemsize:
        problems.append(f"token_ids has {len(m.token_ids)} bytes, not a multiple of 4")
    if len(m.logprobs) != n * LOGPROB_DTYPE.itemsize:
        problems.append(f"logprobs has {len(m.logprobs)} bytes for {n} tokens")
    if len(m.loss_mask) != n * MASK_DTYPE.itemsize:
        problems.append(f"loss_mask has {len(m.loss_mask)} bytes for {n} tokens")
    if len(m.versions) != n * VERSION_DTYPE.itemsize:
        problems.append(f"versions has {len(m.versions)} bytes for {n} tokens")
    if not 0 <= m.prompt_len <= n:
        problems.append(f"prompt_len {m.prompt_len} outside [0, {n}]")
    return problems


def _check_trajectory(t: Trajectory, what: str) -> None:
    """Reject a trajectory whose byte fields disagree in length: it would misalign training."""
    problems = _token_problems(t)
    if t.group_size < 1:
        problems.append(f"group_size {t.group_size} is not a positive number of samples")
    elif not 0 <= t.sample_index < t.group_size:
        problems.append(f"sample_index {t.sample_index} outside group of {t.group_size}")
    if problems:
        name = f"trajectory {t.trajectory_id!r} {what}".strip()
        raise WireDecodeError(f"invalid {name}: " + "; ".join(problems))


def _check_policy_version(v: PolicyVersion, what: str) -> None:
    """Reject an announcement no learner makes: actors would chase a version that never comes."""
    if v.version < 0 or not -1 <= v.snapshot_version <= v.version:
        raise WireDecodeError(
            f"invalid policy version {what}: version {v.version}, snapshot_version "
            f"{v.snapshot_version} (need 0 <= version and -1 <= snapshot_version <= version)"
        )


def _check_episode_checkpoint(c: EpisodeCheckpoint, what: str) -> None:
    """Reject a checkpoint that cannot be continued: misaligned tokens, or a history whose
    actions and observations do not pair up (one observation per action but the last)."""
    problems = _token_problems(c)
    if c.sample_index < 0:
        problems.append(f"sample_index {c.sample_index} is negative")
    if not c.stored and not len(c.actions) == len(c.observations) == c.num_turns:
        problems.append(
            f"{c.num_turns} turns with {len(c.actions)} actions and "
            f"{len(c.observations)} observations"
        )
    if problems:
        name = f"episode checkpoint {c.task_id!r}/{c.sample_index} {what}".strip()
        raise WireDecodeError(f"invalid {name}: " + "; ".join(problems))
