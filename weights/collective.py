"""Buckets over a weight group (weights/communicator.py): rank 0 streams packed buckets,
every other rank yields tensors as they arrive.

Framing, per bucket (rank 0 sends, everyone else receives):

    int64[2] (header bytes, buffer bytes) ─► JSON header (uint8) ─► flat buffer (uint8)
    ... end of round: int64[2] zeros

The sender keeps at most `MAX_IN_FLIGHT` buckets in flight: before packing the next one it
waits (bounded) for the oldest to complete, so a GPU learner holds two bucket buffers, not
the model, however slow the receivers. A receiver allocates one bucket at a time and hands
its tensors on (views, no copies) before the next arrives. Every wait is bounded by the
group's timeout: no progress for that long means a dead or hung peer.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from weights.buckets import bucketize, pack_bucket, unpack_bucket

if TYPE_CHECKING:
    import torch

    from weights.communicator import WeightGroup

MAX_IN_FLIGHT = 2


def send_buckets(
    group: WeightGroup, named_tensors: Iterable[tuple[str, torch.Tensor]], *, bucket_bytes: int
) -> tuple[int, int]:
    """Broadcast every tensor from rank 0, bucket by bucket, and wait until the last has
    left. Returns (tensors, bytes)."""
    import torch

    device = group.device
    in_flight: deque = deque()
    num_tensors = num_bytes = 0
    for bucket in bucketize(named_tensors, bucket_bytes):
        while len(in_flight) >= MAX_IN_FLIGHT:
            group.wait(in_flight.popleft(), "a bucket")
        header, buffer = pack_bucket(bucket, device)
        header_tensor = torch.frombuffer(bytearray(header), dtype=torch.uint8).to(device)
        sizes = torch.tensor([len(header), buffer.numel()], dtype=torch.int64, device=device)
        group.broadcast(sizes)
        group.broadcast(header_tensor)
        in_flight.append(group.broadcast(buffer))
        num_tensors += len(bucket)
        num_bytes += buffer.numel()
    end = group.broadcast(torch.zeros(2, dtype=torch.int64, device=device))
    group.wait(end, "the end of the round")
    group.synchronize()
    return num_tensors, num_bytes


def receive_buckets(group: WeightGroup) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) as buckets arrive from rank 0, until the end marker. Tensors are
    views into the bucket's buffer, on the group's device."""
    import torch

    device = group.device
    while True:
        sizes = torch.zeros(2, dtype=torch.int64, device=device)
        group.wait(group.broadcast(sizes), "a bucket header")
        header_len, num_bytes = sizes.tolist()
        if header_len == 0:
            return
        header = torch.empty(header_len, dtype=torch.uint8, device=device)
        group.wait(group.broadcast(header), "a bucket header")
        buffer = torch.empty(num_bytes, dtype=torch.uint8, device=device)
        group.wait(group.broadcast(buffer), "a bucket")
        yield from unpack_bucket(header.cpu().numpy().tobytes(), buffer)
