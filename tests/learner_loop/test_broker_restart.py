"""The real learner and scripted actors through a nats-server that is SIGKILLed mid-run and
restarted on the same port and file store (as the launcher's supervisor does): streams,
consumers and the KV come back, every client reconnects, and nothing accepted is lost."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from broker import client
from broker.names import BusNames
from broker.server import NatsServer
from deploy.run_ledger import RunLedger
from tests.learner_loop.conftest import running
from tests.learner_loop.scripted_actor import ScriptedActor
from tests.learner_loop.test_learner_process import _assert_every_trajectory_accounted_for

TIMEOUT_S = 200


@pytest.fixture
def own_nats(tmp_path):
    """A nats-server of this test alone (it gets killed), and how to bring it back."""
    server = NatsServer(tmp_path / "nats", max_file_store="20GB").start()

    def restart() -> NatsServer:
        again = NatsServer(
            server.store_dir,
            port=server.port,
            monitor_port=server.monitor_port,
            max_file_store="20GB",
            log_file=tmp_path / "nats-again.log",
        )
        return again.start()

    servers = [server]
    yield server, lambda: servers.append(restart()) or servers[-1]
    for s in servers:
        s.stop()


async def _version(url: str, names: BusNames) -> int:
    nc = await client.connect(url, name="probe", connect_timeout_s=2)
    try:
        announced = await client.PolicyStore(nc.jetstream(), names).get()
        return -1 if announced is None else announced.version
    finally:
        await nc.close()


async def test_broker_killed_and_restarted_mid_run_loses_nothing(
    learner_run, own_nats, monkeypatch
):
    server, restart = own_nats
    names = BusNames(namespace="restart")
    run = learner_run(total_steps=6, max_staleness=1, eval_interval=3)
    run.overrides = [
        o for o in run.overrides if not o.startswith(("broker.url", "broker.namespace"))
    ]
    run.overrides += [f"broker.url={server.url}", f"broker.namespace={names.namespace}"]
    actors = [
        ScriptedActor(server.url, names, actor_id="a", delay_s=0.05, seed=1),
        ScriptedActor(server.url, names, actor_id="b", delay_s=0.2, seed=2),
    ]
    nc = await client.connect(server.url, name="test")
    await client.ensure_streams(nc.jetstream(), names)
    await nc.close()
    async with running(actors):
        await run.start()
        while await _version(server.url, names) < 2:
            assert run.process.returncode is None, run.log_tail()
            await asyncio.sleep(0.1)
        os.kill(server.process.pid, signal.SIGKILL)
        server.process.wait()
        killed_at = time.monotonic()
        await asyncio.sleep(1.0)
        restart()
        code = await run.wait(TIMEOUT_S)
        finished_in = time.monotonic() - killed_at
    assert code == 0, run.log_tail()
    _assert_every_trajectory_accounted_for(run, actors)
    assert RunLedger.read(run.run_dir).problems() == []
    assert [r["version"] for r in run.records("train")] == list(range(1, 7))
    assert sorted(r["version"] for r in run.records("eval")) == [0, 3, 6]
    print(f"finished {finished_in:.1f}s after the broker was killed")
