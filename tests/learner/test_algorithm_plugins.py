"""An advantage estimator and a policy loss of the user's own, outside the repository, named
by import path in `[learner.algorithm]`: used exactly as the built-ins are (which are import
paths too), checked against numbers worked out by hand, and refused in one line at start-up
when they cannot be loaded."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from learner.advantages import compute_advantages
from learner.cli import algorithm_plugin_problem
from learner.trainer.config import AlgorithmConfig
from learner.trainer.losses import LossInputs, policy_loss

MY_RL = '''
import torch

from learner.trainer.losses import PolicyTerm


def reinforce(inputs, algorithm):
    """Plain REINFORCE: -A * log pi, no ratio, no clip."""
    ones = torch.ones_like(inputs.logprobs).detach()
    return PolicyTerm(
        pg_loss=-inputs.advantages * inputs.logprobs,
        ratio=ones,
        clipped=torch.zeros_like(ones, dtype=torch.bool),
        weight=ones,
    )


def median_baseline(rewards, algorithm):
    return rewards - rewards.median(dim=1, keepdim=True).values


def wrong_shape(rewards, algorithm):
    return rewards[:, :1]


NOT_A_FUNCTION = 3
'''


@pytest.fixture
def my_rl(tmp_path, monkeypatch):
    (tmp_path / "my_rl.py").write_text(textwrap.dedent(MY_RL))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("my_rl", None)
    yield "my_rl"
    sys.modules.pop("my_rl", None)


def test_a_users_estimator_gives_its_advantages(my_rl):
    algorithm = AlgorithmConfig(advantage_estimator="my_rl:median_baseline")
    advantages = compute_advantages(torch.tensor([[1.0, 0.0, 4.0], [2.0, 2.0, 5.0]]), algorithm)
    torch.testing.assert_close(advantages, torch.tensor([[0.0, -1.0, 3.0], [0.0, 0.0, 3.0]]))
    with pytest.raises(ValueError, match=r"my_rl:wrong_shape: returned torch.Size\(\[1, 1\]\)"):
        compute_advantages(
            torch.tensor([[1.0, 0.0]]), AlgorithmConfig(advantage_estimator="my_rl:wrong_shape")
        )


def test_a_users_loss_is_masked_and_its_gradient_is_minus_the_advantage(my_rl):
    logprobs = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    inputs = LossInputs(
        logprobs=logprobs,
        behaviour_logprobs=torch.tensor([-1.1, -2.0, -0.4]),
        advantages=torch.tensor([1.0, 1.0, -2.0]),
        loss_mask=torch.tensor([1, 1, 0]),
        seq_ids=torch.zeros(3, dtype=torch.long),
        num_seqs=1,
    )
    terms = policy_loss(inputs, AlgorithmConfig(policy_loss="my_rl:reinforce"))
    # -A * log pi = [1, 2, -1]; the third token is off the mask.
    torch.testing.assert_close(terms.loss, torch.tensor([1.0, 2.0, 0.0]))
    terms.loss.sum().backward()
    torch.testing.assert_close(logprobs.grad, torch.tensor([-1.0, -1.0, 0.0]))
    # The built-in, by the same path, on the same tokens: a ratio exp(-1 + 1.1) inside the clip.
    ppo = policy_loss(inputs, AlgorithmConfig(policy_loss="ppo"))
    assert ppo.loss[0].item() == pytest.approx(-torch.exp(torch.tensor(0.1)).item())


def test_names_that_are_neither_built_in_nor_a_path_are_config_errors():
    with pytest.raises(ValueError, match=r"'reinforce': one of \['gspo', 'ppo'\], or your own"):
        AlgorithmConfig(policy_loss="reinforce")


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        (
            {"policy_loss": "nobody_wrote:this"},
            "learner.algorithm.policy_loss: nobody_wrote:this: importing nobody_wrote failed",
        ),
        (
            {"advantage_estimator": "my_rl:missing"},
            "learner.algorithm.advantage_estimator: my_rl:missing: module my_rl has no",
        ),
        (
            {"policy_loss": "my_rl:NOT_A_FUNCTION"},
            "learner.algorithm.policy_loss: my_rl:NOT_A_FUNCTION is a int, not a function",
        ),
    ],
)
def test_the_learner_refuses_a_plugin_it_cannot_load_in_one_line(my_rl, fields, says):
    problem = algorithm_plugin_problem(AlgorithmConfig(**fields))
    assert problem is not None and problem.startswith(says) and "\n" not in problem
    assert algorithm_plugin_problem(AlgorithmConfig(policy_loss="my_rl:reinforce")) is None
