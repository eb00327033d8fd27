"""Step-wise trajectories (`learner.step_wise`): each turn of an episode is its own sequence
in the loss, sharing the episode's advantage, trained in one forward per episode.

The slow obvious reference is SkyRL's form: one sample per turn, holding the history up to
that turn with the loss on that turn only. Its logits at the turn's tokens are the episode's
(causal attention: later tokens change nothing before them), so the two must give the same
gradient, under every reduction and GSPO, while the episode form trains fewer tokens."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from learner.batching import Group, samples_from_groups
from learner.trainer.sample import Sample, step_starts
from learner.trainer.trainer import Trainer
from tests.learner.builders import VOCAB, learner_config, random_samples, tiny_qwen2, trajectory

ALGORITHMS = [
    {"loss_reduction": "token_mean"},
    {"loss_reduction": "seq_mean_token_sum"},
    {"loss_reduction": "seq_mean_token_mean"},
    {"policy_loss": "gspo", "loss_reduction": "seq_mean_token_mean"},
]


def _episode(index: int, *, turn_lengths: list[int], rng) -> Sample:
    """A prompt of 6 tokens, then turns (loss 1) with a 4-token observation (loss 0)
    between consecutive turns."""
    mask = [0] * 6
    for k, n in enumerate(turn_lengths):
        mask += [1] * n + ([0] * 4 if k < len(turn_lengths) - 1 else [])
    mask = np.array(mask, dtype=np.uint8)
    n = len(mask)
    return Sample(
        token_ids=rng.integers(0, VOCAB, n).astype(np.int32),
        loss_mask=mask,
        behaviour_logprobs=np.where(mask == 1, -np.log(VOCAB) + rng.normal(0, 0.05, n), 0.0).astype(
            np.float32
        ),
        versions=np.where(mask == 1, 0, -1).astype(np.int32),
        advantage=float(rng.normal()),
        trajectory_id=f"t{index}",
        group_id=f"g{index // 2}",
        env_class="calculator",
    )


def _step_wise(samples: list[Sample]) -> list[Sample]:
    return [dataclasses.replace(s, step_starts=step_starts(s.loss_mask)) for s in samples]


def _one_sample_per_turn(samples: list[Sample]) -> list[Sample]:
    """SkyRL's step-wise samples: turn k's sample is the history up to its end, the loss on
    turn k only, the episode's advantage."""
    out = []
    for s in samples:
        starts = step_starts(s.loss_mask)
        for k, start in enumerate(starts):
            end = start + int(np.argmin(np.append(s.loss_mask[start:], 0)))
            mask = np.zeros(end, dtype=np.uint8)
            mask[start:end] = 1
            out.append(
                dataclasses.replace(
                    s,
                    token_ids=s.token_ids[:end],
                    loss_mask=mask,
                    behaviour_logprobs=s.behaviour_logprobs[:end],
                    versions=s.versions[:end],
                    trajectory_id=f"{s.trajectory_id}/{k}",
                )
            )
    return out


def _gradient(samples: list[Sample], algorithm: dict) -> tuple[dict, int]:
    """Gradient of the batch loss at the tiny model's initial weights, and tokens trained."""
    trainer = Trainer(tiny_qwen2(), learner_config(algorithm=algorithm, micro_batch_tokens=512))
    micro_batches, num_trained = trainer.micro_batches(samples)
    none = [None] * len(micro_batches)
    trainer._accumulate(micro_batches, none, none, samples)
    return {n: p.grad.clone() for n, p in trainer.model.named_parameters()}, num_trained


def _assert_same(a: dict, b: dict) -> None:
    for name in a:
        assert torch.allclose(a[name], b[name], rtol=1e-4, atol=1e-7), name


def test_step_starts_are_the_runs_of_loss_tokens():
    assert step_starts(np.array([0, 0, 1, 1, 0, 0, 1, 0, 1], np.uint8)).tolist() == [2, 6, 8]
    assert step_starts(np.array([1, 1, 0], np.uint8)).tolist() == [0]
    assert step_starts(np.zeros(5, np.uint8)).tolist() == []  # overlong-filtered: no steps


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_single_turn_episodes_give_the_whole_episode_gradient(algorithm):
    samples = random_samples(num_samples=6, seed=3)  # prompt then one generated turn each
    whole, whole_tokens = _gradient(samples, algorithm)
    steps, step_tokens = _gradient(_step_wise(samples), algorithm)
    _assert_same(whole, steps)
    assert whole_tokens == step_tokens


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_multi_turn_step_wise_equals_one_sample_per_turn(algorithm):
    rng = np.random.default_rng(5)
    turns = [[5, 3], [4, 6, 2], [7], [3, 3]]
    episodes = [_episode(i, turn_lengths=t, rng=rng) for i, t in enumerate(turns)]
    fast, fast_tokens = _gradient(_step_wise(episodes), algorithm)
    slow, slow_tokens = _gradient(_one_sample_per_turn(episodes), algorithm)
    _assert_same(fast, slow)
    # One forward per episode: the tokens of the whole episodes, not each turn's history.
    assert fast_tokens == _gradient(episodes, algorithm)[1] < slow_tokens


def test_what_a_sequence_is_matters_only_to_the_sequence_reductions():
    rng = np.random.default_rng(6)
    episodes = [_episode(i, turn_lengths=[2, 9], rng=rng) for i in range(4)]
    for algorithm, same in (
        ({"loss_reduction": "token_mean"}, True),
        ({"loss_reduction": "seq_mean_token_mean"}, False),
    ):
        whole, _ = _gradient(episodes, algorithm)
        steps, _ = _gradient(_step_wise(episodes), algorithm)
        close = all(torch.allclose(whole[n], steps[n], rtol=1e-4, atol=1e-7) for n in whole)
        assert close == same, algorithm


def test_samples_from_groups_marks_turns_and_shares_the_advantage():
    mask = [0, 0, 1, 1, 0, 1, 1]
    group = Group(
        group_id="g",
        step=0,
        env_class="calculator",
        trajectories=[
            trajectory(
                trajectory_id=f"t{i}",
                sample_index=i,
                reward=float(i),
                token_ids=list(range(1, 8)),
                loss_mask=mask,
            )
            for i in range(2)  # rewards 0 and 1
        ],
    )
    whole = samples_from_groups([group])
    steps = samples_from_groups([group], step_wise=True)
    assert [s.step_starts for s in whole] == [None, None]
    assert [s.step_starts.tolist() for s in steps] == [[2, 5], [2, 5]]
    assert [s.advantage for s in steps] == [s.advantage for s in whole]
    assert [s.num_loss_seqs for s in steps] == [2, 2]
