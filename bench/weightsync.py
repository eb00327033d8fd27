"""Weight sync: broadcast bytes/s from the learner's sender to K = 1 and 2 vLLM engines,
against single-stream TCP loopback in the same run, and the generation stall per update.

Written against the public weight API only, so it keeps measuring whatever the transport
becomes: `weights.learner_side.sender.WeightSender.broadcast` (in a process of its own, as the
learner's
rank 0), `weights.actor_side.follower.BroadcastFollower` around each `actors.vllm_engine.VllmEngine`
(which receives with `update_weights`: pause with the KV cache kept, receive and load in
the engine worker, resume).

    model:     a random-weight Qwen2 with the tiny tokenizer, `--hidden` x `--layers`
               (default 768 x 4: 28M parameters, 113 MB in fp32), so that bytes, not round
               trips, dominate; `--model` takes any HF directory instead.
    loopback:  the sender process writes the same number of bytes into one TCP connection
               on 127.0.0.1 (sendall of 16 MiB chunks); this process reads them
               (recv_into); bytes / seconds from accept to the last byte.
    broadcast: `--rounds` rounds to engine 0 alone (K = 1), then as many to both engines
               (K = 2); bytes / the sender's transfer time (forming the round's group and
               sending every bucket; joining is not counted). Engines are pinned one per
               core (the machine's two), the sender and this process float.
    stall:     during each round every receiving engine decodes one long request
               (demo/engine.py `decode_arrivals`: DELTA outputs, one token per engine
               step); the stall is the longest gap between two tokens that overlaps the
               update, the decode step the median gap before it. Also the engine's own
               account (`WeightUpdate`: the whole stall and its parts: pausing, receiving
               the buckets, loading them).

Medians over rounds. Writes bench/results/weightsync.json: `ratio_vs_loopback` (the
smaller of K = 1 and K = 2; target >= 0.5), `stall_ms`, `decode_step_ms` (target: stall
<= two decode steps).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from statistics import median

from bench.common import (
    Benchmark,
    load_average,
    loopback_bytes_per_s,
    report,
    send_bytes,
)
from demo.engine import decode_arrivals
from demo.random_model import random_qwen2

BENCHMARK = Benchmark(
    measures="weight broadcast bytes/s against loopback TCP, and the generation stall",
    target="bench",
    minutes=1.5,
)

MAX_MODEL_LEN = 4096


def max_model_len(model_dir: Path) -> int:
    """MAX_MODEL_LEN, or a shorter context the model has (the demo's 2048)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return min(MAX_MODEL_LEN, int(config.get("max_position_embeddings", MAX_MODEL_LEN)))


def width_config(hidden: int, layers: int):
    """A Qwen2 config of the given width and depth over the demo's vocabulary (head_dim 64:
    vLLM's CPU attention needs >= 32)."""
    from transformers import AutoConfig, Qwen2Config

    from demo.tinymodel import shipped_model_dir

    vocab = AutoConfig.from_pretrained(shipped_model_dir()).vocab_size
    return Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 8 // 3,
                       num_hidden_layers=layers, num_attention_heads=hidden // 64,
                       num_key_value_heads=hidden // 64, max_position_embeddings=4096,
                       tie_word_embeddings=True)  # fmt: skip


# ---- the sender process (the learner's rank 0) ----------------------------------------------


def sender_main(conn, model_dir: str) -> None:
    """Serve the weight store; then on command: ("round", v) broadcasts version v and
    answers its report; ("loopback", port, nbytes) writes nbytes to 127.0.0.1:port;
    ("members",) answers the member states; ("stop",) ends."""
    import torch

    from weights.config import WeightSyncConfig
    from weights.formats.snapshot import safetensors_weights
    from weights.learner_side.sender import WeightSender

    torch.set_num_threads(1)
    named = list(safetensors_weights(model_dir))
    sender = WeightSender(
        WeightSyncConfig(store_port=0, backend="gloo", join_timeout_s=60, transfer_timeout_s=300)
    )
    conn.send(sender.config.store_port)
    while True:
        command, *rest = conn.recv()
        if command == "round":
            report = sender.broadcast(rest[0], named)
            conn.send({k: getattr(report, k) for k in ("num_receivers", "num_bytes", "transfer_s")})
        elif command == "loopback":
            conn.send(send_bytes(*rest))
        elif command == "members":
            conn.send(sender.members())
        else:
            sender.close()
            conn.send("stopped")
            return


def sender_writes(conn) -> Callable[[int, int], object]:
    """`send` for `loopback_bytes_per_s`: the sender process writes the stream."""

    def send(port: int, nbytes: int) -> int:
        conn.send(("loopback", port, nbytes))
        return conn.recv()

    return send


# ---- the engines ------------------------------------------------------------------------------


def stall_of(arrivals: list[float], update_start: float, update_end: float) -> tuple[float, float]:
    """(longest gap between tokens overlapping [update_start, update_end], median gap of the
    tokens before the update) in seconds."""
    gaps = [(b - a, a, b) for a, b in zip(arrivals, arrivals[1:], strict=False)]
    during = [g for g, a, b in gaps if b >= update_start and a <= update_end]
    before = [g for g, a, b in gaps[2:] if b < update_start]
    return max(during, default=update_end - update_start), median(before) if before else 0.0


