"""Calculator demo rows: SkyRL format, deterministic per seed, train/eval disjoint."""

import json
import random

import pytest

from demo.data import (
    SYSTEM_PROMPT,
    demonstration,
    demonstrations,
    eval_rows,
    make_rows,
    read_jsonl,
    write_dataset,
)
from envservers.envs.calculator import CalculatorEnv


def test_row_format():
    row = make_rows(1, seed=0)[0]
    a, b = row["extra_info"]["a"], row["extra_info"]["b"]
    assert row == {
        "data_source": "calculator",
        "env_class": "calculator",
        "prompt": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"What is {a} + {b}?"},
        ],
        "reward_spec": {"method": "rule", "ground_truth": str(a + b)},
        "extra_info": {
            "task_key": f"calculator-add-{a}-{b}",
            "split": "train",
            "a": a,
            "b": b,
            "tools": ["add"],
        },
    }
    assert 10 <= a <= 999 and 10 <= b <= 999


def test_must_call_tool_flag():
    row = make_rows(1, seed=0, must_call_tool=True)[0]
    assert row["reward_spec"]["must_call_tool"] is True


def test_deterministic_per_seed_and_distinct():
    assert make_rows(50, seed=7) == make_rows(50, seed=7)
    assert make_rows(50, seed=7) != make_rows(50, seed=8)
    keys = [r["extra_info"]["task_key"] for r in make_rows(500, seed=7)]
    assert len(set(keys)) == 500


def test_train_and_eval_never_share_a_question():
    train = {r["extra_info"]["task_key"] for r in make_rows(3000, seed=0)}
    evals = {r["extra_info"]["task_key"] for r in eval_rows(200)}
    assert len(evals) == 200 and not train & evals
    assert eval_rows(200) == eval_rows(200)


def test_write_dataset(tmp_path):
    train_path, eval_path = write_dataset(tmp_path, num_train=30, num_eval=10, seed=1)
    assert read_jsonl(train_path) == make_rows(30, seed=1)
    assert read_jsonl(eval_path) == eval_rows(10)
    json.loads(train_path.read_text().splitlines()[0])  # one JSON object per line


async def test_demonstrations_score_as_intended():
    # Tool demos earn reward 1 in the calculator; guesses are always wrong.
    rng = random.Random(0)
    for use_tool, reward in ((True, 1.0), (False, 0.0)):
        messages = demonstration(123, 456, use_tool=use_tool, rng=rng)
        env = CalculatorEnv()  # the env server's calculator: the demonstrations play in it
        await env.reset(make_rows(1, seed=0)[0] | {"reward_spec": {"ground_truth": "579"}})
        for message in messages[2:]:
            if message["role"] == "assistant":
                step = await env.step(message["content"])
            else:
                assert step.observations == [message]
        assert step.done and step.reward == reward
        assert step.metadata["num_tool_calls"] == int(use_tool)


def test_demonstration_mix():
    demos = demonstrations(1000, seed=0, tool_fraction=0.5)
    num_tool = sum(len(d) == 5 for d in demos)
    assert 430 < num_tool < 570
    assert all(len(d) == 5 for d in demonstrations(20, seed=0, tool_fraction=1.0))
    with pytest.raises(ValueError):
        demonstrations(1, seed=0, tool_fraction=1.5)


async def test_rows_offer_exactly_the_tools_the_warm_start_saw():
    # The warm start is trained on DEMO_TOOLS; the real env must hand out the same text.
    from demo.data import DEMO_TOOLS, make_rows
    from envservers.envs.calculator import CalculatorEnv

    observation = await CalculatorEnv().reset(make_rows(1, seed=0)[0])
    assert observation.tools == DEMO_TOOLS
    assert [tool["function"]["name"] for tool in DEMO_TOOLS] == ["add"]
