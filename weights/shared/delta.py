"""Weight updates as deltas in the wire dtype, to send fewer bytes: the codec, pure, no I/O.

At RL learning rates most bf16 values do not change from one version to the next: a step
moves a weight by about the learning rate, and bf16 rounds it back unless that crosses half
a unit of its last place. So a version is sent as the XOR of its bit patterns with the
previous version's (zero wherever nothing changed) and compressed with zstd; the receiver
XORs the decoded bits into the previous version's and holds the new one, bit for bit
(`tests/weights/test_delta.py`; `bench/delta_sync.py` measures the bytes at the 0.5B shape).

Two encodings of the same change, measured against each other by the benchmark:

    xor     the XOR of the whole tensor's bit patterns, zstd-compressed: a zero run costs
            almost nothing, a changed value two bytes plus zstd's framing of the run.
    sparse  the changed positions (gaps between them, as uint32) and their new values,
            each zstd-compressed: cheaper when changes are rare, dearer as they crowd.

Every payload carries a CRC-32 of the tensor it must produce: a receiver whose previous
version differs from the sender's (it missed a delta) gets a mismatch, not silently wrong
weights, and asks for a keyframe (the whole tensor, `keyframe`).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

Encoding = Literal["keyframe", "xor", "sparse"]
ZSTD_LEVEL = 1
"""zstd's fastest regular level: the XOR is mostly zero runs, which every level squeezes
alike; higher levels buy little here and cost encode time."""

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


class DeltaMismatch(ValueError):
    """The decoded tensor is not the one the sender encoded: the receiver's previous version
    differs from the sender's (a missed delta). The remedy is a keyframe."""


@dataclass(frozen=True)
class Payload:
    encoding: Encoding
    data: bytes
    crc: int
    """CRC-32 of the bit patterns the decode must produce."""
    numel: int

    @property
    def num_bytes(self) -> int:
        return len(self.data)


def bits(tensor: torch.Tensor) -> np.ndarray:
    """The tensor's bit patterns as unsigned integers of its width (a view, no copy)."""
    flat = tensor.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().view(_UINT[flat.element_size()])


def crc_of(tensor: torch.Tensor) -> int:
    return zlib.crc32(bits(tensor).view(np.uint8))


def encode(
    current: torch.Tensor, previous: torch.Tensor | None, encoding: Encoding = "xor"
) -> Payload:
    """`current` as a payload against `previous` (the receiver's copy); None, or encoding
    `keyframe`: the whole tensor."""
    import zstandard  # here: only a learner or engine that sends deltas needs it

    now = bits(current)
    crc = zlib.crc32(now.view(np.uint8))
    compress = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress
    if previous is None or encoding == "keyframe":
        return Payload("keyframe", compress(now.view(np.uint8)), crc, now.size)
    before = bits(previous)
    if before.shape != now.shape or before.dtype != now.dtype:
        raise ValueError(
            f"a delta needs the same shape and dtype: {previous.shape} vs {current.shape}"
        )
    changed = np.bitwise_xor(now, before)
    if encoding == "xor":
        return Payload("xor", compress(changed.view(np.uint8)), crc, now.size)
    positions = np.flatnonzero(changed).astype(np.uint32)
    gaps = np.diff(positions, prepend=np.uint32(0)).astype(np.uint32)
    header = np.array([positions.size], dtype=np.uint64).view(np.uint8).tobytes()
    body = gaps.view(np.uint8).tobytes() + now[positions].view(np.uint8).tobytes()
    return Payload("sparse", header + compress(body), crc, now.size)


def decode(payload: Payload, previous: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """The tensor `payload` encodes, shaped and typed as `like`, from `previous` (the
    receiver's copy of the version the sender encoded against). Raises DeltaMismatch when
    the result is not what the sender had."""
    import zstandard

    width = like.element_size()
    raw = zstandard.ZstdDecompressor().decompress
    if payload.encoding == "keyframe":
        out = np.frombuffer(raw(payload.data), dtype=_UINT[width]).copy()
    elif previous is None:
        raise DeltaMismatch("a delta needs the previous version: ask for a keyframe")
    elif payload.encoding == "xor":
        changed = np.frombuffer(raw(payload.data), dtype=_UINT[width])
        out = np.bitwise_xor(bits(previous), changed)
    else:
        count = int(np.frombuffer(payload.data[:8], dtype=np.uint64)[0])
        body = raw(payload.data[8:])
        gaps = np.frombuffer(body[: 4 * count], dtype=np.uint32)
        values = np.frombuffer(body[4 * count :], dtype=_UINT[width])
        out = bits(previous).copy()
        out[np.cumsum(gaps, dtype=np.uint64)] = values
    if out.size != payload.numel or zlib.crc32(out.view(np.uint8)) != payload.crc:
        raise DeltaMismatch("decoded weights differ from the sender's: ask for a keyframe")
    return torch.from_numpy(out.view(np.uint8)).view(like.dtype).reshape(like.shape)
