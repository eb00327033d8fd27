"""`learner prepare` from what users hold: reasoning-gym tasks, their own row functions, saved
Hugging Face datasets and CSV/JSONL files with a column mapping (learner/sources.py). Real
reasoning-gym and `datasets`, no mocks."""

import argparse
import json
import re
import textwrap

import pytest

from common.plugins import PluginError
from learner.data import load_dataset
from learner.prepare import add_prepare_arguments, run_prepare


def _prepare(out, *argv: str) -> list[dict]:
    """Run `learner prepare ARGV --output-dir OUT`; every row written, train then eval."""
    parser = argparse.ArgumentParser()
    add_prepare_arguments(parser)
    assert run_prepare(parser.parse_args([*argv, "--output-dir", str(out)])) == 0
    return load_dataset(out / "train.jsonl") + (
        load_dataset(out / "eval.jsonl") if (out / "eval.jsonl").read_text() else []
    )


def _write_jsonl(path, records) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_chain_sum_rows_answer_their_own_question(tmp_path):
    rows = _prepare(tmp_path, "--from", "reasoning_gym:chain_sum", "--size", "40", "--seed", "3")
    assert len(rows) == 40
    for row in rows:
        assert row["env_class"] == row["data_source"] == "reasoning_gym:chain_sum"
        system, user = row["prompt"]
        assert system["role"] == "system" and "<answer>" in system["content"]
        expression = re.fullmatch(r".*problem: ([-+ 0-9]+) =", user["content"]).group(1)
        assert str(eval(expression)) == row["reward_spec"]["ground_truth"]  # digits and +/-
        recipe = row["extra_info"]["reasoning_gym"]
        assert recipe["task"] == "chain_sum" and recipe["config"] == {"seed": 3, "size": 40}
        assert row["extra_info"]["task_key"] == f"chain_sum-{recipe['digest']}"
    assert sorted(r["extra_info"]["reasoning_gym"]["index"] for r in rows) == list(range(40))


def test_reasoning_gym_rows_are_deterministic_and_split_by_key(tmp_path):
    argv = ["--from", "reasoning_gym:basic_arithmetic", "--size", "200", "--eval-fraction", "0.1"]
    first = _prepare(tmp_path / "a", *argv, "--seed", "5")
    again = _prepare(tmp_path / "b", *argv, "--seed", "5")
    other = _prepare(tmp_path / "c", *argv, "--seed", "6")
    assert first == again and first != other
    eval_rows = load_dataset(tmp_path / "a" / "eval.jsonl")
    assert 5 <= len(eval_rows) <= 40  # ~10% by key hash; none duplicated into train
    eval_keys = {r["extra_info"]["task_key"] for r in eval_rows}
    train = load_dataset(tmp_path / "a" / "train.jsonl")
    assert not eval_keys & {r["extra_info"]["task_key"] for r in train}


def test_task_config_reaches_the_dataset_and_the_system_prompt_can_change(tmp_path):
    rows = _prepare(
        tmp_path,
        *("--from", "reasoning_gym:chain_sum", "--size", "30"),
        *("--task-config", "min_digits=3", "--task-config", "max_digits=3"),
        *("--system", "", "--env-class", "sums"),
    )
    for row in rows:
        (user,) = row["prompt"]  # --system "": no system message
        numbers = re.findall(r"\d+", user["content"].split(":")[1])
        assert numbers and all(len(n) == 3 for n in numbers)
        assert row["env_class"] == "sums"
        assert row["extra_info"]["reasoning_gym"]["config"]["max_digits"] == 3


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--from", "reasoning_gym:chain_summ", "--size", "3"], "no task 'chain_summ'.*chain_sum"),
        (["--from", "reasoning_gym:chain_sum", "--size", "3", "--task-config", "bogus=1"], "bogus"),
        (["--from", "reasoning_gym:chain_sum", "--size", "3", "--task-config", "seed=1"], "--seed"),
        (["--from", "reasoning_gym:chain_sum"], "--from needs --size"),
        (["--size", "3"], "give dataset files"),
        ([], "give dataset files or directories, or --from"),
        (["--from", "no_such_source", "--size", "3"], "tether.datasets entry point"),
    ],
)
def test_bad_sources_are_one_line(tmp_path, argv, message):
    with pytest.raises(ValueError, match=message):
        _prepare(tmp_path, *argv)


