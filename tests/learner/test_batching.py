import pytest

from broker.codec import token_arrays
from learner.batching import (
    GroupAssembler,
    conversations,
    samples_from_groups,
)
from learner.steps import sample_problem
from learner.trainer.config import AlgorithmConfig
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
    samples = samples_from_groups([group], algorithm=AlgorithmConfig(std_eps=1e-12))
    assert [s.advantage for s in samples] == pytest.approx([1.5, -0.5, -0.5, -0.5])
    assert samples[0].token_ids.tolist() == [7, 8, 9]
    # the first token can never be predicted, so it never carries loss
    assert samples[0].loss_mask.tolist() == [0, 1, 1]


def test_an_agent_episode_of_two_conversations_is_two_sequences_with_its_advantage():
    """Conversation 2 begins at token 4: two samples, each from its own first token (which
    never carries loss), both with the episode's advantage; the other episode is one."""
    two = trajectory(trajectory_id="a", sample_index=0, reward=1.0, token_ids=[5, 6, 7, 8, 5, 9, 7],
                     loss_mask=[0, 0, 1, 1, 0, 1, 1], segment_starts=[4])  # fmt: skip
    one = trajectory(trajectory_id="b", sample_index=1, reward=0.0)
    assembler = GroupAssembler()
    assembler.add(two)
    group = assembler.add(one)
    samples = samples_from_groups([group], algorithm=AlgorithmConfig(std_eps=1e-12))
    assert [s.trajectory_id for s in samples] == ["a", "a#1", "b"]
    assert samples[0].token_ids.tolist() == [5, 6, 7, 8]
    assert samples[1].token_ids.tolist() == [5, 9, 7]
    assert samples[1].loss_mask.tolist() == [0, 1, 1]
    assert samples[0].advantage == samples[1].advantage > 0 > samples[2].advantage


@pytest.mark.parametrize("starts", [[0], [4, 4], [9], [5, 3]])
def test_conversation_starts_outside_the_tokens_are_a_bad_sample(starts):
    bad = trajectory(trajectory_id="a", token_ids=[5, 6, 7, 8, 5, 9, 7], segment_starts=starts)
    arrays = token_arrays(bad)
    assert sample_problem(bad, arrays) == "bad_segments"
    with pytest.raises(ValueError, match="not ascending positions"):
        conversations(7, starts)
