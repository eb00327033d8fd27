"""The elastic fleet's pure parts on Ray (deploy/ray_fleet.py): the backlog read from the
learner's /metrics, and which replicas start or leave."""

import pytest

from deploy.ray_fleet import FleetWatch, changes, is_replica, replica_index, work_from_metrics

METRICS = """\
# HELP tether_bus_pending_messages Stored, not yet delivered
# TYPE tether_bus_pending_messages gauge
tether_bus_pending_messages{queue="prompts"} 5.0
tether_bus_pending_messages{queue="trajectories"} 40.0
# HELP tether_bus_ack_pending_messages Delivered, not yet acked
# TYPE tether_bus_ack_pending_messages gauge
tether_bus_ack_pending_messages{queue="prompts"} 11.0
tether_bus_ack_pending_messages{queue="trajectories"} 2.0
"""


def test_the_work_is_the_prompts_queue_pending_and_running():
    assert work_from_metrics(METRICS) == 16.0  # the trajectories queue is the learner's


def test_no_reading_before_the_learner_read_the_bus():
    assert work_from_metrics("# nothing yet\n") is None
    only_pending = "\n".join(METRICS.splitlines()[:4]) + "\n"
    assert work_from_metrics(only_pending) is None


def test_new_replicas_fill_the_lowest_free_numbers_and_the_newest_leave_first():
    assert changes(3, ["actor-0"]) == (["actor-1", "actor-2"], [])
    assert changes(3, ["actor-0", "actor-2"]) == (["actor-1"], [])
    assert changes(1, ["actor-0", "actor-3", "actor-1"]) == ([], ["actor-3", "actor-1"])
    assert changes(2, ["actor-1", "actor-0"]) == ([], [])


def test_only_replicas_are_sized():
    assert is_replica("actor-0") and is_replica("actor-12")
    assert not is_replica("learner") and not is_replica("actor-0/replica-0")
    with pytest.raises(ValueError, match="'learner' is not an actor replica's name"):
        replica_index("learner")


def test_the_backlog_is_read_every_poll_once_the_engines_had_time_to_start():
    bounds = dict(
        min_replicas=1, max_replicas=4, groups_per_replica=8,
        scale_up_after_s=0.0, scale_down_after_s=0.0,
    )  # fmt: skip
    spec = {"bounds": bounds, "poll_s": 5.0, "engine_start_s": 30.0}
    watch = FleetWatch(spec, replicas=1)
    assert [watch.due(t) for t in (100.0, 129.0, 130.0, 134.9, 135.0)] == [
        False, False, True, False, True,
    ]  # fmt: skip
    assert watch.wanted(135.0, 17) == 3
