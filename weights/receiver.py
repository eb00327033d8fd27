"""An engine worker's side of a weight round: form the round's group at its seat and yield
the tensors as they arrive (called inside the vLLM worker, weights/vllm_worker.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from weights.collective import receive_buckets, round_group
from weights.rendezvous import connect_store
from weights.subscription import RoundTicket

if TYPE_CHECKING:
    import torch


def receive_round(
    ticket: RoundTicket, *, worker_rank: int = 0, store=None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Worker side of a round: form the group at rank base_rank + worker_rank and yield
    (name, tensor) as they arrive. Tensors are on CUDA for nccl, CPU for gloo."""
    if store is None:
        store = connect_store(
            ticket.store_host,
            ticket.store_port,
            is_master=False,
            timeout_s=ticket.transfer_timeout_s,
        )
    group = round_group(
        store,
        ticket.store_host,
        ticket.version,
        ticket.base_rank + worker_rank,
        ticket.world_size,
        ticket.backend,
        ticket.transfer_timeout_s,
    )
    yield from receive_buckets(group, backend=ticket.backend)
