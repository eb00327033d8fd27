import numpy as np
import pytest

from learner.dispatcher import num_releasable, step_of_release
from learner.staleness import (
    is_too_stale,
    may_release,
    oldest_allowed_version,
    oldest_version,
    release_horizon,
    staleness_histogram,
)


def test_admission():
    assert may_release(step=3, version=1, max_staleness=2)
    assert not may_release(step=3, version=0, max_staleness=2)
    assert may_release(step=0, version=0, max_staleness=0)


def test_the_dispatcher_releases_exactly_the_steps_the_rule_admits():
    # By hand: at v2 with bound 1, steps 0..3 are admitted (2 >= 3 - 1), step 4 is not.
    assert release_horizon(2, 1) == 4
    assert oldest_allowed_version(step=3, max_staleness=1) == 2
    assert oldest_allowed_version(step=0, max_staleness=3) == 0  # never below the first
    for version in range(6):
        for bound in range(3):
            admitted = [s for s in range(20) if may_release(s, version, bound)]
            released = num_releasable(
                version=version,
                num_released=0,
                num_dropped_groups=0,
                prompts_per_step=2,
                max_staleness=bound,
            )
            assert released == 2 * len(admitted)
            newest = step_of_release(
                10**6, version=version, prompts_per_step=2, max_staleness=bound
            )
            assert newest == max(admitted)  # replacements go to the newest admitted step
    with pytest.raises(ValueError):
        release_horizon(0, -1)


def test_consumption():
    assert not is_too_stale(3, version=5, max_staleness=2)
    assert is_too_stale(2, version=5, max_staleness=2)
    assert not is_too_stale(None, version=5, max_staleness=0)


def test_max_staleness_zero_is_synchronous():
    """Prompts for step s wait for version s; only current-version tokens are trained."""
    for version in range(5):
        assert may_release(step=version, version=version, max_staleness=0)
        assert not may_release(step=version + 1, version=version, max_staleness=0)
        assert not is_too_stale(version, version=version, max_staleness=0)
        if version > 0:
            assert is_too_stale(version - 1, version=version, max_staleness=0)


def test_admitted_tokens_pass_consumption_at_their_step():
    """A prompt released for step s at the earliest allowed version and trained at step s is
    never dropped: the two rules agree."""
    for k in range(4):
        for s in range(10):
            v_release = max(s - k, 0)
            assert may_release(step=s, version=v_release, max_staleness=k)
            assert not is_too_stale(v_release, version=s, max_staleness=k)


def test_oldest_version_ignores_non_policy_tokens():
    arrays = [np.array([-1, 5, 5, 4]), np.array([-1, 3, -1])]
    assert oldest_version(arrays) == 3
    assert oldest_version([np.array([-1, -1])]) is None


def test_histogram_by_hand():
    """At version 5: staleness 0, 0, 1 | 2, 4 -> buckets 0, 1, >=2 = [2, 1, 2]."""
    arrays = [np.array([-1, 5, 5, 4], dtype=np.int32), np.array([3, 1], dtype=np.int32)]
    assert staleness_histogram(arrays, current_version=5, num_buckets=3) == [2, 1, 2]
    assert staleness_histogram(arrays, current_version=5, num_buckets=1) == [5]


def test_bad_input():
    with pytest.raises(ValueError, match="newer than"):
        staleness_histogram([np.array([6])], current_version=5, num_buckets=3)
    with pytest.raises(ValueError, match="max_staleness"):
        may_release(step=1, version=1, max_staleness=-1)
