import json

import pytest

from learner.eval_dump import (
    env_file_name,
    eval_dir,
    trajectory_record,
    write_aggregated_results,
    write_eval_dump,
)
from tests.learner_metrics.builders import group, trajectory


def _decode(ids: list[int]) -> str:
    """Stands in for a tokenizer: token id i is the letter chr(i)."""
    return "".join(chr(i) for i in ids)


def _read_jsonl(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


PROMPT = tuple(map(ord, "Q?"))
RESPONSE = tuple(map(ord, "call|obs|42"))
OBSERVATION = tuple(range(4, 9))  # "|obs|" is templated by the actor, not generated


def test_write_and_read_back(tmp_path):
    calculator = group(
        "run-eval3-0",
        dict(
            reward=1.0,
            prompt_ids=PROMPT,
            response_ids=RESPONSE,
            observation_positions=OBSERVATION,
            versions=(2, 3),
            num_turns=2,
            num_tool_calls=1,
            data_source="calculator",
            env_metrics={"tool_errors": 0.0},
        ),
        dict(
            reward=0.0,
            prompt_ids=PROMPT,
            response_ids=(ord("7"),),
            stop_reason="length",
            versions=(3, 3),
            data_source="calculator",
        ),
    )
    failed = group(
        "run-eval3-1",
        dict(
            reward=0.0,
            env_class="sql",
            stop_reason="error:env_open",
            prompt_ids=PROMPT,
            response_ids=(),
        ),
    )
    paths = write_eval_dump(
        tmp_path, 3, [calculator, failed], decode=_decode, task_keys={"run-eval3-0": "add-17-25"}
    )
    directory = tmp_path / "evals" / "global_step_3"
    assert paths == [directory / "calculator.jsonl", directory / "sql.jsonl"]

    first, second = _read_jsonl(directory / "calculator.jsonl")
    assert first == {
        "input_prompt": "Q?",
        "output_response": "call|obs|42",
        "score": 1.0,
        "stop_reason": "stop",
        "env_extras": {
            "task_key": "add-17-25",
            "data_source": "calculator",
            "env_class": "calculator",
            "group_id": "run-eval3-0",
            "sample_index": 0,
            "trajectory_id": "run-eval3-0/0",
            "num_turns": 2,
            "num_tool_calls": 1,
            "env_metrics": {"tool_errors": 0.0},
            "versions": {"min": 2, "max": 3},
        },
    }
    assert (second["output_response"], second["score"], second["stop_reason"]) == (
        "7",
        0.0,
        "length",
    )
    assert second["env_extras"]["sample_index"] == 1
    assert second["env_extras"]["versions"] == {"min": 3, "max": 3}

    [error] = _read_jsonl(directory / "sql.jsonl")
    assert error["output_response"] == "" and error["input_prompt"] == "Q?"
    assert error["env_extras"]["task_key"] is None  # not given
    assert error["env_extras"]["versions"] is None  # no policy token


def test_rewriting_a_version_replaces_its_dump(tmp_path):
    write_eval_dump(tmp_path, 0, [group("a", dict(reward=0.0), dict(reward=0.0))], decode=_decode)
    write_eval_dump(tmp_path, 0, [group("b", dict(reward=1.0))], decode=_decode)
    [only] = _read_jsonl(eval_dir(tmp_path, 0) / "calculator.jsonl")
    assert only["env_extras"]["group_id"] == "b"
    assert not list(eval_dir(tmp_path, 0).glob("*.tmp"))


def test_aggregated_results(tmp_path):
    path = write_aggregated_results(tmp_path, 5, {"eval/all/pass_at_1": 0.5, "version": 5})
    assert path == tmp_path / "evals" / "global_step_5" / "aggregated_results.jsonl"
    assert _read_jsonl(path) == [{"eval/all/pass_at_1": 0.5, "version": 5}]


def test_unicode_text_survives(tmp_path):
    t = trajectory(reward=1.0, prompt_ids=(ord("π"),), response_ids=(ord("✓"),))
    assert trajectory_record(t, decode=_decode)["output_response"] == "✓"
    [path] = write_eval_dump(tmp_path, 1, [[t]], decode=_decode)
    assert _read_jsonl(path)[0]["input_prompt"] == "π"


def test_env_class_as_file_name():
    assert env_file_name("calculator") == "calculator"
    assert env_file_name("skyrl/gsm8k v2") == "skyrl_gsm8k_v2"
    assert env_file_name("..") == "_.."  # never a parent directory
    with pytest.raises(ValueError):
        env_file_name("")
