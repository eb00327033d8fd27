"""The host memory a vLLM engine's worker takes on during one weight round, streamed against
staged (the target: the engine receives a bucketed update with host memory growth of at
most two buckets), for the test that holds that bound
(tests/actors/test_engine_update_memory.py) and the benchmark that reports it at a real
model's shape (bench/engine_update_memory.py).

    engine:   one real vLLM CPU engine (`VllmEngine.start`, max_model_len 256, 1 GiB of KV
              cache). On CPU its one worker runs inside the engine-core process: that
              process is measured.
    rounds:   first, a plain receiver process (`WeightChannel.receive`, each tensor dropped
              once seen, nothing loaded) takes rounds from a `WeightSender` on gloo in this
              process (`bucket_mb`): the receive path's own memory. Then the engine takes
              rounds in flight (`update_weights`): after one unmeasured warm-up round,
              streamed and staged rounds alternate (`staged_weight_load` switched on the one
              engine). `rounds` measured rounds of each.
    measure:  before each round the process's VmRSS, and its peak reset (`echo 5 >
              /proc/PID/clear_refs`); after it, its VmHWM. Growth = VmHWM - VmRSS before: in
              MB, in buckets (growth / bucket_mb) and in largest buckets (growth / the round's
              largest bucket: a tensor larger than bucket_mb travels alone, as the 0.5B
              shape's 519 MB embedding does). Both processes run with glibc's mmap and trim
              thresholds fixed (`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`: 128 KiB),
              so that what a round frees goes back to the system and VmRSS before a round is
              live memory: with the default, adaptive threshold a round reuses what the one
              before freed without VmRSS growing (a staged round's growth read anywhere from
              22 to 110 MB on a 174 MB model). MB: 2**20 bytes.

The largest growth over each mode's rounds is reported (the bound is what matters), with the
engine's stall and the sender's transfer time per round (medians): streamed loads go as the
buckets arrive, so the sender waits for the engine's loads as well.

It lives in deploy/ because it starts an actor's engine (actors/) beside a learner's sender
(weights/) and reads the engine-core process in /proc, as deploy/proctree.py reads a run's
processes: of the installed packages only deploy/ may import a role (demo/ and weights/
import none), and a harness is no part of what an actor runs. The test and the benchmark
both measure with it, so the bound the test holds is the figure the benchmark reports.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from statistics import median

from common.environ import environ_set
from common.proc_memory import reset_peak, status_kb

MB = 2**20
FIXED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}
"""glibc's thresholds fixed at their initial values: freed buffers are unmapped at once."""


# ---- the engine-core process's memory -----------------------------------------------------


def reset_peak_checked(pid: int) -> None:
    """`reset_peak` of a measured process (the engine core, the plain receiver), checked to
    have taken: a reset that did nothing would leave the start-up peak (the model loaded
    twice), far above what a round adds."""
    memory = reset_peak(pid)
    # The bound leaves room for an allocation landing between the reset and the read.
    assert memory["VmHWM"] - memory["VmRSS"] < 64 * 1024, f"VmHWM not reset: {memory}"


def child_pids() -> set[int]:
    import psutil

    return {child.pid for child in psutil.Process().children(recursive=True)}


def engine_core_pid(started_before: set[int]) -> int:
    """The pid of the vLLM engine core this process started after `started_before` (its
    children then) was taken: on CPU the engine's worker runs in it."""
    import psutil

    new = [p for p in psutil.Process().children(recursive=True) if p.pid not in started_before]
    cores = [p for p in new if "EngineCore" in p.name() + " ".join(p.cmdline())]
    assert len(cores) == 1, f"expected one new engine-core process, found {cores} in {new}"
    return cores[0].pid


# ---- rounds -------------------------------------------------------------------------------


def tensor_bytes(named: list) -> int:
    return sum(t.numel() * t.element_size() for _, t in named)


def largest_bucket_bytes(named: list, bucket_bytes: int) -> int:
    from weights.shared.buckets import bucketize

    return max(tensor_bytes(bucket) for bucket in bucketize(named, bucket_bytes))


def new_sender(bucket_mb: float):
    """A learner's sender on a free port, in this process."""
    from weights.config import WeightSyncConfig
    from weights.learner_side.sender import WeightSender

    config = WeightSyncConfig(store_port=0, bucket_mb=bucket_mb, transfer_timeout_s=300.0)
    return WeightSender(config)


def receiver_main(host: str, port: int, conn) -> None:
    """A plain receiver process: one subscription and one worker's channel, as in an engine
    worker, taking a round whenever the parent says so and dropping each tensor once seen
    (nothing loaded). Sends its pid first, then the bytes of each round."""
    from weights.actor_side.subscription import WeightSubscription
    from weights.engine_side.receiver import WeightChannel

    subscription = WeightSubscription(host, port)
    channel = WeightChannel()
    conn.send(os.getpid())
    version = -1
    while conn.recv() == "round":
        ticket = subscription.wait_round(version, 60.0)
        num_bytes = 0
        for _, tensor in channel.receive(ticket):
            num_bytes += tensor.numel() * tensor.element_size()
        version = ticket.version
        conn.send(num_bytes)
    channel.close()
    subscription.leave()