async def one_round(conn, version: int, engines, updates: dict) -> dict:
    """Broadcast `version` while each engine in `engines` decodes; the round's figures."""
    stop = asyncio.Event()
    arrivals = {i: [] for i in engines}
    decoding = [
        asyncio.create_task(decode_arrivals(e, stop, arrivals[i])) for i, e in engines.items()
    ]
    while any(len(a) < 20 for a in arrivals.values()):  # decoding at a steady pace
        await asyncio.sleep(0.05)
    conn.send(("round", version))
    report = await asyncio.to_thread(conn.recv)
    while any(updates.get((i, version)) is None for i in engines):
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.5)  # a few tokens after the resume
    stop.set()
    await asyncio.gather(*decoding)
    figures = {"bytes_per_s": report["num_bytes"] / report["transfer_s"], **report}
    stalls, steps, parts = [], [], []
    for i in engines:
        update, ended = updates[(i, version)]
        stall, step = stall_of(arrivals[i], ended - update.stall_s, ended)
        stalls.append(stall)
        steps.append(step)
        parts.append(update)
    assert report["num_receivers"] == len(engines), report
    slowest = max(parts, key=lambda u: u.stall_s)
    return {
        **figures,
        "stall_s": max(stalls),
        "decode_step_s": median(steps),
        "engine_stall_s": slowest.stall_s,
        "engine_pause_s": slowest.pause_s,
        "engine_receive_s": slowest.receive_s,
        "engine_load_s": slowest.load_s,
    }


async def start_engines(model_dir: Path):
    from actors.vllm_engine import VllmEngine, VllmEngineConfig

    base = VllmEngineConfig(model=str(model_dir), max_model_len=max_model_len(model_dir))
    configs = [base.model_copy(update={"max_num_seqs": 4, "cpu_threads_bind": c}) for c in "01"]
    return await asyncio.gather(*(VllmEngine.start(c) for c in configs))


async def follow(engines, address: str, updates: dict, conn, count: int):
    """A BroadcastFollower per engine in `engines` ({index: engine}); returns them once the
    sender counts `count` alive members."""
    from weights.actor_side.follower import BroadcastFollower

    followers = []
    for i, engine in engines.items():

        def on_update(update, i=i) -> None:
            updates[(i, update.version)] = (update, time.monotonic())

        follower = BroadcastFollower(engine, address, on_update=on_update)
        followers.append((follower, asyncio.create_task(follower.run())))
    while True:
        conn.send(("members",))
        states = await asyncio.to_thread(conn.recv)
        if sum(s == "alive" for s in states.values()) >= count:
            return followers
        await asyncio.sleep(0.1)


async def measure(conn, model_dir: Path, nbytes: int, args) -> dict:
    address = f"127.0.0.1:{conn.recv()}"
    engines = await start_engines(model_dir)
    updates: dict = {}
    rounds = {1: [], 2: []}
    followers = []
    try:
        loopback = [loopback_bytes_per_s(nbytes, sender_writes(conn)) for _ in range(args.rounds)]
        version = 0
        for k in (1, 2):
            chosen = {i: engines[i] for i in range(k)}
            followers += await follow(
                {i: e for i, e in chosen.items() if i >= k - 1}, address, updates, conn, k
            )
            for _ in range(args.rounds):
                version += 1
                rounds[k].append(await one_round(conn, version, chosen, updates))
    finally:
        for follower, task in followers:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await follower.leave()
        for engine in engines:
            engine.shutdown()
    return summarize(loopback, rounds, nbytes)


def summarize(loopback: list[float], rounds: dict[int, list[dict]], nbytes: int) -> dict:
    loop = median(loopback)
    figures = {"loopback_bytes_per_s": loop, "weight_bytes": nbytes}
    for k, measured in rounds.items():
        rate = median(r["bytes_per_s"] for r in measured)
        figures[f"broadcast_bytes_per_s_k{k}"] = rate
        figures[f"ratio_vs_loopback_k{k}"] = rate / loop
        figures[f"transfer_ms_k{k}"] = 1e3 * median(r["transfer_s"] for r in measured)
        figures[f"stall_ms_k{k}"] = 1e3 * median(r["stall_s"] for r in measured)
        for part in ("stall", "pause", "receive", "load"):
            values = [r[f"engine_{part}_s"] for r in measured]
            figures[f"engine_{part}_ms_k{k}"] = 1e3 * median(values)
        figures[f"decode_step_ms_k{k}"] = 1e3 * median(r["decode_step_s"] for r in measured)
    figures["ratio_vs_loopback"] = min(
        figures["ratio_vs_loopback_k1"], figures["ratio_vs_loopback_k2"]
    )
    figures["stall_ms"] = max(figures["stall_ms_k1"], figures["stall_ms_k2"])
    figures["decode_step_ms"] = median([figures["decode_step_ms_k1"], figures["decode_step_ms_k2"]])
    figures["stall_in_decode_steps"] = figures["stall_ms"] / figures["decode_step_ms"]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--model", type=Path, help="an HF model directory instead")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per K (median)")
    args = parser.parse_args()

    from weights.formats.snapshot import safetensors_weights

    with tempfile.TemporaryDirectory(prefix="weightsync-") as tmp:
        model_dir = args.model or random_qwen2(
            Path(tmp) / "model", width_config(args.hidden, args.layers)
        )
        nbytes = sum(t.numel() * t.element_size() for _, t in safetensors_weights(model_dir))
        context = mp.get_context("spawn")
        conn, child_conn = context.Pipe()
        sender = context.Process(target=sender_main, args=(child_conn, str(model_dir)))
        sender.start()
        try:
            with load_average() as loads:
                figures = asyncio.run(measure(conn, model_dir, nbytes, args))
            conn.send(("stop",))
            conn.recv()
        finally:
            sender.join(timeout=30)
            if sender.is_alive():
                sender.kill()
    figures.update(rounds=args.rounds, model_params=nbytes // 4, **loads)
    report(
        "weightsync",
        "weight sync: broadcast to K engines vs TCP loopback; generation stall per update",
        figures,
    )


if __name__ == "__main__":
    main()
