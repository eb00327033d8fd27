"""The collective transport: one weight round as a stateless process group (gloo on CPU, NCCL
on GPU, the same code) over which rank 0 broadcasts buckets.

Framing, per bucket (rank 0 sends, everyone else receives):

    int64[2] (header bytes, buffer bytes) ─► JSON header (uint8) ─► flat buffer (uint8)
    ... end of round: int64[2] zeros

torch is imported inside functions so that configs importing this package stay fast.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING

from weights.buckets import bucketize, pack_bucket, unpack_bucket
from weights.rendezvous import PREFIX, is_loopback, round_key

if TYPE_CHECKING:
    import torch


def round_group(
    store, host: str, version: int, rank: int, world_size: int, backend: str, timeout_s: float
):
    """The process group of round `version`: its own key prefix in the shared store, so it
    neither needs nor disturbs a default group. Blocks until all ranks joined (or raises
    after `timeout_s`)."""
    import torch.distributed as dist

    prefixed = dist.PrefixStore(f"{PREFIX}/{round_key(version, 'pg')}", store)
    timeout = timedelta(seconds=timeout_s)
    if backend == "gloo":
        options = dist.ProcessGroupGloo._Options()
        options._timeout = timeout
        # Bind gloo to loopback when the store is local, so nothing leaves 127.0.0.1.
        device = (
            dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")
            if is_loopback(host)
            else dist.ProcessGroupGloo.create_default_device()
        )
        options._devices = [device]
        return dist.ProcessGroupGloo(prefixed, rank, world_size, options)
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(prefixed, rank, world_size, options)
    raise ValueError(f"unknown backend {backend!r}")


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