def receive_path_growths(
    named: list, *, bucket_mb: float, rounds: int
) -> tuple[list[int], list[float]]:
    """Growth in bytes of a plain receiver process (`receiver_main`) in each of `rounds`
    rounds, after a warm-up one, and the sender's transfer seconds of each (the wire and
    the receive path, no load to wait for)."""
    import multiprocessing as mp

    sender = new_sender(bucket_mb)
    ours, theirs = mp.Pipe()
    address = (sender.config.store_host, sender.config.store_port)
    with environ_set(FIXED_MALLOC):  # read by the receiver process when it starts
        receiver = mp.get_context("spawn").Process(target=receiver_main, args=(*address, theirs))
        receiver.start()
    growths, transfers = [], []
    try:
        pid = ours.recv()
        while not sender.members():
            time.sleep(0.01)
        for version in range(rounds + 1):
            before = status_kb(pid)["VmRSS"]
            reset_peak_checked(pid)
            ours.send("round")
            report = sender.broadcast(version, named)
            assert report.ok, report.error
            assert ours.recv() == tensor_bytes(named)
            growths.append((status_kb(pid)["VmHWM"] - before) * 1024)
            transfers.append(report.transfer_s)
        ours.send("stop")
        receiver.join(timeout=60)
    finally:
        if receiver.is_alive():
            receiver.kill()
        sender.close()
    return growths[1:], transfers[1:]


async def engine_round(engine, sender, subscription, named: list, version: int, pid: int):
    """One round of `named` into `engine`, with the engine-core process's memory around
    it: (growth in bytes, the engine's WeightUpdate, the sender's report)."""

    async def take_round():
        ticket = await asyncio.to_thread(subscription.wait_round, engine.version, 60.0)
        assert ticket is not None and ticket.version == version
        return await engine.update_weights(ticket)

    before = status_kb(pid)["VmRSS"]
    reset_peak_checked(pid)
    sent, update = await asyncio.gather(
        asyncio.to_thread(sender.broadcast, version, named), take_round()
    )
    growth = (status_kb(pid)["VmHWM"] - before) * 1024
    assert sent.ok, sent.error
    return growth, update, sent


async def engine_rounds(model_dir: Path, named: list, *, bucket_mb: float, rounds: int):
    """A real engine on `model_dir`: a warm-up round, then `rounds` streamed and `rounds`
    staged ones, alternating. Returns ({mode: [engine_round results]}, the engine-core
    process's VmRSS in bytes before the first round)."""
    from actors.config import VllmEngineConfig
    from actors.vllm_engine import VllmEngine
    from weights.actor_side.subscription import WeightSubscription

    config = VllmEngineConfig(
        model=str(model_dir), max_model_len=256, max_num_seqs=2, enable_chunked_prefill=False
    )
    children = child_pids()
    with environ_set(FIXED_MALLOC):  # read by the engine-core process when it starts
        engine = await VllmEngine.start(config)
    sender = new_sender(bucket_mb)
    subscription = WeightSubscription(sender.config.store_host, sender.config.store_port)
    by_mode: dict[str, list] = {"streamed": [], "staged": []}
    try:
        pid = engine_core_pid(children)
        rss_before = status_kb(pid)["VmRSS"] * 1024
        await engine_round(engine, sender, subscription, named, 1, pid)  # warm-up
        for version in range(2, 2 + 2 * rounds):
            mode = "streamed" if version % 2 == 0 else "staged"
            engine.config = config.model_copy(update={"staged_weight_load": mode == "staged"})
            by_mode[mode].append(
                await engine_round(engine, sender, subscription, named, version, pid)
            )
        rss_after = status_kb(pid)["VmRSS"] * 1024  # what the engine holds between rounds
    finally:
        subscription.leave()
        sender.close()
        engine.shutdown()
    return by_mode, rss_before, rss_after


async def measure(model_dir: Path, *, bucket_mb: float, rounds: int) -> dict:
    """The figures of one measurement of the model in `model_dir` (what
    bench/engine_update_memory.py writes to engine_update_memory.json)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    named = [(name, param.detach()) for name, param in model.named_parameters()]
    largest = largest_bucket_bytes(named, int(bucket_mb * MB))
    received, received_s = receive_path_growths(named, bucket_mb=bucket_mb, rounds=rounds)
    by_mode, rss_before, rss_after = await engine_rounds(
        model_dir, named, bucket_mb=bucket_mb, rounds=rounds
    )
    figures: dict[str, float | int | str] = {
        "model_parameters": sum(t.numel() for _, t in named),
        "model_mb": tensor_bytes(named) / MB,
        "bucket_mb": bucket_mb,
        "largest_bucket_mb": largest / MB,
        "rounds_per_mode": rounds,
        "engine_rss_mb_before": rss_before / MB,
        "engine_rss_mb_after": rss_after / MB,
    }
    growths = {"receive_only": received}
    growths.update(
        {mode: [growth for growth, _, _ in results] for mode, results in by_mode.items()}
    )
    for mode, values in growths.items():
        figures[f"{mode}_growth_mb"] = max(values) / MB
        figures[f"{mode}_growth_mb_min"] = min(values) / MB
        figures[f"{mode}_growth_buckets"] = max(values) / (bucket_mb * MB)
        figures[f"{mode}_growth_largest_buckets"] = max(values) / largest
    figures["receive_only_sender_transfer_ms"] = median(received_s) * 1e3
    for mode, results in by_mode.items():
        figures[f"{mode}_stall_ms"] = median(u.stall_s for _, u, _ in results) * 1e3
        figures[f"{mode}_sender_transfer_ms"] = median(r.transfer_s for _, _, r in results) * 1e3
    return figures
