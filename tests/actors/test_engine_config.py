"""VllmEngineConfig checks and per-replica thread binding (pure: no engine starts)."""

import dataclasses

import pytest

from actors.config import VLLM_ENGINE_ARGS, VllmEngineConfig
from actors.engine_processes import threads_bind_for_replica


@pytest.mark.parametrize(
    "bind, index, cores, expected",
    [
        ("nobind", 3, [0, 1], "nobind"),
        ("auto", 0, [0, 1], "auto"),
        ("0-3", 1, [0, 1], "0-3"),
        ("spread", 0, [0, 1], "0"),
        ("spread", 1, [0, 1], "1"),
        ("spread", 2, [0, 1], "0"),  # more replicas than cores: wrap around
        ("spread", 1, [7, 5], "7"),  # the cores this process may use, in order
    ],
)
def test_threads_bind_for_replica(bind, index, cores, expected):
    assert threads_bind_for_replica(bind, index, cores) == expected


def test_spread_needs_a_core():
    with pytest.raises(ValueError, match="core"):
        threads_bind_for_replica("spread", 0, [])


def test_prefills_must_fit_a_step_without_chunked_prefill():
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        VllmEngineConfig(
            model="m", max_model_len=2048, enable_chunked_prefill=False, max_num_batched_tokens=1024
        )
    config = VllmEngineConfig(model="m", max_model_len=1024, enable_chunked_prefill=False)
    assert config.max_num_batched_tokens is None  # vLLM picks one that fits
    VllmEngineConfig(model="m", max_model_len=2048, max_num_batched_tokens=1024)  # chunks


@pytest.mark.vllm
def test_engine_args_passed_as_they_are_are_fields_of_both():
    from vllm.engine.arg_utils import AsyncEngineArgs

    assert VLLM_ENGINE_ARGS <= set(VllmEngineConfig.model_fields)
    assert VLLM_ENGINE_ARGS <= {field.name for field in dataclasses.fields(AsyncEngineArgs)}
    config = VllmEngineConfig(model="m", max_model_len=1024, max_num_seqs=8)
    assert config.vllm_engine_args()["max_num_seqs"] == 8
    assert "cpu_threads_bind" not in config.vllm_engine_args()  # Tether's own: an env variable
