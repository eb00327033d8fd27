"""The warm start for any task's rows (demo/warmstart.py): solved conversations, the row split,
the teacher-forced scores against hand-computed values, and a two-step run that keeps the
tokenizer byte for byte."""

import math
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoTokenizer

from demo.sft import encode_conversation
from demo.tinymodel import shipped_model_dir
from demo.warmstart import (
    BUILD_INFO,
    TOKENIZER_FILES,
    WarmStartRecipe,
    answer_scores,
    solved_conversation,
    split_rows,
    warm_start,
)


def _row(*, question="What is 3 + 4?", truth="7", key="k"):
    return {
        "data_source": "test",
        "env_class": "reasoning_gym:chain_sum",
        "prompt": [
            {"role": "system", "content": "Answer as <answer>X</answer>."},
            {"role": "user", "content": question},
        ],
        "reward_spec": {"ground_truth": truth},
        "extra_info": {"task_key": key},
    }


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(shipped_model_dir())


def test_a_solved_conversation_is_the_prompt_and_the_tagged_answer():
    row = _row(truth="-4")
    assert solved_conversation(row) == [
        *row["prompt"],
        {"role": "assistant", "content": "<answer>-4</answer>"},
    ]
    with pytest.raises(ValueError, match="ground_truth"):
        solved_conversation(_row(truth=""))


def test_the_loss_mask_covers_only_the_answer_and_its_end(tokenizer):
    ids, mask = encode_conversation(tokenizer, solved_conversation(_row(truth="12")))
    generated = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    assert generated == "<answer>12</answer><|im_end|>"
    last = max(i for i, m in enumerate(mask) if m)
    assert mask[: last + 1] == sorted(mask[: last + 1])  # one span; after it only the "\n"
    assert tokenizer.decode(ids[last + 1 :]) == "\n"


def test_split_holds_out_check_rows_and_takes_a_fraction_of_the_rest():
    rows = [_row(key=str(i)) for i in range(41)]
    train, check = split_rows(rows, fraction=0.25, num_check=9, seed=3)
    assert len(check) == 9 and len(train) == 8  # 0.25 of the 32 left
    keys = lambda rs: {r["extra_info"]["task_key"] for r in rs}  # noqa: E731
    assert not keys(train) & keys(check)
    assert split_rows(rows, fraction=0.25, num_check=9, seed=3) == (train, check)
    with pytest.raises(ValueError, match="check rows"):
        split_rows(rows[:9], fraction=1.0, num_check=9, seed=0)


def test_scores_of_a_uniform_model_are_one_over_vocab_per_token(tokenizer):
    """A model whose logits are all zero gives each token 1/V: expected pass@1 of an example
    with k generated tokens is V^-k; greedy picks token 0, never the answer."""
    vocab = 10
    examples = [([5, 6, 7, 8], [0, 0, 1, 1]), ([5, 6, 7], [0, 1, 1])]

    def uniform(input_ids, attention_mask):
        return SimpleNamespace(logits=torch.zeros((*input_ids.shape, vocab)))

    expected, greedy = answer_scores(uniform, examples, pad_id=0)
    assert math.isclose(expected, (vocab**-2 + vocab**-2) / 2, rel_tol=1e-5)
    assert greedy == 0.0


def test_scores_of_a_model_that_knows_the_answer_are_one():
    examples = [([1, 2, 3], [0, 1, 1])]

    def oracle(input_ids, attention_mask):  # predicts token t+1 after token t, surely
        return SimpleNamespace(logits=100.0 * torch.nn.functional.one_hot(input_ids + 1, 8))

    expected, greedy = answer_scores(oracle, examples, pad_id=0)
    assert expected == pytest.approx(1.0) and greedy == 1.0


def test_two_steps_write_a_model_with_the_tokenizer_unchanged(tmp_path, tiny_model_dir):
    rows = [_row(question=f"What is {i} + 1?", truth=str(i + 1), key=str(i)) for i in range(12)]
    recipe = WarmStartRecipe(init=str(tiny_model_dir), max_steps=2, stop_at=None,
                             num_check_rows=4, batch_size=4, check_every=1)  # fmt: skip
    info = warm_start(rows, tmp_path / "out", recipe, snapshot_every=1, log=lambda _: None)
    assert info["steps"] == 2 and [c["step"] for c in info["checks"]] == [0, 1, 2]
    for name in TOKENIZER_FILES:
        if (tiny_model_dir / name).is_file():
            assert (tmp_path / "out" / name).read_bytes() == (tiny_model_dir / name).read_bytes()
    assert (tmp_path / "out" / "model.safetensors").is_file()
    assert (tmp_path / "out" / "generation_config.json").is_file()
    assert (tmp_path / "out" / BUILD_INFO).is_file()
    assert sorted(p.name for p in (tmp_path / "out" / "steps").iterdir()) == ["1", "2"]
