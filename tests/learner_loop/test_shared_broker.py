"""Runs that share one long-lived broker, as people run them by hand: one real
`python -m broker serve`, then six runs one after another, each the real `learner` CLI fed
by a scripted actor, each with fresh run directories; three in the default namespace, three
in new ones.

Before run ids, the second run in a namespace hung at v0 (its task ids repeated the first
run's, and the duplicate window dropped them), and new namespaces filled the store (each
reserves its trajectory stream's max_bytes). The store here holds two namespaces (80 MiB,
32 MiB each), so the later new namespaces fit only if done runs are reclaimed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from broker import client, runs
from broker.names import BusNames
from common.procs import free_port
from tests.learner_loop.conftest import REPO, LearnerRun
from tests.learner_loop.scripted_actor import ScriptedActor

pytestmark = pytest.mark.slow

NAMESPACES = ["learner_test", "learner_test", "shared-1", "learner_test", "shared-2", "shared-3"]
TRAJECTORY_BYTES = 32 * 1024**2
MAX_FILE_STORE = "80MB"  # nats-server reads it as 80 MiB: two namespaces, not three
FIRST_PROMPTS_BOUND_S = 10.0
"""Longest wait for the first step's groups: seconds at worst on a loaded 2-core machine;
the runs that collided waited for ever."""
TOTAL_STEPS = 3


@pytest.fixture(scope="module")
def served_broker(tmp_path_factory):
    """(client URL, monitoring URL) of `python -m broker serve` in its own process."""
    store = tmp_path_factory.mktemp("served")
    command = [sys.executable, "-m", "broker", "serve", "--port", str(free_port())]
    command += ["--store-dir", str(store), "--max-file-store", MAX_FILE_STORE]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        found = re.search(r"ready at (\S+) .* monitoring (http://\S+)\)", line)
        assert found, line
        yield found.group(1), found.group(2)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(autouse=True)
def _stacks_on_abort(monkeypatch):
    """A learner that hangs is sent SIGABRT (`_finish`): its threads' stacks go to its log."""
    monkeypatch.setenv("PYTHONFAULTHANDLER", "1")


async def _finish(run: LearnerRun, timeout_s: float) -> None:
    """Wait for the learner to exit 0; one that hangs dumps its stacks (SIGABRT) first."""
    exited = asyncio.ensure_future(run.process.wait())
    done, _ = await asyncio.wait({exited}, timeout=timeout_s)
    if not done:
        run.process.send_signal(signal.SIGABRT)
    code = await run.wait(30)
    assert code == 0, f"learner exited with {code} (timeout {timeout_s}s):\n{run.log_tail(12000)}"


def _jsz(monitor_url: str) -> dict:
    with urllib.request.urlopen(f"{monitor_url}/jsz", timeout=5) as response:
        return json.loads(response.read())


def _learner(url: str, namespace: str, run_dir, *, model, data) -> LearnerRun:
    train, eval_ = data
    port = free_port()
    overrides = [
        f"broker.url={url}",
        f"broker.namespace={namespace}",
        f"broker.max_trajectory_bytes={TRAJECTORY_BYTES}",
        f"learner.model_path={model}",
        f"learner.train_data={train}",
        f"learner.eval_data={eval_}",
        f"learner.run_dir={run_dir}",
        f"learner.checkpoint.dir={run_dir / 'checkpoints'}",
        f"learner.metrics_port={port}",
        f"learner.total_steps={TOTAL_STEPS}",
        f"learner.eval_interval={TOTAL_STEPS}",  # evals at v0 and at the end
        "learner.checkpoint.interval=100",  # the final checkpoint only
    ]
    return LearnerRun(run_dir, overrides, port, run_dir.parent / f"{run_dir.name}-{port}.log")


async def _wait_until_running(js, names: BusNames, run: LearnerRun, previous: str | None) -> str:
    """The run id of the learner once it has marked its namespace (its streams exist)."""
    while True:
        assert run.process.returncode is None, run.log_tail()
        record = await runs.read_run(js, names)
        if record and record["state"] == runs.RUNNING and record["run_id"] != previous:
            return record["run_id"]
        await asyncio.sleep(0.05)


