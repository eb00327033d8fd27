"""Fixtures for the env server tests: one real server on loopback for the whole session,
hosting the built-ins plus two test-only environments (`faulty`, `slow`), and a client."""

from __future__ import annotations

import os

import pytest
import pytest_asyncio

from envservers.config import EnvServerConfig
from envservers.registry import build_providers
from envservers.server import EnvServer
from protos.client import EnvClient
from tests.envservers.fakes import FaultyProvider, SlowProvider, UnmakeableProvider


def calculator_task(question: str = "What is 17 + 25?", truth: str = "42", **spec) -> dict:
    return {
        "data_source": "calculator",
        "env_class": "calculator",
        "prompt": [
            {"role": "system", "content": "You are a calculator agent."},
            {"role": "user", "content": question},
        ],
        "reward_spec": {"method": "rule", "ground_truth": truth, **spec},
        "extra_info": {"task_key": "t1"},
    }


def sandbox_uids() -> range:
    """The sandbox uids of this pytest process's env servers: a block per xdist worker, so
    that one worker's runs never count in another's process limit (RLIMIT_NPROC is per uid)
    nor in its checks that nothing of a run is left."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    base = 200_000 + 10_000 * (int(worker) if worker.isdigit() else 0)
    return range(base, base + 1000)


def _python(**settings) -> dict:
    uids = sandbox_uids()
    return {"timeout_s": 3, "cpu_s": 2, "uid_base": uids.start, "uid_pool": len(uids), **settings}


def server_config(**overrides) -> EnvServerConfig:
    values = dict(
        port=0,
        envs=["calculator", "noop", "sql", "python"],
        metrics_port=0,
        session_idle_ttl_s=600,
        max_action_chars=100_000,
        max_message_bytes=1024 * 1024,
        drain_s=0,
        python=_python(),
        sql={"query_timeout_s": 0.5},
    )
    values.update(overrides)
    return EnvServerConfig(**values)


@pytest_asyncio.fixture(scope="session")
async def env_server(tmp_path_factory):
    config = server_config(python=_python(scratch_root=str(tmp_path_factory.mktemp("sandbox"))))
    providers = build_providers(config)
    providers["faulty"] = FaultyProvider()
    providers["slow"] = SlowProvider()
    providers["unmakeable"] = UnmakeableProvider()
    async with EnvServer(config, providers) as server:
        yield server


@pytest_asyncio.fixture(scope="session")
async def client(env_server):
    async with EnvClient(env_server.address, timeout_s=20, max_retries=2, backoff_s=0.05) as c:
        yield c


@pytest.fixture
def calc_task():
    return calculator_task
