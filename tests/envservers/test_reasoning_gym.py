"""reasoning-gym tasks behind our server (envservers/adapters/reasoning_gym.py): rows made by
`learner prepare --from reasoning_gym:TASK` are scored by the task's own score_answer, through
a real server and client. Real reasoning-gym, no mocks."""

import json

import grpc
import pytest
import pytest_asyncio
import reasoning_gym

from common.plugins import PluginError
from common.reasoning_gym_tasks import make_rows
from envservers.adapters.reasoning_gym import score
from envservers.config import EnvServerConfig
from envservers.envs.scored import RETRY_MESSAGE
from envservers.registry import build_providers
from envservers.server import EnvServer
from protos.client import EnvClient
from tests.envservers.conftest import server_config

SEED, SIZE = 1, 6


@pytest_asyncio.fixture(scope="module")
async def gym_client():
    config = server_config(
        envs=[
            "reasoning_gym:chain_sum",
            "reasoning_gym:basic_arithmetic",
            "retrying=reasoning_gym:leg_counting",  # served under its alias, with retries
        ],
        plugins={"retrying": {"retries": 1}},
        metrics_port=None,
    )
    async with EnvServer(config) as server, EnvClient(server.address) as client:
        yield client


def _rows(task: str = "chain_sum") -> list[dict]:
    return make_rows(task, size=SIZE, seed=SEED)


def _own_score(task: str, answer: str | None, index: int) -> float:
    """What reasoning-gym itself gives `answer` for entry `index` of the rows' dataset."""
    dataset = reasoning_gym.create_dataset(task, seed=SEED, size=SIZE)
    return dataset.score_answer(answer, dataset[index])


@pytest.mark.parametrize("task", ["chain_sum", "basic_arithmetic"])
async def test_right_answer_scores_what_the_task_gives(gym_client, task):
    row = _rows(task)[2]
    truth = row["reward_spec"]["ground_truth"]
    session = await gym_client.open(f"reasoning_gym:{task}", row)
    assert session.observation.messages == row["prompt"] and session.observation.tools == []
    result = await session.step(f"Adding up step by step.\n<answer>{truth}</answer>")
    assert (result.reward, result.done) == (_own_score(task, truth, 2), True) == (1.0, True)


@pytest.mark.parametrize(
    ("completion", "answer"),
    [
        ("<answer>-99999</answer>", "-99999"),
        ("<answer>{truth} apples</answer>", "{truth} apples"),  # partial credit, reasoning-gym's
        ("<answer>1</answer> no, <answer>{truth}0</answer>", "{truth}0"),  # the last one counts
        ("{truth}", None),  # no tags: no answer
    ],
)
async def test_other_answers_score_what_the_task_gives(gym_client, completion, answer):
    row = _rows()[2]
    truth = row["reward_spec"]["ground_truth"]
    session = await gym_client.open("reasoning_gym:chain_sum", row)
    result = await session.step(completion.format(truth=truth))
    expected = _own_score("chain_sum", answer and answer.format(truth=truth), 2)
    assert (result.reward, result.done) == (expected, True)
    assert expected < 1.0


async def test_retries_give_a_second_turn(gym_client):
    row = {**_rows("leg_counting")[0], "env_class": "retrying"}
    session = await gym_client.open("retrying", row)
    first = await session.step("<answer>-99999</answer>")
    assert (first.reward, first.done) == (0.0, False)
    assert first.observations == [{"role": "user", "content": RETRY_MESSAGE}]
    last = await session.step(f"<answer>{row['reward_spec']['ground_truth']}</answer>")
    assert (last.reward, last.done) == (1.0, True)


def _without_recipe(row):
    return {**row, "extra_info": {"task_key": "k"}}


def _other_digest(row):
    recipe = {**row["extra_info"]["reasoning_gym"], "digest": "0" * 16}
    return {**row, "extra_info": {**row["extra_info"], "reasoning_gym": recipe}}


@pytest.mark.parametrize(
    ("env", "broken", "message"),
    [
        ("chain_sum", _without_recipe, "extra_info.reasoning_gym: missing"),
        ("basic_arithmetic", lambda row: row, "extra_info.reasoning_gym.task: 'chain_sum'"),
        ("chain_sum", _other_digest, "regenerates differently"),
    ],
)
async def test_a_row_without_its_entry_is_refused_at_reset(gym_client, env, broken, message):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await gym_client.open(f"reasoning_gym:{env}", broken(_rows()[1]))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in info.value.details()


def test_entries_that_json_cannot_carry_are_regenerated_exactly():
    """rearc keeps grids as tuples and compares with ==: scoring from a JSON copy of the
    entry would give a right answer 0.05; regenerated from the recipe it gets 1.0."""
    (row,) = make_rows("rearc", size=1, seed=SEED)
    dataset = reasoning_gym.create_dataset("rearc", seed=SEED, size=1)
    json_copy = json.loads(json.dumps(dataset[0]))
    assert dataset.score_answer(dataset[0]["answer"], json_copy) < 1.0
    assert score("rearc", f"<answer>{row['reward_spec']['ground_truth']}</answer>", row) == 1.0


def test_a_scorer_raising_on_malformed_output_scores_zero():
    (row,) = make_rows("prime_factorization", size=1, seed=SEED)
    dataset = reasoning_gym.create_dataset("prime_factorization", seed=SEED, size=1)
    with pytest.raises(ValueError):  # reasoning-gym's own scorer, on this answer
        dataset.score_answer("A B", dataset[0])
    assert score("prime_factorization", "<answer>A B</answer>", row) == 0.0


@pytest.mark.parametrize(
    ("envs", "plugins", "message"),
    [
        (["reasoning_gym:chain_summ"], {}, "no task 'chain_summ'.*chain_sum"),
        (["reasoning_gym:chain_sum"], {"reasoning_gym:chain_sum": {"tries": 2}}, "'tries'"),
        (["reasoning_gym:chain_sum"], {"reasoning_gym:chain_sum": {"retries": -1}}, "retries"),
    ],
)
def test_bad_entries_stop_the_server_at_start_up(envs, plugins, message):
    with pytest.raises(PluginError, match=message):
        build_providers(EnvServerConfig(envs=envs, plugins=plugins))
