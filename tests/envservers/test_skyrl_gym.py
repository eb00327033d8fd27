"""skyrl-gym environments (PyPI `skyrl-gym`) behind our server, by name: its `gsm8k` env
scores our client's answers exactly as SkyRL would."""

import grpc
import pytest
import pytest_asyncio

from envservers.config import EnvServerConfig
from envservers.registry import build_providers
from envservers.server import EnvServer
from protos.client import EnvClient
from tests.envservers.conftest import server_config


@pytest_asyncio.fixture(scope="module")
async def gym_client():
    config = server_config(
        envs=["skyrl_gym:gsm8k", "skyrl_gym:gsm8k_multi_turn"], metrics_port=None
    )
    async with EnvServer(config) as server, EnvClient(server.address) as client:
        yield client


def _row(env_class="gsm8k", truth="72"):
    return {
        "data_source": "openai/gsm8k",
        "env_class": env_class,
        "prompt": [
            {
                "role": "user",
                "content": "Natalia sold clips to 48 of her friends in "
                "April, and then half as many in May. How many clips altogether? "
                'Let\'s think step by step and output the final answer after "####".',
            }
        ],
        "reward_spec": {"method": "rule", "ground_truth": truth},
        "extra_info": {"split": "train", "index": 0},
    }


@pytest.mark.parametrize(
    "answer, reward", [("48 + 24 = 72\n#### 72", 1.0), ("#### 71", 0.0), ("72", 0.0)]
)
async def test_gsm8k_through_our_server(gym_client, answer, reward):
    session = await gym_client.open("gsm8k", _row())
    assert session.observation.messages == _row()["prompt"]
    result = await session.step(answer)
    assert (result.reward, result.done, result.observations) == (reward, True, [])


async def test_gsm8k_multi_turn_gives_observations(gym_client):
    session = await gym_client.open("gsm8k_multi_turn", _row("gsm8k_multi_turn"))
    first = await session.step("I am not sure yet")
    assert not first.done and first.observations[0]["role"] == "user"
    assert "####" in first.observations[0]["content"]
    last = await session.step("#### 72")
    assert (last.reward, last.done) == (1.0, True)


async def test_row_skyrl_gym_rejects_is_invalid_argument(gym_client):
    row = _row()
    del row["reward_spec"]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await gym_client.open("gsm8k", row)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "ground_truth" in info.value.details()


def test_every_registered_env_can_be_hosted_and_unknown_names_are_refused():
    providers = build_providers(EnvServerConfig(envs=["skyrl_gym:*"]))
    assert {"gsm8k", "aime", "text2sql", "search"} <= set(providers)
    with pytest.raises(ValueError, match="not registered in skyrl-gym"):
        build_providers(EnvServerConfig(envs=["skyrl_gym:chess"]))