SOURCE_MODULE = """
def rows(size, seed, level=1):
    for i in range(size):
        yield {
            "data_source": "mine",
            "env_class": "reward:my_rows:score",
            "prompt": [{"role": "user", "content": f"level {level} question {seed}-{i}"}],
            "reward_spec": {"ground_truth": str(seed + i)},
        }

def bad_rows(size, seed):
    return [{"data_source": "mine", "env_class": "x", "prompt": "hi", "reward_spec": {}}]

def not_rows(size, seed):
    return {"data_source": "mine"}

def broken(size, seed):
    raise RuntimeError("no network here")
"""


@pytest.fixture
def source_module(tmp_path, monkeypatch):
    (tmp_path / "my_rows.py").write_text(textwrap.dedent(SOURCE_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))


def test_import_path_source_gets_size_seed_and_config(tmp_path, source_module):
    argv = ["--from", "my_rows:rows", "--size", "12", "--seed", "4", "--task-config", "level=2"]
    rows = _prepare(tmp_path / "out", *argv)
    assert sorted(r["prompt"][0]["content"] for r in rows) == sorted(
        f"level 2 question 4-{i}" for i in range(12)
    )
    assert all(r["extra_info"] == {} for r in rows)


@pytest.mark.parametrize(
    ("spec", "error", "message"),
    [
        ("my_rows:bad_rows", ValueError, r"my_rows:bad_rows: row 1: prompt: expected a non-empty"),
        ("my_rows:not_rows", ValueError, "returned a dict; a dataset source returns an iterable"),
        ("my_rows:broken", PluginError, "my_rows:broken: RuntimeError: no network here"),
        ("my_rows:missing", PluginError, "has no attribute 'missing'"),
    ],
)
def test_bad_import_path_sources(tmp_path, source_module, spec, error, message):
    with pytest.raises(error, match=message):
        _prepare(tmp_path / "out", "--from", spec, "--size", "2")


@pytest.fixture(scope="module")
def datasets_lib():
    import datasets

    datasets.disable_progress_bars()
    return datasets


MAPPING = ["--column", "prompt=question", "--column", "ground_truth=answer"]


def test_saved_hugging_face_dataset_with_a_column_mapping(tmp_path, datasets_lib):
    records = [
        {"question": f"What is {i} + 1?", "answer": str(i + 1), "level": i} for i in range(8)
    ]
    datasets_lib.Dataset.from_list(records).save_to_disk(tmp_path / "saved")
    system = "--system=Answer in <answer> tags."
    rows = _prepare(
        tmp_path / "out", str(tmp_path / "saved"), *MAPPING, "--env-class=calculator", system
    )
    by_answer = {r["reward_spec"]["ground_truth"]: r for r in rows}
    assert sorted(by_answer, key=int) == [str(i + 1) for i in range(8)]
    row = by_answer["4"]
    assert row["prompt"] == [
        {"role": "system", "content": "Answer in <answer> tags."},
        {"role": "user", "content": "What is 3 + 1?"},
    ]
    assert (row["env_class"], row["data_source"]) == ("calculator", "saved")
    assert row["extra_info"] == {"level": 3}  # columns not mapped


def test_saved_dataset_dict_split_and_message_columns(tmp_path, datasets_lib):
    messages = [
        [{"role": "user", "content": "hi"}],  # Arrow gives it "name": None
        [{"role": "system", "content": "s", "name": "n"}, {"role": "user", "content": "yo"}],
    ]
    test = datasets_lib.Dataset.from_list(
        [{"messages": m, "gt": i, "env": "noop"} for i, m in enumerate(messages)]
    )
    datasets_lib.DatasetDict({"train": test.select([0]), "test": test}).save_to_disk(
        tmp_path / "dd"
    )
    argv = [str(tmp_path / "dd"), "--column=prompt=messages", "--column=ground_truth=gt"]
    argv += ["--column=env_class=env"]
    rows = _prepare(tmp_path / "out", *argv, "--split=test")
    by_truth = {r["reward_spec"]["ground_truth"]: r["prompt"] for r in rows}
    assert by_truth == {0: messages[0], 1: messages[1]}
    with pytest.raises(ValueError, match=r"dd: no split 'dev' \(it has \['test', 'train'\]\)"):
        _prepare(tmp_path / "out2", *argv, "--split=dev")
    (row,) = _prepare(tmp_path / "out3", *argv, "--system=S")
    assert row["prompt"] == [{"role": "system", "content": "S"}, *messages[0]]  # train split
    with pytest.raises(ValueError, match="has its own system message"):
        _prepare(tmp_path / "out4", *argv, "--system=S", "--split=test")


