import argparse
import datetime
import json
import math

import pytest

from learner.data import hash_fraction, load_dataset, split_rows, task_key, write_dataset
from learner.prepare import add_prepare_arguments, run_prepare


def _row(env: str = "calculator", key: str | None = "k", **fields) -> dict:
    row = {
        "data_source": env,
        "env_class": env,
        "prompt": [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "What is 1 + 2?"},
        ],
        "reward_spec": {"method": "rule", "ground_truth": "3"},
        "extra_info": {"task_key": key} if key else {},
    }
    return {**row, **fields}


def _write_jsonl(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_jsonl_loads_and_keeps_extra_keys(tmp_path):
    path = tmp_path / "d.jsonl"
    _write_jsonl(path, [_row(key="a", ability="math"), _row(key=None, extra_info=None)])
    rows = load_dataset(path)
    assert rows[0]["ability"] == "math" and rows[1]["extra_info"] == {}


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"env_class": ""}, "env_class: must not be empty"),
        ({"env_class": 3}, "env_class: expected a string"),
        ({"prompt": []}, "prompt: expected a non-empty list"),
        ({"prompt": [{"role": "assistant", "content": "x"}]}, "prompt\\[0\\].role"),
        (
            {"prompt": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]},
            "prompt: must be .*first user message only",
        ),
        ({"prompt": [{"role": "user", "content": 5}]}, "prompt\\[0\\].content: expected"),
        (
            {"reward_spec": {"method": "rule"}},
            "reward_spec: expected an object with 'ground_truth'",
        ),
        ({"extra_info": [1]}, "extra_info: expected an object"),
    ],
)
def test_bad_row_names_file_row_and_field(tmp_path, bad, message):
    path = tmp_path / "d.jsonl"
    _write_jsonl(path, [_row(key="a"), _row(key="b", **bad)])
    with pytest.raises(ValueError, match=f"d.jsonl:2: {message}"):
        load_dataset(path)


def test_invalid_json_and_missing_file(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(_row()) + "\n{oops\n")
    with pytest.raises(ValueError, match="d.jsonl:2: not valid JSON"):
        load_dataset(path)
    with pytest.raises(ValueError, match="does not exist"):
        load_dataset(tmp_path / "nope.jsonl")


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        # json.dumps writes NaN and Infinity literals, which json.loads reads back
        ({"reward_spec": {"ground_truth": math.nan}}, r"reward_spec.ground_truth: nan is not a"),
        ({"extra_info": {"seed": math.inf}}, r"extra_info.seed: inf is not a finite number"),
        ({"extra_info": {"id": [1, 2**70]}}, r"extra_info.id\[1\]: integer \d+ does not fit"),
        (
            {"prompt": [{"role": "user", "content": "q", "name": 3}]},
            r"prompt\[0\].name: expected a string, got 3",
        ),
        ({"data_source": None}, "data_source: expected a string, got None"),
        ({"reward_spec": "42"}, "reward_spec: expected an object with 'ground_truth'"),
    ],
)
def test_every_field_is_checked(tmp_path, bad, message):
    path = tmp_path / "d.jsonl"
    _write_jsonl(path, [_row(key="a"), _row(key="b", **bad)])
    with pytest.raises(ValueError, match=f"d.jsonl:2: {message}"):
        load_dataset(path)


def test_a_line_that_is_not_an_object_or_not_utf8_names_the_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(_row()) + "\n\n" + '["a", "list"]\n')
    with pytest.raises(ValueError, match="d.jsonl:3: row: expected an object, got list"):
        load_dataset(path)
    path.write_bytes(json.dumps(_row()).encode() + b"\n" + b'{"data_source": "\xff"}\n')
    with pytest.raises(ValueError, match="d.jsonl:2: not UTF-8 text"):
        load_dataset(path)


