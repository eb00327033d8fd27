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


def test_a_burst_shorter_than_the_up_window_adds_nothing():
    sizer = FleetSizer(_bounds(), replicas=1, now=0.0)
    assert sizer.observe(0.0, 30) == 1  # a step's release arrives at once
    assert sizer.observe(5.0, 2) == 1
    assert sizer.observe(12.0, 30) == 1  # the window [2, 12] saw 1 replica's worth


def test_work_held_for_the_up_window_adds_the_lowest_size_it_saw():
    sizer = FleetSizer(_bounds(), replicas=1, now=0.0)
    for t, work in ((0, 30), (5, 20), (10, 30)):
        size = sizer.observe(float(t), work)
    assert size == 3  # min over the window: 20 groups = 3 replicas of 8


def test_the_fleet_shrinks_only_after_the_down_window_and_to_its_highest_want():
    sizer = FleetSizer(_bounds(), replicas=1, now=0.0)
    for t in range(0, 11, 5):
        sizer.observe(float(t), 32)
    assert sizer.replicas == 4
    sizer.observe(40.0, 0)
    assert sizer.observe(69.0, 0) == 4  # the window is watched whole only 60 s after the change
    sizer.observe(71.0, 9)
    assert sizer.observe(72.0, 0) == 2  # the highest want in [12, 72]: 9 groups
    assert sizer.observe(200.0, 0) == 1


def test_a_zero_window_follows_every_reading():
    sizer = FleetSizer(_bounds(scale_up_after_s=0, scale_down_after_s=0), replicas=2, now=0.0)
    assert [sizer.observe(float(t), w) for t, w in enumerate((0, 20, 9, 40))] == [1, 3, 2, 4]
