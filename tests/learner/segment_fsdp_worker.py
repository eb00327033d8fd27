"""One rank of the 2-rank shared-prefix run (launched twice by test_segment_distributed.py).

Usage: RANK=r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=p python segment_fsdp_worker.py OUT

Shards the tiny Qwen2 with FSDP2 (each decoder layer, then the root; gradient checkpointing
on, so the `segments=` keyword must survive the recompute), plans `BATCH` over both ranks,
recomputes every micro-batch's logprobs without grad (as for a proximal policy), then runs
forward + backward on each, the loss scaled by the world size as the trainer does. Rank 0
writes the full gradients, the loss summed over ranks and every sample's logprobs to OUT.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from learner.trainer.prefix_plan import plan_pieces
from learner.trainer.segment_attention import use_segment_attention
from learner.trainer.segment_forward import forward_loss_tokens
from learner.trainer.segments import collate_segments
from tests.learner.builders import tiny_qwen2
from tests.learner.segment_builders import group, shared_step
from tests.learner.two_ranks import exit_after_teardown

TOKEN_BUDGET = 64
REDUCTION = "seq_mean_token_mean"


def batch():
    """Group a (24 + 68 as trained) does not fit 64: its suffixes 20, 18 | 16, 14 go in
    pieces of 62 and 54; group b (30 + 28) fits whole; group c diverges at token 3 (plain
    40 and 35). Longest first onto the lighter rank: r0 gets a's first piece and c's two
    samples (3 micro-batches); r1 gets b and a's second piece (2, padded with an empty one)."""
    return [
        *group(group_id="a", prefix_len=24, suffix_lens=[20, 18, 16, 14], seed=11),
        *group(group_id="b", prefix_len=30, prompt_len=22, suffix_lens=[10, 12, 6], seed=12),
        *group(group_id="c", prefix_len=20, suffix_lens=[20, 15], seed=13, diverge_at=3),
    ]


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()

    model = tiny_qwen2(seed=0)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    use_segment_attention(model)
    mesh = init_device_mesh("cpu", (world_size,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)

    samples = batch()
    plan = plan_pieces(samples, num_ranks=world_size, token_budget=TOKEN_BUDGET)
    micro_batches = plan[rank]
    with torch.no_grad():
        recomputed = {}
        for pieces in micro_batches:
            mb = collate_segments(samples, pieces)
            logprobs, _ = forward_loss_tokens(model, mb)
            for k, i in enumerate(mb.sample_indices):
                recomputed[i] = logprobs[mb.seq_ids == k]
    by_sample, loss = shared_step(
        model, samples, micro_batches, reduction=REDUCTION, scale=float(world_size)
    )
    loss_total = torch.tensor(loss, dtype=torch.float64)
    dist.all_reduce(loss_total)
    grads = {}
    for name, param in model.named_parameters():
        grad = param.grad
        grads[name] = grad.full_tensor() if isinstance(grad, DTensor) else grad
    gathered = [None] * world_size
    dist.all_gather_object(gathered, (by_sample, recomputed))
    if rank == 0:
        torch.save(
            {
                "plan": [[[(p.prefix_len, p.members) for p in mb] for mb in r] for r in plan],
                "loss": loss_total.item(),
                "grads": grads,
                "logprobs": {i: lp for part, _ in gathered for i, lp in part.items()},
                "recomputed": {i: lp for _, part in gathered for i, lp in part.items()},
            },
            out / "result.pt",
        )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_after_teardown()