def test_an_empty_dataset_is_refused(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("\n")
    with pytest.raises(ValueError, match="d.jsonl holds no rows"):
        load_dataset(path)


def test_parquet_rows_are_checked_like_jsonl_rows(tmp_path):
    pyarrow = pytest.importorskip("pyarrow")
    parquet = pytest.importorskip("pyarrow.parquet")

    path = tmp_path / "d.parquet"
    write_dataset([_row(key="a"), _row(key="b", env_class="")], path)
    with pytest.raises(ValueError, match="d.parquet:row 2: env_class: must not be empty"):
        load_dataset(path)
    # Parquet holds what JSON cannot: a timestamp in extra_info would break the actors later.
    rows = [_row(key="a"), _row(key="b")]
    for row in rows:
        row["extra_info"]["when"] = datetime.datetime(2026, 1, 1)
    parquet.write_table(pyarrow.Table.from_pylist(rows), path)
    with pytest.raises(ValueError, match="d.parquet:row 1: extra_info.when: expected JSON data"):
        load_dataset(path)
    path.write_bytes(b"PAR1 but not really")
    with pytest.raises(ValueError, match="d.parquet: not a readable Parquet file"):
        load_dataset(path)


def test_parquet_round_trip(tmp_path):
    pytest.importorskip("pyarrow")
    rows = [_row(key=f"k{i}") for i in range(3)]
    write_dataset(rows, tmp_path / "d.parquet")
    assert load_dataset(tmp_path / "d.parquet") == rows


def test_task_key_falls_back_to_a_prompt_hash():
    assert task_key(_row(key="abc")) == "abc"
    no_key = task_key(_row(key=None))
    assert no_key.startswith("prompt-") and no_key == task_key(_row(key=None))


def test_hash_fraction_matches_the_md5_rule():
    # md5("calculator-add-12-30")[:8] as an integer / 2^32, computed independently
    import hashlib

    expected = int(hashlib.md5(b"calculator-add-12-30").hexdigest()[:8], 16) / 2**32
    assert hash_fraction("calculator-add-12-30") == expected


def test_split_rules():
    """big: 1000 rows, 10% -> about 100 eval, by hash; small: 20 rows expect 2 < 5 eval ->
    all train; held: all eval."""
    rows = (
        [_row("big", key=f"big-{i}") for i in range(1000)]
        + [_row("small", key=f"small-{i}") for i in range(20)]
        + [_row("held", key=f"held-{i}") for i in range(7)]
    )
    train, eval_ = split_rows(rows, eval_fraction=0.1, min_eval_per_env=5, held_out_envs=["held"])
    big_eval = [r for r in eval_ if r["env_class"] == "big"]
    assert 70 <= len(big_eval) <= 130
    assert all(hash_fraction(r["extra_info"]["task_key"]) < 0.1 for r in big_eval)
    assert sum(r["env_class"] == "small" for r in train) == 20
    assert sum(r["env_class"] == "held" for r in eval_) == 7
    assert len(train) + len(eval_) == len(rows)


def test_split_is_stable_when_the_dataset_grows():
    rows = [_row("big", key=f"big-{i}") for i in range(500)]
    _, eval_small = split_rows(rows, eval_fraction=0.2)
    _, eval_big = split_rows(
        rows + [_row("big", key=f"new-{i}") for i in range(500)], eval_fraction=0.2
    )
    keys = {r["extra_info"]["task_key"] for r in eval_big}
    assert all(r["extra_info"]["task_key"] in keys for r in eval_small)


def test_prepare_command(tmp_path, capsys):
    source = tmp_path / "all.jsonl"
    _write_jsonl(source, [_row("big", key=f"b{i}") for i in range(200)] + [_row("held", key="h")])
    parser = argparse.ArgumentParser()
    add_prepare_arguments(parser)
    args = parser.parse_args(
        [
            str(source),
            "--output-dir",
            str(tmp_path / "out"),
            "--eval-fraction",
            "0.1",
            "--held-out",
            "held",
        ]
    )
    assert run_prepare(args) == 0
    train = load_dataset(tmp_path / "out" / "train.jsonl")
    eval_ = load_dataset(tmp_path / "out" / "eval.jsonl")
    assert len(train) + len(eval_) == 201 and any(r["env_class"] == "held" for r in eval_)
    printed = capsys.readouterr().out
    assert "held" in printed and f"{len(train):>8}{len(eval_):>8}" in printed
