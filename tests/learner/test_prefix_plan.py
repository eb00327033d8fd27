"""The shared-prefix planner on hand-checked cases: what a group shares, what a piece costs,
how pieces are split, spread over ranks and packed into micro-batches."""

import random

import numpy as np
import pytest

from learner.trainer.prefix_plan import Piece, common_prefix_len, plan_pieces, shared_prefix_len
from learner.trainer.sample import Sample


def _sample(*, token_ids, group_id: str, index: int = 0) -> Sample:
    n = len(token_ids)
    return Sample(
        token_ids=np.asarray(token_ids, dtype=np.int32),
        loss_mask=np.array([0] + [1] * (n - 1), dtype=np.uint8),
        behaviour_logprobs=np.zeros(n, np.float32),
        versions=np.zeros(n, np.int32),
        advantage=0.0,
        trajectory_id=f"{group_id}-{index}",
        group_id=group_id,
        env_class="calculator",
    )


def _group(*, group_id: str, prefix_len: int, suffix_lens: list[int], first_token: int = 1):
    """Prefix tokens `first_token...`, then suffix k made of tokens 1000 + k (so suffixes
    differ from each other at their first token)."""
    prefix = list(range(first_token, first_token + prefix_len))
    return [
        _sample(token_ids=prefix + [1000 + k] * n, group_id=group_id, index=k)
        for k, n in enumerate(suffix_lens)
    ]


def _shape(plan):
    """plan as [rank][micro_batch] lists of (prefix_len, members)."""
    return [[[(p.prefix_len, p.members) for p in mb] for mb in bins] for bins in plan]


def test_common_prefix_by_hand():
    a, b, c = np.array([1, 2, 3, 4]), np.array([1, 2, 9]), np.array([1, 2, 3])
    assert common_prefix_len([a]) == 4
    assert common_prefix_len([a, b]) == 2
    assert common_prefix_len([a, c]) == 3  # c is a prefix of a
    assert common_prefix_len([a, np.array([7])]) == 0


def test_shared_prefix_is_capped_one_short_of_the_shortest_member():
    """[1..20] is a prefix of the other sample: sharing all 20 would leave it no suffix."""
    short = _sample(token_ids=list(range(1, 21)), group_id="g")
    long = _sample(token_ids=list(range(1, 31)), group_id="g", index=1)
    assert shared_prefix_len([short, long], min_shared_tokens=16) == 19
    assert shared_prefix_len([short, long], min_shared_tokens=20) == 0  # 19 < 20: not worth it
    assert shared_prefix_len([long], min_shared_tokens=1) == 0  # nobody to share with


def test_budget_counts_the_prefix_once():
    """Three samples of 30 = 20 shared + 10 own: 20 + 3 x 10 = 50 tokens as trained, one
    micro-batch of 50 (whole sequences would need 90)."""
    samples = _group(group_id="g", prefix_len=20, suffix_lens=[10, 10, 10])
    plan = plan_pieces(samples, num_ranks=1, token_budget=50)
    assert plan == [[[Piece(prefix_len=20, members=(0, 1, 2), num_tokens=50)]]]


def test_groups_stay_together_on_one_rank():
    """Groups of 50 and 44 tokens as trained: longest first onto the least-loaded rank."""
    samples = [
        *_group(group_id="a", prefix_len=20, suffix_lens=[8, 8, 8]),  # 44
        *_group(group_id="b", prefix_len=20, suffix_lens=[10, 10, 10], first_token=50),  # 50
    ]
    plan = plan_pieces(samples, num_ranks=2, token_budget=64)
    assert _shape(plan) == [[[(20, (3, 4, 5))]], [[(20, (0, 1, 2))]]]


def test_a_group_too_big_for_the_budget_is_split_first_fit_decreasing():
    """24 + (20 + 18 + 16 + 14) = 92 > 60: room for 36 of suffix per piece next to the
    prefix; by suffix, longest first: 20 -> A, 18 -> B (38 > 36), 16 -> A (36), 14 -> B."""
    samples = _group(group_id="g", prefix_len=24, suffix_lens=[20, 18, 16, 14])
    plan = plan_pieces(samples, num_ranks=1, token_budget=60)
    assert plan == [
        [
            [Piece(prefix_len=24, members=(0, 2), num_tokens=60)],
            [Piece(prefix_len=24, members=(1, 3), num_tokens=56)],
        ]
    ]


