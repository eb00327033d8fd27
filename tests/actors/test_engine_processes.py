"""The CPU engine's process layout: which environment makes the engine-core process run
the one worker itself, with the threads placed as vLLM's worker process had them."""

import pytest

from actors.engine_processes import in_core_worker_env, parse_core_list


def test_core_lists_parse_like_vllms_bind_variable():
    assert parse_core_list("1") == [1]
    assert parse_core_list("0,2-3") == [0, 2, 3]
    for bad in ("", "a", "1-", "0;1", "2-x"):
        with pytest.raises(ValueError, match="cpu_threads_bind"):
            parse_core_list(bad)


def test_a_bound_cpu_engine_runs_its_worker_on_the_bound_cores():
    env = in_core_worker_env("1,3", num_workers=1, on_gpu=False, usable_cores={0, 1, 2, 3})
    assert env == {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "OMP_NUM_THREADS": "2",
        "OMP_PLACES": "{1,3}",
        "OMP_PROC_BIND": "true",
    }


def test_an_unbound_cpu_engine_keeps_one_thread_per_usable_core():
    env = in_core_worker_env("nobind", num_workers=1, on_gpu=False, usable_cores={0, 1, 2})
    assert env == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "3"}


@pytest.mark.parametrize(
    "bind, num_workers, on_gpu",
    [("0", 1, True), ("0-1", 2, False), ("auto", 1, False), ("nobind", 1, True)],
)
def test_gpu_multi_worker_and_auto_bound_engines_keep_vllms_layout(bind, num_workers, on_gpu):
    assert (
        in_core_worker_env(bind, num_workers=num_workers, on_gpu=on_gpu, usable_cores={0, 1})
        is None
    )
