"""Learner throughput: the whole learner loop vs a bare torch training loop, same batches.

    ours:  M = K x P groups of synthetic trajectories pre-published to a real JetStream
           stream; the real `Learner` (in this process, one rank) consumes them: fetch,
           decode, assemble groups, staleness decisions, advantages, micro-batch planning
           and collation, the training step (PPO-clip loss, health metrics, grad clip,
           AdamW), announcing each version in the KV, metrics.jsonl and trained.jsonl.
           Timed from `run()` to the end of the K-th step (the final checkpoint after it
           is not counted).
    bare:  a plain transformers model, AdamW, the same K batches planned and laid out into
           the same micro-batches (same token budget, segment attention: the learner's own
           forward), collated before the clock starts; per micro-batch forward, loss-token
           logprobs, policy-gradient loss, backward; grad clip, step; on a worker thread, as
           the learner trains. So the ratio is the cost of the learner's machinery around
           the same arithmetic (the arithmetic itself: bench/prefix_sharing.py).
    Runs alternate (bare, learner, bare, learner, ...) after a warm-up step, each on fresh
    pre-published data; the best of each is compared (the machines are shared and noisy).
    torch runs one thread (`--torch-threads`): with two, an OpenMP team on a 2-core machine
    shared with other busy processes spins for a descheduled member and the numbers swing
    6x.

Tokens/s = tokens trained / seconds. Writes bench/results/learner.json with
`ratio_vs_bare_torch` (target >= 0.95).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import threading
import time
from pathlib import Path

from bench.common import Benchmark, load_average, print_table, write_results

BENCHMARK = Benchmark(
    measures="learner throughput: the whole learner loop against a bare torch loop",
    target="bench",
    minutes=0.5,
)

VOCAB_LOW = 5


def synthetic_groups(*, num_groups: int, group_size: int, min_len: int, max_len: int, vocab: int):
    """Groups of trajectories: a prompt (1/4 of the tokens), the rest generated at version 0;
    rewards 0/1 within each group so that advantages are not zero."""
    import numpy as np

    from broker.codec import pack_tokens
    from broker.wire import Trajectory

    rng = np.random.default_rng(0)
    groups = []
    for g in range(num_groups):
        group = []
        for i in range(group_size):
            n = int(rng.integers(min_len, max_len + 1))
            prompt_len = n // 4
            mask = np.zeros(n, np.uint8)
            mask[prompt_len:] = 1
            packed = pack_tokens(
                token_ids=rng.integers(VOCAB_LOW, vocab, n),
                logprobs=np.where(mask == 1, -np.log(vocab), 0.0),
                loss_mask=mask,
                versions=np.where(mask == 1, 0, -1),
            )
            group.append(
                Trajectory(
                    trajectory_id=f"b{g}-{i}",
                    group_id=f"b{g}",
                    group_size=group_size,
                    sample_index=i,
                    step=0,
                    env_class="calculator",
                    prompt_len=prompt_len,
                    reward=float(i % 2),
                    stop_reason="stop",
                    num_turns=1,
                    **packed,
                )
            )
        groups.append(group)
    return groups


async def publish(url: str, namespace: str, groups) -> None:
    from broker import client
    from broker.names import BusNames

    names = BusNames(namespace)
    nc = await client.connect(url, name="bench-publisher")
    js = nc.jetstream()
    await client.ensure_streams(js, names)
    publisher = client.TrajectoryPublisher(js, names)
    for group in groups:
        await publisher.publish_many(group)
    await nc.close()


def micro_batches_per_step(groups, *, prompts_per_step: int, token_budget: int):
    """The learner's batches, planned and laid out as the trainer does (segments, shared
    prefixes): step k trains groups [kP, (k+1)P) in stream order."""
    from learner.batching import Group as LearnerGroup
    from learner.batching import samples_from_groups
    from learner.trainer.prefix_plan import plan_pieces
    from learner.trainer.segments import collate_segments

    steps = []
    for start in range(0, len(groups), prompts_per_step):
        chunk = [
            LearnerGroup(group_id=g[0].group_id, step=0, env_class="calculator", trajectories=g)
            for g in groups[start : start + prompts_per_step]
        ]
        samples = samples_from_groups(chunk)
        (plan,) = plan_pieces(samples, num_ranks=1, token_budget=token_budget)
        num_loss_tokens = sum(int(s.loss_mask.sum()) for s in samples)
        steps.append(([collate_segments(samples, mb) for mb in plan], num_loss_tokens))
    return steps


def in_worker_thread(fn, *args, **kwargs):
    """Run `fn` on a fresh thread, as the learner runs its training step (asyncio.to_thread):
    on a crowded 2-core machine torch's OpenMP team behaves very differently on the main
    thread (measured here: up to 10x slower), so both sides must run the same way."""
    results = []
    thread = threading.Thread(target=lambda: results.append(fn(*args, **kwargs)))
    thread.start()
    thread.join()
    return results[0]


def bare_torch(model_path: str, steps, *, lr: float) -> tuple[float, int]:
    """(seconds, tokens) of a plain training loop over pre-collated micro-batches, on the
    learner's own forward (segment attention, logits at the loss tokens only)."""
    import torch
    from transformers import AutoModelForCausalLM

    from learner.trainer.segment_attention import use_segment_attention
    from learner.trainer.segment_forward import forward_loss_tokens

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).train()
    model = use_segment_attention(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    num_tokens = 0
    started = time.perf_counter()
    for micro_batches, num_loss_tokens in steps:
        for mb in micro_batches:
            logprobs, _ = forward_loss_tokens(model, mb)  # [L]
            loss = -(mb.advantages * logprobs).sum() / num_loss_tokens
            loss.backward()
            num_tokens += mb.num_unshared_tokens
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - started, num_tokens


def run_learner(model_path: str, url: str, namespace: str, work: Path, args) -> tuple[float, int]:
    """(seconds, tokens) of the real learner loop consuming the pre-published groups."""
    import torch

    from broker.config import BrokerConfig
    from learner.config import LearnerConfig
    from learner.loop import Learner
    from learner.reporting import Reporter
    from learner.trainer.model_init import load_model
    from learner.trainer.ranks import RankCommands
    from learner.trainer.trainer import Trainer

    work.mkdir(parents=True, exist_ok=True)
    train_data = work / "train.jsonl"
    row = {
        "data_source": "bench",
        "env_class": "calculator",
        "prompt": [{"role": "user", "content": "What is 1 + 1?"}],
        "reward_spec": {"ground_truth": "2"},
    }
    train_data.write_text(json.dumps(row) + "\n")
    config = LearnerConfig(
        model_path=model_path,
        train_data=str(train_data),
        total_steps=args.steps,
        prompts_per_step=args.prompts_per_step,
        group_size=args.group_size,
        max_staleness=args.steps,  # every synthetic token is version 0
        micro_batch_tokens=args.micro_batch_tokens,
        broadcast_weights=False,
        snapshot_interval=10**6,
        run_dir=str(work / "run"),
        optim={"lr": args.lr},
        checkpoint={"dir": str(work / "checkpoints"), "interval": 10**6, "resume": False},
    )
    broker = BrokerConfig(url=url, namespace=namespace)
    torch.manual_seed(0)
    trainer = Trainer(load_model(model_path, device=torch.device("cpu")), config)
    commands = RankCommands(
        trainer,
        checkpoint_dir=config.checkpoint.dir,
        keep=1,
        snapshot_dir=work / "run" / "weights",
        snapshot_interval=config.snapshot_interval,
    )
    reporter = Reporter(config, work / "run", use_wandb=False)
    learner = Learner(config, broker, commands, reporter)
    started = time.monotonic()
    asyncio.run(learner.run())
    reporter.close()
    records = [json.loads(line) for line in (work / "run" / "metrics.jsonl").open()]
    train = [r for r in records if r["kind"] == "train"]
    assert len(train) == args.steps, f"learner trained {len(train)} of {args.steps} steps"
    # wall_s counts from the learner's construction; the clock here starts at run().
    seconds = train[-1]["wall_s"] - (started - learner.started)
    return seconds, sum(r["num_tokens"] for r in train)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4, help="K optimizer steps")
    parser.add_argument("--prompts-per-step", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--min-len", type=int, default=128, help="tokens per trajectory")
    parser.add_argument("--max-len", type=int, default=384)
    parser.add_argument("--micro-batch-tokens", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=2, help="best of N, alternating")
    parser.add_argument(
        "--torch-threads", type=int, default=1, help="1: steady on a shared 2-core machine"
    )
    parser.add_argument("--lr", type=float, default=1e-5)
    args = parser.parse_args()

    import torch

    from broker.server import NatsServer
    from demo.tinymodel import build_random_tiny_model

    torch.set_num_threads(args.torch_threads)
    model_path = str(build_random_tiny_model())
    vocab = json.loads((Path(model_path) / "config.json").read_text())["vocab_size"]
    groups = synthetic_groups(
        num_groups=args.steps * args.prompts_per_step,
        group_size=args.group_size,
        min_len=args.min_len,
        max_len=args.max_len,
        vocab=vocab,
    )
    steps = micro_batches_per_step(
        groups, prompts_per_step=args.prompts_per_step, token_budget=args.micro_batch_tokens
    )
    bare, ours = [], []
    with (
        load_average() as loads,
        tempfile.TemporaryDirectory() as tmp,
        NatsServer(Path(tmp) / "nats") as server,
    ):
        for r in range(args.repeats):
            asyncio.run(publish(server.url, f"benchlearner{r}", groups))
        in_worker_thread(bare_torch, model_path, steps[:1], lr=args.lr)  # warm-up
        for r in range(args.repeats):
            bare.append(in_worker_thread(bare_torch, model_path, steps, lr=args.lr))
            work = Path(tmp) / f"learner{r}"
            ours.append(run_learner(model_path, server.url, f"benchlearner{r}", work, args))

    assert {tokens for _, tokens in bare + ours} == {bare[0][1]}, (bare, ours)
    bare_tps = max(tokens / seconds for seconds, tokens in bare)
    ours_tps = max(tokens / seconds for seconds, tokens in ours)
    figures = {
        "learner_tokens_per_s": ours_tps,
        "bare_torch_tokens_per_s": bare_tps,
        "ratio_vs_bare_torch": ours_tps / bare_tps,
        "steps": args.steps,
        "repeats": args.repeats,
        "trajectories": len(groups) * args.group_size,
        "tokens_per_step": bare[0][1] / args.steps,
        "micro_batch_tokens": args.micro_batch_tokens,
        "torch_threads": args.torch_threads,
        **loads,
    }
    print_table(
        "learner: NATS -> decode -> groups -> batches -> train step, vs bare torch",
        [
            ("optimizer steps", args.steps),
            ("trajectories", figures["trajectories"]),
            ("tokens per step", int(figures["tokens_per_step"])),
            ("learner, best of repeats (tokens/s)", ours_tps),
            ("bare torch, best of repeats (tokens/s)", bare_tps),
            ("ratio (learner / bare torch)", figures["ratio_vs_bare_torch"]),
        ],
    )
    write_results("learner", figures)


if __name__ == "__main__":
    main()