async def _one_run(url: str, js, run: LearnerRun, namespace: str, previous: str | None):
    """The learner first (as by hand), then an actor once the learner has made its
    namespace's streams, until the learner exits 0; returns (run id, the actor)."""
    names = BusNames(namespace)
    await run.start()
    try:
        run_id = await asyncio.wait_for(_wait_until_running(js, names, run, previous), 60)
    except BaseException:
        run.kill()
        raise
    actor = ScriptedActor(url, names, actor_id=run.run_dir.name, delay_s=0.01, seed=1)
    task = asyncio.create_task(actor.run())
    try:
        await _finish(run, 90)
    finally:
        actor.stop()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return run_id, actor


async def test_six_runs_one_after_another_on_one_served_broker(
    served_broker, tmp_path, tiny_model_dir, datasets
):
    url, monitor_url = served_broker
    nc = await client.connect(url, name="test")
    js = nc.jetstream()
    run_ids: list[str] = []
    previous: dict[str, str] = {}
    first_waits: list[float] = []
    started = time.monotonic()
    try:
        for i, namespace in enumerate(NAMESPACES):
            run = _learner(
                url, namespace, tmp_path / f"run{i}", model=tiny_model_dir, data=datasets
            )
            run_id, actor = await _one_run(url, js, run, namespace, previous.get(namespace))
            previous[namespace] = run_id
            run_ids.append(run_id)
            train = run.records("train")
            assert [r["step"] for r in train] == list(range(TOTAL_STEPS)), run.log_tail()
            (done,) = run.records("done")
            assert done["run_id"] == run_id and done["outstanding_groups"] == 0
            assert sorted(r["version"] for r in run.records("eval")) == [0, TOTAL_STEPS]
            # Only this run's prompts reached its actor: training and eval ids carry its id.
            assert actor.seen and all(t.task_id.startswith(f"{run_id}-") for t in actor.seen)
            first_waits.append(train[0]["wait_data_s"])
            jsz = _jsz(monitor_url)
            assert jsz["reserved_storage"] <= jsz["config"]["max_storage"]
            assert jsz["storage"] <= jsz["config"]["max_storage"]
            assert "insufficient storage" not in run.log_path.read_text()
        listed = {n.names.namespace: n for n in await runs.list_namespaces(js)}
        jsz = _jsz(monitor_url)
    finally:
        await nc.close()

    wall_s = time.monotonic() - started
    store = f"{jsz['storage']} B used, {jsz['reserved_storage']} B reserved"
    print(f"six runs in {wall_s:.1f} s; first groups after {first_waits} s; store {store}")
    assert len(set(run_ids)) == len(NAMESPACES)
    assert max(first_waits) < FIRST_PROMPTS_BOUND_S, first_waits
    # The done runs of earlier namespaces were reclaimed to make room; the last run's is
    # kept (it is done, and would go when the next run needs the room).
    assert "shared-1" not in listed and "shared-3" in listed
    assert listed["shared-3"].state == runs.DONE
    assert jsz["reserved_storage"] == len(listed) * TRAJECTORY_BYTES <= 2 * TRAJECTORY_BYTES


async def test_a_rerun_in_the_same_directory_resumes_loudly_and_fresh_starts_anew(
    served_broker, tmp_path, tiny_model_dir, datasets
):
    url, _ = served_broker
    namespace = "shared-rerun"
    nc = await client.connect(url, name="test")
    js = nc.jetstream()
    run_dir = tmp_path / "run"
    try:
        first = _learner(url, namespace, run_dir, model=tiny_model_dir, data=datasets)
        first_id, _ = await _one_run(url, js, first, namespace, None)
        # The same command again: it resumes the final checkpoint and says so.
        again = _learner(url, namespace, run_dir, model=tiny_model_dir, data=datasets)
        await again.start()
        await _finish(again, 90)
        checkpoint = run_dir / "checkpoints" / f"step_{TOTAL_STEPS:08d}"
        said = f"resuming run {first_id} from checkpoint {checkpoint} at version {TOTAL_STEPS}"
        assert said in again.log_tail(), again.log_tail()
        # --fresh: a new run id, the old checkpoints moved aside, every step trained again.
        fresh = _learner(url, namespace, run_dir, model=tiny_model_dir, data=datasets)
        fresh.overrides.insert(0, "--fresh")
        fresh_id, _ = await _one_run(url, js, fresh, namespace, first_id)
    finally:
        await nc.close()
    assert fresh_id != first_id
    assert "moved" in fresh.log_tail() and "resuming" not in fresh.log_tail()
    assert [r["step"] for r in fresh.records("train")] == list(range(TOTAL_STEPS))
    assert len(list(tmp_path.glob("run/checkpoints.earlier-*/step_*"))) == 1
