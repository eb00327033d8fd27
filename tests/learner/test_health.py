import math

import pytest
import torch

from learner.trainer.ppo_health import health_metrics, health_sums, is_degenerate


def test_ratio_stats_by_hand():
    """Ratios 1, 2, 0.5 (a fourth, masked token is ignored): mean 3.5/3; deviations 0, 1, -.5
    -> population var = 1.25/3 - (1/6)^2 = 0.388889; approx KL = mean(r - 1 - log r) =
    (0 + (1 - log 2) + (-.5 + log 2)) / 3 = 1/6; one of three clipped."""
    behaviour = torch.log(torch.tensor([0.2, 0.1, 0.4, 0.3]))
    logprobs = torch.log(torch.tensor([0.2, 0.2, 0.2, 0.9]))
    mask = torch.tensor([True, True, True, False])
    sums, extremes = health_sums(
        logprobs=logprobs,
        behaviour_logprobs=behaviour,
        loss_mask=mask,
        clipped=torch.tensor([False, True, False, True]),
        entropy=torch.tensor([1.0, 2.0, 3.0, 50.0]),
    )
    m = health_metrics(sums, extremes)
    assert m["num_loss_tokens"] == 3
    assert m["ratio_mean"] == pytest.approx(3.5 / 3)
    assert m["ratio_std"] == pytest.approx(math.sqrt(1.25 / 3 - 1 / 36), rel=1e-6)
    assert m["ratio_max"] == pytest.approx(2.0) and m["ratio_min"] == pytest.approx(0.5)
    assert m["approx_kl"] == pytest.approx(1 / 6, rel=1e-6)
    assert m["clip_fraction"] == pytest.approx(1 / 3)
    assert m["entropy"] == pytest.approx(2.0)


def test_sums_of_parts_equal_the_whole():
    torch.manual_seed(0)
    logprobs, behaviour = torch.randn(10) - 2, torch.randn(10) - 2
    mask, clipped = torch.rand(10) > 0.3, torch.rand(10) > 0.5
    whole = health_sums(
        logprobs=logprobs, behaviour_logprobs=behaviour, loss_mask=mask, clipped=clipped
    )
    a = health_sums(
        logprobs=logprobs[:4],
        behaviour_logprobs=behaviour[:4],
        loss_mask=mask[:4],
        clipped=clipped[:4],
    )
    b = health_sums(
        logprobs=logprobs[4:],
        behaviour_logprobs=behaviour[4:],
        loss_mask=mask[4:],
        clipped=clipped[4:],
    )
    torch.testing.assert_close(a[0] + b[0], whole[0])
    torch.testing.assert_close(torch.maximum(a[1], b[1]), whole[1])


def test_small_ratio_std_survives_float32_cancellation():
    """Ratios 1 +- 1e-4: the std must come out as 1e-4, not 0."""
    behaviour = torch.zeros(1000)
    logprobs = torch.log(1 + 1e-4 * torch.tensor([1.0, -1.0]).repeat(500))
    m = health_metrics(
        *health_sums(
            logprobs=logprobs,
            behaviour_logprobs=behaviour,
            loss_mask=torch.ones(1000, dtype=torch.bool),
            clipped=torch.zeros(1000, dtype=torch.bool),
        )
    )
    assert m["ratio_std"] == pytest.approx(1e-4, rel=1e-3)


def test_no_loss_tokens():
    sums, extremes = health_sums(
        logprobs=torch.zeros(2),
        behaviour_logprobs=torch.zeros(2),
        loss_mask=torch.zeros(2, dtype=torch.bool),
        clipped=torch.zeros(2, dtype=torch.bool),
    )
    assert health_metrics(sums, extremes) == {"num_loss_tokens": 0.0}


def test_degenerate_only_when_the_policy_changed():
    assert is_degenerate(ratio_std=0.0, num_tokens=100, oldest_version=3, current_version=4)
    assert not is_degenerate(ratio_std=0.0, num_tokens=100, oldest_version=4, current_version=4)
    assert not is_degenerate(ratio_std=0.006, num_tokens=100, oldest_version=3, current_version=4)
    assert not is_degenerate(ratio_std=0.0, num_tokens=1, oldest_version=3, current_version=4)
    assert not is_degenerate(ratio_std=0.0, num_tokens=100, oldest_version=-1, current_version=4)


def test_logprob_gap_over_fresh_tokens_by_hand():
    """Loss tokens 0-2; tokens 0 and 2 were sampled by the weights being trained (fresh):
    gaps |-1.0 - -1.1| = 0.1 and |-2.0 - -1.7| = 0.3 -> mean 0.2. Token 1 is stale, token 3
    fresh but masked: neither counts."""
    sums, extremes = health_sums(
        logprobs=torch.tensor([-1.0, -3.0, -2.0, -5.0]),
        behaviour_logprobs=torch.tensor([-1.1, -1.0, -1.7, -1.0]),
        loss_mask=torch.tensor([True, True, True, False]),
        clipped=torch.zeros(4, dtype=torch.bool),
        fresh=torch.tensor([True, False, True, True]),
    )
    m = health_metrics(sums, extremes)
    assert m["num_fresh_tokens"] == 2
    assert m["logprob_gap_fresh"] == pytest.approx(0.2)
    none_fresh = health_metrics(
        *health_sums(
            logprobs=torch.zeros(2),
            behaviour_logprobs=torch.zeros(2),
            loss_mask=torch.ones(2, dtype=torch.bool),
            clipped=torch.zeros(2, dtype=torch.bool),
        )
    )
    assert none_fresh["num_fresh_tokens"] == 0 and "logprob_gap_fresh" not in none_fresh
