"""The long-episode chain task (demo/chain.py): its rows, what its demonstrations teach, and
that its tool calls add up through the real calculator env."""

from __future__ import annotations

import asyncio
import json
import random
import re

import pytest

from common.rows import validate_row
from demo.chain import (
    DEFAULT_RECIPE,
    ChainRecipe,
    demonstration,
    main,
    make_rows,
    recipe_hash,
    sample_terms,
)
from envservers.envs.calculator import CalculatorProvider


def test_rows_ask_for_the_sum_and_never_share_a_question_across_splits():
    train = make_rows(200, DEFAULT_RECIPE, seed=0, split="train")
    evals = make_rows(50, DEFAULT_RECIPE, seed=0, split="eval")
    for row in train + evals:
        validate_row(row, where="chain row")
        terms = row["extra_info"]["terms"]
        assert len(terms) == 4 and all(10 <= t <= DEFAULT_RECIPE.max_operand for t in terms)
        assert row["prompt"][-1]["content"] == "What is " + " + ".join(map(str, terms)) + "?"
        assert row["reward_spec"]["ground_truth"] == str(sum(terms))
    keys = lambda rows: {r["extra_info"]["task_key"] for r in rows}  # noqa: E731
    assert len(keys(train)) == 200 and not keys(train) & keys(evals)
    assert make_rows(5, DEFAULT_RECIPE, seed=0, split="eval") == evals[:5]  # seeded


def test_a_chain_adds_each_operand_to_the_last_result_then_answers():
    terms = [908, 669, 24, 271]
    messages = demonstration(terms, chain=True, rng=random.Random(0))
    calls = [
        json.loads(re.search(r"\{.*\}", m["content"], re.S).group(0))["arguments"]
        for m in messages
        if m["role"] == "assistant" and "<tool_call>" in m["content"]
    ]
    assert calls == [{"a": 908, "b": 669}, {"a": 1577, "b": 24}, {"a": 1601, "b": 271}]
    assert [m["content"] for m in messages if m["role"] == "tool"] == ["1577", "1601", "1872"]
    assert messages[-1] == {"role": "assistant", "content": "<answer>1872</answer>"}
    guess = demonstration(terms, chain=False, rng=random.Random(0))
    assert len(guess) == 3 and guess[-1]["content"] != "<answer>1872</answer>"


def test_the_env_scores_a_played_chain_as_its_demonstration_says():
    """The real calculator env: the demonstration's calls return its tool contents, and
    its answer earns the reward."""
    (row,) = make_rows(1, ChainRecipe(terms=3), seed=1, split="train")
    messages = demonstration(row["extra_info"]["terms"], chain=True, rng=random.Random(0))
    env = CalculatorProvider().make()

    async def play():
        await env.reset(row)
        replies = [m for m in messages if m["role"] == "assistant"]
        outputs = [await env.step(reply["content"]) for reply in replies]
        return outputs

    outputs = asyncio.run(play())
    tools = [m["content"] for m in messages if m["role"] == "tool"]
    assert [o.observations[0]["content"] for o in outputs[:-1]] == tools
    assert not any(o.done for o in outputs[:-1])
    assert outputs[-1].done and outputs[-1].reward == 1.0


def test_the_cache_entry_follows_the_recipe():
    assert recipe_hash(DEFAULT_RECIPE) == recipe_hash(ChainRecipe())
    assert recipe_hash(ChainRecipe(terms=3)) != recipe_hash(DEFAULT_RECIPE)
    with pytest.raises(ValueError):
        ChainRecipe(terms=1)
    assert all(len(t) == 3 for t in sample_terms(4, ChainRecipe(terms=3), seed=0, split="train"))


def test_the_cli_refuses_a_chain_of_one(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), "--terms", "1"])
    assert "--terms 1: Input should be greater than or equal to 2" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing written, nothing built


def test_a_guess_is_wrong_even_when_every_operand_is_the_smallest():
    guess = demonstration([10, 10, 10, 10], chain=False, rng=random.Random(0))
    assert guess[-1]["content"] != "<answer>40</answer>"
