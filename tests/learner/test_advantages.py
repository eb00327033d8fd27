import pytest
import torch

from learner.advantages import (
    compute_advantages,
    dr_grpo_advantages,
    grpo_advantages,
    rloo_advantages,
)
from learner.trainer.config import AlgorithmConfig


def _compute(rewards: torch.Tensor, estimator: str) -> torch.Tensor:
    return compute_advantages(rewards, AlgorithmConfig(advantage_estimator=estimator))


def close(actual: torch.Tensor, expected: list[list[float]]) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected), atol=1e-6, rtol=0)


def test_grpo_one_success_in_four_by_hand():
    # mean 0.25; deviations .75, -.25 x3; unbiased var = (.5625 + 3 * .0625) / 3 = .25
    close(grpo_advantages(torch.tensor([[1.0, 0, 0, 0]]), eps=0.0), [[1.5, -0.5, -0.5, -0.5]])


def test_grpo_two_successes_in_four_by_hand():
    # std = sqrt(4 * .25 / 3) = 0.57735; .5 / 0.57735 = 0.866025
    close(
        grpo_advantages(torch.tensor([[1.0, 0, 0, 1]]), eps=0.0),
        [[0.866025, -0.866025, -0.866025, 0.866025]],
    )


def test_grpo_eps_is_added_to_the_std():
    close(grpo_advantages(torch.tensor([[1.0, 0, 0, 0]]), eps=0.5), [[0.75, -0.25, -0.25, -0.25]])


def test_grpo_without_std_and_dr_grpo_only_centre():
    rewards = torch.tensor([[1.0, 0, 0, 0]])
    close(grpo_advantages(rewards, normalize_std=False), [[0.75, -0.25, -0.25, -0.25]])
    close(dr_grpo_advantages(rewards), [[0.75, -0.25, -0.25, -0.25]])


def test_rloo_by_hand():
    # sample 0: others' mean 0 -> 1; the others: others' mean 1/3 -> -1/3
    close(rloo_advantages(torch.tensor([[1.0, 0, 0, 0]])), [[1.0, -1 / 3, -1 / 3, -1 / 3]])
    close(rloo_advantages(torch.tensor([[2.0, 4.0]])), [[-2.0, 2.0]])


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
def test_equal_rewards_give_zero_advantage(estimator):
    rewards = torch.tensor([[0.3, 0.3, 0.3, 0.3], [1.0, 1.0, 1.0, 1.0]])
    advantages = _compute(rewards, estimator)
    assert torch.equal(advantages, torch.zeros_like(rewards))


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
def test_groups_are_independent_and_advantages_sum_to_zero(estimator):
    rewards = torch.tensor([[1.0, 0, 0, 0], [5.0, 7.0, 9.0, 3.0]])
    both = _compute(rewards, estimator)
    assert torch.equal(both[0], _compute(rewards[:1], estimator)[0])
    torch.testing.assert_close(both.sum(dim=1), torch.zeros(2), atol=1e-5, rtol=0)


def test_rloo_is_scaled_dr_grpo():
    rewards = torch.tensor([[0.2, 0.9, 0.4, 0.1, 0.7]])
    torch.testing.assert_close(rloo_advantages(rewards), 5 / 4 * dr_grpo_advantages(rewards))


def test_bad_shapes_and_names_are_value_errors():
    with pytest.raises(ValueError, match="group size of at least 2"):
        grpo_advantages(torch.tensor([[1.0]]))
    with pytest.raises(ValueError, match="num_groups, group_size"):
        rloo_advantages(torch.tensor([1.0, 0.0]))
    with pytest.raises(ValueError, match=r"'ppo': one of \['dr_grpo', 'grpo', 'rloo'\], or your"):
        AlgorithmConfig(advantage_estimator="ppo")
