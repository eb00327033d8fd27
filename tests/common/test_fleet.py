"""The fleet-size rule (common/fleet.py): bounds from the config, and sizes that change
only once a whole window agrees."""

import pytest

from common.fleet import ElasticConfig, FleetBounds, FleetSizer, fleet_bounds, groups_per_replica


def _bounds(**over) -> FleetBounds:
    base = dict(
        min_replicas=1, max_replicas=4, groups_per_replica=8,
        scale_up_after_s=10.0, scale_down_after_s=60.0,
    )  # fmt: skip
    return FleetBounds(**{**base, **over})


def test_one_replica_holds_its_engines_room_or_the_cap():
    assert groups_per_replica(max_num_seqs=64, group_size=8, max_groups_in_flight=None) == 8
    assert groups_per_replica(max_num_seqs=64, group_size=8, max_groups_in_flight=3) == 3
    assert groups_per_replica(max_num_seqs=4, group_size=8, max_groups_in_flight=None) == 1


def test_the_ceiling_follows_the_staleness_window():
    def ceiling(max_staleness: int, **elastic) -> int:
        b = fleet_bounds(
            ElasticConfig(**elastic), max_staleness=max_staleness, prompts_per_step=8,
            group_size=8, max_num_seqs=64, max_groups_in_flight=None,
        )  # fmt: skip
        return b.max_replicas

    assert ceiling(0) == 1 and ceiling(1) == 2 and ceiling(3) == 4
    assert ceiling(3, max_replicas=3) == 3  # the config may lower it
    assert ceiling(0, min_replicas=2) == 2  # never under the minimum


def test_bad_windows_and_bounds_are_refused_by_name():
    with pytest.raises(ValueError, match="elastic.max_replicas .1. is below elastic.min_replicas"):
        ElasticConfig(min_replicas=2, max_replicas=1)
    with pytest.raises(ValueError, match="shorter than elastic.engine_start_s"):
        ElasticConfig(scale_down_after_s=30, engine_start_s=60)


def test_work_maps_to_replicas_within_the_bounds():
    b = _bounds()
    assert [b.replicas_for(w) for w in (0, 1, 8, 9, 16, 100, -3)] == [1, 1, 1, 2, 2, 4, 1]


def test_one_burst_adds_nothing_but_its_share_of_the_mean():
    sizer = FleetSizer(_bounds(), replicas=1, now=0.0)
    sizes = [sizer.observe(float(t), 64 if t == 55 else 0) for t in range(0, 61, 5)]
    assert sizes == [1] * 13  # sustained 0; held 64 / 13 readings: under one replica's 8


def test_releases_every_step_size_the_fleet_by_their_mean_not_their_peaks():
    sizer = FleetSizer(_bounds(), replicas=3, now=0.0)
    for t in range(0, 181, 5):  # a step's 12 groups released, then taken and finished
        size = sizer.observe(float(t), 12 if t % 10 == 0 else 0)
    assert size == 1  # about 6 groups in flight on average: one replica's room (peaks want 2)


def test_work_held_for_the_up_window_grows_the_fleet_at_once():
    sizer = FleetSizer(_bounds(), replicas=1, now=0.0)
    assert [sizer.observe(float(t), w) for t, w in ((0, 30), (5, 20), (10, 30))] == [1, 1, 4]
    # sustained 20 (the lowest of the window), held 26.7 (the mean): 4 replicas of 8


def test_the_fleet_shrinks_to_the_largest_want_of_the_down_window():
    sizer = FleetSizer(_bounds(), replicas=1, now=0.0)
    for t in range(0, 11, 5):
        sizer.observe(float(t), 32)
    assert sizer.replicas == 4
    sizes = {t: sizer.observe(float(t), 0) for t in range(15, 200, 5)}
    assert sizes[70] == 4  # the want of 4 at t=10 is still inside the 60 s window
    assert sizes[75] < 4 and sizes[195] == 1  # then the held mean falls, and the fleet with it
    assert all(sizes[t] >= sizes[t + 5] for t in range(15, 195, 5))  # never grows back


def test_a_zero_window_follows_every_reading():
    sizer = FleetSizer(_bounds(scale_up_after_s=0, scale_down_after_s=0), replicas=2, now=0.0)
    assert [sizer.observe(float(t), w) for t, w in enumerate((0, 20, 9, 40))] == [1, 3, 2, 4]
