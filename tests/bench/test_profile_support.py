"""bench/profile_support.py on hand-written py-spy raw lines: roles from the process chain,
categories from the frames, seconds per step."""

import pytest

from bench.profile_support import (
    SPIN,
    WAITING,
    category_of,
    mean_step_s,
    parse_raw,
    per_step,
    profile,
    role_of,
)

LAUNCHER = 'process 10:"python -m deploy.local"'
LEARNER = f'{LAUNCHER};process 11:"python -m learner.cli --config configs/demo.toml"'
ACTOR = f'{LAUNCHER};process 12:"python -m actors.cli --config c --replicas 1"'
REPLICA = f'{ACTOR};process 13:"python -B -c from multiprocessing.spawn import spawn_main"'
ENGINE = f'{REPLICA};process 14:"VLLM::EngineCore"'

RAW = [
    f"{LEARNER};<module> (learner/cli.py:85);Tensor.backward (torch/_tensor.py:600) 50\n",
    f"{LEARNER};<module> (learner/cli.py:85);"
    "Qwen2Attention.forward (transformers/models/qwen2/modeling_qwen2.py:200) 30\n",
    f"{LEARNER};train (learner/main.py:1);AdamW.step (torch/optim/adamw.py:200) 10\n",
    f"{LEARNER};publish_weights (learner/trainer/ranks.py:9);"
    "send (weights/learner_side/sender.py:40) 5\n",
    f"{REPLICA};run_episode (actors/episode.py:10);call (protos/client.py:88) 20\n",
    f"{REPLICA};run_episode (actors/episode.py:10);generate (vllm/v1/engine/async_llm.py:1) 8\n",
    f"{ENGINE};run (vllm/v1/engine/core.py:9);"
    "Qwen2Model.forward (vllm/model_executor/models/qwen2.py:3) 100\n",
    f"{ENGINE};step (vllm/v1/engine/core.py:9);schedule (vllm/v1/core/sched/scheduler.py:3) 7\n",
    'process 99:"/bin/something else";main (x.py:1) 3\n',
    "a line that is not a sample\n",
]


def test_raw_lines_parse_into_frames_and_counts():
    samples = parse_raw(RAW)
    assert len(samples) == 9
    frames, count = samples[0]
    assert count == 50 and frames[-1] == "Tensor.backward (torch/_tensor.py:600)"


def test_the_innermost_process_names_the_role():
    assert role_of(LEARNER.split(";")) == "learner"
    assert role_of(REPLICA.split(";")) == "actor"  # a spawned child of the actor launcher
    assert role_of(ENGINE.split(";")) == "engine"
    assert role_of(LAUNCHER.split(";")) == "launcher"
    assert role_of(['process 99:"/bin/something else"']) == "other"


def test_the_first_matching_category_wins():
    # backward before forward: an activation-checkpointed forward inside backward is backward
    frames = ["Tensor.backward (torch/_tensor.py:1)", "Block.forward (learner/model.py:2)"]
    assert category_of("learner", frames) == "backward"
    assert category_of("learner", ["idle (x.py:1)"]) == "other"
    assert category_of("nobody", frames) == "other"


def test_samples_become_seconds_per_step_by_role_and_category():
    seconds = per_step(profile(parse_raw(RAW)), rate_hz=50, steps=2)
    assert seconds["learner"] == {
        "backward": 0.5,
        "forward": 0.3,
        "optimizer": 0.1,
        "weight broadcast": 0.05,
    }
    assert seconds["actor"] == {"env calls (gRPC)": 0.2, "vLLM client": 0.08}
    assert seconds["engine"] == {"model forward": 1.0, "scheduling": 0.07}
    assert seconds["other"] == {"other": 0.03}
    with pytest.raises(ValueError, match="no training step"):
        per_step({}, rate_hz=50, steps=0)


def test_a_thread_blocked_in_a_wait_is_waiting_only_by_its_innermost_frame():
    pool = "_worker (concurrent/futures/thread.py:81)"
    assert category_of("actor", ["Thread.run (threading.py:982)", pool]) == WAITING
    working = [pool, "_WorkItem.run (concurrent/futures/thread.py:58)", "wait_round (w.py:9)"]
    assert category_of("actor", working) == "weight update"
    # vLLM's worker process polling its shared-memory queue burns a core: work, not a wait
    spin = ["SpinCondition.wait (vllm/distributed/device_communicators/shm_broadcast.py:9)"]
    assert category_of("engine", [*spin, "sched_yield (vllm/distributed/utils.py:46)"]) == SPIN


def test_a_step_lasts_the_mean_gap_between_step_records_on_the_learners_clock():
    records = [{"t": 10.0, "wall_s": 4.0}, {"t": 11.0, "wall_s": 6.0}, {"t": 13.5, "wall_s": 7.0}]
    assert mean_step_s(records) == 1.5
    assert mean_step_s([{"t": 1.0}, {"t": 2.0, "wall_s": 9.0}, {"t": 4.0}]) == 1.5  # watcher's
    with pytest.raises(RuntimeError, match="fewer than two steps"):
        mean_step_s([{"t": 1.0}])
