"""Acceptance: shared-prefix training under FSDP2 with 2 ranks (gloo, loopback) gives the
per-token logprobs, the loss and every parameter's gradient of one plain forward per sample
on one process (fp32, max relative error 1e-5). The batch splits a group across ranks and
leaves rank 1 an empty micro-batch; the no-grad recompute equals the training forward."""

from pathlib import Path

import pytest
import torch

from tests.learner.builders import tiny_qwen2
from tests.learner.segment_builders import Result, max_relative_errors, reference
from tests.learner.segment_fsdp_worker import REDUCTION, batch
from tests.learner.two_ranks import run_two_ranks

WORKER = Path(__file__).with_name("segment_fsdp_worker.py")
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("segment_fsdp")
    run_two_ranks([str(WORKER), str(out)])
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