def test_saved_skyrl_rows_without_a_mapping(tmp_path, datasets_lib):
    rows = [
        {
            "data_source": "d",
            "env_class": "noop",
            "prompt": [{"role": "user", "content": f"q{i}"}],
            "reward_spec": {"ground_truth": str(i)},
        }
        for i in range(3)
    ]
    datasets_lib.Dataset.from_list(rows).save_to_disk(tmp_path / "skyrl")
    prepared = _prepare(tmp_path / "out", str(tmp_path / "skyrl"))
    assert sorted(r["prompt"][0]["content"] for r in prepared) == ["q0", "q1", "q2"]


def test_csv_and_jsonl_with_a_column_mapping(tmp_path):
    (tmp_path / "data.csv").write_text('question,answer,topic\n"2, then 3?",5,sums\nx?,y,z\n')
    _write_jsonl(tmp_path / "more.jsonl", [{"question": "q", "answer": 1, "env": "python"}])
    csv_rows = _prepare(tmp_path / "a", str(tmp_path / "data.csv"), *MAPPING, "--env-class", "e")
    pairs = sorted((r["prompt"][0]["content"], r["reward_spec"]["ground_truth"]) for r in csv_rows)
    assert pairs == [("2, then 3?", "5"), ("x?", "y")]
    assert {r["extra_info"]["topic"] for r in csv_rows} == {"sums", "z"}
    jsonl = [str(tmp_path / "more.jsonl"), *MAPPING, "--column=env_class=env"]
    (row,) = _prepare(tmp_path / "b", *jsonl, "--column=task_key=question")
    assert (row["env_class"], row["reward_spec"]) == ("python", {"ground_truth": 1})
    assert row["extra_info"] == {"task_key": "q"}


@pytest.mark.parametrize(
    ("csv_text", "argv", "message"),
    [
        ("q,answer\na,b\n", MAPPING, r"data.csv:row 1: column 'question' missing"),
        ("question,answer\na,b\n ,c\n", MAPPING, r"data.csv:row 2: column 'question' is empty"),
        ("question,answer\na,b,c\n", MAPPING, r"data.csv:row 1: more cells than the header"),
        ("question,answer\na\n", MAPPING, r"data.csv:row 1: fewer cells than the header"),
        ("question,answer\na,b\n", [], r"data.csv: a CSV file holds columns, not SkyRL rows"),
        ("question,answer\n", MAPPING, r"data.csv holds no rows"),
        ("question\na\n", ["--column", "prompt=question"], r"map ground_truth too"),
        ("question\na\n", [*MAPPING, "--column", "answer=x"], r"--column answer: not a row"),
        ("question,answer\na,b\n", ["--env-class", "e"], r"--env-class goes with --column"),
    ],
)
def test_bad_mapped_inputs_name_the_row_and_field(tmp_path, csv_text, argv, message):
    (tmp_path / "data.csv").write_text(csv_text)
    env = ["--env-class", "e"] if "--column" in argv and "--env-class" not in argv else []
    with pytest.raises(ValueError, match=message):
        _prepare(tmp_path / "out", str(tmp_path / "data.csv"), *argv, *env)


def test_bad_mapped_jsonl_values(tmp_path):
    path = tmp_path / "d.jsonl"
    _write_jsonl(path, [{"question": "ok", "answer": 1}, {"question": 7, "answer": 2}])
    with pytest.raises(ValueError, match=r"d.jsonl:2: column 'question': expected text or a list"):
        _prepare(tmp_path / "out", str(path), *MAPPING, "--env-class", "e")
    _write_jsonl(path, [{"question": "ok", "answer": {"when": float("nan")}}])
    with pytest.raises(ValueError, match=r"d.jsonl:1: reward_spec.ground_truth.when: nan is not"):
        _prepare(tmp_path / "out", str(path), *MAPPING, "--env-class", "e")
    with pytest.raises(ValueError, match="mapped rows need an environment"):
        _prepare(tmp_path / "out", str(path), *MAPPING)
