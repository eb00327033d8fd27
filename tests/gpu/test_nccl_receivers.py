"""The weight broadcast over NCCL between processes on different GPUs: the learner's side
(this process, GPU 0) and receiver processes on GPU 1 following every round on a long-lived
communicator (tests/weights/receiver_process.py, each a stand-in for one engine worker).

- Bandwidth: 1 GiB of bf16 weights, against this machine's GPU 0 -> GPU 1 copy bandwidth
  (NCCL cannot beat the link; the ratio says what the bucket framing and the bounded waits
  cost).
- A receiver that dies mid-round: NCCL raises nothing for a dead peer; the round must fail
  within the transfer timeout, this process must live on (the weight group's watchdog only
  aborts its own communicator), and the next round reaches a new receiver."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch

from tests.gpu.conftest import REPO, need_gpus, record
from weights.config import WeightSyncConfig
from weights.learner_side.sender import WeightSender

pytestmark = [pytest.mark.gpu, pytest.mark.slow]
RECEIVER = REPO / "tests" / "weights" / "receiver_process.py"


def _receiver(sender: WeightSender, rounds: int, *fault: str) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "CUDA_VISIBLE_DEVICES": "1",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }
    address = f"127.0.0.1:{sender.config.store_port}"
    proc = subprocess.Popen(
        [sys.executable, str(RECEIVER), address, str(rounds), *fault],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _sender(**overrides) -> WeightSender:
    torch.cuda.set_device(0)
    config = {
        "store_port": 0,
        "backend": "nccl",
        "join_timeout_s": 10.0,
        "transfer_timeout_s": 20.0,
    }
    return WeightSender(WeightSyncConfig(**{**config, **overrides}), dtype="bfloat16")


def _until_members(sender: WeightSender, count: int) -> None:
    for _ in range(600):
        if sum(s == "alive" for s in sender.members().values()) >= count:
            return
        time.sleep(0.05)
    raise AssertionError("receiver never registered")


def _link_gbps(num_bytes: int) -> float:
    source = torch.empty(num_bytes, dtype=torch.uint8, device="cuda:0")
    target = torch.empty(num_bytes, dtype=torch.uint8, device="cuda:1")
    target.copy_(source)  # warm up peer access
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(3):
        target.copy_(source)
    torch.cuda.synchronize()
    return 3 * num_bytes / (time.perf_counter() - started) / 1e9


def test_nccl_broadcast_bandwidth_against_the_link():
    need_gpus(2)
    sender = _sender(bucket_mb=256)
    weights = [
        (f"w{i}", torch.randn(32 * 2**20, device="cuda:0").to(torch.bfloat16)) for i in range(16)
    ]
    receiver = _receiver(sender, 2)
    try:
        _until_members(sender, 1)
        first = sender.broadcast(1, weights)  # forms the communicator
        second = sender.broadcast(2, weights)  # the long-lived one
        lines = [json.loads(line) for line in receiver.communicate(timeout=300)[0].splitlines()]
    finally:
        receiver.kill()
        sender.close()
    assert first.ok and second.ok and not second.new_group
    assert [line["version"] for line in lines] == [1, 2]
    link = _link_gbps(2**30)
    broadcast = second.num_bytes / second.transfer_s / 1e9
    record(
        nccl_broadcast_gbps=round(broadcast, 2),
        gpu0_to_gpu1_copy_gbps=round(link, 2),
        nccl_broadcast_vs_link=round(broadcast / link, 3),
        nccl_first_round_s=round(first.transfer_s, 3),
        nccl_later_round_s=round(second.transfer_s, 3),
    )


def test_a_dead_receiver_on_nccl_is_dropped_and_the_learner_lives_on():
    need_gpus(2)
    sender = _sender(join_timeout_s=5.0, transfer_timeout_s=10.0, bucket_mb=1.0)
    weights = [(f"w{i}", torch.full((2**20,), float(i), device="cuda:0")) for i in range(8)]
    lost = _receiver(sender, 3, "die", "2")
    newcomer = None
    try:
        _until_members(sender, 1)
        one = sender.broadcast(1, weights)
        started = time.monotonic()
        two = sender.broadcast(2, weights)  # the receiver dies after its first bucket
        two_s = time.monotonic() - started
        assert lost.wait(timeout=30) == 3
        newcomer = _receiver(sender, 1)
        _until_members(sender, 2)  # the dead one is still "alive" until a round drops it
        started = time.monotonic()
        three = sender.broadcast(3, weights)
        three_s = time.monotonic() - started
        lines = [json.loads(line) for line in newcomer.communicate(timeout=120)[0].splitlines()]
    finally:
        lost.kill()
        if newcomer is not None:
            newcomer.kill()
        sender.close()
    assert one.ok and not two.ok and two_s < 5 + 3 * 10
    assert three.ok and three.num_receivers == 1 and len(three.missed) == 1
    assert lines[-1]["version"] == 3
    record(nccl_dead_receiver_failed_round_s=round(two_s, 2), nccl_next_round_s=round(three_s, 2))
