"""Named tensors as a stream of flat buckets: how weights travel in one broadcast round.

Packing is pure: `bucketize` groups consecutive (name, tensor) pairs into lists of about
`bucket_bytes`, pulling the source lazily (the learner never holds more than one bucket of
gathered tensors); `pack_bucket` copies one list into a flat uint8 buffer, each tensor at a
64-byte aligned offset so any dtype can be viewed in place, described by a JSON header of
[name, dtype, shape, offset]; `unpack_bucket` views the tensors back out, without copies.

Framing over a broadcast group (rank 0 sends, everyone else receives), per bucket:

    int64[2] (header bytes, buffer bytes) ─► JSON header (uint8) ─► flat buffer (uint8)
    ... end of round: int64[2] zeros

torch is imported inside functions so that configs importing this package stay fast.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

ALIGN = 64
"""Byte offset alignment of each tensor inside a bucket (any dtype can view it)."""


def _aligned(offset: int) -> int:
    return (offset + ALIGN - 1) // ALIGN * ALIGN


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def bucketize(
    named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group consecutive tensors into lists of at most `bucket_bytes` (aligned) bytes; a
    tensor larger than that travels alone. Pulls the source lazily (one bucket at a time)."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    bucket: list[tuple[str, torch.Tensor]] = []
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
    named_tensors: list[tuple[str, torch.Tensor]], device: torch.device | str = "cpu"
) -> tuple[bytes, torch.Tensor]:
    """One flat uint8 buffer holding every tensor's bytes, and a JSON header of
    [name, dtype, shape, offset] entries locating them."""
    import torch

    entries: list[list[Any]] = []
    offset = 0
    for name, tensor in named_tensors:
        entries.append([name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape), offset])
        offset = _aligned(offset + _nbytes(tensor))
    buffer = torch.zeros(offset, dtype=torch.uint8, device=device)  # [nbytes]
    for (_, tensor), (_, _, _, start) in zip(named_tensors, entries, strict=True):
        flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
        buffer[start : start + flat.numel()].copy_(flat)
    return json.dumps(entries).encode(), buffer


def unpack_bucket(header: bytes, buffer: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """Inverse of `pack_bucket`: views into `buffer` (no copies)."""
    import torch

    out = []
    for name, dtype_name, shape, start in json.loads(header):
        dtype = getattr(torch, dtype_name)
        numel = 1
        for dim in shape:
            numel *= dim
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        out.append((name, buffer[start : start + nbytes].view(dtype).reshape(shape)))
    return out


# ---- framing over a broadcast group --------------------------------------------------------------


def _broadcast(group, tensor: torch.Tensor) -> None:
    group.broadcast(tensor, 0).wait()


def buffer_device(backend: str):
    import torch

    return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else "cpu"


def send_buckets(
    group, named_tensors: Iterable[tuple[str, torch.Tensor]], *, backend: str, bucket_bytes: int
) -> tuple[int, int]:
    """Broadcast every tensor from rank 0, bucket by bucket. Returns (tensors, bytes)."""
    import torch

    device = buffer_device(backend)
    num_tensors = num_bytes = 0
    for bucket in bucketize(named_tensors, bucket_bytes):
        header, buffer = pack_bucket(bucket, device)
        sizes = torch.tensor([len(header), buffer.numel()], dtype=torch.int64, device=device)
        _broadcast(group, sizes)
        _broadcast(group, torch.frombuffer(bytearray(header), dtype=torch.uint8).to(device))
        _broadcast(group, buffer)
        num_tensors += len(bucket)
        num_bytes += buffer.numel()
    _broadcast(group, torch.zeros(2, dtype=torch.int64, device=device))  # end of round
    return num_tensors, num_bytes


def receive_buckets(group, *, backend: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) as buckets arrive from rank 0, until the end marker."""
    import torch

    device = buffer_device(backend)
    while True:
        sizes = torch.zeros(2, dtype=torch.int64, device=device)
        _broadcast(group, sizes)
        header_len, num_bytes = sizes.tolist()
        if header_len == 0:
            return
        header = torch.empty(header_len, dtype=torch.uint8, device=device)
        _broadcast(group, header)
        buffer = torch.empty(num_bytes, dtype=torch.uint8, device=device)
        _broadcast(group, buffer)
        yield from unpack_bucket(header.cpu().numpy().tobytes(), buffer)
