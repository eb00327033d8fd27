"""Runs sharing one server (broker/runs.py, broker/gc.py): a real nats-server whose file
store holds two namespaces' trajectory streams (32 MiB each in 80 MiB), so the third
needs a done run's room."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys

import pytest

from broker import client, runs
from broker.names import BusNames
from broker.server import NatsServer
from broker.streams import StreamLimits
from broker.wire import PromptTask

LIMITS = StreamLimits(max_trajectory_bytes=32 * 1024**2)


@pytest.fixture
async def small_store(tmp_path):
    """(server, js) with an 80 MiB file store."""
    with NatsServer(tmp_path, max_file_store="80MB") as server:
        nc = await client.connect(server.url, name="test")
        try:
            yield server, nc.jetstream()
        finally:
            await nc.close()


async def _namespace(js, name: str, state: str | None) -> BusNames:
    names = BusNames(name)
    await client.ensure_streams(js, names, LIMITS)
    if state is not None:
        await runs.mark_run(js, names, f"{name}-run", state)
    return names


async def _listed(js) -> dict[str, runs.Namespace]:
    return {n.names.namespace: n for n in await runs.list_namespaces(js)}


async def test_a_full_store_reclaims_done_runs_and_then_says_who_holds_it(small_store):
    _, js = small_store
    await _namespace(js, "a", runs.DONE)
    await _namespace(js, "b", runs.RUNNING)
    listed = await _listed(js)
    assert (listed["a"].state, listed["a"].run_id, listed["a"].reclaimable) == (
        "done",
        "a-run",
        True,
    )
    assert listed["b"].reserved_bytes == 32 * 1024**2 and not listed["b"].reclaimable

    await _namespace(js, "c", None)  # no room: a (done) is deleted to make it
    assert set(await _listed(js)) == {"b", "c"}
    assert await runs.read_run(js, BusNames("a")) is None  # its bucket went too

    with pytest.raises(runs.StoreFull) as failure:
        await _namespace(js, "d", None)  # b runs, c is unmarked: nothing to reclaim
    message = str(failure.value)
    assert (
        "namespace d cannot create its streams (its trajectory stream reserves 32.0 MiB)" in message
    )
    assert "b (run b-run, running, 32.0 MiB reserved)" in message
    assert "c (no run, unmarked" in message
    assert "python -m broker gc --namespace NS" in message


async def test_a_done_namespace_an_actor_still_pulls_from_is_kept(small_store):
    _, js = small_store
    names = await _namespace(js, "a", runs.DONE)
    sub = await js.pull_subscribe_bind(durable=names.prompts.consumer, stream=names.prompts.stream)
    pulling = asyncio.create_task(sub.fetch(1, timeout=10))
    try:
        for _ in range(50):
            listed = await _listed(js)
            if listed["a"].num_waiting_pulls:
                break
            await asyncio.sleep(0.05)
        assert listed["a"].num_waiting_pulls == 1 and not listed["a"].reclaimable
        assert "1 actor pull(s) waiting" in listed["a"].describe()
        assert await runs.reclaim_done(js) == []
    finally:
        pulling.cancel()
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await pulling


async def test_a_fresh_run_empties_its_queues_and_a_resumed_one_keeps_them(small_store):
    _, js = small_store
    names = await _namespace(js, "a", runs.DONE)
    task = PromptTask(task_id="a-old-0", step=0, min_version=0, group_size=2, env_class="x",
                      data_source="", prompt=[], reward_spec={}, extra_info={})  # fmt: skip
    await client.publish_prompts(js, names, [task])
    await runs.begin_run(js, names, "a-resumed", fresh=False)
    assert (await js.stream_info(names.prompts.stream)).state.messages == 1
    assert (await runs.read_run(js, names))["state"] == runs.RUNNING
    await runs.begin_run(js, names, "a-new", fresh=True)
    assert (await js.stream_info(names.prompts.stream)).state.messages == 0
    assert (await runs.read_run(js, names))["run_id"] == "a-new"


def _gc(server, *args: str) -> str:
    command = [sys.executable, "-m", "broker", "gc", "--url", server.url, *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_gc_lists_every_namespace_and_deletes_the_done_ones_or_those_named(small_store):
    server, js = small_store
    await _namespace(js, "a", runs.DONE)
    await _namespace(js, "b", None)
    listing = await asyncio.to_thread(_gc, server, "--dry-run")
    assert "would delete 1 namespace(s), 32.0 MiB of reservations" in listing
    row_a = next(line for line in listing.splitlines() if line.startswith("a "))
    assert "a-run" in row_a and "done" in row_a and row_a.endswith("would delete")
    assert set(await _listed(js)) == {"a", "b"}

    output = await asyncio.to_thread(_gc, server)
    assert "deleted 1 namespace(s)" in output
    assert set(await _listed(js)) == {"b"}
    output = await asyncio.to_thread(_gc, server, "--namespace", "b")
    assert "deleted 1 namespace(s)" in output and "0.0 MiB still reserved" in output
    assert await _listed(js) == {}


def test_gc_refuses_a_namespace_that_cannot_be_one():
    command = [sys.executable, "-m", "broker", "gc", "--namespace", "a.b"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "bus namespace 'a.b'" in done.stderr
