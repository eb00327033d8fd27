"""The placement plan (common/placement.py) on hand-laid machines: which GPU each learner
rank and each engine gets, co-location on a 1-GPU machine with the memory split worked out
by hand, and the errors that name what was needed."""

from __future__ import annotations

import pytest

from common.placement import PlacementRequest, parse_visible_gpus, plan_placement

EIGHT = {"n0": [str(i) for i in range(8)]}


def _engines(placement):
    return [(e.node, e.gpus) for e in placement.engines]


def test_one_node_learner_first_then_engines_of_two_gpus():
    placement = plan_placement(EIGHT, PlacementRequest(4, 2, gpus_per_engine=2))
    assert [(s.rank, s.local_rank, s.gpu) for s in placement.learner] == [
        (0, 0, "0"), (1, 1, "1"), (2, 2, "2"), (3, 3, "3"),
    ]  # fmt: skip
    assert _engines(placement) == [("n0", ("4", "5")), ("n0", ("6", "7"))]
    assert placement.learner_gpus("n0") == "0,1,2,3"
    assert placement.engines[1].cuda_visible_devices == "6,7"
    assert not placement.colocated
    assert all(e.memory_fraction == 0.9 for e in placement.engines)


def test_learner_packed_on_the_first_node_and_engines_never_span_nodes():
    nodes = {"a": ["0", "1", "2"], "b": ["0", "1", "2", "3"]}
    placement = plan_placement(nodes, PlacementRequest(4, 2, gpus_per_engine=2))
    assert [(s.node, s.local_rank, s.gpu) for s in placement.learner] == [
        ("a", 0, "0"), ("a", 1, "1"), ("a", 2, "2"), ("b", 0, "0"),
    ]  # fmt: skip
    # b has 1,2,3 left: one engine of 2 fits there, and no other node has two free.
    with pytest.raises(ValueError, match=r"need 8 GPUs; found 7 \(a: 3, b: 4\)"):
        plan_placement(nodes, PlacementRequest(4, 2, gpus_per_engine=2, colocate="never"))
    assert _engines(placement)[0] == ("b", ("1", "2"))
    assert placement.colocated  # the second engine shares the learner's GPUs


def test_gpu_ids_are_kept_as_named():
    nodes = {"n": ["GPU-aa", "GPU-bb"]}
    placement = plan_placement(nodes, PlacementRequest(1, 1))
    assert placement.learner[0].gpu == "GPU-aa" and placement.engines[0].gpus == ("GPU-bb",)


def test_one_gpu_machine_colocates_learner_and_two_engines():
    placement = plan_placement({"n": ["0"]}, PlacementRequest(1, 2, learner_memory_fraction=0.4))
    assert placement.colocated
    assert placement.learner_gpus("n") == "0"
    assert _engines(placement) == [("n", ("0",)), ("n", ("0",))]
    # The learner keeps 40%; the two engines split the other 60%: 0.3 each.
    assert [e.memory_fraction for e in placement.engines] == [0.3, 0.3]
    assert all(e.shares_learner_gpu for e in placement.engines)


def test_colocated_engines_round_robin_over_the_learner_gpus():
    # 2 GPUs, 2 learner ranks, 3 engines: engines alternate GPU 0, 1, 0; GPU 0 carries two.
    placement = plan_placement(
        {"n": ["0", "1"]}, PlacementRequest(2, 3, learner_memory_fraction=0.5)
    )
    assert _engines(placement) == [("n", ("0",)), ("n", ("1",)), ("n", ("0",))]
    assert [e.memory_fraction for e in placement.engines] == [0.25, 0.5, 0.25]


def test_a_dedicated_engine_keeps_its_fraction_beside_colocated_ones():
    placement = plan_placement({"n": ["0", "1"]}, PlacementRequest(1, 2))
    assert [(e.gpus, e.memory_fraction, e.shares_learner_gpu) for e in placement.engines] == [
        (("1",), 0.9, False),
        (("0",), 0.6, True),
    ]


def test_actors_alone_take_every_gpu_and_refuse_when_short():
    placement = plan_placement(EIGHT, PlacementRequest(0, 4, gpus_per_engine=2))
    assert _engines(placement)[3] == ("n0", ("6", "7")) and not placement.learner
    with pytest.raises(ValueError, match="need 10 GPUs; found 8"):
        plan_placement(EIGHT, PlacementRequest(0, 5, gpus_per_engine=2))


def test_too_many_learner_ranks_and_bad_requests_are_errors():
    with pytest.raises(ValueError, match="9 learner ranks need 9 GPUs; found 8"):
        plan_placement(EIGHT, PlacementRequest(9, 0))
    with pytest.raises(ValueError, match="cannot share"):
        plan_placement({"n": ["0"]}, PlacementRequest(1, 1, gpus_per_engine=2))
    with pytest.raises(ValueError):
        PlacementRequest(1, 1, gpus_per_engine=0)
    with pytest.raises(ValueError):
        PlacementRequest(1, 1, learner_memory_fraction=1.0)


def test_no_gpu_machine_with_nothing_to_place_is_fine():
    assert plan_placement({"n": []}, PlacementRequest(0, 0)).engines == ()


def test_visible_gpus_prefer_cuda_visible_devices():
    assert parse_visible_gpus("2, 3", "0\n1\n2\n3\n") == ["2", "3"]
    assert parse_visible_gpus("", "0\n1\n") == []  # set but empty hides every GPU
    assert parse_visible_gpus(None, "0\n1\n") == ["0", "1"]
    assert parse_visible_gpus(None, None) == []
