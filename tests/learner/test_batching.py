import random

import numpy as np
import pytest
import torch

from learner.batching import (
    GroupAssembler,
    collate,
    plan_micro_batches,
    samples_from_groups,
)
from tests.learner.builders import trajectory


def test_group_completes_when_all_samples_arrived():
    assembler = GroupAssembler()
    assert assembler.add(trajectory(trajectory_id="b", sample_index=1, reward=1.0)) is None
    assert assembler.num_pending_groups == 1
    group = assembler.add(trajectory(trajectory_id="a", sample_index=0, reward=0.0))
    assert group is not None and group.group_id == "g0"
    assert [t.trajectory_id for t in group.trajectories] == ["a", "b"]  # by sample index
    assert group.rewards == [0.0, 1.0] and assembler.num_pending_groups == 0


def test_duplicates_are_ignored_and_counted():
    assembler = GroupAssembler()
    assembler.add(trajectory(trajectory_id="a", sample_index=0))
    assert assembler.add(trajectory(trajectory_id="a", sample_index=0)) is None  # redelivery
    assert assembler.add(trajectory(trajectory_id="a2", sample_index=0)) is None  # same slot
    assert assembler.num_duplicates == 2
    assert assembler.add(trajectory(trajectory_id="b", sample_index=1)) is not None
    # a redelivery after the group was handed out is still a duplicate
    assert assembler.add(trajectory(trajectory_id="b", sample_index=1)) is None
    assert assembler.num_duplicates == 3 and assembler.num_pending_groups == 0


def test_ids_from_a_checkpoint_are_never_trained_again():
    assembler = GroupAssembler(seen_ids={"a"})
    assert assembler.add(trajectory(trajectory_id="a")) is None
    assert assembler.num_duplicates == 1 and assembler.num_pending_groups == 0


def test_conflicting_group_size_is_a_value_error():
    assembler = GroupAssembler()
    assembler.add(trajectory(trajectory_id="a", group_size=2))
    with pytest.raises(ValueError, match="earlier one said 2"):
        assembler.add(trajectory(trajectory_id="b", sample_index=1, group_size=4))


def test_samples_carry_group_advantages_and_decoded_tokens():
    assembler = GroupAssembler()
    group = None
    for i, reward in enumerate([1.0, 0.0, 0.0, 0.0]):
        group = assembler.add(
            trajectory(
                trajectory_id=f"t{i}",
                sample_index=i,
                group_size=4,
                reward=reward,
                token_ids=[7, 8, 9],
                loss_mask=[1, 1, 1],
                prompt_len=0,
            )
        )
    samples = samples_from_groups([group], estimator="grpo", eps=0.0)
    assert [s.advantage for s in samples] == pytest.approx([1.5, -0.5, -0.5, -0.5])
    assert samples[0].token_ids.tolist() == [7, 8, 9]
    # the first token can never be predicted, so it never carries loss
    assert samples[0].loss_mask.tolist() == [0, 1, 1]


def test_plan_by_hand():
    """Longest first onto the least-loaded rank: 62 -> r0, 62 -> r1, 62 -> r0, 12 -> r1.
    r0 packs [0], [2] (124 > 74); r1 packs [1, 3] (74) and gets an empty micro-batch."""
    plan = plan_micro_batches([62, 62, 62, 12], num_ranks=2, token_budget=74)
    assert plan == [[[0], [2]], [[1, 3], []]]
    assert plan_micro_batches([62, 62, 62, 12], num_ranks=1, token_budget=74) == [
        [[0, 3], [1], [2]]
    ]


def test_plan_invariants_on_random_lengths():
    rng = random.Random(0)
    for _ in range(50):
        lengths = [rng.randint(1, 300) for _ in range(rng.randint(1, 40))]
        num_ranks, budget = rng.randint(1, 4), rng.randint(50, 400)
        plan = plan_micro_batches(lengths, num_ranks=num_ranks, token_budget=budget)
        assert len({len(bins) for bins in plan}) == 1  # same count on every rank
        placed = sorted(i for bins in plan for mb in bins for i in mb)
        assert placed == list(range(len(lengths)))
        for bins in plan:
            for mb in bins:
                assert len(mb) == 1 or sum(lengths[i] for i in mb) <= budget
        assert plan == plan_micro_batches(lengths, num_ranks=num_ranks, token_budget=budget)


def test_collate_by_hand():
    assembler = GroupAssembler()
    assembler.add(
        trajectory(
            trajectory_id="a",
            token_ids=[5, 6, 7],
            loss_mask=[0, 1, 1],
            logprobs=[0.0, -0.5, -0.25],
            versions=[-1, 3, 4],
            reward=1.0,
        )
    )
    group = assembler.add(
        trajectory(
            trajectory_id="b", sample_index=1, token_ids=[8, 9], loss_mask=[0, 1], reward=0.0
        )
    )
    mb = collate(samples_from_groups([group], estimator="dr_grpo"))
    assert mb.input_ids.tolist() == [[5, 6, 7, 8, 9]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 0, 1]]
    assert mb.cu_seqlens.tolist() == [0, 3, 5]
    assert mb.seq_ids.tolist() == [0, 0, 0, 1, 1]
    assert mb.loss_mask.tolist() == [False, True, True, False, True]
    assert mb.advantages.tolist() == [0.5, 0.5, 0.5, -0.5, -0.5]
    assert mb.behaviour_logprobs.tolist() == [0.0, -0.5, -0.25, 0.0, -1.0]
    assert mb.versions.tolist() == [-1, 3, 4, -1, 0]
    assert mb.num_seqs == 2 and mb.num_tokens == 5


def test_empty_micro_batch_is_one_token_without_loss():
    mb = collate([])
    assert mb.num_tokens == 1 and not mb.loss_mask.any() and mb.num_seqs == 1
    assert mb.input_ids.dtype == torch.int64 and isinstance(mb.versions, torch.Tensor)
    assert np.array_equal(mb.cu_seqlens.numpy(), [0, 1])
