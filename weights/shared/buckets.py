"""Named tensors as a stream of flat buckets: how weights travel in one broadcast round.

Packing is pure: `bucketize` groups consecutive (name, tensor) pairs into lists of about
`bucket_bytes`, pulling the source lazily (the learner never holds more than one bucket of
gathered tensors); `pack_bucket` copies one list into a flat uint8 buffer, each tensor at a
64-byte aligned offset so any dtype can be viewed in place, described by a JSON header of
[name, dtype, shape, offset]; `unpack_bucket` views the tensors back out, without copies.
A tensor may travel as other bytes (`Encoded`: a delta, weights/shared/delta_book.py): its entry
then carries a fifth field, what to rebuild it from, and unpacks as `Encoded` again.
torch is imported inside functions so that configs importing this package stay fast.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

ALIGN = 64
"""Byte offset alignment of each tensor inside a bucket (any dtype can view it)."""


@dataclass(frozen=True)
class Encoded:
    """A tensor of `dtype` and `shape` that travels as the bytes `data` (uint8, flat), with
    `meta` saying how to rebuild it (weights/shared/delta_book.py)."""

    data: torch.Tensor
    dtype: str
    shape: list[int]
    meta: dict[str, Any]


def dtype_name(tensor: torch.Tensor) -> str:
    """The tensor's dtype as a header names it (`bfloat16`)."""
    return str(tensor.dtype).removeprefix("torch.")


def _aligned(offset: int) -> int:
    return (offset + ALIGN - 1) // ALIGN * ALIGN


def _nbytes(tensor: torch.Tensor | Encoded) -> int:
    if isinstance(tensor, Encoded):
        return tensor.data.numel()
    return tensor.numel() * tensor.element_size()


def bucketize(
    named_tensors: Iterable[tuple[str, torch.Tensor | Encoded]], bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor | Encoded]]]:
    """Group consecutive tensors into lists of at most `bucket_bytes` (aligned) bytes; a
    tensor larger than that travels alone. Pulls the source lazily (one bucket at a time)."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    bucket: list[tuple[str, torch.Tensor | Encoded]] = []
    size = 0
    for name, tensor in named_tensors:
        need = _aligned(_nbytes(tensor))
        if bucket and size + need > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += need
    if bucket:
        yield bucket


def pack_bucket(
    named_tensors: list[tuple[str, torch.Tensor | Encoded]],
    device: torch.device | str = "cpu",
    into: torch.Tensor | None = None,
) -> tuple[bytes, torch.Tensor]:
    """One flat uint8 buffer holding every tensor's bytes, and a JSON header of
    [name, dtype, shape, offset] entries locating them ([..., meta] for an `Encoded`).

    The buffer is the front of `into` when that is large enough (a sender reuses its
    buffers: fresh memory costs a page fault per 4 KiB, a third of the copy's time), else a
    new one; a lone contiguous tensor on `device` is its own buffer, sent without a copy
    (a vocabulary-sized tensor travels alone: a quarter of a 0.5B model's bytes)."""
    import torch

    entries: list[list[Any]] = []
    offset = 0
    for name, tensor in named_tensors:
        if isinstance(tensor, Encoded):
            entries.append([name, tensor.dtype, list(tensor.shape), offset, tensor.meta])
        else:
            entries.append([name, dtype_name(tensor), list(tensor.shape), offset])
        offset = _aligned(offset + _nbytes(tensor))
    header = json.dumps(entries).encode()
    if len(named_tensors) == 1:
        lone = named_tensors[0][1]
        if not isinstance(lone, Encoded) and lone.is_contiguous() and on_device(lone, device):
            return header, lone.detach().reshape(-1).view(torch.uint8)
    if into is not None and into.numel() >= offset:
        buffer = into[:offset]
    else:
        buffer = torch.empty(offset, dtype=torch.uint8, device=device)  # [nbytes]
    end = 0
    for (_, tensor), entry in zip(named_tensors, entries, strict=True):
        if isinstance(tensor, Encoded):
            flat = tensor.data
        else:
            flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
        start = entry[3]
        buffer[end:start].zero_()  # alignment padding: no stale bytes on the wire
        buffer[start : start + flat.numel()].copy_(flat)
        end = start + flat.numel()
    buffer[end:].zero_()
    return header, buffer


def on_device(tensor: torch.Tensor, device: torch.device | str) -> bool:
    """Whether `tensor` lives on `device` (`cuda` meaning the current GPU)."""
    import torch

    want = torch.device(device)
    if want.type == "cuda" and want.index is None:
        want = torch.device("cuda", torch.cuda.current_device())
    return tensor.device == want


def unpack_bucket(header: bytes, buffer: torch.Tensor) -> list[tuple[str, torch.Tensor | Encoded]]:
    """Inverse of `pack_bucket`: views into `buffer` (no copies)."""
    import torch

    out: list[tuple[str, torch.Tensor | Encoded]] = []
    for name, dtype_name, shape, start, *meta in json.loads(header):
        if meta:
            data = buffer[start : start + meta[0]["nbytes"]]
            out.append((name, Encoded(data, dtype_name, shape, meta[0])))
            continue
        dtype = getattr(torch, dtype_name)
        numel = 1
        for dim in shape:
            numel *= dim
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        out.append((name, buffer[start : start + nbytes].view(dtype).reshape(shape)))
    return out
