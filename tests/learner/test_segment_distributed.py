"""Acceptance: shared-prefix training under FSDP2 with 2 ranks (gloo, loopback) gives the
per-token logprobs, the loss and every parameter's gradient of one plain forward per sample
on one process (fp32, max relative error 1e-5). The batch splits a group across ranks and
leaves rank 1 an empty micro-batch; the no-grad recompute equals the training forward."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.learner.builders import tiny_qwen2
from tests.learner.segment_builders import Result, max_relative_errors, reference
from tests.learner.segment_fsdp_worker import REDUCTION, batch

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("segment_fsdp_worker.py")
TOLERANCE = 1e-5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("segment_fsdp")
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "WORLD_SIZE": "2",
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(out)],
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=600)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for rank, proc in enumerate(procs):
        assert proc.returncode == 0, f"rank {rank} failed:\n{logs[rank][-4000:]}"
    return torch.load(out / "result.pt")


def test_the_plan_splits_a_group_across_ranks_and_pads_rank_one(two_ranks):
    assert two_ranks["plan"] == [
        [[(24, (0, 1))], [(0, (7,))], [(0, (8,))]],
        [[(30, (4, 5, 6))], [(24, (2, 3))], []],
    ]


def test_two_ranks_equal_one_plain_forward_per_sample(two_ranks):
    samples = batch()
    expected = reference(tiny_qwen2(seed=0), samples, reduction=REDUCTION)
    logprobs = [two_ranks["logprobs"][i] for i in range(len(samples))]
    got = Result(logprobs, two_ranks["loss"], two_ranks["grads"])
    errors = max_relative_errors(got, expected)
    worst = max(errors, key=errors.get)
    assert errors[worst] < TOLERANCE, (worst, errors[worst])


def test_the_no_grad_recompute_equals_the_training_forward(two_ranks):
    for i, logprobs in two_ranks["logprobs"].items():
        torch.testing.assert_close(two_ranks["recomputed"][i], logprobs, rtol=0, atol=1e-6)
