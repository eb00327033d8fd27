"""The real `learner` CLI with a bucket (moto's S3 server on loopback): it uploads
checkpoints, snapshots and eval dumps while it trains, and a learner on a fresh machine
(SIGKILLed, its checkpoint directory wiped) resumes from the bucket's newest complete
checkpoint without a gap, a repeat or a loss."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal

from common.s3 import ObjectStore
from tests.learner_loop.conftest import bus, running
from tests.learner_loop.scripted_actor import resumable_pair
from tests.learner_loop.test_learner_process import (
    TIMEOUT_S,
    _assert_every_trajectory_accounted_for,
    _assert_trained_within_bound,
)
from tests.s3_server import overrides


async def _until_in_bucket(store, layout, step: int, run) -> None:
    while step not in (await asyncio.to_thread(store.artifacts, layout, "checkpoint"))[0]:
        assert run.process.returncode is None, run.log_tail()
        await asyncio.sleep(0.2)


async def _until_evals_in_bucket(store, layout, versions: tuple[int, ...], run) -> None:
    """Until the eval dumps of `versions` are uploaded: an eval still in flight when the
    learner is killed is not run again by its successor (learner/evals.py), so the test
    kills only once the evals due before the kill are done."""
    wanted = {layout.eval_key(version, "aggregated_results.jsonl") for version in versions}
    while not wanted <= set(await asyncio.to_thread(store.listing, f"{layout.prefix}/evals/")):
        assert run.process.returncode is None, run.log_tail()
        await asyncio.sleep(0.2)


async def test_a_fresh_machine_resumes_from_the_bucket(
    learner_run, nats_server, bus_names, s3_storage
):
    storage = s3_storage()
    store, layout = ObjectStore(storage), storage.layout(bus_names.namespace)
    run = learner_run(total_steps=8, max_staleness=1, eval_interval=3, snapshot_interval=2)
    run.overrides += overrides(storage)
    actors = resumable_pair(nats_server.url, bus_names)
    async with bus(nats_server.url, bus_names) as (js, versions), running(actors):
        await run.start()
        while not versions.versions or versions.versions[-1] < 5:
            assert run.process.returncode is None, run.log_tail()
            await asyncio.sleep(0.05)
        await _until_in_bucket(store, layout, 4, run)  # checkpoints every 2 versions
        await _until_evals_in_bucket(store, layout, (0, 3), run)
        os.kill(run.process.pid, signal.SIGKILL)
        assert await run.wait(30) == -signal.SIGKILL
        # 4, or 6 if the learner got that far while the evals finished.
        resumed = (await asyncio.to_thread(store.artifacts, layout, "checkpoint"))[0][-1]
        shutil.rmtree(run.run_dir / "checkpoints")  # the new machine has none of it
        num_announced = len(versions.versions)
        await run.start()
        code = await run.wait(TIMEOUT_S)
    assert code == 0, run.log_tail()
    assert f"downloaded checkpoint {resumed} from s3://" in run.log_tail(200_000)

    # The KV went back to the bucket's checkpoint and counted on from there.
    assert versions.versions[num_announced:] == list(range(resumed, 9))
    trained_lines, _ = _assert_every_trajectory_accounted_for(run, actors)
    assert [line["step"] for line in trained_lines] == list(range(8))
    _assert_trained_within_bound(trained_lines, actors, max_staleness=1)

    # What the bucket holds at the end: the checkpoints, the newest snapshot announced by
    # URL, the eval dumps in the layout of learner/eval_dump.py.
    complete, incomplete = store.artifacts(layout, "checkpoint")
    assert complete[-1] == 8 and incomplete == []
    snapshots, _ = store.artifacts(layout, "snapshot")
    assert snapshots[-1] == 8
    announced = versions.announced[-1]  # the newest upload verified when it was announced
    assert announced.snapshot_version in snapshots
    assert announced.snapshot_path == layout.url(
        layout.directory("snapshot", announced.snapshot_version)
    )
    evals = store.listing(f"{layout.prefix}/evals/")
    for version in (0, 3, 6, 8):
        for name in ("calculator.jsonl", "aggregated_results.jsonl"):
            assert layout.eval_key(version, name) in evals, (version, name)
    assert layout.dispatcher_key in store.listing(layout.dispatcher_key)
