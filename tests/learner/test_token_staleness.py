"""The per-token staleness rule (learner.staleness_rule = "token"), by hand: a long episode
whose early turns are older than the bound keeps its fresh turns; the loss they get is
exactly the loss of those tokens alone; without a stale token both rules are one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from learner.batching import Group, samples_from_groups
from learner.staleness import fresh_fraction, stale_tokens, version_span
from learner.steps import decide_group, staleness_of
from learner.trainer.config import AlgorithmConfig
from learner.trainer.losses import LossInputs, policy_loss
from tests.learner.builders import trajectory

VERSION, BOUND = 6, 2  # tokens of versions 4, 5, 6 are within the bound; 3 and older are not


def _group(*versions_per_sample: list[int], rewards=(1.0, 0.0)) -> Group:
    """One sample per entry: a 2-token prompt, then policy tokens of those versions (loss 1)."""
    return Group("g", 0, "calculator", [
        trajectory(trajectory_id=f"g-{i}", group_id="g", group_size=len(versions_per_sample),
                   sample_index=i, reward=rewards[i], token_ids=list(range(2 + len(versions))),
                   versions=[-1, -1, *versions])
        for i, versions in enumerate(versions_per_sample)
    ])  # fmt: skip


def test_stale_tokens_and_the_fresh_fraction_by_hand():
    versions = np.array([-1, -1, 2, 3, 4, 6], dtype=np.int32)
    assert stale_tokens(versions, VERSION, BOUND).tolist() == [0, 0, 1, 1, 0, 0]
    mask = np.array([0, 0, 1, 1, 1, 0], dtype=np.uint8)  # the last token carries no loss
    # loss tokens: versions 2, 3, 4 -> one of three within the bound
    assert fresh_fraction([versions], [mask], VERSION, BOUND) == pytest.approx(1 / 3)
    assert fresh_fraction([versions], [np.zeros(6, dtype=np.uint8)], VERSION, BOUND) is None


def test_the_version_span_of_an_episode_by_hand():
    assert version_span(np.array([-1, -1, 4, 4, -1, 6, 7])) == 3  # prompt and deltas are -1
    assert version_span(np.array([-1, 5, 5])) == 0
    assert version_span(np.array([-1, -1])) == 0  # no policy token


def test_a_long_episode_keeps_its_fresh_turns_where_the_group_rule_drops_it():
    # Sample 0 spans updates: two turns at v2-v3 (stale), four at v4-v6; sample 1 is fresh.
    group = _group([2, 3, 4, 5, 6, 6], [5, 6, 6, 6])
    assert decide_group(group, version=VERSION, max_staleness=BOUND).drop_reason == "stale"
    decision = decide_group(group, version=VERSION, max_staleness=BOUND, staleness_rule="token")
    assert decision.drop_reason is None and decision.masked_stale_tokens == 2
    masks = [arrays.loss_mask.tolist() for arrays in decision.group.tokens]
    assert masks == [[0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]]
    # The wire bytes are untouched: the trajectory as published stays what was generated.
    assert group.tokens[0].loss_mask.tolist() == [0, 0, 1, 1, 1, 1, 1, 1]
    assert staleness_of(decision.group, VERSION) == 2  # of what is trained: v4


def test_too_little_fresh_loss_drops_the_group_as_stale():
    # 7 of 10 loss tokens stale: 0.3 fresh.
    group = _group([1, 1, 2, 2, 3, 3], [3, 4, 5, 6])
    rules = dict(version=VERSION, max_staleness=BOUND, staleness_rule="token")
    assert decide_group(group, **rules, min_fresh_fraction=0.5).drop_reason == "stale"
    kept = decide_group(group, **rules, min_fresh_fraction=0.25)
    assert kept.drop_reason is None and kept.masked_stale_tokens == 7


def test_the_loss_of_a_partly_stale_group_is_the_loss_of_its_fresh_tokens():
    group = _group([3, 4, 5], [6, 6, 6])
    decision = decide_group(group, version=VERSION, max_staleness=BOUND, staleness_rule="token")
    (stale_sample, fresh_sample) = samples_from_groups([decision.group])
    # GRPO over rewards (1, 0): advantages +0.7071, -0.7071 (std of two samples is 0.7071).
    assert stale_sample.advantage == pytest.approx(2**-0.5, rel=1e-4)
    mask = torch.tensor(np.asarray(stale_sample.loss_mask))
    assert mask.tolist() == [0, 0, 0, 1, 1]  # the first token never carries loss; v3 cleared
    logprobs = torch.full((5,), -1.0, requires_grad=True)
    inputs = LossInputs(logprobs=logprobs, behaviour_logprobs=torch.full((5,), -1.0),
                        advantages=torch.full((5,), stale_sample.advantage), loss_mask=mask,
                        seq_ids=torch.zeros(5, dtype=torch.long), num_seqs=1)  # fmt: skip
    loss = policy_loss(inputs, AlgorithmConfig()).loss
    # ratio 1 on the two fresh tokens: -A each; nothing elsewhere.
    torch.testing.assert_close(loss, torch.tensor([0, 0, 0, -1.0, -1.0]) * stale_sample.advantage)
    assert fresh_sample.loss_mask.tolist() == [0, 0, 1, 1, 1]


def test_without_a_stale_token_the_two_rules_train_the_same_samples():
    group = _group([4, 5, 6], [5, 6])
    by_group = decide_group(group, version=VERSION, max_staleness=BOUND)
    by_token = decide_group(group, version=VERSION, max_staleness=BOUND, staleness_rule="token")
    assert by_token.masked_stale_tokens == 0
    for a, b in zip(samples_from_groups([by_group.group]), samples_from_groups([by_token.group]),
                    strict=True):  # fmt: skip
        assert a.advantage == b.advantage
        assert np.array_equal(np.asarray(a.loss_mask), np.asarray(b.loss_mask))
        assert np.array_equal(np.asarray(a.token_ids), np.asarray(b.token_ids))
