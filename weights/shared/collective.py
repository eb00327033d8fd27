"""Buckets over a weight group (weights/shared/communicator.py): rank 0 streams packed buckets,
every other rank yields tensors as they arrive.

Framing, per bucket (rank 0 sends, everyone else receives):

    int64[2] (header bytes, buffer bytes) ─► JSON header (uint8) ─► flat buffer (uint8)
    ... end of round: int64[2] zeros

The sender keeps at most `MAX_IN_FLIGHT` buckets in flight: before packing the next one it
waits (bounded) for the oldest to complete, so a GPU learner holds two bucket buffers, not
the model, however slow the receivers. It packs into those two buffers round after round,
and sends a tensor that travels alone from its own memory. A receiver takes one bucket at a
time and hands its tensors on (views, no copies) before the next arrives, into a buffer of
the round that nobody holds any more when there is one (`BucketBuffers`). Every wait is
bounded by the group's timeout: no progress for that long means a dead or hung peer.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from weights.shared.buckets import bucketize, on_device, pack_bucket, unpack_bucket

if TYPE_CHECKING:
    import torch

    from weights.shared.communicator import WeightGroup

MAX_IN_FLIGHT = 2

Destination = Callable[[str, str, list], "torch.Tensor | None"]
"""(name, dtype name, shape) -> the tensor a receiver wants that tensor's bytes written
into, or None: the consumer's own memory for a tensor that travels alone."""


def send_buckets(
    group: WeightGroup, named_tensors: Iterable[tuple[str, torch.Tensor]], *, bucket_bytes: int
) -> tuple[int, int]:
    """Broadcast every tensor from rank 0, bucket by bucket, and wait until the last has
    left. Returns (tensors, bytes)."""
    import torch

    device = group.device
    in_flight: deque = deque()
    # One packing buffer per bucket in flight, reused round the ring: before bucket k is
    # packed, bucket k - MAX_IN_FLIGHT (the same slot) has completed.
    slots: list[torch.Tensor | None] = [None] * MAX_IN_FLIGHT
    num_tensors = num_bytes = 0
    for index, bucket in enumerate(bucketize(named_tensors, bucket_bytes)):
        while len(in_flight) >= MAX_IN_FLIGHT:
            group.wait(in_flight.popleft(), "a bucket")
        slot = index % MAX_IN_FLIGHT
        if slots[slot] is None and len(bucket) > 1:
            slots[slot] = torch.empty(bucket_bytes, dtype=torch.uint8, device=device)
        header, buffer = pack_bucket(bucket, device, into=slots[slot])
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


def receive_buckets(
    group: WeightGroup, destination: Destination | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) as buckets arrive from rank 0, until the end marker. Tensors are
    views into the bucket's buffer, on the group's device; a bucket of one plain tensor for
    which `destination` offers a tensor of its dtype, shape and device arrives in that
    tensor's memory instead (the engine's own vocabulary-sized parameter: no buffer of that
    size, no copy, memory already faulted in)."""
    import torch

    device = group.device
    spare = BucketBuffers(device)
    while True:
        sizes = torch.zeros(2, dtype=torch.int64, device=device)
        group.wait(group.broadcast(sizes), "a bucket header")
        header_len, num_bytes = sizes.tolist()
        if header_len == 0:
            return
        header = torch.empty(header_len, dtype=torch.uint8, device=device)
        group.wait(group.broadcast(header), "a bucket header")
        entries = header.cpu().numpy().tobytes()
        buffer = _destined(entries, num_bytes, destination, device)
        if buffer is None:
            buffer = spare.take(num_bytes)
        group.wait(group.broadcast(buffer), "a bucket")
        yield from unpack_bucket(entries, buffer)
        del buffer  # the views handed out now hold it, or nobody does


def _destined(entries: bytes, num_bytes: int, destination: Destination | None, device):
    """The bytes of the tensor `destination` offers for a bucket that is exactly one plain
    tensor (not an `Encoded` delta, no padding) of the same dtype, shape and device; else
    None."""
    import torch

    parsed = json.loads(entries) if destination is not None else []
    if len(parsed) != 1 or len(parsed[0]) != 4 or parsed[0][3] != 0:
        return None
    name, dtype, shape, _ = parsed[0]
    target = destination(name, dtype, shape)
    if (
        target is None
        or target.dtype != getattr(torch, dtype)
        or list(target.shape) != shape
        or not target.is_contiguous()
        or not on_device(target, device)
        or target.numel() * target.element_size() != num_bytes
    ):
        return None
    return target.detach().reshape(-1).view(torch.uint8)


class BucketBuffers:
    """A receiver's bucket buffers within one round, reused once nobody holds a view of
    them. Receiving into fresh memory faults in every page inside the transfer: gloo over
    loopback moved 1.2 GB/s into fresh 64 MB buffers against 3.4 GB/s into a reused one, on
    the same machine. A consumer that keeps every tensor (a staged load) leaves nothing to
    reuse, and each bucket is new; one that loads as it goes (streamed) frees each bucket's
    views when its layers are loaded. At most `MAX_KEPT` buffers are kept, and only for the
    round: what the round leaves is freed with it."""

    MAX_KEPT = MAX_IN_FLIGHT

    def __init__(self, device) -> None:
        import torch

        self.device = device
        self.kept: list[torch.Tensor] = []
        self._use_count = getattr(torch._C, "_storage_Use_Count", None)

    def take(self, num_bytes: int) -> torch.Tensor:
        """A buffer of `num_bytes`: a kept one nobody else holds, else a new one (kept in
        place of the smallest when `MAX_KEPT` are)."""
        import torch

        free = [b for b in self.kept if b.numel() >= num_bytes and self._unshared(b)]
        if free:
            return min(free, key=torch.Tensor.numel)[:num_bytes]
        buffer = torch.empty(num_bytes, dtype=torch.uint8, device=self.device)
        if len(self.kept) >= self.MAX_KEPT:  # by identity: `==` on tensors compares values
            del self.kept[min(range(len(self.kept)), key=lambda i: self.kept[i].numel())]
        self.kept.append(buffer)
        return buffer

    def _unshared(self, buffer: torch.Tensor) -> bool:
        """Whether only this pool holds `buffer`'s memory (torch counts every tensor on a
        storage; without that count, never: reuse must not overwrite a consumer's tensor)."""
        if self._use_count is None:
            return False
        storage = buffer.untyped_storage()
        return self._use_count(storage._cdata) <= 2  # the kept tensor, and `storage`