def test_a_member_longer_than_the_budget_goes_alone_and_plain():
    """Suffix 50 leaves no room next to the 24-token prefix (74 > 60): member 0 becomes a
    plain sequence in a micro-batch of its own; members 1 and 2 still share (24 + 6 + 5)."""
    samples = _group(group_id="g", prefix_len=24, suffix_lens=[50, 6, 5])
    plan = plan_pieces(samples, num_ranks=1, token_budget=60)
    assert plan == [
        [
            [Piece(prefix_len=0, members=(0,), num_tokens=74)],
            [Piece(prefix_len=24, members=(1, 2), num_tokens=35)],
        ]
    ]


def test_ranks_balance_tokens_as_trained_and_get_equal_micro_batch_counts():
    """The group costs 20 + 3 x 10 = 50 as trained (90 as whole sequences); longest first:
    group -> r0, plain 40 -> r1, plain 30 -> r1 (40 < 50), plain 25 -> r0 (50 < 70).
    r0: group + 25 = 75 > 60, two micro-batches; r1: 40 + 30 = 70 > 60, two as well."""
    samples = [
        *_group(group_id="g", prefix_len=20, suffix_lens=[10, 10, 10]),
        _sample(token_ids=[7] * 40, group_id="x"),
        _sample(token_ids=[8] * 30, group_id="y"),
        _sample(token_ids=[9] * 25, group_id="z"),
    ]
    plan = plan_pieces(samples, num_ranks=2, token_budget=60)
    assert _shape(plan) == [
        [[(20, (0, 1, 2))], [(0, (5,))]],
        [[(0, (3,))], [(0, (4,))]],
    ]
    plan = plan_pieces(samples, num_ranks=2, token_budget=80)
    assert _shape(plan) == [
        [[(20, (0, 1, 2)), (0, (5,))]],
        [[(0, (3,)), (0, (4,))]],
    ]
    plan = plan_pieces(samples, num_ranks=3, token_budget=80)  # r2: 30 + 25; r0, r1 one each
    assert _shape(plan) == [[[(20, (0, 1, 2))]], [[(0, (3,))]], [[(0, (4,)), (0, (5,))]]]


def test_short_ranks_are_padded_with_empty_micro_batches():
    samples = [_sample(token_ids=[i] * 50, group_id=f"s{i}") for i in range(3)]
    plan = plan_pieces(samples, num_ranks=2, token_budget=60)
    assert _shape(plan) == [[[(0, (0,))], [(0, (2,))]], [[(0, (1,))], []]]


def test_empty_batch_and_bad_arguments():
    assert plan_pieces([], num_ranks=2, token_budget=10) == [[], []]
    with pytest.raises(ValueError, match="num_ranks >= 1"):
        plan_pieces([], num_ranks=0, token_budget=10)
    with pytest.raises(ValueError, match="token_budget >= 1"):
        plan_pieces([], num_ranks=1, token_budget=0)


def test_sharing_off_and_under_the_minimum():
    samples = _group(group_id="g", prefix_len=10, suffix_lens=[5, 5])
    assert _shape(plan_pieces(samples, num_ranks=1, token_budget=100)) == [
        [[(0, (0,)), (0, (1,))]]
    ]  # 10 < 16
    assert _shape(plan_pieces(samples, num_ranks=1, token_budget=100, min_shared_tokens=8)) == [
        [[(10, (0, 1))]]
    ]


def test_plan_invariants_on_random_groups():
    rng = random.Random(0)
    for _ in range(40):
        samples = []
        for g in range(rng.randint(0, 6)):
            samples += _group(
                group_id=f"g{g}",
                prefix_len=rng.randint(0, 60),
                suffix_lens=[rng.randint(1, 80) for _ in range(rng.randint(1, 5))],
                first_token=100 * g,
            )
        rng.shuffle(samples)
        num_ranks, budget = rng.randint(1, 3), rng.randint(40, 300)
        plan = plan_pieces(samples, num_ranks=num_ranks, token_budget=budget)
        assert len({len(bins) for bins in plan}) == 1
        placed = sorted(i for bins in plan for mb in bins for p in mb for i in p.members)
        assert placed == list(range(len(samples)))
        for bins in plan:
            for mb in bins:
                assert len(mb) == 1 or sum(p.num_tokens for p in mb) <= budget
                for p in mb:
                    own = [samples[i].num_tokens - p.prefix_len for i in p.members]
                    assert p.num_tokens == p.prefix_len + sum(own) and min(own) >= 1
                    assert (p.prefix_len == 0) == (len(p.members) == 1)
                    assert len({samples[i].group_id for i in p.members}) == 1
        assert plan == plan_pieces(samples, num_ranks=num_ranks, token_budget=budget)
