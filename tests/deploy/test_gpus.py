"""The local launcher's GPU wiring (deploy/gpus.py) and the actor's own replica plan
(actors/replicas.py `replica_gpus`), on hand-laid machines: what the learner's environment
and the actors' overrides say."""

from __future__ import annotations

import pytest

from actors.replicas import replica_gpus
from deploy.config import load_run_config
from deploy.gpus import gpu_wiring

CONFIG = "configs/demo.toml"
WIRED = [
    "learner.model_path=m",
    "actor.engine.model=m",
    "learner.train_data=t.jsonl",
    "learner.eval_data=e.jsonl",
]


def _run(*overrides: str):
    run = load_run_config(CONFIG, [*WIRED, *overrides])
    return run, run.local


def test_no_gpus_wires_nothing():
    run, local = _run()
    wiring = gpu_wiring(run, local, [])
    assert wiring.learner_env == {} and wiring.overrides == []


def test_one_gpu_runs_learner_and_both_engines_there_over_gloo():
    run, local = _run("local.learner_gpu_memory_fraction=0.4", "local.actor_replicas=2")
    wiring = gpu_wiring(run, local, ["0"])
    assert wiring.learner_env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0"}
    assert wiring.overrides == [
        'actor.replica_gpus=["0", "0"]',
        "actor.engine.gpu_memory_utilization=0.3",  # (1 - 0.4) / 2
        "learner.weight_sync.backend=gloo",
    ]
    # The overrides are valid config.
    load_run_config(CONFIG, [*WIRED, *wiring.overrides])


def test_three_gpus_give_each_process_its_own():
    run, local = _run("actor.engine.gpu_memory_utilization=0.85", "local.actor_replicas=2")
    wiring = gpu_wiring(run, local, ["0", "1", "2"])
    assert wiring.learner_env["CUDA_VISIBLE_DEVICES"] == "0"
    assert wiring.overrides == [
        'actor.replica_gpus=["1", "2"]',
        "actor.engine.gpu_memory_utilization=0.85",
    ]


def test_two_learner_ranks_and_tensor_parallel_engines_on_eight():
    run, local = _run(
        "learner.nproc=2", "actor.engine.tensor_parallel_size=2", "local.actor_replicas=3"
    )
    wiring = gpu_wiring(run, local, [str(i) for i in range(8)])
    assert wiring.learner_env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert wiring.overrides[0] == 'actor.replica_gpus=["2,3", "4,5", "6,7"]'


def test_never_colocate_refuses_a_machine_too_small():
    run, local = _run("local.colocate=never", "local.actor_replicas=2")
    with pytest.raises(ValueError, match="need 3 GPUs; found 1"):
        gpu_wiring(run, local, ["0"])


def test_actor_replicas_plan_their_own_gpus_or_take_the_launchers():
    assert replica_gpus(None, 2, 1, []) == [None, None]  # CPU machine: nothing set
    assert replica_gpus(None, 2, 2, ["4", "5", "6", "7"]) == ["4,5", "6,7"]
    assert replica_gpus(["0", "0"], 3, 1, ["0"]) == ["0", "0", "0"]
    with pytest.raises(ValueError, match="need 4 GPUs; found 2"):
        replica_gpus(None, 2, 2, ["0", "1"])


def test_engine_data_parallel_is_refused_and_pipeline_counts_gpus():
    from actors.config import VllmEngineConfig

    with pytest.raises(ValueError, match="actor --replicas 2"):
        VllmEngineConfig(model="m", data_parallel_size=2)
    config = VllmEngineConfig(model="m", tensor_parallel_size=2, pipeline_parallel_size=2)
    assert config.num_gpus == 4


def test_a_file_whose_learner_and_engine_dtypes_differ_is_refused_before_anything_starts():
    with pytest.raises(ValueError, match='actor.engine.dtype = "bfloat16"'):
        _run("learner.dtype=bf16", "actor.engine.dtype=float32")
    run, _ = _run("learner.dtype=bf16", "actor.engine.dtype=bfloat16")
    assert run.learner.dtype == "bfloat16"
    _run("learner.dtype=fp32")  # against the engine's auto: checked where it resolves
